"""Time to accuracy (``bench run --to-accuracy``, issue 40): the learnable task, bad input, the report's section and
verdicts (and the section in headless Chromium), and the gate, on records made here with known values; then one real
sweep at 2 gloo ranks (ddp, ddp_spawn, allreduce_manual at one global batch) and one short single run that misses its
target, shared by every slow assertion: stopping at the target, the same epochs and curve across the DDP family,
the schedule in the record and in the optimizer that stepped, "not reached", and the report of those records.
The schedule's own values are in tests/test_schedule.py."""
import argparse
import itertools
import json
import shutil

import pytest
import torch

from bench.commands import report
from bench.core import results
from bench.core.schedule import Schedule, scaled_lr
from bench.rank import learnable
from tests import chromium
from tests.conftest import REQUIRE_OPTIONAL, bench_inproc, cli_error, optional_problem, records

GiB = 2 ** 30
_ids = itertools.count()


# --- the learnable task -----------------------------------------------------------------------------------------

def test_the_learnable_task_is_deterministic_balanced_and_its_held_out_set_a_disjoint_draw():
    a, b = learnable.Task(16), learnable.Task(16)
    x, y = a.train_set(256)
    x2, y2 = b.train_set(256)
    assert torch.equal(a.prototypes, b.prototypes) and torch.equal(x, x2) and torch.equal(y, y2)  # from the seed
    assert not torch.equal(learnable.Task(16, seed=1).prototypes, a.prototypes)
    assert x.shape == (256, 3, 16, 16) and torch.bincount(y, minlength=10).tolist() == [26] * 6 + [25] * 4
    xe, ye = a.held_out(300)
    # no held-out sample is a training sample, even for a training set of the same size (another generator)
    assert torch.cdist(xe.flatten(1), x.flatten(1)).min() > 1.0
    assert torch.cdist(xe.flatten(1), a.train_set(300)[0].flatten(1)).min() > 1.0
    # the prototypes carry the signal at 0.25 sd per pixel; the noise is 1
    assert a.prototypes.flatten(1).std(1).tolist() == pytest.approx([learnable.SIGNAL] * 10, rel=1e-5)
    assert (xe - a.prototypes[ye]).std().item() == pytest.approx(1.0, abs=0.01)
    # the nearest pattern (the Bayes classifier) is right on every held-out sample; a wrong labelling scores chance
    assert a.reachable(xe, ye) == 1.0 and a.reachable(xe, (ye + 1) % 10) == 0.0


def test_epochs_give_each_rank_its_share_and_one_process_the_ranks_shares_in_order():
    x, y = torch.arange(64.).view(64, 1), torch.arange(64)
    share = [learnable.Epochs(x, y, 4, 2, r, seed=0, device="cpu") for r in (0, 1)]
    whole = learnable.Epochs(x, y, 4, 2, None, seed=0, device="cpu")
    assert share[0].steps == whole.steps == 8
    for e in (0, 1):
        got = [list(share[r].epoch(e)) for r in (0, 1)]
        both = list(whole.epoch(e))
        for k in range(8):  # single and dp get rank 0's share then rank 1's: what DataParallel's scatter hands out
            assert torch.equal(both[k][1], torch.cat([got[0][k][1], got[1][k][1]]))
        seen = torch.cat([t for _, t in both])
        assert sorted(seen.tolist()) == list(range(64))  # every sample once per epoch
    assert [t.tolist() for _, t in whole.epoch(0)] != [t.tolist() for _, t in whole.epoch(1)]  # reshuffled


def test_the_rate_goes_into_the_param_groups_that_step_inside_a_wrapper():
    """DeepSpeed's ZeRO optimizers promote the wrapped optimizer's param groups as a property; Backend.set_lr writes
    through it and stepped_settings reads the inner optimizer (the real DeepSpeed: the slow sweep's records)."""
    from backends.base import Backend

    class ZeroLike:  # the shape of deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer
        def __init__(self, optimizer):
            self.optimizer = optimizer

        param_groups = property(lambda self: self.optimizer.param_groups)

    backend = Backend("single", "inproc")
    inner = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.01, momentum=0.9, weight_decay=1e-4)
    backend.optimizer = ZeroLike(inner)
    backend.set_lr(0.125)
    backend.set_optimizer_settings(momentum=0.5, weight_decay=0.0)
    assert inner.param_groups[0]["lr"] == 0.125
    assert backend.stepped_settings() == {"optimizer": "SGD", "lr": 0.125, "momentum": 0.5, "betas": None,
                                          "weight_decay": 0.0}
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=6e-4, betas=(0.9, 0.95))
    backend.optimizer = adamw
    backend.set_optimizer_settings(momentum=0.8)
    assert backend.stepped_settings()["betas"] == [0.8, 0.95]


# --- bad input: one line, exit 2, nothing launched -----------------------------------------------------------------

SMALL = ["run", "--device", "cpu", "--gpus", "1", "--backends", "single"]
LEARN = [*SMALL, "--data", "learnable", "--to-accuracy", "0.9"]


