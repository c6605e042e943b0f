"""The device seam (DESIGN.md, "The device seam"): every question the harness asks a GPU goes through bench/core/cuda.py
(torch.cuda's queries) or bench/core/nvml.py (NVML), and the tests answer them with a fake GPU machine
(tests/fake_gpu.py). So the GPU side runs here, on a machine with none: device discovery, the NVML names and driver in
the record's environment, the GPUs a run watches, the memory, energy and TF32 readers, and ``bench run --device cuda``
from the plan up to the rank's first CUDA kernel. A device read catches the library's own errors only, and says why
in the record."""
import ast
import json
import os
from pathlib import Path

import pytest
import torch

from bench.core import cuda, environment, nvml
from bench.launch import machine
from tests.conftest import REPO, bench_inproc, records
from tests.fake_gpu import FakeGpu, FakeGpuMachine, NVMLError_GpuIsLost

# What only the seam may ask: torch.cuda's queries of the device and its allocator, its TF32 and cuDNN switches,
# and NVML. The kernels, torch.cuda.OutOfMemoryError and torch.device objects are not questions.
TORCH_CUDA_QUERIES = {"is_available", "device_count", "get_device_name", "get_device_properties", "set_device",
                      "synchronize", "max_memory_allocated", "max_memory_reserved", "memory_allocated",
                      "memory_reserved", "reset_peak_memory_stats", "empty_cache", "mem_get_info",
                      "device_memory_used", "_get_nvml_device_index", "Event", "current_device", "nccl", "device"}
SWITCHES = {("cudnn", "allow_tf32"), ("cudnn", "benchmark"), ("cudnn", "deterministic"), ("cudnn", "version"),
            ("matmul", "allow_tf32")}
SEAM = {"bench/core/cuda.py", "bench/core/nvml.py"}
# The plain twins (bench/twins/, --reference) are the hand-written loop a user would write, importing nothing of the
# harness (tests/test_reference.py): they ask torch themselves, by design.
PLAIN = "bench/twins/"


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def device_questions(path: Path, rel: str | None = None) -> list[str]:
    """Where a module asks the device something outside the seam: ``file:line what``."""
    rel = rel or path.relative_to(REPO).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text(), rel)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] == "pynvml" for n in names):
                found.append(f"{rel}:{node.lineno} imports pynvml")
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted.startswith("torch.cuda.") and dotted.split(".")[2] in TORCH_CUDA_QUERIES:
                found.append(f"{rel}:{node.lineno} {dotted}")
            elif dotted.startswith("torch.backends.") and tuple(dotted.split(".")[-2:]) in SWITCHES:
                found.append(f"{rel}:{node.lineno} {dotted}")
    return found


def test_every_device_question_goes_through_the_seam():
    found = [hit for top in ("bench", "backends") for path in sorted((REPO / top).rglob("*.py"))
             if path.relative_to(REPO).as_posix() not in SEAM and not path.relative_to(REPO).as_posix().startswith(PLAIN)
             for hit in device_questions(path)]
    assert found == [], "ask the device through bench/core/cuda.py or bench/core/nvml.py:\n" + "\n".join(found)


def test_the_rule_finds_a_question_asked_outside_the_seam(tmp_path):
    """The scan above fails on a direct call (so the rule cannot rot into finding nothing)."""
    bad = tmp_path / "probe.py"
    bad.write_text("import torch\nimport pynvml\n\ndef f(d):\n    return torch.cuda.max_memory_allocated(d), "
                   "torch.backends.cuda.matmul.allow_tf32\n")
    assert sorted(device_questions(bad, "probe.py")) == ["probe.py:2 imports pynvml",
                                                         "probe.py:5 torch.backends.cuda.matmul.allow_tf32",
                                                         "probe.py:5 torch.cuda.max_memory_allocated"]


def test_the_fake_machine_answers_every_question_of_the_seam():
    public = {n for n, v in vars(cuda).items() if callable(v) and not n.startswith("_") and v.__module__ == cuda.__name__}
    assert public == set(FakeGpuMachine().cuda_functions())


# -- discovery and the record's environment ---------------------------------------------------------------------

