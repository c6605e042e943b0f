"""NVML (nvidia-ml-py's ``pynvml``), and the only module that imports it: the GPUs' count, names and driver, the
memory in use, SM and memory clocks, clock-event (throttle) reasons, the compute processes and the energy counter.
Indices are NVML's (the driver's order); ``bench.core.cuda.nvml_index`` maps a CUDA device to one.

Every query raises ``Unavailable`` with the library's own reason (no library, no driver, a query this GPU does not
support), and nothing else is caught: a caller puts the reason in the record (``energy_reason``, ``nvml``), and a
mistake in our own code stays an error instead of becoming a null field. The tests replace ``open`` with a fake
GPU machine (tests/fake_gpu.py), which is how the harness's GPU side runs in ``make test`` on a machine with none.
"""
from __future__ import annotations


class Unavailable(Exception):
    """NVML could not answer; ``str()`` is the reason, for the record."""


def _library():
    try:
        import pynvml
    except ImportError as e:  # nvidia-ml-py is locked, but TORCH=system may run in an environment without it
        raise Unavailable(f"NVML unavailable: nvidia-ml-py is not installed ({e})") from e
    return pynvml


class Session:
    """An initialised NVML (``with nvml.open() as n: n.count()``); every query names what failed."""

    def __init__(self, lib):
        self._lib, self._handles = lib, {}

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except self._lib.NVMLError as e:
            raise Unavailable(f"NVML {what}: {type(e).__name__}: {e}") from e

    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._call(f"GPU {index}", self._lib.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    @staticmethod
    def _text(value) -> str:
        return value.decode() if isinstance(value, bytes) else value

    def count(self) -> int:
        return int(self._call("device count", self._lib.nvmlDeviceGetCount))

    def name(self, index: int) -> str:
        return self._text(self._call("device name", self._lib.nvmlDeviceGetName, self._handle(index)))

    def driver(self) -> str:
        return self._text(self._call("driver version", self._lib.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        """The newest CUDA this driver runs ("12.2"; nvidia-smi's "CUDA Version")."""
        v = int(self._call("CUDA driver version", self._lib.nvmlSystemGetCudaDriverVersion))
        return f"{v // 1000}.{v % 1000 // 10}"

    def compute_capability(self, index: int) -> tuple[int, int]:
        """The GPU's CUDA compute capability, (major, minor): 8.0 and newer compute bf16 natively."""
        major, minor = self._call("compute capability", self._lib.nvmlDeviceGetCudaComputeCapability, self._handle(index))
        return int(major), int(minor)

    def cpu_affinity(self, index: int) -> set[int]:
        """The CPUs near this GPU (NVML's ideal CPU affinity: those of its NUMA node), as CPU numbers."""
        import os

        words = -(-(os.cpu_count() or 1) // 64)  # 64 CPUs per word of the mask
        mask = self._call("CPU affinity", self._lib.nvmlDeviceGetCpuAffinity, self._handle(index), words)
        return {64 * w + bit for w, word in enumerate(mask) for bit in range(64) if int(word) >> bit & 1}

    def memory_total(self, index: int) -> int:
        return int(self._call("memory info", self._lib.nvmlDeviceGetMemoryInfo, self._handle(index)).total)

    def memory_used(self, index: int) -> int:
        """Bytes in use on the whole GPU, every process's (what nvidia-smi shows)."""
        return int(self._call("memory info", self._lib.nvmlDeviceGetMemoryInfo, self._handle(index)).used)

    def clock_mhz(self, index: int, which: str) -> int:
        """``which``: "sm" or "mem"."""
        clock = {"sm": self._lib.NVML_CLOCK_SM, "mem": self._lib.NVML_CLOCK_MEM}[which]
        return int(self._call(f"{which} clock", self._lib.nvmlDeviceGetClockInfo, self._handle(index), clock))

    def clock_event_reasons(self, index: int) -> int:
        """The bit mask of why the clocks are held down (throttling); bench/core/trust.py names the bits."""
        get = getattr(self._lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self._lib.nvmlDeviceGetCurrentClocksThrottleReasons  # the name before nvidia-ml-py 12.535
        return int(self._call("clock-event reasons", get, self._handle(index)))

    def compute_pids(self, index: int) -> list[int]:
        procs = self._call("compute processes", self._lib.nvmlDeviceGetComputeRunningProcesses, self._handle(index))
        return [p.pid for p in procs]

    def energy_joules(self, index: int) -> float:
        """The GPU's energy counter: joules since the driver loaded (Volta and newer)."""
        return self._call("energy counter", self._lib.nvmlDeviceGetTotalEnergyConsumption, self._handle(index)) / 1000.0

    def close(self) -> None:
        if self._lib is not None:
            lib, self._lib, self._handles = self._lib, None, {}
            try:
                lib.nvmlShutdown()
            except lib.NVMLError:
                pass  # shutting down an NVML that is going away: nothing left to release

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open() -> Session:  # noqa: A001 - nvml.open(), as the module is always named
    """An initialised NVML session, or ``Unavailable`` with why not (a CPU machine: no library or no driver)."""
    lib = _library()
    try:
        lib.nvmlInit()
    except lib.NVMLError as e:
        raise Unavailable(f"NVML unavailable: {type(e).__name__}: {e}") from e
    return Session(lib)