@pytest.mark.parametrize("args, message", [
    ([*SMALL, "--data", "learnable", "--to-accuracy", "90"],
     "--to-accuracy 90: the held-out top-1 to reach, as a fraction: 0 < A <= 1 (0.9 = 90%)"),
    ([*SMALL, "--to-accuracy", "0.9"],
     "--to-accuracy needs data a model can learn: --data learnable (a synthetic task) or --data imagenet --data-dir "
     "DIR; --data synthetic is one fixed batch with random labels"),
    ([*SMALL, "--max-epochs", "3", "--lr-scaling", "sqrt"], "--max-epochs, --lr-scaling are for --to-accuracy A"),
    ([*SMALL, "--data", "learnable"], "--data learnable is --to-accuracy's task (a model can learn it); a timed run "
                                      "uses --data synthetic or imagenet"),
    ([*LEARN, "--lr-scaling", "linear,cubic"], "--lr-scaling 'linear,cubic': choose from linear, sqrt, none (or "
                                               "several, comma-separated)"),
    ([*LEARN, "--lr-decay", "exp"], "--lr-decay 'exp': choose from cosine, step, none"),
    ([*LEARN, "--warmup-epochs", "5", "--max-epochs", "5"], "--warmup-epochs 5: from 0 to below --max-epochs (5)"),
    ([*LEARN, "--momentum", "1"], "--momentum 1: from 0 to below 1"),
    ([*LEARN, "--trace"], "--to-accuracy trains to a target in epochs; it cannot go with --trace"),
    ([*LEARN, "--model", "gpt-micro"], "--to-accuracy trains an image classifier to a top-1 target; gpt-micro is not "
                                       "one (a torchvision model or cnn-tiny)"),
    ([*LEARN, "--train-samples", "10", "--batch-size", "16"], "--train-samples 10: not one step of 16 samples "
                                                              "(single x1); give more samples or a smaller batch"),
    ([*LEARN, "--image-size", "4"], "--image-size 4: too small for cnn-tiny; use at least 8 (its two stride-2 stages "
                                    "leave a 2x2 map)"),
])
def test_bad_to_accuracy_input_is_one_line(capsys, tmp_path, args, message):
    code, err = cli_error(capsys, *args, "--results", tmp_path / "raw")
    assert (code, err) == (2, f"bench: error: {message}\n")
    assert not (tmp_path / "raw").exists() or not list((tmp_path / "raw").rglob("*.json"))


def test_rules_that_give_the_same_rate_are_one_run_labelled_with_each(tmp_path, monkeypatch, capsys):
    """Issue 47: at world size 1 the linear and none rules are the same training (the base batch is the global batch),
    yet both ran, with identical results. One run stands for both, labelled "linear = none"; at 2 workers each rule
    runs. Planned and launched in process (the launcher is replaced: nothing starts)."""
    from bench import launch
    from bench.plan import accuracy as _accuracy

    s = {"base_lr": 0.05, "base_batch": 16, "scaling": ["linear", "sqrt", "none"]}
    assert _accuracy.rule_groups(s, 16) == [["linear", "sqrt", "none"]]
    assert _accuracy.rule_groups(s, 32) == [["linear"], ["sqrt"], ["none"]]
    assert _accuracy.rule_groups({**s, "scaling": ["none", "linear"]}, 16) == [["none", "linear"]]
    ran = []

    def run_one(cfg, results_dir, env_meta, backend, extra_spec=None, **kw):
        ran.append((cfg.backend, cfg.world_size, extra_spec["accuracy"]["scaling"], extra_spec["accuracy"]["rules"]))
        rec = results.skeleton(cfg.to_dict(), results.new_run_id(cfg.backend, cfg.world_size), env_meta)
        return {**rec, "status": "skipped", "reason": "not launched here"}

    monkeypatch.setattr(launch, "run_one", run_one)
    from bench import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--device", "cpu", "--backends", "single,ddp", "--gpus", "1,2", "--data", "learnable",
                  "--to-accuracy", "0.9", "--batch-size", "16", "--lr-scaling", "linear,none", "--results",
                  str(tmp_path)])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert ("[1/4] single x1 to 90% top-1: cnn-tiny learnable data, global batch 16, linear = none scaling (the same "
            "rate: one run) ...") in out
    assert "[4/4] ddp x2 to 90% top-1: cnn-tiny learnable data, global batch 32, none scaling ..." in out
    assert ran == [("single", 1, "linear", ["linear", "none"]), ("ddp", 1, "linear", ["linear", "none"]),
                   ("ddp", 2, "linear", ["linear"]), ("ddp", 2, "none", ["none"])]


