"""A fake GPU machine for the CPU: what the device seam (bench/core/cuda.py, bench/core/nvml.py) answers on a machine
with N GPUs, so the harness's GPU side runs in ``make test`` where there is none (DESIGN.md, "The device seam").

``FakeGpuMachine(...).install(monkeypatch)`` replaces every function of bench/core/cuda.py (the torch.cuda queries:
each is one library call, the line a GPU alone executes) and puts a fake ``pynvml`` in ``sys.modules``, so the real
bench/core/nvml.py (its error handling included) runs against it. What a test can set: the GPUs (names, memory,
clocks, clock-event reasons, compute processes, energy), the driver, CUDA_VISIBLE_DEVICES's mapping, an NVML that is
missing or whose queries fail, and a GPU without an energy counter. The kernels are not faked: a rank that reaches its
first CUDA kernel stops there (torch here has no driver).
"""
from __future__ import annotations

import os
import sys
import time
import types
from dataclasses import dataclass, field

GiB = 1024 ** 3


class NVMLError(Exception):
    """pynvml's base error; subclasses carry the message pynvml's own would."""

    message = "Unknown Error"

    def __str__(self):
        return self.message


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's names
    message = "NVML Shared Library Not Found"


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    message = "Not Supported"


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    message = "GPU is lost"


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 80 * GiB
    used_bytes: int = 1 * GiB  # NVML's whole-GPU figure
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    reasons: int = 0x1  # GpuIdle; a callable (samples so far) -> bit mask for a script
    pids: list = field(default_factory=list)  # other processes' pids; the caller's own is added (it holds a context)
    energy_joules: float = 1000.0
    watts: float = 350.0  # the energy counter grows at this rate while the test runs
    energy_counter: bool = True  # False: a GPU before Volta, no counter
    peak_allocated: int = 3 * GiB
    peak_reserved: int = 4 * GiB
    cpus: list | None = None  # the CPUs near it (NVML's CPU affinity); None: every CPU of the machine
    capability: tuple = (9, 0)  # CUDA compute capability (an H100's; bf16 from 8.0)


