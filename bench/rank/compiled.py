"""What ``--compile`` did, and which attention kernel a GPT ran, read in the rank after the timed windows.

Graph breaks and graphs: TorchDynamo counts them in ``torch._dynamo.utils.counters`` (the same counters
``torch._dynamo.explain`` reports from): ``counters["graph_break"]`` maps each break's reason to how often it happened,
``counters["stats"]["unique_graphs"]`` counts the graphs compiled. Read once after the settle step (compilation is
warm-up's) and once after the windows: a graph compiled in between was compiled inside a timed window (a recompile:
a guard failed), and the record says so.

The attention kernel: ``F.scaled_dot_product_attention`` dispatches to one of several aten operations (flash, memory-
efficient, cuDNN, math, or flash's CPU implementation), chosen per call by shapes, dtype, device and the
``torch.nn.attention`` flags. One more training step after everything measured runs under ``torch.profiler`` (CPU
activity only: the aten operations, compiled code's calls into aten included, which a TorchDispatchMode such as
bench/rank/numerics.py's would not see under --compile) and the operations' names say which ran."""
from __future__ import annotations

# aten operation -> the kernel it is (forward; its backward is the same name + "_backward")
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_attention_math": "math",
    "_scaled_dot_product_fused_attention_overrideable": "fused (backend-specific)",
}


def dynamo_counters() -> dict:
    """Graph breaks so far (and their three most frequent reasons, first line each) and graphs compiled so far."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {"graph_breaks": int(sum(breaks.values())), "unique_graphs": int(counters["stats"]["unique_graphs"]),
            "break_reasons": [reason_line(reason) for reason, _ in breaks.most_common(3)]}


def reason_line(reason) -> str:
    """A graph break's reason in one line: its title and its explanation ("Failed to trace builtin operator:
    Dynamo does not know how to trace builtin operator `print` ..."), at most 240 characters."""
    lines = [ln.strip().removeprefix("Explanation:").strip() for ln in str(reason).strip().splitlines() if ln.strip()]
    return ": ".join(lines[:2])[:240]


def compile_fields(before_windows: dict | None, after_windows: dict | None) -> dict | None:
    """The record's ``compile_graphs``: breaks and graphs after the windows, and the graphs compiled during them."""
    if before_windows is None or after_windows is None:
        return None
    return {**after_windows, "graphs_compiled_in_windows": after_windows["unique_graphs"] - before_windows["unique_graphs"],
            "how": "torch._dynamo.utils.counters: graph_break (per reason), stats.unique_graphs; read after the settle "
                   "step and after the timed windows"}


def kernels_of(op_names) -> dict:
    """Which attention kernels the aten operations ``op_names`` (``aten::`` prefixed or not) show."""
    ops = sorted({n.removeprefix("aten::") for n in op_names if "scaled_dot_product" in n})
    kernels = sorted({SDPA_KERNELS[o.removesuffix("_backward")] for o in ops if o.removesuffix("_backward") in SDPA_KERNELS})
    out = {"kernels": kernels, "ops": ops}
    if not kernels:
        out["reason"] = ("no scaled-dot-product kernel ran as an aten operation (a compiler may have generated its own "
                         "attention kernels)") if not ops else "an unknown scaled-dot-product operation"
    return out


def sdpa_kernels(backend) -> dict:
    """One more training step of ``backend`` under the profiler; which attention kernels ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        backend.train(1)
    return {**kernels_of(e.name for e in prof.events()),
            "how": "torch.profiler (CPU activity) over one training step after the windows: the aten operations"}