def test_a_disturbed_to_accuracy_run_says_it_was_its_training_not_timed_windows(tmp_path):
    """Issue 47: the message said "during the timed windows", but accuracy runs have no windows."""
    from bench.plan import accuracy as _accuracy

    machine = {"cpus": 2, "windows": {"others_cpu_share": 0.45, "others_cpu_cores": 0.9}, "gpus": []}
    rec = {**acc_record("ddp", 2), "machine": machine, "disturbed": True,
           "disturbed_reasons": ["other processes used 45% of the 2 CPUs (0.90 cores) during the timed windows"]}
    write(tmp_path, [rec])
    got = _accuracy.reword(rec, tmp_path)
    assert got["disturbed_reasons"] == ["other processes used 45% of the 2 CPUs (0.90 cores) during its training "
                                        "(first step to last evaluation) (limit 10%)"]
    assert records(tmp_path)[0]["disturbed_reasons"] == got["disturbed_reasons"]  # the record on disk too
    assert "timed windows" not in _accuracy.one_line(got)


def test_coinciding_curves_stay_apart_each_backend_in_its_own_colour_and_marker(tmp_path, monkeypatch):
    """Issue 47: in the curves plot, single x1 hid under ddp x1 (the same training, the same curve)."""
    import numpy as np
    from matplotlib.colors import to_rgb

    from bench.report import accuracy, style

    figures = []
    monkeypatch.setattr(accuracy, "save_figure", lambda fig, stem, tight=False: figures.append(fig))
    rows = accuracy.configurations([acc_record("single", 1, "linear", 2, 4.0, rules=["linear", "none"]),
                                    acc_record("ddp", 1, "linear", 2, 4.0, rules=["linear", "none"]),
                                    acc_record("ddp", 2, "linear", 3, 3.1)])
    assert accuracy.draw_curves(rows, tmp_path / "c")
    [fig] = figures
    fig.canvas.draw()
    left_linear = fig.axes[0]
    lines = [ln for ln in left_linear.get_lines() if ln.get_marker() not in (None, "None", "")]
    by_colour = {to_rgb(ln.get_color()): ln.get_marker() for ln in lines}
    assert by_colour == {to_rgb(style.LOOK[b][0]): style.LOOK[b][1] for b in ("single", "ddp")}
    size = 4 * fig.dpi / 72
    for ax in fig.axes:
        pts = [xy for ln in ax.get_lines() if ln.get_marker() not in (None, "None", "")
               for xy in ax.transData.transform(ln.get_xydata())]
        assert all(np.linalg.norm(p - q) >= size for p, q in itertools.combinations(pts, 2)), ax.get_ylabel()
    # one row of plots per rule, the run that stood for both in each
    assert [ax.get_ylabel() for ax in fig.axes[::3]] == ["held-out top-1 (%), linear scaling",
                                                         "held-out top-1 (%), none scaling"]


# --- records with known values: the report, its verdicts, the gate ------------------------------------------------

SETTINGS = {"target": 0.9, "max_epochs": 10, "eval_every": 1, "base_lr": 0.05, "base_batch": 16, "warmup_epochs": 0.0,
            "decay": "cosine", "momentum": None, "weight_decay": None, "train_samples": 2048}
ENV = {"torch": "2.5.1", "torchvision": "0.20.1", "cpu_model": "Test CPU", "cpu_count": 2, "hostname": "node1",
       "python": "3.11.7", "git_commit": "abc123", "started_at": "2026-01-01T00:00:00+00:00", "gpu_count": 0,
       "gpu_names": []}


def acc_record(backend, n, rule="linear", epochs=2, time=3.0, thr=1000.0, best=0.85, per_device=16, seed=0, rules=None,
               **extra):
    """A to-accuracy record: ``epochs`` to 90% in ``time`` s (None: not reached in 10 epochs, best ``best``), a curve
    rising to it, training at ``thr`` samples/s."""
    cfg = dict(backend=backend, launcher="inproc" if backend == "single" else "torchrun", world_size=n,
               device_type="cpu", model="cnn-tiny", image_size=16, precision="fp32", batch_size=per_device, warmup=2,
               steps=1, windows=1, data="learnable", options={}, cudnn_benchmark=None, optimizer="sgd")
    rec = results.skeleton(cfg, f"20260101T000000Z-{backend}-w{n}-{next(_ids):06d}", ENV)
    gb = per_device * n
    steps = 2048 // gb
    schedule = Schedule.for_epochs(0.05, 16, gb, rule, 0, 10, steps, "cosine")
    ran = epochs or 10
    acc = [(0.91 if e == epochs else (best if epochs is None and e == ran else 0.5 + 0.3 * e / ran))
           for e in range(1, ran + 1)]
    wall = time if epochs else 5.0
    curve = [{"epoch": e, "step": e * steps, "wall_seconds": wall * e / ran, "eval_seconds": 0.1 * e,
              "train_seconds": wall * e / ran - 0.1 * e, "accuracy": a, "loss": 1.0 / e, "train_loss": 1.2 / e,
              "lr": schedule.lr(e * steps - 1)} for e, a in zip(range(1, ran + 1), acc)]
    reached = epochs is not None
    rec.update(status="ok", task="accuracy", seed=seed, target_accuracy=0.9, reached=reached,
               outcome="reached" if reached else f"not reached in 10 epochs: best {100 * best:.1f}% at epoch 10",
               epochs_to_accuracy=epochs, steps_to_accuracy=epochs and epochs * steps,
               time_to_accuracy_seconds=time if reached else None, eval_seconds_to_accuracy=0.1 * ran if reached else None,
               train_seconds_to_accuracy=time - 0.1 * ran if reached else None, best_accuracy=max(acc), best_epoch=ran,
               epochs_run=ran, steps_run=ran * steps, wall_seconds=wall, eval_seconds=0.1 * ran, setup_seconds=1.0,
               steps_per_epoch=steps, samples_per_epoch=steps * gb, train_throughput=thr, curve=curve,
               final_lr=schedule.lr(ran * steps - 1),
               schedule={**schedule.describe(), "warmup_epochs": 0.0, "max_epochs": 10, "eval_every": 1},
               accuracy_settings={**SETTINGS, "scaling": rule, "rules": rules or [rule]},
               dataset={"kind": "learnable", "classes": 10, "pattern": "a pattern", "train_samples": 2048,
                        "held_out_samples": 300, "reachable_accuracy": 1.0},
               replicas_consistent=True if n > 1 else None, host_peak_rss_bytes=[GiB] * n)
    rec.update(extra)
    return rec