def test_devices_and_the_environment_come_from_the_fake(monkeypatch):
    from bench.core.devices import detect_device

    FakeGpuMachine([FakeGpu("NVIDIA H200"), FakeGpu("NVIDIA H100 80GB HBM3")], visible=[1, 0]).install(monkeypatch)
    assert detect_device("auto") == ("cuda", 2) and detect_device("cuda") == ("cuda", 2)
    # CUDA order, not NVML's: CUDA_VISIBLE_DEVICES=1,0
    assert environment.nvml_gpus() == {"count": 2, "names": ["NVIDIA H100 80GB HBM3", "NVIDIA H200"],
                                       "driver": "580.159.04"}
    env = environment.collect_env()
    assert (env["gpu_count"], env["gpu_names"], env["driver"], env["nvml"]) == (
        2, ["NVIDIA H100 80GB HBM3", "NVIDIA H200"], "580.159.04", "ok")
    assert (env["cuda"], env["nccl"], env["cudnn"], env["cuda_available"]) == ("13.0", "2.27.7", 91300, True)


OLD_DRIVER = ("NVML sees 8 GPUs (driver 535.104.05, which runs CUDA up to 12.2), but torch {torch} was built for CUDA "
              "13.2, which this driver is too old for: run `make bench TORCH=system` with a torch built for CUDA 12.2 "
              "or older, or update the driver; or pass --device cpu to measure the CPU on purpose")


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_gpus_torch_cannot_use_are_refused_in_one_line_not_measured_as_a_cpu(monkeypatch, capsys, device):
    """A node whose driver is older than the CUDA the locked torch was built for: torch.cuda.is_available() is False
    while NVML sees the GPUs. ``auto`` quietly picked the CPU, and ``make bench GPUS=8`` wrote a gloo CPU report;
    now bench run exits 2 with one line naming the driver, torch's CUDA and the way out. --device cpu still runs."""
    import torch

    from bench.plan import sweep as _plan
    from tests.conftest import cli_error

    FakeGpuMachine([FakeGpu() for _ in range(8)], driver="535.104.05", driver_cuda="12.2", torch_sees=False,
                   versions={"cuda": "13.2", "nccl": "2.27.7", "cudnn": 91300}).install(monkeypatch)
    code, err = cli_error(capsys, "run", "--device", device, "--backends", "ddp")
    assert code == 2
    assert err == f"bench: error: --device {device}: {OLD_DRIVER.format(torch=torch.__version__)}\n"
    assert _plan.detect_device("cpu")[0] == "cpu"  # measuring the CPU on purpose stays possible


@pytest.mark.parametrize("machine,why", [
    (dict(versions={"cuda": None, "nccl": None, "cudnn": None}),
     "NVML sees 2 GPUs (driver 580.159.04, which runs CUDA up to 13.0), but torch {torch} is a CPU build: install a "
     "CUDA build (`make bench` installs the lock's) or keep one you have with `make bench TORCH=system`"),
    (dict(driver_cuda="13.2"),
     "NVML sees 2 GPUs (driver 580.159.04, which runs CUDA up to 13.2), but torch {torch} (CUDA 13.0) cannot use them "
     "(torch.cuda.is_available() is False): check that this process can open the GPUs (nvidia-smi; a container's "
     "--gpus)"),
    (dict(env=""), "NVML sees 2 GPUs (driver 580.159.04, which runs CUDA up to 13.0), but CUDA_VISIBLE_DEVICES='' "
                   "hides them all from torch: unset it"),
    (dict(nvml="missing"), None),  # a machine without NVIDIA GPUs: the CPU, as before
    (dict(gpus=[]), None),
])
def test_why_torch_cannot_use_the_gpus_nvml_sees(monkeypatch, machine, why):
    import torch

    from bench.core.devices import unusable_gpus

    env = machine.pop("env", None)
    if env is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    FakeGpuMachine(torch_sees=False, **machine).install(monkeypatch)
    assert unusable_gpus() == (why and why.format(torch=torch.__version__))


def test_without_nvml_the_environment_says_why(monkeypatch):
    FakeGpuMachine(nvml="missing").install(monkeypatch)
    env = environment.collect_env()
    assert env["gpu_count"] == 0 and env["gpu_names"] == [] and env["driver"] is None
    assert env["nvml"] == "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"


def test_a_failing_nvml_query_is_the_library_s_reason_not_a_crash(monkeypatch):
    FakeGpuMachine(nvml="nvmlSystemGetDriverVersion", fail_with=NVMLError_GpuIsLost).install(monkeypatch)
    assert environment.nvml_gpus() == {"error": "NVML driver version: NVMLError_GpuIsLost: GPU is lost"}


def test_an_error_of_our_own_is_not_swallowed_as_a_missing_nvml(monkeypatch):
    """Only NVML's own errors become reasons: a mistake in the code (here a query the library lacks) stays an error."""
    fake = FakeGpuMachine().install(monkeypatch)
    lib = fake.pynvml()
    del lib.nvmlDeviceGetName
    monkeypatch.setitem(__import__("sys").modules, "pynvml", lib)
    with pytest.raises(AttributeError):
        environment.nvml_gpus()


