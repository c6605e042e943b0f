"""The plain twin of a gpt-<size> run (``bench run --reference``): the plainest PyTorch loop that trains the same
GPT (backends/models/gpt.py, the model definition the harness trains) on the same random token sequences, at the
same precision, batch and compile setting, on one device, with the same warm-up, settle step and windows. No harness
code: torch and the model definition only, so a reader can check it line by line. The harness compares every
world-size-1 run of the same configuration with it (docs/close-to-the-machine.md).

    PYTHONPATH=. python bench/twins/gpt.py SETTINGS.json OUT.json

SETTINGS.json holds plain values (model shape as gpt = [layers, width, heads, vocabulary], seq_len, batch, precision,
compile, device, threads, seed, warmup, settle, steps, windows); OUT.json gets each window's wall and CPU time.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

from backends.models.gpt import GPT


def setup(c):
    """The model, its optimizer and the one fixed batch: the same values the harness's rank 0 trains on."""
    device = torch.device("cuda", 0) if c["device"] == "cuda" else torch.device("cpu")
    layers, width, heads, vocab = c["gpt"]
    torch.manual_seed(c["seed"])
    model = GPT(layers, width, heads, vocab, c["seq_len"]).to(device)
    gen = torch.Generator().manual_seed(1000)  # rank 0's batch: 1000 + rank
    tokens = torch.randint(0, vocab, (c["batch"], c["seq_len"] + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)  # next-token targets
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  foreach=device.type == "cuda")
    return model, optimizer, x, y, device


def main(settings, out_path):
    c = json.load(open(settings))
    torch.set_num_threads(c["threads"])
    model, optimizer, x, y, device = setup(c)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["precision"])
    scaler = torch.amp.GradScaler(device.type) if c["precision"] == "fp16" else None
    compiled = torch.compile(model) if c["compile"] else model

    def step(net):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = net(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
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
        for _ in range(c["warmup"]):
            t0 = time.perf_counter()
            step(net)
            sync()
            warm.append(time.perf_counter() - t0)
        for _ in range(c["settle"]):
            step(net)
        sync()
        span = [time.time()]
        for _ in range(c["windows"]):
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
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "torch": torch.__version__}
    if c["compile"]:  # the eager twin: the same model uncompiled, timed the same way after the compiled windows
        _, out["eager_window_seconds"], out["eager_window_cpu_seconds"], _ = measure(model)
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