def sweep_records():
    """single x1 at global batch 16 (both rules give it the same rate: one run stands for both, 2 epochs), ddp and
    allreduce_manual x2 at 32: linear needs 3 epochs and ddp is clearly faster (3 runs each, ranges apart); none needs
    4, ddp_spawn ran once, and allreduce_manual misses the target."""
    recs = [acc_record("single", 1, "linear", 2, t, thr=1000.0, rules=["linear", "none"]) for t in (4.0, 4.2, 4.4)]
    recs += [acc_record("ddp", 2, "linear", 3, t, thr=2000.0) for t in (3.0, 3.1, 3.2)]
    recs += [acc_record("allreduce_manual", 2, "linear", 3, t, thr=1700.0) for t in (3.6, 3.7, 3.8)]
    recs += [acc_record("ddp", 2, "none", 4, t, thr=2000.0) for t in (4.0, 4.1, 4.2)]
    recs += [acc_record("ddp_spawn", 2, "none", 4, 4.5, thr=1900.0)]
    recs += [acc_record("allreduce_manual", 2, "none", None, thr=1700.0, best=0.85) for _ in range(3)]
    return recs


def write(directory, recs):
    for r in recs:
        results.save(r, directory)
    return directory


@pytest.fixture(scope="module")
def made_report(tmp_path_factory):
    """REPORT.md and REPORT.html of the records above alone (no timed run)."""
    base = tmp_path_factory.mktemp("acc-report")
    src = write(base / "raw" / "accuracy", sweep_records()).parent
    out = base / "rep"
    code = report.cmd_report(argparse.Namespace(results=str(src), out=str(out)))
    assert code == 0
    return out, (out / "REPORT.md").read_text()


