"""Bad input refused before anything launches, in one line with exit 2 (each case once got through: issue 38), and a
failure inside a rank reported with the exception's own message."""
import pytest

from bench.launch import diagnose
from tests.conftest import cli_error

SMALL = ["--device", "cpu", "--gpus", "1", "--backends", "single"]


@pytest.mark.parametrize("args,message", [
    (["--image-size", "1"], "--image-size 1: too small for resnet18; use at least 32 (32 px: below it the network's "
                            "stride-32 stages leave a 1x1 map, not an image workload)"),
    (["--image-size", "64", "--model", "inception_v3"], "--image-size 64: too small for inception_v3; use at least 75 "
                                                        "(inception_v3's smallest input (75 px, torchvision))"),
    (["--backends", "dpp"], "--backends 'dpp': unknown backend dpp (did you mean dp or ddp?); choose from single, dp, ddp, ddp_spawn, "
                            "ddp_amp_syncbn, horovod, fsdp2, ds_zero1, ds_zero2, ds_zero3, ddp_zero, allreduce_manual"),
    (["--backends", "nothing_like_it"], "--backends 'nothing_like_it': unknown backend nothing_like_it; choose from single, dp, ddp, ddp_spawn, "
                                        "ddp_amp_syncbn, horovod, fsdp2, ds_zero1, ds_zero2, ds_zero3, ddp_zero, "
                                        "allreduce_manual"),
])
def test_bad_run_input_is_one_line(capsys, args, message):
    code, err = cli_error(capsys, "run", *SMALL, *args)
    assert (code, err) == (2, f"bench: error: {message}\n")


def test_a_folder_of_text_files_named_jpeg_is_refused_before_launching(tmp_path, capsys):
    for c in ("n01", "n02"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i in range(32):
            (tmp_path / "train" / c / f"{i}.JPEG").write_text("not an image")
    code, err = cli_error(capsys, "run", *SMALL, "--batch-size", 2, "--data", "imagenet", "--data-dir", tmp_path,
                          "--results", tmp_path / "raw")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"bench: error: no readable image among the first 3 of {tmp_path / 'train' / 'n01'} "
                          f"({tmp_path / 'train' / 'n01' / '0.JPEG'}: UnidentifiedImageError: ")
    assert err.endswith("is this an image folder?\n") and not (tmp_path / "raw").exists()


def test_one_corrupt_image_among_good_ones_is_left_to_the_loaders(tmp_path):
    from PIL import Image

    from bench.rank import data

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "0.JPEG").write_text("corrupt")
    Image.new("RGB", (8, 8)).save(tmp_path / "c" / "1.JPEG")
    data.check_decodes([(str(tmp_path / "c" / "0.JPEG"), 0), (str(tmp_path / "c" / "1.JPEG"), 0)])  # no error


def test_a_results_path_that_is_a_file_says_so(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text("{}")
    code, err = cli_error(capsys, "run", *SMALL, "--results", path)
    assert (code, err) == (2, f"bench: error: --results {str(path)!r} is a file, not a directory\n")
    code, err = cli_error(capsys, "report", "--results", path)
    assert (code, err) == (2, f"bench: error: --results {str(path)!r} is a file, not a directory\n")


TRACEBACK = """$ /venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 -m bench.rank --spec s.json
[rank0]: Traceback (most recent call last):
[rank0]:   File "/repo/bench/rank/loaders/tv.py", line 55, in __init__
[rank0]:     raise UsageError(f"no readable image in {self.root}")
[rank0]: bench.core.errors.UsageError: no readable image in /data/train
[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
"""


def test_a_failed_rank_is_reported_with_the_exception_s_message_not_its_source_line(tmp_path):
    from bench.core.config import RunConfig

    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1).validate()
    reason = diagnose.failure_reason(cfg, TRACEBACK, 1, False, 60, tmp_path / "x.log")
    assert "first error: bench.core.errors.UsageError: no readable image in /data/train;" in reason
    assert "raise UsageError" not in reason.split("last lines")[0]
    # the harness writes the failed record itself: the reason says what the ranks did not write, not "no record"
    assert reason.startswith("torchrun exit code 1 before rank 0 wrote the run's results;")
    assert diagnose._first_error("[rank0]: Segmentation fault (core dumped)\n") == "Segmentation fault (core dumped)"
    # the rank that failed first printed after the others' collapse: its cause is still the first error
    collapse_first = (TRACEBACK.splitlines()[-1] + "\n" + "\n".join(TRACEBACK.splitlines()[1:-1]) + "\n"
                      "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 13\n")
    assert diagnose._first_error(collapse_first) == "bench.core.errors.UsageError: no readable image in /data/train"
    # only the collapse: it is still said
    assert diagnose._first_error(TRACEBACK.splitlines()[-1]).startswith("RuntimeError: [../third_party/gloo")


def test_the_default_cpu_sweep_measures_dp_at_one_worker():
    from bench.plan import sweep as _plan

    configs, notes = _plan.plan(_plan.parse_run(["--device", "cpu", "--max-gpus", "2"]))
    planned = {(c.backend, c.world_size) for c in configs}
    assert ("dp", 1) in planned and ("dp", 2) not in planned and ("ddp", 2) in planned
    assert notes == ["CPU sweep: single and dp at 1 worker, the others at 2 workers only (--gpus 1,2 runs every size)"]
    # every rank of the sweep gets the same share of the cores, the baseline included
    from bench.core.devices import usable_cpus

    assert {c.threads for c in configs} == {max(1, usable_cpus() // 2)}
