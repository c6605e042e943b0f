"""MFU: model FLOPs utilisation, against a GPU's dense peak (no torch here: records, the report and the gate read it).

MFU = achieved FLOP/s / (dense peak per device x devices), achieved = FLOPs per sample x global samples/s (FLOPs
counted by backends/models/flops.py). The peak is the device's dense tensor-core rate at the run's precision (no 2:4
sparsity), from NVIDIA's datasheets below, or ``--peak-tflops``. An fp32 run's peak is the one its FLOPs run at: the
TF32 tensor-core rate where TF32 is on for them, else the CUDA cores' fp32 rate (``tf32``). cuDNN runs fp32
convolutions on TF32 tensor cores by default (``torch.backends.cudnn.allow_tf32``), and convolutions are a torchvision
model's FLOPs; fp32 matrix multiplications (a transformer's FLOPs) are NOT TF32 by default
(``torch.backends.cuda.matmul.allow_tf32`` is False, ``torch.get_float32_matmul_precision()`` is "highest"; torch 2.15
``torch/backends/cuda/__init__.py``). The suite leaves both as they are and the rank reads the one that applies
(bench/rank/record.py), so an fp32 GPT's MFU is against the fp32 rate (about 1/7 of TF32 on an H100), not a TF32 rate it
could never reach. On CPU, or on a GPU not in the table, MFU is left empty.

Rows are tried in order and the first match wins: the NVL parts come before the SXM rows their names would
also match (``H100 NVL`` contains ``H100``), since their peaks are about 16% lower.
"""
from __future__ import annotations

import re

# (pattern on torch.cuda.get_device_name, dense TFLOP/s by precision, source)
PEAKS = [
    (r"H100.*(PCIe|PCIE)", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
     "NVIDIA H100 Tensor Core GPU datasheet (PCIe), dense"),
    # H100 NVL and H200 NVL: 1,671 TFLOP/s bf16/fp16 and 835 TF32 "with sparsity" per GPU in NVIDIA's H100
    # Tensor Core GPU datasheet (H100 NVL column) and H200 Tensor Core GPU datasheet (H200 NVL column); dense is half.
    (r"H100.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
     "NVIDIA H100 Tensor Core GPU datasheet (NVL), dense"),
    (r"H200.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
     "NVIDIA H200 Tensor Core GPU datasheet (NVL), dense"),
    (r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67.0},
     "NVIDIA H100 Tensor Core GPU datasheet (SXM), dense"),
    (r"H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67.0},
     "NVIDIA H200 Tensor Core GPU datasheet (SXM), dense"),
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
     "NVIDIA A100 Tensor Core GPU datasheet, dense"),
    (r"L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}, "NVIDIA L40S datasheet, dense"),
    (r"A10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}, "NVIDIA A10 datasheet, dense"),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}, "NVIDIA L4 datasheet, dense"),
    (r"V100.*(PCIe|PCIE)", {"fp16": 112.0, "fp32": 14.0}, "NVIDIA V100 datasheet (PCIe); no bf16, no TF32"),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}, "NVIDIA V100 datasheet (SXM2); no bf16, no TF32"),
]


def peak_tflops(device_name: str | None, precision: str, override: float | None = None,
                tf32: bool = True) -> tuple[float | None, str]:
    """(dense TFLOP/s per device, where the figure comes from); (None, why) when unknown. ``tf32``: whether an fp32
    run's FLOPs run on TF32 tensor cores (else the CUDA cores' fp32 rate applies)."""
    if override:
        return float(override), "--peak-tflops"
    if not device_name:
        return None, "no GPU: MFU is for GPUs"
    for pattern, peaks, source in PEAKS:
        if re.search(pattern, device_name):
            key = ("tf32" if tf32 and "tf32" in peaks else "fp32") if precision == "fp32" else precision
            if key in peaks:
                mode = {"tf32": " (TF32 tensor cores)", "fp32": " (fp32 CUDA cores: TF32 off)"}.get(key, "")
                return peaks[key], source + (mode if precision == "fp32" else "")
            return None, f"{device_name} has no dense {precision} tensor-core rate in {source}"
    return None, f"{device_name} is not in the peak table (give --peak-tflops)"


def mfu(flops: float | None, global_throughput: float | None, peak: float | None, devices: int) -> float | None:
    """Model FLOPs utilisation, 0..1; None when anything is unknown."""
    if not (flops and global_throughput and peak and devices):
        return None
    return flops * global_throughput / (peak * 1e12 * devices)