def test_the_gpus_a_run_watches_follow_cuda_visible_devices(monkeypatch):
    FakeGpuMachine([FakeGpu() for _ in range(4)], visible=[2, 3]).install(monkeypatch)
    assert machine.run_gpus("cuda", 2) == [2, 3] and machine.run_gpus("cuda", 1) == [2]
    assert machine.run_gpus("cpu", 2) == [] and machine.run_gpus("cuda", 0) == []


def test_without_nvml_a_run_still_watches_its_cuda_devices_and_says_why_it_read_nothing(monkeypatch):
    FakeGpuMachine(nvml="missing").install(monkeypatch)
    gpus = machine.run_gpus("cuda", 2)
    assert gpus == [0, 1]
    with machine.Watch("cuda", gpus, interval=0.05) as watch:
        pass
    m = watch.summary()
    assert m["gpus"] == [] and m["nvml"].startswith("NVML unavailable: NVMLError_LibraryNotFound")


# -- the rank's readers ------------------------------------------------------------------------------------------

class OneRank:
    """What the readers ask of a backend: its rank and the devices it drives."""

    def __init__(self, *indices, rank=0):
        self.rank, self._devices = rank, [torch.device("cuda", i) for i in indices]

    def devices(self):
        return self._devices


def test_memory_is_read_from_the_allocator_and_nvml_of_each_device(monkeypatch):
    from bench.rank.memory import memory_stats, reset_peaks

    GiB = 2 ** 30
    fake = FakeGpuMachine([FakeGpu(used_bytes=5 * GiB), FakeGpu("NVIDIA H200", used_bytes=7 * GiB,
                                                                peak_allocated=2 * GiB, peak_reserved=6 * GiB)],
                          visible=[1, 0]).install(monkeypatch)
    got = memory_stats(OneRank(0, 1, rank=3))
    assert got == [
        {"rank": 3, "device_index": 0, "device_name": "NVIDIA H200", "peak_allocated_bytes": 2 * GiB,
         "peak_reserved_bytes": 6 * GiB, "nvml_used_bytes": 7 * GiB, "nvml_used_reason": None},
        {"rank": 3, "device_index": 1, "device_name": "NVIDIA H100 80GB HBM3", "peak_allocated_bytes": 3 * GiB,
         "peak_reserved_bytes": 4 * GiB, "nvml_used_bytes": 5 * GiB, "nvml_used_reason": None}]
    reset_peaks(OneRank(0))
    assert [args for args in fake.called("reset_peaks")] == [(torch.device("cuda", 0),)]
    assert memory_stats(OneRank(0))[0]["peak_allocated_bytes"] == 0
    assert memory_stats(OneRank()) == []  # a CPU rank: nothing


def test_memory_at_four_gpus_is_reported_per_gpu_on_three_figures_and_the_verdict_says_which_it_reads(
        monkeypatch, tmp_path, capsys):
    """nn.DataParallel on 4 GPUs, read through the seam as a rank reads it: GPU 0 holds the gathered outputs and the
    reduced gradients (allocated), every GPU its allocator's slack (reserved) and its CUDA context and NCCL's buffers
    (NVML's used bytes, which going from 1 to N GPUs adds). The report gives the three side by side per GPU, an
    imbalance on each, and the verdict reads allocated's, saying so."""
    from bench.report.summary import summarise, usable_records
    from bench.rank.memory import memory_stats
    from tests.test_report import run_report, runs, write

    GiB = 2 ** 30
    figures = [(16, 20, 23), (8, 14, 17), (8, 10, 13), (8, 12, 15)]  # allocated, reserved, NVML used: GiB per GPU
    FakeGpuMachine([FakeGpu(peak_allocated=a * GiB, peak_reserved=r * GiB, used_bytes=u * GiB)
                    for a, r, u in figures]).install(monkeypatch)
    memory = memory_stats(OneRank(0, 1, 2, 3))
    assert [(m["peak_allocated_bytes"], m["peak_reserved_bytes"], m["nvml_used_bytes"]) for m in memory] == [
        (a * GiB, r * GiB, u * GiB) for a, r, u in figures]
    dp = runs("dp", 4, 235.0, 240.0, 245.0)
    for rec in dp:
        rec["memory"] = memory
    raw = write(tmp_path, *runs("single", 1, 98.0, 100.0, 102.0), *runs("ddp", 4, 355.0, 360.0, 365.0), *dp)
    assert run_report(raw, tmp_path / "rep", capsys)[0] == 0
    [row] = [r for r in summarise(usable_records(raw, print)).to_dict("records") if r["backend"] == "dp"]
    assert row["memory_imbalance"] == pytest.approx(16 / 10)  # allocated: what the verdict reads
    assert row["memory_imbalance_reserved"] == pytest.approx(20 / 14)
    assert row["memory_imbalance_nvml"] == pytest.approx(23 / 17)
    assert row["nvml_used_max_gib"] == pytest.approx(23.0)
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert ("| dp | 4 | " in md and " | 0: 16.00 / 20.00 / 23.00 · 1: 8.00 / 14.00 / 17.00 · 2: 8.00 / 10.00 / 13.00 · "
            "3: 8.00 / 12.00 / 15.00 GiB | 1.60 × | 1.43 × | 1.35 × | +8.00 GiB |") in md
    assert "the verdict reads the imbalance of peak allocated" in md
    assert "- dp: 33% slower (CI 31–36%), GPU 0 holds 2.0× the peak allocated memory of the others" in md


