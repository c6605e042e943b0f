"""Test-only fault injection, switched on by the BENCH_FAULT environment variable.

    crash@rank1:step3    rank 1 exits with code 13 at its 3rd training step (counting warm-up)
    hang@rank1[:step2]   rank 1 sleeps forever at that step (default step 1)
    oom[@rank0][:step1]  raise torch.cuda.OutOfMemoryError, as a too-large batch would
    oom-cublas, oom-cuda, oom-cudnn, oom-nccl  (the same form) out of memory as the libraries under torch raise
                         it, with their own exception type and message (OOM_ERRORS below)
    diverge@rank1        after training, perturb rank 1's parameters (the replica check must catch it)
    bloat@rank0:step2    hold 256 MiB on the rank's first device through that step (a one-time peak such as
                         cuDNN's search workspace; in a warm-up step it must not reach the timed peaks)
    grad-scale@rank1     rank 1's local gradients are doubled before they are reduced (the loss keeps its
                         value): replicas stay identical but are wrong (bench verify must catch it)
    wrong-shard@rank1    rank 1 reads rank 0's share of the data instead of its own (bench verify must catch it)
    overflow@rank1:step3 at that step one element of one weight's gradient becomes inf on rank 1, in backward, before
                         any reduction sees it: an fp16 overflow on one rank alone (every rank's loss scaler must skip
                         that step and halve its scale alike)
    node-dies@rank1:step6     this node dies at that step: its harness, launcher and ranks get SIGKILL at once
                              (a power cut on a real cluster; the other nodes must name it, bench/rank/lifeline.py)
    node-freezes@rank1:step6  the same with SIGSTOP: a node that stops answering without closing a connection
                              (a kernel hang, a partition); the test that injects it kills the frozen processes
    Both wait 1.5 s before acting, so the node's last heartbeat carries the phase it died in.
    pause40@rank0        every training step of that rank sleeps 40 ms after it (wall time, no CPU): a step of a known
                         length, whatever the machine does (tests/test_sweep_verdict.py makes two backends alike with it)
    slow@rank0           every training step of that rank burns SLOW_SHARE (5%) more CPU time after it, in a busy
                         loop inside the step (a harness that got 5% slower); ``slowN``: N% (``slow50@rank0``: 50%,
                         what tests/test_reference.py makes ``bench run --reference`` see)
    watchdog-abort@rank0      once a training step of this rank fails (its peer died), the process is taken down as
                              NCCL's watchdog does (TORCH_NCCL_ASYNC_ERROR_HANDLING 1 or 3): SIGABRT from a thread
                              of its own while the main thread stays blocked, as in a CUDA synchronize

``@rank*`` is every rank whose environment has the fault (give BENCH_FAULT to one node's ``bench run`` only).

A ``BACKEND/`` prefix limits a fault to one backend (``ddp/crash@rank1:step3``), so a sweep can show that
one failing run does not stop the next; a ``MODEL:`` prefix before it, to one workload (``cnn-tiny:dp/pause40@rank*``). Several faults are separated by commas. With BENCH_FAULT unset nothing is installed: the timed loop
runs the backend's own ``step`` untouched.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass

# oom-*: how each library reports a failed device allocation, copied from its source (bench/core/markers.py names
# them): C10_CUDA_CHECK's message, TORCH_CUDABLAS_CHECK's at cuBLAS's first use, AT_CUDNN_CHECK's under cuDNN 9, and
# C10D_NCCL_CHECK's with NCCL's last error as NCCL's CUCHECK words it (the version is this venv's NCCL; the file and
# line name where torch checks a call, whichever it was).
OOM_ERRORS = {
    "oom-cuda": ("AcceleratorError", "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported "
                 "at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
                 "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"),
    "oom-cublas": ("RuntimeError", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "oom-cudnn": ("RuntimeError", "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    "oom-nccl": ("DistBackendError", "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled "
                 "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.30.7\nncclUnhandledCudaError: "
                 "Call to CUDA function failed.\nLast error:\nCuda failure 2 'out of memory'"),
}
KINDS = ("crash", "hang", "oom", *OOM_ERRORS, "diverge", "bloat", "grad-scale", "wrong-shard", "node-dies",
         "node-freezes", "watchdog-abort", "slow", "overflow", "pause")
SLOW_SHARE = 0.05  # slow: the CPU time each step burns beyond its own, as a share of it
ANY_RANK = -1
BLOAT_BYTES = 256 * 2 ** 20
_SPEC = re.compile(r"^(?:(?P<model>[a-z0-9._-]+):)?(?:(?P<backend>[a-z0-9_]+)/)?(?P<kind>[a-z-]+)"
                   r"(?P<pct>(?:(?<=slow)|(?<=pause))\d+)?(?:@rank(?P<rank>\d+|\*))?(?::step(?P<step>\d+))?$")


@dataclass
class _One:
    kind: str
    rank: int
    step: int
    backend: str | None
    share: float = SLOW_SHARE  # slow: the extra CPU time's share of the step's; pause: the seconds slept
    model: str | None = None


class Fault:
    def __init__(self, faults: list[_One]):
        self.faults = faults

    @classmethod
    def parse(cls, text: str | None) -> "Fault":
        faults = []
        for part in filter(None, (text or "").split(",")):
            m = _SPEC.match(part.strip())
            if not m or m["kind"] not in KINDS:
                raise ValueError(f"BENCH_FAULT: cannot parse {part!r}; expected [BACKEND/]KIND[@rankR][:stepS] "
                                 f"with KIND one of {', '.join(KINDS)}")
            rank = ANY_RANK if m["rank"] == "*" else int(m["rank"] or 0)
            if m["kind"] == "pause" and not m["pct"]:
                raise ValueError(f"BENCH_FAULT: {part!r}: pause needs its milliseconds (pause40@rank0)")
            share = (int(m["pct"]) / (1000 if m["kind"] == "pause" else 100)) if m["pct"] else SLOW_SHARE
            faults.append(_One(m["kind"], rank, int(m["step"] or 1), m["backend"], share, m["model"]))
        return cls(faults)

    def _mine(self, backend, kinds):
        model = getattr(getattr(backend, "workload", None), "name", None)
        return [f for f in self.faults
                if f.rank in (backend.rank, ANY_RANK) and f.kind in kinds and f.backend in (None, backend.name)
                and f.model in (None, model)]

    def install(self, backend) -> None:
        """After setup, before the harness builds the data (wrong-shard picks the share the data comes from)."""
        if self._mine(backend, ("wrong-shard",)):
            backend.shard_rank = 0
        if self._mine(backend, ("grad-scale",)):
            forward_loss = backend.forward_loss

            def doubled():  # the same loss value, twice its gradient: what reaches the reduction is doubled
                loss = forward_loss()
                return loss + (loss - loss.detach())

            backend.forward_loss = doubled
        if self._mine(backend, ("watchdog-abort",)):
            failing = backend.step

            def watched_step():
                try:
                    return failing()
                except Exception:  # noqa: BLE001 - what NCCL's watchdog would have seen as an asynchronous error
                    _watchdog_abort(backend)

            backend.step = watched_step
        for f in self._mine(backend, ("slow",)):
            backend.step = slowed(backend.step, f.share)
        for f in self._mine(backend, ("pause",)):
            backend.step = paused(backend.step, f.share)
        for f in self._mine(backend, ("overflow",)):
            backend.step = overflowed(backend, backend.step, f.step)
        mine = self._mine(backend, ("crash", "hang", "oom", *OOM_ERRORS, "bloat", "node-dies", "node-freezes"))
        if not mine:
            return
        original, count = backend.step, [0]

        def step():
            count[0] += 1
            held = [_trigger(f, backend) for f in mine if f.step == count[0]]  # a bloat block lives through the step
            loss = original()
            del held
            return loss

        backend.step = step

    def after_training(self, backend) -> None:
        import torch

        if self._mine(backend, ("diverge",)):
            with torch.no_grad():
                next(backend.module.parameters()).add_(1e-3)


def paused(step, seconds: float):
    """``step``, then a sleep of ``seconds`` inside the same call: a step of a known length, on any machine."""
    def step_then_sleep():
        loss = step()
        time.sleep(seconds)
        return loss

    return step_then_sleep


def slowed(step, share: float = SLOW_SHARE, clock=time.process_time):
    """``step``, followed inside the same call by a busy loop burning ``share`` of the CPU time the step took (the
    process's CPU time: what a harness that does more per step costs, whatever else the machine runs)."""
    def step_then_spin():
        c0 = clock()
        loss = step()
        until = clock() + share * (clock() - c0)
        while clock() < until:
            pass
        return loss

    return step_then_spin


def overflowed(backend, step, at: int):
    """``step``, in whose ``at``-th call one element of the first weight of the model's first block (its first Linear
    or convolution) gets an inf gradient in backward. The hook goes on the weight the module computes with at that
    forward (FSDP2's unsharded parameter, ZeRO-3's gathered one: a forward pre-hook reads it), so the inf enters before
    the backend reduces, reduce-scatters or partitions the gradient, as an overflow in this rank's backward would."""
    import torch

    from backends.models import find_blocks

    blocks = find_blocks(backend.module) or [backend.module]
    leaf = next(m for m in blocks[0].modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
    count, handles = [0], []

    def poison(grad):
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad

    def arm(module, args):
        if not handles:  # once (a checkpointed block runs its forward again in backward)
            handles.append(module.weight.register_hook(poison))

    def step_with_overflow():
        count[0] += 1
        if count[0] != at:
            return step()
        print(f"BENCH_FAULT: injected overflow on rank {backend.rank} at step {at} (at {time.time():.3f})",
              file=sys.stderr, flush=True)
        pre = leaf.register_forward_pre_hook(arm)
        try:
            return step()
        finally:
            pre.remove()
            for h in handles:
                h.remove()
            handles.clear()

    return step_with_overflow


def _whole_node(sig: int) -> None:
    """``sig`` to this node's harness and every process of this node's run (they share RUN_TAG), this one last."""
    import psutil

    from bench.core.markers import HARNESS_ENV, RUN_TAG

    tag, me = os.environ.get(RUN_TAG), os.getpid()
    victims = [int(os.environ[HARNESS_ENV].split(":")[0])] if os.environ.get(HARNESS_ENV) else []
    for p in psutil.process_iter():
        try:
            if p.pid != me and p.environ().get(RUN_TAG) == tag:
                victims.append(p.pid)
        except (psutil.Error, OSError):
            pass
    for pid in victims:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    os.kill(me, sig)


def _trigger(f: _One, backend):
    print(f"BENCH_FAULT: injected {f.kind} on rank {backend.rank} at step {f.step} (at {time.time():.3f})",
          file=sys.stderr, flush=True)
    if f.kind in ("node-dies", "node-freezes"):
        time.sleep(1.5)  # the phase this step is in reaches the heartbeat first
        _whole_node(signal.SIGKILL if f.kind == "node-dies" else signal.SIGSTOP)
    if f.kind == "bloat":
        import torch

        return torch.ones(BLOAT_BYTES // 4, device=backend.devices()[0])  # written, so the pages are resident
    if f.kind == "crash":
        os._exit(13)
    if f.kind == "hang":
        while True:
            time.sleep(3600)
    if f.kind == "oom":
        import torch

        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by BENCH_FAULT)")
    if f.kind in OOM_ERRORS:
        raise oom_error(f.kind)


def oom_error(kind: str) -> Exception:
    """The exception the library behind ``kind`` raises (OOM_ERRORS): its type as torch maps it to Python (an
    AcceleratorError is a RuntimeError in an older torch; a c10::CuDNNError or c10::Error is a RuntimeError)."""
    import torch
    import torch.distributed as dist

    name, message = OOM_ERRORS[kind]
    cls = getattr(torch, name, None) or getattr(dist, name, None) or RuntimeError
    return cls(message)


def _watchdog_abort(backend) -> None:
    import ctypes
    import threading

    print(f"BENCH_FAULT: injected watchdog-abort on rank {backend.rank}: a step failed, SIGABRT from a thread "
          f"(at {time.time():.3f})", file=sys.stderr, flush=True)
    threading.Thread(target=ctypes.CDLL(None).abort, name="fake-nccl-watchdog", daemon=True).start()  # no GIL held
    while True:  # the main thread stays where NCCL would keep it: blocked, not in Python
        time.sleep(3600)
