"""--compile worth its name (issue 39, item 4): compile time recorded on its own and never inside a window, graph
breaks and graphs counted (TorchDynamo's counters, bench/rank/compiled.py), a compiled run slower than its eager twin
says so, and a GPT's attention kernel recorded from the aten operations that ran."""
import argparse
import statistics

import pytest
import torch

from bench.rank import compiled
from tests.conftest import bench_inproc, records


def test_graph_breaks_and_graphs_are_counted_and_a_recompile_between_the_reads_is_seen():
    def with_a_break(x):
        y = x.sin()
        print("", end="")  # Dynamo cannot trace print: a graph break, two graphs
        return y.cos()

    before = compiled.dynamo_counters()
    f = torch.compile(with_a_break, backend="eager")  # Dynamo only: counted the same, no code generated
    f(torch.randn(4))
    after = compiled.dynamo_counters()
    assert after["graph_breaks"] - before["graph_breaks"] == 1
    assert after["unique_graphs"] - before["unique_graphs"] == 2
    assert any("print" in r for r in after["break_reasons"])
    g = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    g(torch.randn(4))
    warm = compiled.dynamo_counters()
    g(torch.randn(4))  # the same shape: no new graph
    assert compiled.compile_fields(warm, compiled.dynamo_counters())["graphs_compiled_in_windows"] == 0
    g(torch.randn(4, dtype=torch.float64))  # a guard fails: compiled again, as inside a window it would be
    fields = compiled.compile_fields(warm, compiled.dynamo_counters())
    assert fields["graphs_compiled_in_windows"] == 1 and fields["how"].startswith("torch._dynamo.utils.counters")
    assert compiled.compile_fields(None, warm) is None


def test_the_attention_kernel_is_named_from_the_aten_operations():
    got = compiled.kernels_of(["aten::mm", "aten::scaled_dot_product_attention",
                               "aten::_scaled_dot_product_flash_attention",
                               "aten::_scaled_dot_product_flash_attention_backward"])
    assert got == {"kernels": ["flash"], "ops": ["_scaled_dot_product_flash_attention",
                                                 "_scaled_dot_product_flash_attention_backward",
                                                 "scaled_dot_product_attention"]}
    assert compiled.kernels_of(["aten::_scaled_dot_product_efficient_attention",
                                "aten::_scaled_dot_product_cudnn_attention"])["kernels"] == ["cuDNN", "memory-efficient"]
    assert compiled.kernels_of(["aten::_scaled_dot_product_flash_attention_for_cpu_backward"])["kernels"] == [
        "flash (CPU)"]  # a backward alone names its kernel too
    assert compiled.kernels_of(["aten::mm"])["reason"].startswith("no scaled-dot-product kernel ran")


class OneGPT:
    """What sdpa_kernels needs of a backend: train(steps)."""

    def __init__(self):
        from backends.models.gpt import GPT

        torch.manual_seed(0)
        self.model, self.x = GPT(1, 32, 2, 64, 8), torch.randint(0, 64, (2, 8))

    def train(self, steps):
        for _ in range(steps):
            self.model(self.x).sum().backward()


def test_the_probe_reads_the_kernel_that_ran_not_a_declaration():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gpt = OneGPT()
    got = compiled.sdpa_kernels(gpt)
    assert got["kernels"] == ["flash (CPU)"]  # torch's choice on a CPU for these inputs
    assert "_scaled_dot_product_flash_attention_for_cpu_backward" in got["ops"]
    with sdpa_kernel(SDPBackend.MATH):  # the math kernel forced: the probe sees it
        assert compiled.sdpa_kernels(gpt)["kernels"] == ["math"]


@pytest.mark.slow
def test_a_compiled_run_beside_its_eager_twin(tmp_path):
    """gpt-micro, single, --compile --reference: compile time outside the windows, no graph break, nothing compiled
    inside a window, the twin's eager windows and the ratio, the attention kernel under compile."""
    proc = bench_inproc("run", "--backends", "single", "--gpus", 1, "--device", "cpu", "--model", "gpt-micro",
                        "--seq-len", 32, "--batch-size", 2, "--warmup", 3, "--steps", 5, "--windows", 3, "--compile",
                        "--reference", "--results", tmp_path / "raw",
                        env={"BENCH_PEAK_CACHE": tmp_path / "peak", "OMP_WAIT_POLICY": "PASSIVE"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec], [twin] = records(tmp_path / "raw"), records(tmp_path / "raw" / "reference")
    g = rec["compile_graphs"]
    assert (g["graph_breaks"], g["graphs_compiled_in_windows"], g["break_reasons"]) == (0, 0, []) and g["unique_graphs"] >= 1
    assert rec["compile_seconds"] > max(rec["window_seconds"])  # compilation was warm-up's, in no window
    assert rec["sdpa"]["kernels"] == ["flash (CPU)"]  # compiled code calls the same aten kernel
    assert len(twin["eager_window_seconds"]) == len(twin["window_seconds"]) == 3
    ref = rec["reference"]
    # windows of equal samples (3 each): compiled throughput / eager is the eager median CPU time / the run's
    assert ref["compiled_vs_eager"] == pytest.approx(statistics.median(twin["eager_window_cpu_seconds"])
                                                     / statistics.median(rec["window_cpu_seconds"]))
    assert ref["compiled_slower_than_eager"] is (ref["compiled_vs_eager"] < 1)
    line = [ln for ln in proc.stdout.splitlines() if "compiled / eager twin" in ln]
    assert line and ("slower than its eager twin" in line[0]) is ref["compiled_slower_than_eager"]
    from bench.commands import report

    assert report.cmd_report(argparse.Namespace(results=str(tmp_path / "raw"), out=str(tmp_path / "rep"))) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "**7. Compile and attention**" in md
    assert f"| single (compile=True) | 1 | fp32 | {rec['compile_seconds']:,.1f} s | 0 | {g['unique_graphs']} | 0 | " in md
    slower = "the compiled run is slower than its eager twin" in md
    assert slower is ref["compiled_slower_than_eager"]