def test_memory_without_nvml_keeps_the_allocator_s_figures_and_says_why(monkeypatch):
    from bench.rank.memory import memory_stats

    FakeGpuMachine(nvml="nvmlDeviceGetMemoryInfo").install(monkeypatch)
    [m] = memory_stats(OneRank(1))
    assert m["peak_reserved_bytes"] > 0 and m["nvml_used_bytes"] is None
    assert m["nvml_used_reason"] == "NVML memory info: NVMLError_NotSupported: Not Supported"


def test_energy_is_read_per_gpu_through_its_nvml_index(monkeypatch):
    from bench.rank.energy import EnergyMeter, window_energy

    FakeGpuMachine([FakeGpu(energy_joules=10.0, watts=0.0), FakeGpu(energy_joules=99.0, watts=0.0)],
                   visible=[1, 0]).install(monkeypatch)
    meter = EnergyMeter([torch.device("cuda", 0)])
    assert meter.reason is None and meter.read() == [99.0]  # CUDA device 0 is NVML's GPU 1
    two = EnergyMeter([torch.device("cuda", 0), torch.device("cuda", 1)])
    assert two.read() == [99.0, 10.0] and window_energy([1.0, 2.0], two.read()) == 106.0
    assert EnergyMeter([torch.device("cpu")]).reason == "no GPU"


@pytest.mark.parametrize("nvml_mode,gpu,reason", [
    ("missing", FakeGpu(), "NVML energy counter unavailable: NVML unavailable: NVMLError_LibraryNotFound: NVML "
                           "Shared Library Not Found"),
    ("ok", FakeGpu(energy_counter=False), "NVML energy counter unavailable: NVML energy counter: "
                                          "NVMLError_NotSupported: Not Supported"),
])
def test_energy_that_cannot_be_read_says_why_in_the_record_field(monkeypatch, nvml_mode, gpu, reason):
    from bench.rank.energy import EnergyMeter

    FakeGpuMachine([gpu], nvml=nvml_mode).install(monkeypatch)
    meter = EnergyMeter([torch.device("cuda", 0)])
    assert meter.reason == reason and meter.read() is None


def test_energy_of_a_device_cuda_cannot_map_to_nvml_says_why(monkeypatch):
    from bench.rank.energy import EnergyMeter

    FakeGpuMachine([FakeGpu()]).install(monkeypatch)
    meter = EnergyMeter([torch.device("cuda", 3)])
    assert meter.reason == ("NVML energy counter unavailable: device 3 is not visible (CUDA_VISIBLE_DEVICES=[0])")


def test_the_tf32_switch_and_the_device_name_for_the_peak(monkeypatch):
    from bench.core.config import RunConfig
    from bench.rank import peak
    from bench.rank.record import flops_fields, tf32_applies

    fake = FakeGpuMachine([FakeGpu("NVIDIA H100 80GB HBM3")]).install(monkeypatch)
    with peak.tf32_mode("cuda", "fp32", True):
        assert fake.tf32["matmul"] is True
    assert fake.tf32["matmul"] is False  # restored
    with peak.tf32_mode("cuda", "bf16", True):  # only fp32 matmuls have a TF32 mode
        assert fake.tf32["matmul"] is False
    assert peak.device_name(torch.device("cuda", 0), {}) == "NVIDIA H100 80GB HBM3"
    common = dict(backend="single", launcher="inproc", world_size=1, device_type="cuda", image_size=32,
                  batch_size=2, warmup=2, steps=1, windows=1, precision="fp32")
    vision = RunConfig(model="resnet18", **common).validate()
    gpt = RunConfig(model="gpt-tiny", **common).validate()
    assert tf32_applies(vision) is True and tf32_applies(gpt) is False  # cuDNN's flag, the matmul flag
    memory = [{"device_name": "NVIDIA H100 80GB HBM3"}]
    assert flops_fields(vision, memory, 100.0)["tf32"] == {"cudnn": True, "matmul": False}


