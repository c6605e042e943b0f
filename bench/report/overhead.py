"""The "Host overhead per step" section: the newest ``bench overhead`` record beside the runs (RESULTS/overhead):
what each backend costs on the host per step, beside single, when the compute is negligible."""
from __future__ import annotations

from pathlib import Path

from bench.core import overhead


def section(src: Path, warn) -> list[str]:
    rec = overhead.latest(src, warn)
    if rec is None:
        return []
    return ["## Host overhead per step (bench overhead)", "",
            f"From `{rec['_path']}`: every backend at world size 1 in one process on the CPU with one thread, "
            f"{rec['model']} at batch {rec['batch_per_device']} (negligible compute), {rec['rounds']} interleaved rounds "
            f"of {rec['steps']} steps, the median CPU time per step. What a backend does around the kernels on the "
            "host, every step: on a GPU that time is idle device time whenever the kernels are faster than it.", "",
            overhead.table(rec), ""]