def row_of(md: str, start: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {start} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_section_tables_time_to_accuracy_beside_the_throughput_only_prediction(made_report):
    out, md = made_report
    section = md[md.index("## Time to accuracy (bench run --to-accuracy)"):]
    assert "### cnn-tiny 16px, learnable data, fp32: to 90% top-1 within 10 epochs, base lr 0.05 at batch 16, cosine " \
           "decay, evaluated every epoch · CPU: Test CPU (cpu)" in section
    assert "Reference for the prediction: single x1 at global batch 16 (linear = none scaling), 2 epochs." in section
    # ddp x2, linear: 3 epochs (192 steps of 32) in 3.1 s (3.0-3.2); at 2000 img/s the reference's 2 epochs of 2048
    # samples promise 2.048 s: it arrives 3.1 / 2.048 = 1.51x later than its throughput promised
    rows = [r for r in section.splitlines() if r.startswith("| ddp x2 | 2 | 32 | linear |")]
    assert [c.strip() for c in rows[0].strip("|").split("|")] == [
        "ddp x2", "2", "32", "linear", "0.1", "3", "3", "192", "3.1 s (3.0–3.2)", "0.3 s", "2,000 img/s", "2.0 s",
        "1.51", f"{Schedule.for_epochs(0.05, 16, 32, 'linear', 0, 10, 64, 'cosine').lr(191):.3g}"]
    none = [r for r in section.splitlines() if r.startswith("| allreduce_manual x2 | 2 | 32 | none |")][0]
    assert "not reached (best 85.0%)" in none and "| 0.05 |" in none
    # the reference itself: its own 2 epochs at 1000 img/s promise 4.096 s; it took 4.2 s (evaluation, start-up)
    assert row_of(section, "single x1")[3:13] == ["linear = none", "0.05", "3", "2", "256", "4.2 s (4.0–4.4)", "0.2 s",
                                                  "1,000 img/s", "4.1 s", "1.03"]
    assert len([r for r in section.splitlines() if r.startswith("| single x1 |")]) == 1  # one run, one row
    plots = sorted(p.name for p in (out / "plots").glob("accuracy-*.svg"))
    assert len(plots) == 2 and plots[0].endswith("-curves.svg") and plots[1].endswith("-epochs.svg")
    assert md.count("![time to accuracy](plots/") == 1 and md.count("![epochs to accuracy](plots/") == 1


def test_the_verdict_names_the_fastest_only_when_the_runs_spreads_allow_it(made_report):
    _, md = made_report
    verdict = md[md.index("## Verdict"):md.index("## Time to accuracy")]
    # linear at 2 workers: 3 runs each, ddp's slowest (3.2 s) before allreduce_manual's fastest (3.6 s)
    linear = verdict[verdict.index("time to 90% top-1, linear scaling, global batch 32, 2 CPU workers"):]
    assert linear.split("\n\n")[1] == ("**Use ddp x2 to reach 90% top-1 soonest: its slowest run beat every other "
                                       "backend's fastest.**")
    assert "- allreduce_manual x2: 19% longer to the target by the medians (3.7 s)" in linear
    # none at 2 workers: ddp_spawn ran once, so no winner; allreduce_manual did not reach the target
    none = verdict[verdict.index("time to 90% top-1, none scaling, global batch 32, 2 CPU workers"):]
    assert none.split("\n\n")[1].startswith("**Fastest here: ddp x2 to 90% top-1, but no winner established: "
                                            "ddp_spawn x2 ran once")
    assert ("- allreduce_manual x2: not reached in 3 of 3 runs (best top-1 85.0% within 10 epochs)"
            in none.split("###")[0])
    # one backend alone at 1 worker: nothing to compare, once for the two rules its run stood for
    assert ("time to 90% top-1, linear = none scaling, global batch 16, 1 CPU worker\n\n**Only single x1 ran here: "
            "nothing to compare it with.**\n\n- single x1: 4.2 s to 90% top-1 (3 runs, 4.0–4.4 s)") in verdict


def test_the_verdict_s_first_screen_has_a_line_for_every_group(tmp_path, capsys):
    """Issue 47: the printed verdict left out the linear x2 group, the one that reached the target: a group with one
    configuration had no line of its own."""
    src = write(tmp_path / "raw" / "accuracy", [acc_record("single", 1, "linear", 2, t, rules=["linear", "none"])
                                                 for t in (4.0, 4.2)]
                + [acc_record("ddp", 2, "linear", 3, 3.1), acc_record("ddp", 2, "none", None, best=0.6)]).parent
    assert report.cmd_report(argparse.Namespace(results=str(src), out=str(tmp_path / "rep"))) == 0
    lines = capsys.readouterr().out.split("\n== Verdict\n")[1].strip().splitlines()
    assert lines == [
        "On CPU: Test CPU:",
        "  cnn-tiny 16px learnable data, fp32: time to 90% top-1, linear scaling, global batch 32, 2 CPU workers: Only "
        "ddp x2 ran: 3.1 s to 90% top-1 (one run), 3 epochs, of which evaluation 0.3 s.",
        "  cnn-tiny 16px learnable data, fp32: time to 90% top-1, linear = none scaling, global batch 16, 1 CPU worker: "
        "Only single x1 ran: 4.1 s to 90% top-1 (2 runs, 4.0–4.2 s), 2 epochs, of which evaluation 0.2 s.",
        "  cnn-tiny 16px learnable data, fp32: time to 90% top-1, none scaling, global batch 32, 2 CPU workers: No "
        "backend reached 90% top-1 in every run."]


def test_the_verdict_names_no_winner_when_the_runs_overlap_or_were_disturbed(tmp_path):
    from bench.report import accuracy

    src = tmp_path / "raw"
    write(src / "accuracy", [acc_record("ddp", 2, "linear", 3, t) for t in (3.0, 3.1, 3.5)]
          + [acc_record("ddp_zero", 2, "linear", 3, t) for t in (3.4, 3.6, 3.7)])
    (v,) = accuracy.verdicts(src, print)
    assert v["headline"] == ("No winner established: the runs of ddp x2 and ddp_zero x2 overlap in their time to 90% "
                             "top-1.") and not v["established"]
    write(src / "accuracy", [acc_record("fsdp2", 2, "linear", 3, t, disturbed=True) for t in (5.0, 5.1)])
    (v,) = accuracy.verdicts(src, print)
    assert v["headline"].startswith("No winner established: runs of fsdp2 x2 were disturbed")


def test_a_report_with_timed_runs_gains_the_section_and_its_verdicts(tmp_path):
    src = write(tmp_path / "raw" / "accuracy", [acc_record("ddp", 2, "linear", 3, t) for t in (3.0, 3.1)]).parent
    timed = results.skeleton(dict(backend="single", launcher="inproc", world_size=1, device_type="cpu",
                                  model="resnet18", image_size=32, precision="fp32", batch_size=8, warmup=2, steps=2,
                                  windows=3, options={}, cudnn_benchmark=None), "20260101T000000Z-single-w1-t", ENV)
    timed.update(status="ok", window_seconds=[0.1, 0.1, 0.1], throughput=160.0, throughput_ci95=[160.0, 160.0],
                 per_device_throughput=160.0, host_peak_rss_bytes=[GiB])
    results.save(timed, src)
    out = tmp_path / "rep"
    assert report.cmd_report(argparse.Namespace(results=str(src), out=str(out))) == 0
    md = (out / "REPORT.md").read_text()
    assert "### CPU: Test CPU, resnet18 32px batch 8/device synthetic, fp32, 1 CPU worker" in md  # the timed verdict
    assert "time to 90% top-1, linear scaling, global batch 32, 2 CPU workers" in md  # ... and the accuracy one
    assert md.index("## Verdict") < md.index("## Time to accuracy") and "| ddp x2 | 2 | 32 | linear |" in md
    assert "malformed" not in (out / "REPORT.md").read_text()  # accuracy records are not read as timed runs


# --- the section in a real browser ----------------------------------------------------------------------------------

DOM = """JSON.stringify({
  verdict: (document.querySelector('#verdict') || {}).innerText || '',
  winners: [...document.querySelectorAll('#verdict p.winner')].map(p => p.innerText),
  section: (document.querySelector('#s-time-to-accuracy-bench-run-to-accuracy') || {}).innerText || '',
  plots: [...document.querySelectorAll('#s-time-to-accuracy-bench-run-to-accuracy img[data-plot]')].map(
    i => [i.dataset.plot, i.complete, i.naturalWidth]),
  rows: document.querySelectorAll('#s-time-to-accuracy-bench-run-to-accuracy tbody tr').length})"""


def test_the_section_in_headless_chromium(made_report):
    out, md = made_report
    browser = chromium.browser_or_skip()
    try:
        got = browser.load((out / "REPORT.html").as_uri(), DOM)
    finally:
        browser.close()
    assert got["errors"] == [] and got["requests"] == [(out / "REPORT.html").as_uri()]
    dom = json.loads(got["value"])
    assert dom["winners"] == ["Use ddp x2 to reach 90% top-1 soonest: its slowest run beat every other backend's "
                              "fastest."]
    assert "Fastest here: ddp x2 to 90% top-1, but no winner established" in dom["verdict"]
    assert [p[0] for p in dom["plots"]] == ["time to accuracy", "epochs to accuracy"]
    assert all(complete and width > 500 for _, complete, width in dom["plots"])  # drawn, not a broken image
    assert dom["rows"] == 6 and "throughput-only prediction" in dom["section"]  # single x1: one run for two rules
    assert "3.1 s (3.0–3.2)" in dom["section"] and "not reached (best 85.0%)" in dom["section"]


# --- the gate -----------------------------------------------------------------------------------------------------

def gate(capsys, base, cur, *extra):
    from bench import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["compare", str(base), str(cur), "--format", "json", *extra])
    out, err = capsys.readouterr()
    return e.value.code, json.loads(out), err