# -- bench run --device cuda, the parent side ---------------------------------------------------------------------

@pytest.mark.slow
def test_bench_run_on_cuda_plans_watches_and_launches_up_to_the_first_cuda_kernel(monkeypatch, tmp_path):
    """The harness's half of a CUDA run on a fake machine of 2 H100s: the plan, the GPUs it watches (NVML sampled
    during the run), torchrun's command and environment, the record's environment from NVML. The ranks are real and
    stop at their first CUDA call (no driver here); before the device seam's fix, the harness itself stopped at an
    ImportError in machine.run_gpus before launching anything."""
    from bench.launch import run as launch_run

    FakeGpuMachine().install(monkeypatch)
    launched, watched = [], []
    real_group, real_watch = launch_run.run_group, machine.Watch

    def run_group(cmd, env, log_path, timeout):
        launched.append((cmd, {k: env[k] for k in ("OMP_NUM_THREADS", "PYTHONPATH")}))
        return real_group(cmd, env, log_path, timeout)

    class Watch(real_watch):
        def __exit__(self, *exc):
            watched.append(self)
            return super().__exit__(*exc)

    monkeypatch.setattr(launch_run, "run_group", run_group)
    monkeypatch.setattr(machine, "Watch", Watch)
    raw = tmp_path / "raw"
    proc = bench_inproc("run", "--device", "cuda", "--backends", "ddp", "--gpus", "2", "--model", "resnet18",
                        "--image-size", "32", "--batch-size", "2", "--warmup", "2", "--steps", "1", "--windows", "2",
                        "--repeat", "1", "--results", raw, "--timeout", "300", "--no-bind")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the run failed in its ranks, not in the harness
    [(cmd, env)] = launched
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5:8] == ["-m", "bench.rank", "--spec"] and cmd[0] == __import__("sys").executable
    assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    [watch] = watched
    assert watch.gpus.indices == [0, 1] and watch.gpus.reason is None
    assert watch.samples and [g["sm_mhz"] for g in watch.samples[-1]["gpus"]] == [1980, 1980]
    assert watch.summary()["nvml"] == "ok"
    [rec] = records(raw)
    assert rec["status"] == "failed" and rec["device_type"] == "cuda" and rec["world_size"] == 2
    assert "Found no NVIDIA driver" in rec["reason"], rec["reason"]  # the rank's first CUDA call, on this machine
    assert (rec["env"]["gpu_names"], rec["env"]["driver"], rec["env"]["nvml"]) == (
        ["NVIDIA H100 80GB HBM3"] * 2, "580.159.04", "ok")
    spec = json.loads((raw / "logs" / f"{rec['run_id']}.spec.json").read_text())
    assert spec["config"]["device_type"] == "cuda" and spec["env"]["gpu_count"] == 2
    assert spec["bind_cpus"] is False  # --no-bind reaches the ranks (bench/rank/affinity.py)


# -- each rank bound to the CPUs near its GPU (bench/rank/affinity.py) ----------------------------------------------

@pytest.fixture
def two_numa_nodes(monkeypatch):
    """4 fake GPUs on a machine of 2 NUMA nodes (GPUs 0-1 near CPUs 0-7, GPUs 2-3 near CPUs 8-15), this process allowed
    CPUs 2-15; the binding is noted per thread instead of applied to the test's own process."""
    from bench.rank import affinity

    near = [list(range(8))] * 2 + [list(range(8, 16))] * 2
    FakeGpuMachine([FakeGpu(cpus=c) for c in near]).install(monkeypatch)
    monkeypatch.setattr(affinity, "numa_nodes", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2, 16)))
    bound = {}
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: bound.__setitem__(tid, set(cpus)))
    return bound