class FakeGpuMachine:
    """``gpus``: the machine's GPUs in NVML's order (default 2 H100s); ``visible``: NVML index of CUDA device 0, 1, ...
    (CUDA_VISIBLE_DEVICES; default all, in order); ``nvml``: "ok", "missing" (no library or driver: nvmlInit fails)
    or the name of a query that fails (e.g. "nvmlDeviceGetClockInfo") with ``fail_with``; ``driver_cuda``: the newest
    CUDA the driver runs (NVML's CUDA driver version); ``torch_sees``: False where torch cannot use the GPUs NVML
    sees (a driver older than the CUDA torch was built for: torch.cuda.is_available() is False, no device counted)."""

    def __init__(self, gpus: list[FakeGpu] | None = None, visible: list[int] | None = None, nvml: str = "ok",
                 fail_with: type = NVMLError_NotSupported, driver: str = "580.159.04",
                 versions: dict | None = None, driver_cuda: str = "13.0", torch_sees: bool = True):
        self.gpus = gpus if gpus is not None else [FakeGpu(), FakeGpu()]
        self.visible = list(range(len(self.gpus))) if visible is None else list(visible)
        self.nvml, self.fail_with, self.driver, self.driver_cuda = nvml, fail_with, driver, driver_cuda
        self.torch_sees = torch_sees
        self.versions = versions or {"cuda": "13.0", "nccl": "2.27.7", "cudnn": 91300}
        self.tf32 = {"cudnn": True, "matmul": False}  # torch's defaults
        self.calls: list[tuple] = []  # (function, args) of the cuda seam, in order
        self.samples = 0
        self.t0 = time.monotonic()
        self.inits = 0

    # -- bench/core/cuda.py -------------------------------------------------------------------------

    def _index(self, device) -> int:
        index = getattr(device, "index", device)
        return 0 if index is None else int(index)

    def _gpu(self, device) -> FakeGpu:
        return self.gpus[self.visible[self._index(device)]]

    def cuda_functions(self) -> dict:
        def log(name):
            def wrap(fn):
                def call(*args, **kwargs):
                    self.calls.append((name, args))
                    return fn(*args, **kwargs)
                return call
            return wrap

        def set_matmul_tf32(on):
            before, self.tf32["matmul"] = self.tf32["matmul"], bool(on)
            return before

        def reset_peaks(d):
            self._gpu(d).peak_allocated = self._gpu(d).peak_reserved = 0

        def nvml_index(d):
            if self._index(d) >= len(self.visible):
                raise RuntimeError(f"device {self._index(d)} is not visible (CUDA_VISIBLE_DEVICES={self.visible})")
            return self.visible[self._index(d)]

        funcs = {
            "available": lambda: self.torch_sees and len(self.visible) > 0,
            "count": lambda: len(self.visible) if self.torch_sees else 0,
            "name": lambda d: self._gpu(d).name,
            "nvml_index": nvml_index,
            "set_device": lambda d: None,
            "synchronize": lambda d: None,
            "peak_allocated_bytes": lambda d: self._gpu(d).peak_allocated,
            "peak_reserved_bytes": lambda d: self._gpu(d).peak_reserved,
            "reset_peaks": reset_peaks,
            "free_bytes": lambda d: self._gpu(d).memory_bytes - self._gpu(d).used_bytes,
            "timing_event": FakeEvent,
            "tf32": lambda: dict(self.tf32),
            "set_matmul_tf32": set_matmul_tf32,
            "set_cudnn": lambda benchmark, deterministic=None: None,
            "versions": lambda: dict(self.versions),
        }
        return {name: log(name)(fn) for name, fn in funcs.items()}

    # -- pynvml ---------------------------------------------------------------------------------------

    def pynvml(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        m.NVMLError, m.NVMLError_LibraryNotFound = NVMLError, NVMLError_LibraryNotFound
        m.NVMLError_NotSupported, m.NVMLError_GpuIsLost = NVMLError_NotSupported, NVMLError_GpuIsLost
        m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 1, 2
        machine = self

        def query(name):
            def wrap(fn):
                def call(*args):
                    if machine.nvml == name:
                        raise machine.fail_with()
                    return fn(*args)
                m.__dict__[name] = call
                return call
            return wrap

        @query("nvmlInit")
        def _init():
            if machine.nvml == "missing":
                raise NVMLError_LibraryNotFound()
            machine.inits += 1

        @query("nvmlShutdown")
        def _shutdown():
            machine.inits -= 1

        query("nvmlDeviceGetCount")(lambda: len(machine.gpus))
        query("nvmlSystemGetDriverVersion")(lambda: machine.driver)
        query("nvmlSystemGetCudaDriverVersion")(
            lambda: int(machine.driver_cuda.split(".")[0]) * 1000 + int(machine.driver_cuda.split(".")[1]) * 10)

        @query("nvmlDeviceGetHandleByIndex")
        def _handle(i):
            if not 0 <= i < len(machine.gpus):
                raise NVMLError("Invalid Argument")
            return i

        query("nvmlDeviceGetName")(lambda h: machine.gpus[h].name)
        query("nvmlDeviceGetMemoryInfo")(lambda h: types.SimpleNamespace(
            total=machine.gpus[h].memory_bytes, used=machine.gpus[h].used_bytes,
            free=machine.gpus[h].memory_bytes - machine.gpus[h].used_bytes))
        query("nvmlDeviceGetCudaComputeCapability")(lambda h: tuple(machine.gpus[h].capability))

        @query("nvmlDeviceGetCpuAffinity")
        def _affinity(h, words):
            cpus = machine.gpus[h].cpus if machine.gpus[h].cpus is not None else range(os.cpu_count() or 1)
            return [sum(1 << (c - 64 * w) for c in cpus if 64 * w <= c < 64 * (w + 1)) for w in range(words)]

        query("nvmlDeviceGetClockInfo")(
            lambda h, which: machine.gpus[h].sm_mhz if which == m.NVML_CLOCK_SM else machine.gpus[h].mem_mhz)

        @query("nvmlDeviceGetCurrentClocksEventReasons")
        def _reasons(h):
            machine.samples += 1
            r = machine.gpus[h].reasons
            return r(machine.samples) if callable(r) else r

        query("nvmlDeviceGetComputeRunningProcesses")(
            lambda h: [types.SimpleNamespace(pid=p) for p in [os.getpid(), *machine.gpus[h].pids]])

        @query("nvmlDeviceGetTotalEnergyConsumption")
        def _energy(h):
            g = machine.gpus[h]
            if not g.energy_counter:
                raise NVMLError_NotSupported()
            return int(1000 * (g.energy_joules + g.watts * (time.monotonic() - machine.t0)))  # millijoules

        return m

    # -- installing -----------------------------------------------------------------------------------

    def install(self, monkeypatch) -> "FakeGpuMachine":
        """Answer every device question of this process from this machine until the test ends."""
        from bench.core import cuda

        for name, fn in self.cuda_functions().items():
            assert hasattr(cuda, name), f"bench.core.cuda has no {name}: the fake is out of date"
            monkeypatch.setattr(cuda, name, fn)
        monkeypatch.setitem(sys.modules, "pynvml", self.pynvml())
        return self

    def called(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]


class FakeEvent:
    """torch.cuda.Event(enable_timing=True) on the host's clock: record() notes the time, elapsed_time() in ms."""

    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1000.0