def runs(tmp_path, side, epochs, thr, n=3, **kw):
    jitter = (0.99, 1.0, 1.01)
    return write(tmp_path / side, [acc_record("ddp", 2, "linear", epochs, 3.0, thr=thr * jitter[i % 3], **kw)
                                   for i in range(n)])


def test_more_epochs_than_the_baseline_is_a_regression_in_convergence(tmp_path, capsys):
    base, cur = runs(tmp_path, "base", 2, 2000.0), runs(tmp_path, "cur", 3, 2000.0)
    code, res, _ = gate(capsys, base, cur)
    (row,) = res["rows"]
    assert code == 1 and row["verdict"] == "more epochs to accuracy" and row["regression"]
    assert row["throughput_verdict"] == "no significant change" and row["convergence"] == "more epochs to accuracy"
    assert res["convergence_regressions"] == [row["config"]] == [
        "ddp x2 cnn-tiny 16px b16/dev fp32 learnable data to 90% top-1, linear scaling"]
    assert "needs more epochs to reach the target: 3 against 2 in the baseline" in row["notes"][0]
    from bench import cli

    with pytest.raises(SystemExit):
        cli.main(["compare", str(base), str(cur)])
    md = capsys.readouterr().out
    assert "**REGRESSION IN CONVERGENCE** in 1 configuration(s): more epochs to the target than the baseline" in md
    assert "| 2 epochs, 3.0 s, 2,000/s training (3 of 3 runs reached) | 3 epochs, 3.0 s" in md


def test_a_slowdown_at_the_same_epochs_fails_as_a_slowdown_not_as_convergence(tmp_path, capsys):
    code, res, _ = gate(capsys, runs(tmp_path, "base", 2, 2000.0), runs(tmp_path, "cur", 2, 1500.0))
    (row,) = res["rows"]
    assert code == 1 and row["verdict"] == "slower" and row["convergence"] is None
    assert res["convergence_regressions"] == [] and res["regressions"] == [row["config"]]
    assert row["ratio"] == pytest.approx(0.75, rel=1e-3)


