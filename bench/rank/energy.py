"""GPU energy from NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the
driver loaded), read per GPU outside the timed region.

The counter is updated every 20-100 ms depending on the GPU, so a read can lag the truth by up to one update.
A 10-step ResNet-50 window on an H100 lasts 0.2-0.5 s: per-window energy is off by up to one update in 2-25,
which is noise. The record's figures (``joules_per_image``, ``mean_watts``) therefore come from one read before
the first timed window and one after the last (``span_summary``): one update's error over the whole timed
span. The span includes the short untimed gaps between windows (barrier, synchronize, host reads), in its
energy and in its seconds alike. Per-window values are kept as diagnostics only
(``energy_window_diagnostic``). Energy is the whole GPU's, whatever else runs on it.
"""
from __future__ import annotations

from bench.core import cuda, nvml


class EnergyMeter:
    """Reads the energy counters of this rank's CUDA devices; ``reason`` says why not when it cannot."""

    def __init__(self, devices):
        self.indices, self.session, self.reason = [], None, None
        gpus = [d for d in devices if d.type == "cuda"]
        if not gpus:
            self.reason = "no GPU"
            return
        try:
            # NVML counts GPUs as the driver does; CUDA_VISIBLE_DEVICES may reorder them
            indices = [cuda.nvml_index(d.index) for d in gpus]
            self.session = nvml.open()
            self.indices = indices
            self.read()
        except (nvml.Unavailable, RuntimeError) as e:  # no NVML, a GPU without the counter (before Volta), no mapping
            self.close()
            self.indices, self.reason = [], f"NVML energy counter unavailable: {e}"

    def read(self) -> list[float] | None:
        """Joules consumed so far by each of this rank's GPUs, or None when not measured."""
        if not self.indices or self.session is None:
            return None
        return [self.session.energy_joules(i) for i in self.indices]

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def window_energy(before: list[float] | None, after: list[float] | None) -> float | None:
    """Joules the rank's GPUs used between two reads (summed over its GPUs)."""
    if before is None or after is None:
        return None
    return sum(a - b for a, b in zip(after, before))


def span_summary(span_joules: list[float | None], span_seconds: list[float | None], samples: int) -> dict:
    """Joules per image and mean watts of all GPUs of the run, from each rank's energy (summed over its GPUs)
    between its read before the first timed window and its read after the last, and the seconds between those
    reads; ``samples``: every sample the timed windows trained (global batch x steps x windows)."""
    if not span_joules or any(j is None for j in span_joules) or not samples:
        return {"joules_per_image": None, "mean_watts": None}
    pairs = [(j, s) for j, s in zip(span_joules, span_seconds) if j is not None and s is not None]
    return {"joules_per_image": sum(j for j, _ in pairs) / samples, "mean_watts": sum(j / s for j, s in pairs)}


def summarise(per_window_joules: list[float | None], window_seconds: list[float], samples_per_window: int) -> dict:
    """DIAGNOSTIC ONLY: joules per image and mean watts (all GPUs of the run together) as medians over the
    windows; off by up to one counter update per window (module docstring). The record's figures are
    ``span_summary``'s."""
    import numpy as np

    pairs = [(j, t) for j, t in zip(per_window_joules, window_seconds) if j is not None]
    if not pairs:
        return {"joules_per_image": None, "mean_watts": None}
    joules, seconds = np.array(pairs).T
    return {"joules_per_image": float(np.median(joules / samples_per_window)),
            "mean_watts": float(np.median(joules / seconds))}
