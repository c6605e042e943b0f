"""GPU energy from NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the
driver loaded), read per GPU around each timed window, outside the timed region.

The counter is updated every 20-100 ms depending on the GPU, so a window shorter than a few hundred ms can
read one update more or less than it consumed: the default GPU windows (10 steps) last seconds. Energy is the
whole GPU's, whatever else runs on it.
"""
from __future__ import annotations


class EnergyMeter:
    """Reads the energy counters of this rank's CUDA devices; ``reason`` says why not when it cannot."""

    def __init__(self, devices):
        self.handles, self.reason = [], None
        cuda = [d for d in devices if d.type == "cuda"]
        if not cuda:
            self.reason = "no GPU"
            return
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            for d in cuda:  # NVML counts GPUs as the driver does; CUDA_VISIBLE_DEVICES may reorder them
                self.handles.append(pynvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(d.index)))
            self.read()
        except Exception as e:  # noqa: BLE001 - no NVML, or a GPU without the counter (before Volta)
            self.handles, self.reason = [], f"NVML energy counter unavailable: {e}"

    def read(self) -> list[float] | None:
        """Joules consumed so far by each of this rank's GPUs, or None when not measured."""
        if not self.handles:
            return None
        import pynvml

        return [pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0 for h in self.handles]


def window_energy(before: list[float] | None, after: list[float] | None) -> float | None:
    """Joules the rank's GPUs used between two reads (summed over its GPUs)."""
    if before is None or after is None:
        return None
    return sum(a - b for a, b in zip(after, before))


def summarise(per_window_joules: list[float | None], window_seconds: list[float], samples_per_window: int) -> dict:
    """Joules per image and mean watts (all GPUs of the run together), medians over the windows."""
    import numpy as np

    pairs = [(j, t) for j, t in zip(per_window_joules, window_seconds) if j is not None]
    if not pairs:
        return {"joules_per_image": None, "mean_watts": None}
    joules, seconds = np.array(pairs).T
    return {"joules_per_image": float(np.median(joules / samples_per_window)),
            "mean_watts": float(np.median(joules / seconds))}