def test_each_rank_is_bound_to_the_cpus_near_its_gpu_on_two_numa_nodes(two_numa_nodes):
    from bench.rank.affinity import bind

    tids = {int(t) for t in os.listdir("/proc/self/task")}
    assert bind([torch.device("cuda", 3)]) == {"cpus": "8-15", "reason": None}
    assert set(two_numa_nodes) >= tids and two_numa_nodes[min(tids)] == set(range(8, 16))  # every thread, not one
    two_numa_nodes.clear()
    assert bind([torch.device("cuda", 0)]) == {"cpus": "2-7", "reason": None}  # within the CPUs it may use
    # DataParallel's one process drives every GPU: the CPUs near any of them
    assert bind([torch.device("cuda", i) for i in range(4)]) == {"cpus": "2-15", "reason": None}
    two_numa_nodes.clear()
    assert bind([torch.device("cuda", 2)], enabled=False) == {"cpus": None, "reason": "--no-bind"}
    assert bind([torch.device("cpu")]) == {"cpus": None, "reason": "no GPU"}
    assert two_numa_nodes == {}


def test_a_bound_rank_runs_its_share_of_the_cpus_it_is_bound_to(two_numa_nodes):
    """The launcher shares the cores over the ranks as if they spread over every CPU (14 allowed here); bound to its
    GPU's NUMA node, a rank runs at most its share of that node's CPUs, shared with the ranks whose GPUs sit there.
    Before: single@1 ran 14 threads on the 6 CPUs it was bound to, and two ranks on GPUs 0 and 1 ran 7 each there."""
    from bench.rank.affinity import bind, bound_threads

    gpu = [torch.device("cuda", i) for i in range(4)]
    assert bind(gpu[:1])["cpus"] == "2-7"
    assert bound_threads(14, "2-7", gpu[:1], local_ranks=1) == 6  # single@1: the node's 6 CPUs
    assert bound_threads(7, "2-7", gpu[:1], local_ranks=2) == 3  # GPUs 0 and 1 share that node
    assert bound_threads(3, "8-15", gpu[2:3], local_ranks=4) == 3  # 4 ranks, 2 a node: 8 // 2 = 4, the launcher's 3
    assert bound_threads(14, "2-15", gpu, local_ranks=1) == 14  # DataParallel: one process near every GPU
    assert bound_threads(3, "2-7", gpu[:1], local_ranks=4, per_gpu=2) == 1  # --ranks-per-gpu 2: 4 ranks on GPUs 0-1
    assert bound_threads(14, None, gpu[:1], local_ranks=1) == 14  # not bound: the launcher's share stands


def test_a_rank_of_a_cuda_run_is_bound_and_runs_that_many_threads_and_says_so(two_numa_nodes, monkeypatch):
    """What bench/rank/train.py calls after set-up: rank 1 of ddp at 2 GPUs (GPUs 0 and 1, one node) is bound to
    CPUs 2-7 and runs 3 threads, which its spec (and so its record's threads_per_rank) says; with --no-bind, the
    launcher's 7."""
    from bench.core.config import RunConfig
    from bench.rank import affinity

    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cuda", model="resnet50", image_size=224,
                    batch_size=64, warmup=2, steps=2, windows=2)
    spec = {"threads_per_rank": 7}
    assert affinity.bind_rank(spec, cfg, [torch.device("cuda", 1)]) == {"cpus": "2-7", "reason": None}
    assert (set_to, spec["threads_per_rank"]) == ([3], 3)
    spec = {"threads_per_rank": 7, "bind_cpus": False}
    assert affinity.bind_rank(spec, cfg, [torch.device("cuda", 1)]) == {"cpus": None, "reason": "--no-bind"}
    assert (set_to, spec["threads_per_rank"]) == ([3], 7)


def test_no_binding_on_one_numa_node_or_without_nvml_and_the_record_says_why(two_numa_nodes, monkeypatch):
    from bench.rank import affinity

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert affinity.bind([torch.device("cuda", 2)]) == {
        "cpus": None, "reason": "the CPUs near GPU 2 (8-15) are outside this process's (0-1)"}
    monkeypatch.setattr(affinity, "numa_nodes", lambda: 1)
    assert affinity.bind([torch.device("cuda", 2)]) == {"cpus": None,
                                                        "reason": "one NUMA node: every CPU is as near as any other"}
    monkeypatch.setattr(affinity, "numa_nodes", lambda: 2)
    FakeGpuMachine(nvml="missing").install(monkeypatch)
    assert affinity.bind([torch.device("cuda", 0)]) == {
        "cpus": None, "reason": "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"}
    assert two_numa_nodes == {}
    assert affinity.cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


# -- make coverage: which missed lines only a GPU runs (scripts/gpu_only_lines.py) ----------------------------------

