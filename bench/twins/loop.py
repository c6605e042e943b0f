"""What the plain twins share, in plain torch: one training step (autocast at bf16/fp16, a GradScaler at fp16) and
the harness's window schedule (warm-up steps timed one by one, the settle step, then the timed windows, the device
synchronised at each edge), with the wall and CPU time of each window. Under --compile the eager model is timed the
same way after the compiled windows. Python's collector runs as in the harness's timed loop (bench/rank/startup.py):
automatic collection off, one full collection before warm-up and ``gc.collect(1)`` before each window. A backend's
own loop (``c["loop"]["name"]``: ddp.py, fsdp2.py, ds_zero.py beside this file) wraps the model and optimizer first,
and may bring its own step (DeepSpeed's engine). It imports gc, importlib, json, time and torch only."""
import gc
import importlib
import json
import time

import torch


def run(c, model, optimizer, loss_of, device, out_path):
    """Train ``model`` on ``loss_of(net)`` (the loss of one forward of ``net`` on the twin's fixed batch) under the
    settings ``c`` and write the window times to ``out_path``."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["precision"])
    autocast, own_step = True, None
    if c["loop"]["name"] != "plain":  # a backend's loop at world size 1: wrap, then step as that backend's users do
        wrap = importlib.import_module(f"bench.twins.{c['loop']['name']}").wrap
        model, optimizer, autocast, own_step = wrap(c, model, optimizer, device)
    scaler = torch.amp.GradScaler(device.type) if c["precision"] == "fp16" and own_step is None else None
    compiled = torch.compile(model) if c["compile"] else model

    def step(net):
        if own_step is not None:
            return own_step(loss_of)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None and autocast):
            loss = loss_of(net)
        optimizer.zero_grad()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def measure(net):
        """Warm-up (each step on its own), settle, then the timed windows: wall and CPU time of each."""
        warm, wall, cpu = [], [], []
        gc.collect()
        gc.disable()
        for _ in range(c["warmup"]):
            t0 = time.perf_counter()
            step(net)
            sync()
            warm.append(time.perf_counter() - t0)
        if c.get("window_s"):  # windows sized by time, by the harness's rule (bench/rank/train.py size_windows)
            half = sorted(warm[len(warm) // 2:])
            per_step = (half[(len(half) - 1) // 2] + half[len(half) // 2]) / 2
            c["steps"] = max(1, min(10_000, round(c["window_s"] / per_step) if per_step > 0 else 10_000))
        for _ in range(c["settle"]):
            step(net)
        sync()
        span = [time.time()]
        for _ in range(c["windows"]):
            gc.collect(1)
            sync()
            c0 = time.process_time()
            t0 = time.perf_counter()
            for _ in range(c["steps"]):
                step(net)
            sync()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        return warm, wall, cpu, span + [time.time()]

    warm, wall, cpu, span = measure(compiled)
    out = {"window_seconds": wall, "window_cpu_seconds": cpu, "warmup_step_seconds": warm, "windows_wall_span": span,
           "steps": c["steps"],
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "torch": torch.__version__}
    if c["compile"]:  # the eager twin: the same model uncompiled, timed the same way after the compiled windows
        _, out["eager_window_seconds"], out["eager_window_cpu_seconds"], _ = measure(model)
    json.dump(out, open(out_path, "w"))