def test_a_target_missed_fails_and_fewer_epochs_or_the_same_pass(tmp_path, capsys):
    code, res, _ = gate(capsys, runs(tmp_path, "base", 2, 2000.0), runs(tmp_path, "missed", None, 2000.0))
    assert code == 1 and res["rows"][0]["verdict"] == "more epochs to accuracy"
    assert "not reached against 2 in the baseline" in res["rows"][0]["notes"][0]
    code, res, _ = gate(capsys, tmp_path / "base", runs(tmp_path, "fewer", 1, 2000.0))
    assert code == 0 and res["rows"][0]["verdict"] == "fewer epochs to accuracy" and not res["regressed"]
    code, res, _ = gate(capsys, tmp_path / "base", runs(tmp_path, "same", 2, 2000.0))
    assert code == 0 and res["rows"][0]["verdict"] == "no significant change"
    # another target is another question: nothing in common, nothing compared
    write(tmp_path / "other", [acc_record("ddp", 2, "linear", 2, 3.0, accuracy_settings={**SETTINGS, "target": 0.8,
                                                                                          "scaling": "linear"})])
    code, res, err = gate(capsys, tmp_path / "base", tmp_path / "other")
    assert code == 2 and "no configuration is present in both baseline and current" in err


# --- real runs: one 2-rank sweep of the DDP family, one single run that misses its target ---------------------------

FAMILY = ("ddp", "ddp_spawn", "allreduce_manual")
# DeepSpeed wraps the torch optimizer in its own: the rate must reach the param groups that step (Backend.set_lr)
WRAPPED = ("ds_zero1",) if optional_problem("deepspeed") is None else ()


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    raw = tmp_path_factory.mktemp("acc-real") / "raw"
    # global batch 32 from 16 per rank; 0.025 at base batch 16, linear: 0.05 at 32
    bench_inproc("run", "--to-accuracy", "0.9", "--data", "learnable", "--device", "cpu", "--backends",
                 ",".join(FAMILY + WRAPPED), "--gpus", "2", "--batch-size", "16", "--base-lr", "0.025", "--base-batch",
                 "16", "--max-epochs", "6", "--results", raw, check=True)
    family = {r["backend"]: r for r in records(raw / "accuracy")}
    missed = raw.parent / "missed"
    bench_inproc("run", "--to-accuracy", "0.999", "--data", "learnable", "--device", "cpu", "--backends", "single",
                 "--gpus", "1", "--batch-size", "32", "--base-lr", "0.05", "--max-epochs", "1", "--lr-scaling", "none",
                 "--lr-decay", "step", "--results", missed, check=True)
    (single,) = records(missed / "accuracy")
    return raw, family, single


@pytest.mark.slow
def test_each_run_stops_at_the_target_and_the_ddp_family_needs_the_same_epochs(real):
    _, everyone, _ = real
    assert sorted(everyone) == sorted(FAMILY + WRAPPED)
    family = {name: everyone[name] for name in FAMILY}
    for name, r in family.items():
        assert r["status"] == "ok" and r["reached"] and r["outcome"] == "reached", name
        accs = [c["accuracy"] for c in r["curve"]]
        # stopped at the first evaluation at or above 90%, well within the budget: the task is learnable
        assert accs[-1] >= 0.9 and all(a < 0.9 for a in accs[:-1]) and r["epochs_run"] == r["epochs_to_accuracy"] <= 3
        assert r["steps_to_accuracy"] == r["epochs_to_accuracy"] * 64 == r["steps_run"]  # 2048 / 32 steps per epoch
        assert r["time_to_accuracy_seconds"] == r["curve"][-1]["wall_seconds"] > r["eval_seconds_to_accuracy"] > 0
        assert r["replicas_consistent"] is True and r["dataset"]["reachable_accuracy"] == 1.0
    assert len({r["epochs_to_accuracy"] for r in family.values()}) == 1
    # one DDP class under two launchers: the same training to the last digit
    strip = lambda r: [(c["epoch"], c["accuracy"], c["loss"], c["train_loss"]) for c in r["curve"]]  # noqa: E731
    assert strip(family["ddp"]) == strip(family["ddp_spawn"])
    # the hand-written all-reduce averages in another order: the same curve to rounding (a sample of 300 at most)
    for a, b in zip(family["ddp"]["curve"], family["allreduce_manual"]["curve"]):
        assert abs(a["accuracy"] - b["accuracy"]) <= 1 / 300 and a["loss"] == pytest.approx(b["loss"], rel=0.05)