def test_the_gpu_only_lines_are_the_cuda_branches_and_the_seam():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_only_lines", REPO / "scripts" / "gpu_only_lines.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    source = (
        "def f(devices, cfg):\n"                    # 1
        "    for d in devices:\n"                     # 2
        "        if d.type != 'cuda':\n"              # 3
        "            continue\n"                      # 4  CPU: leaves
        "        cuda.synchronize(d)\n"               # 5  GPU-only (after the guard)
        "    if cfg.device_type == 'cuda':\n"         # 6
        "        x = 1\n"                             # 7  GPU-only
        "    else:\n"                                 # 8
        "        x = 2\n"                             # 9  CPU
        "    if not cuda.available():\n"              # 10
        "        raise ValueError('none')\n"          # 11 CPU
        "    y = cuda.name(0)\n"                      # 12 GPU-only (after the guard; a device call too)
        "    return error_path(x, y)\n")              # 13 GPU-only (after the guard)
    missed = set(range(1, 14))
    got = tool.classify("bench/x.py", source, missed)
    assert got["call"] == [5, 12] and got["logic"] == [7, 13] and got["seam"] == []  # 5, 12: one device call alone
    assert got["other"] == [1, 2, 3, 4, 6, 8, 9, 10, 11]
    assert tool.classify("bench/core/cuda.py", source, {5, 7}) == {"seam": [5, 7], "call": [], "logic": [], "other": []}
    guards = (
        "def g(device_type, n, per_gpu):\n"          # 1
        "    if per_gpu > 1 and device_type != 'cuda':\n"  # 2
        "        raise ValueError('cpu')\n"           # 3
        "    x = plan(n)\n"                           # 4  either device: 'and' leaves on a CPU only with per_gpu > 1
        "    if device_type != 'cuda' or n < 1:\n"    # 5
        "        return []\n"                         # 6
        "    return x\n")                             # 7  GPU-only: 'or' left for every CPU run
    assert tool.classify("bench/y.py", guards, set(range(1, 8)))["logic"] == [7]
    switches = ("def h(cfg, device):\n"
                "    if cfg.device_type == 'cuda':\n"
                "        torch.backends.cudnn.benchmark = bool(cfg.cudnn_benchmark)\n"   # 3 a library switch
                "        dist.init_process_group('nccl', device_id=device)\n"         # 4 a library call
                "        return torch.device('cuda', 0)\n")                            # 5 logic
    got = tool.classify("bench/twins/z.py", switches, {3, 4, 5})
    assert (got["call"], got["logic"]) == ([3, 4], [5])


@pytest.mark.slow
def test_each_launcher_s_command_and_environment_on_a_cuda_machine(monkeypatch, tmp_path):
    """Every launcher's command line and environment for CUDA runs on 2 fake GPUs, the process trees not started:
    in process (single, dp), torchrun (ddp), mp.spawn (ddp_spawn). (horovodrun's on CUDA needs a build with NCCL
    operations, which a CPU machine's is not: its run is skipped before launch, with that reason.)"""
    import sys

    from bench.launch import run as launch_run

    FakeGpuMachine().install(monkeypatch)
    launched = {}

    def run_group(cmd, env, log_path, timeout):
        name = Path(log_path).name.split("-")[1]
        launched.setdefault(name, []).append((cmd, env))
        return 1, False  # exit 1, not timed out: the record says failed

    monkeypatch.setattr(launch_run, "run_group", run_group)
    names = ["single", "dp", "ddp", "ddp_spawn"]
    proc = bench_inproc("run", "--device", "cuda", "--backends", ",".join(names), "--gpus", "1,2", "--model",
                        "resnet18", "--image-size", "32", "--batch-size", "2", "--warmup", "2", "--steps", "1",
                        "--windows", "1", "--repeat", "1", "--results", tmp_path / "raw")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    py = sys.executable
    expected = {
        # single at 1 GPU: channels_last (the GPU default), and NCHW with cudnn.benchmark on and off: the baselines of
        # dp's runs, which cannot honour the layout, and of its labelled variant
        "single": [[py, "-m", "bench.rank", "--spec"]] * 3,
        "dp": [[py, "-m", "bench.rank", "--spec"]] * 4,  # 1 GPU; 2 GPUs with cudnn.benchmark on and off; 1 GPU off
        "ddp": [[py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m", "bench.rank",
                 "--spec"] for n in (1, 2)],
        "ddp_spawn": [[py, "-m", "bench.rank", "--spec"]] * 2,
    }
    assert {k: [cmd[:cmd.index("--spec") + 1] for cmd, _ in v] for k, v in launched.items()} == expected
    for name, calls in launched.items():
        for cmd, env in calls:
            spec = json.loads(Path(cmd[cmd.index("--spec") + 1]).read_text())
            assert spec["config"]["device_type"] == "cuda" and spec["env"]["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 2
            assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO) and env["BENCH_RUN_ID"] == spec["run_id"]
            ranks = 1 if spec["config"]["launcher"] == "inproc" else spec["config"]["world_size"]
            assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // ranks)), name
        if name == "ddp_spawn":
            assert [cmd[-1] for cmd, _ in calls] == ["1", "2"]  # --spawn N
    assert {r["status"] for r in records(tmp_path / "raw")} == {"failed"}


# -- the rest of the GPU branches, on the fake machine (make coverage listed them as GPU-only) ----------------------

def test_a_collectives_rank_takes_its_gpu_and_half_its_free_memory(monkeypatch):
    from bench.core.config import RunConfig
    from bench.rank import collectives

    GiB = 2 ** 30
    fake = FakeGpuMachine([FakeGpu(memory_bytes=80 * GiB, used_bytes=2 * GiB), FakeGpu()]).install(monkeypatch)
    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cuda", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1).validate()
    assert collectives._device(cfg, 1) == torch.device("cuda", 1) and fake.called("set_device") == [(1,)]
    assert collectives._free_bytes(torch.device("cuda", 0)) == 39 * GiB  # half of what NVML's machine has free


def test_a_traced_cuda_rank_asks_the_profiler_for_cuda_activity(monkeypatch, tmp_path):
    import torch.profiler

    from bench.rank import trace

    FakeGpuMachine().install(monkeypatch)
    asked, real = [], torch.profiler.profile

    def profile(activities, **kw):
        asked.append(list(activities))
        return real(activities=[torch.profiler.ProfilerActivity.CPU], **kw)  # no CUDA here to record

    class Rank:
        rank, phase_marker = 0, None

        def devices(self):
            return [torch.device("cuda", 0)]

        def train(self, steps):
            torch.ones(8).sum()

    monkeypatch.setattr(torch.profiler, "profile", profile)
    got = trace.capture(Rank(), 1, lambda: None, tmp_path / "t.trace.json.gz")
    assert asked == [[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]]
    assert got["steps"] == 1 and got["file"] and got["gpu"] is None  # no kernels recorded: no GPU analysis


def test_bench_loader_refuses_more_ranks_than_gpus(monkeypatch, capsys, tmp_path):
    from tests.conftest import cli_error

    FakeGpuMachine().install(monkeypatch)
    code, err = cli_error(capsys, "loader", "--data-dir", tmp_path, "--gpus", "3")
    assert (code, err) == (2, "bench: error: --gpus 3: this machine has 2 CUDA device(s)\n")


def test_the_seam_s_own_lines_that_a_cpu_can_run_run_for_real(monkeypatch):
    """Not the fake: torch's CUDA_VISIBLE_DEVICES mapping (by index; no driver needed), the TF32 and cuDNN switches,
    and the fallback when torch cannot map a device."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert cuda.nvml_index(0) == 3 and cuda.nvml_index(torch.device("cuda", 1)) == 1
    monkeypatch.delattr(torch.cuda, "_get_nvml_device_index")
    with pytest.raises(RuntimeError, match=r"has no torch\.cuda\._get_nvml_device_index"):
        cuda.nvml_index(0)
    monkeypatch.setattr(cuda, "count", lambda: 2)
    assert environment.visible_nvml_indices(4) == [0, 1, 2, 3]  # unmapped: NVML's own order, all of them
    was = torch.backends.cuda.matmul.allow_tf32
    try:
        assert cuda.set_matmul_tf32(not was) is was and torch.backends.cuda.matmul.allow_tf32 is (not was)
        assert cuda.tf32()["matmul"] is (not was)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    bench_was, det_was = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        cuda.set_cudnn(benchmark=True, deterministic=True)
        assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == (True, True)
        cuda.set_cudnn(False)
        assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == (False, True)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = bench_was, det_was


def test_the_seam_s_error_paths_say_why(monkeypatch):
    import sys

    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (_ for _ in ()).throw(RuntimeError("no NCCL bindings")))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert cuda.versions()["nccl"] is None and cuda.versions()["cuda"] == "13.0"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: the import fails
    with pytest.raises(nvml.Unavailable, match=r"^NVML unavailable: nvidia-ml-py is not installed"):
        nvml.open()
    fake = FakeGpuMachine(nvml="nvmlShutdown").install(monkeypatch)
    with nvml.open() as n:
        assert n.count() == 2
    assert fake.inits == 1  # its shutdown refused, and nothing raised: an NVML going away has nothing to release