@pytest.mark.slow
def test_the_record_holds_the_schedule_and_the_optimizer_stepped_at_its_rate(real):
    _, family, _ = real
    if not WRAPPED and REQUIRE_OPTIONAL:  # without DeepSpeed the DDP family is checked alone
        pytest.fail(f"BENCH_REQUIRE_OPTIONAL=1 and {optional_problem('deepspeed')}")
    for name, r in family.items():
        s = r["schedule"]
        assert s["peak_lr"] == pytest.approx(scaled_lr(0.025, 16, 32, "linear")) == pytest.approx(0.05)
        assert (s["scaling"], s["decay"], s["warmup_steps"], s["total_steps"], s["global_batch"]) == (
            "linear", "cosine", 0, 6 * 64, 32)
        expected = Schedule.for_epochs(0.025, 16, 32, "linear", 0, 6, 64, "cosine")
        assert r["final_lr"] == pytest.approx(expected.lr(r["steps_run"] - 1), rel=1e-12)
        assert [c["lr"] for c in r["curve"]] == pytest.approx([expected.lr(c["step"] - 1) for c in r["curve"]])
        o = r["optimizer_settings"]
        assert o["lr_is_the_schedules"] and o["lr"] == pytest.approx(r["final_lr"], rel=1e-12), name
        assert (o["optimizer"], o["momentum"], o["weight_decay"]) == ("SGD", 0.9, 1e-4)
        assert r["accuracy_settings"]["target"] == 0.9 and r["seed"] == 0 and r["task"] == "accuracy"


@pytest.mark.slow
def test_a_run_that_misses_its_target_says_not_reached_with_its_best(real):
    _, _, r = real
    assert r["status"] == "ok" and r["reached"] is False and r["epochs_run"] == 1
    assert r["epochs_to_accuracy"] is None and r["time_to_accuracy_seconds"] is None
    assert 0.3 < r["best_accuracy"] < 0.999 and r["best_epoch"] == 1
    assert r["outcome"] == f"not reached in 1 epochs: best {100 * r['best_accuracy']:.1f}% at epoch 1"
    # step decay planned over 1 epoch of 64 steps: both milestones at the end of it (epoch 1), so no step ran past one
    assert r["schedule"]["milestones"] == [64, 64] and r["final_lr"] == pytest.approx(0.05)


@pytest.mark.slow
def test_the_report_of_real_runs(real, tmp_path):
    raw, family, _ = real
    out = tmp_path / "rep"
    assert report.cmd_report(argparse.Namespace(results=str(raw), out=str(out))) == 0
    md = (out / "REPORT.md").read_text()
    for name, r in family.items():  # ds_zero1's too
        cells = row_of(md, f"{name} x2")
        assert cells[1:7] == ["2", "32", "linear", "0.05", "1", str(r["epochs_to_accuracy"])]
        assert cells[8] == f"{r['time_to_accuracy_seconds']:.1f} s"
    # the gate: the same records pass on convergence; one doctored to need an epoch more fails as convergence
    doctored = tmp_path / "doctored"
    shutil.copytree(raw / "accuracy", doctored, ignore=shutil.ignore_patterns("logs"))
    for p in doctored.glob("*.json"):
        rec = json.loads(p.read_text())
        if rec["backend"] == "ddp":
            rec["epochs_to_accuracy"] += 1
            p.write_text(json.dumps(rec))
    code = bench_inproc("compare", raw / "accuracy", doctored).returncode
    assert code == 1
    got = bench_inproc("compare", raw / "accuracy", doctored, "--format", "json")
    res = json.loads(got.stdout)
    assert [r["config"].split(" ")[0] for r in res["rows"] if r.get("convergence") == "more epochs to accuracy"] == [
        "ddp"]


@pytest.mark.slow
def test_real_data_in_class_folders_trains_to_its_target(tmp_path):
    """--data imagenet: DIR/train/<class>/ through the torchvision loader and DIR/val/<class>/ held out, as CIFAR-10 or
    Imagenette exported as folders would be; three colours under noise, learnable to 90% in an epoch or two."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    colours = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
    for split, n in (("train", 48), ("val", 10)):
        for name, rgb in colours.items():
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(rng.normal(rgb, 60, (24, 24, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / name / f"{i}.JPEG")
    raw = tmp_path / "raw"
    bench_inproc("run", "--to-accuracy", "0.9", "--data", "imagenet", "--data-dir", tmp_path / "data", "--model",
                 "cnn-tiny", "--image-size", "16", "--device", "cpu", "--backends", "single", "--gpus", "1",
                 "--batch-size", "8", "--base-lr", "0.05", "--max-epochs", "6", "--workers", "0", "--results", raw,
                 check=True)
    (r,) = records(raw / "accuracy")
    assert r["status"] == "ok" and r["reached"] and r["epochs_to_accuracy"] <= 6 and r["best_accuracy"] >= 0.9
    assert r["steps_per_epoch"] == 144 // 8 and r["samples_per_epoch"] == 144  # the loader's length: 3 x 48 images
    assert r["dataset"] == {"kind": "imagenet", "data_dir": str(tmp_path / "data"), "train_samples": 144,
                            "held_out_samples": 30, "reachable_accuracy": None, "loader": "torchvision",
                            "decode": "cpu", "workers": 0}
    assert r["eval_samples"] == 30 and r["data"] == "imagenet"
