"""Workloads beyond the torchvision models (docs/workloads.md): the GPT ladder on synthetic tokens, the optimizer
choice, activation checkpointing, and the user's own model (tests/user_model.py), through the same harness."""
import json
import subprocess
import sys

import pytest
import torch

from backends import models
from backends.base import build_model, checkpoint_blocks, make_optimizer
from backends.models import flops
from bench.core import results, workloads
from bench.core.config import RunConfig
from tests.conftest import REPO, bench_inproc, cli_error, records


def cfg_for(model="gpt-micro", **kw):
    base = dict(backend="single", launcher="inproc", world_size=1, device_type="cpu", model=model, image_size=32,
                batch_size=2, warmup=2, steps=1, windows=1)
    return RunConfig(**{**base, **kw}).validate()


def test_the_gpt_ladder_has_gpt_3_s_shapes_and_counts_its_parameters():
    assert list(workloads.GPT_SIZES)[4:] == ["gpt-125m", "gpt-350m", "gpt-760m", "gpt-1.3b", "gpt-2.7b", "gpt-6.7b"]
    assert workloads.GPT_SIZES["gpt-1.3b"] == (24, 2048, 32, 50304)  # GPT-3 paper, table 2.1 (vocabulary padded)
    billions = {m: round(workloads.gpt_parameters(m, 2048) / 1e9, 2) for m in list(workloads.GPT_SIZES)[4:]}
    assert billions == {"gpt-125m": 0.13, "gpt-350m": 0.36, "gpt-760m": 0.76, "gpt-1.3b": 1.32, "gpt-2.7b": 2.65,
                        "gpt-6.7b": 6.66}
    for name in ("gpt-micro", "gpt-tiny"):  # the formula is the model's own count (the output layer is tied)
        model = build_model(cfg_for(name, seq_len=64))
        assert sum(p.numel() for p in model.parameters()) == workloads.gpt_parameters(name, 64)
        assert flops.parameter_count(name, 64) == workloads.gpt_parameters(name, 64)
    assert 5e6 < workloads.gpt_parameters("gpt-tiny", 64) < 6e6  # "a few million" for the CPU tests


def test_a_gpt_config_has_tokens_an_optimizer_and_no_images():
    cfg = cfg_for()
    assert (cfg.seq_len, cfg.image_size, cfg.optimizer) == (64, None, "adamw")  # CPU default sequence, AdamW default
    assert cfg_for("resnet18").optimizer == "sgd" and cfg_for("resnet18", optimizer="adamw").optimizer == "adamw"
    rec = results.skeleton(cfg_for(seq_len=16).to_dict(), "r", {})
    assert (rec["seq_len"], rec["optimizer"], rec["image_size"], workloads.shape(rec)) == (16, "adamw", None, "seq 16")
    # the optimizer and the sequence length are part of the configuration; old records trained with SGD
    assert results.config_key(rec) != results.config_key({**rec, "seq_len": 32})
    old = results.skeleton(cfg_for("resnet18").to_dict(), "r", {})
    del old["optimizer"]
    assert results.config_key(old) == results.config_key(results.skeleton(cfg_for("resnet18").to_dict(), "r", {}))


def test_gpt_batches_are_next_token_pairs_and_the_loss_is_cross_entropy_over_tokens():
    w = models.for_config(cfg_for(seq_len=8))
    x, y = w.batch(3, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])
    model = build_model(cfg_for(seq_len=8))
    out = model(x)
    assert out.shape == (3, 8, 512)
    loss = w.loss(out, y)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(out.reshape(24, 512), y.reshape(24)))
    assert 5.5 < loss.item() < 7.0  # about ln(512) = 6.24 at initialisation
    losses, correct = w.per_sample(out, y)
    assert losses.shape == correct.shape == (3,) and torch.allclose(losses.mean(), loss)
    # the same model twice from the same seed: identical replicas on every rank
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 build_model(cfg_for(seq_len=8)).state_dict().values()))


def test_gpt_flops_count_the_matmuls_and_attention():
    per_seq = flops.flops_per_sample("gpt-tiny", None, 64)
    params = workloads.gpt_parameters("gpt-tiny", 64)
    # 6 x parameters x tokens for the weights (the embedding lookup is no matmul, the tied output layer is),
    # plus attention's scores and values: between 6ND and 6ND + 12 L T^2 d x 2
    assert 0.9 * 6 * params * 64 < per_seq < 6 * params * 64 + 24 * 4 * 64 * 64 * 256


@pytest.mark.parametrize("field", ["model", "image_size", "seq_len", "torch", "torchvision", "code"])
def test_a_flop_count_made_with_one_value_of_any_key_field_is_never_read_back_for_another(tmp_path, monkeypatch,
                                                                                          field):
    """Issue 63: MFU is only as right as the FLOP count behind it, read from a cache. For every field of the key, a
    count made with one value is never read back for another: the other value is counted (a stand-in counter gives
    each count its own number), and both stay readable. A key that left a field out (gpt-350m at seq 2048 reading the
    count made at 1024) fails here."""
    from importlib import metadata

    monkeypatch.setenv("BENCH_FLOPS_CACHE", str(tmp_path / "flops"))
    counted = []
    monkeypatch.setattr(flops, "count", lambda *a: counted.append(a) or float(len(counted)))
    versions = {"torch": "2.11.0", "torchvision": "0.26.0"}
    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: versions.get(name) or real_version(name))
    package = tmp_path / "models"  # the model code, in a copy this test may edit
    package.mkdir()
    for f in flops._PACKAGE.glob("*.py"):
        (package / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(flops, "_PACKAGE", package)
    base = {"model": "gpt-micro", "image_size": 32, "seq_len": 1024}
    other = {"model": {"model": "gpt-tiny"}, "image_size": {"image_size": 64}, "seq_len": {"seq_len": 2048}}

    def ask(args: dict) -> float:
        flops.flops_per_sample.cache_clear()  # a later process: the file cache only
        return flops.flops_per_sample(args["model"], args["image_size"], args["seq_len"])

    first = ask(base)
    assert ask(base) == first and len(counted) == 1  # read back: the same key
    if field in other:
        changed = {**base, **other[field]}
    else:
        changed = base
        if field == "code":
            (package / "__init__.py").write_text((package / "__init__.py").read_text() + "\n# edited\n")
        else:
            versions[field] += ".post1"
    second = ask(changed)
    assert len(counted) == 2 and second != first, f"the count made with another {field} was read back"
    assert ask(changed) == second and len(counted) == 2  # the new key's count is kept too
    if field in other:
        assert ask(base) == first and len(counted) == 2  # and the first is still there for its own key


def test_a_flop_count_is_made_once_per_key_and_read_back_by_a_later_process(tmp_path, monkeypatch):
    """backends/models/flops.py's cache: the first ask counts and keeps the count under its key; a later process (the
    in-process cache cleared) reads it without counting; another torch, an edited model or a garbled file is counted
    again; a cache that cannot be written still gives the count."""
    from importlib import metadata

    monkeypatch.setenv("BENCH_FLOPS_CACHE", str(tmp_path / "flops"))
    counted, real = [], flops.count
    monkeypatch.setattr(flops, "count", lambda *a: counted.append(a) or real(*a))
    flops.flops_per_sample.cache_clear()
    first = flops.flops_per_sample("cnn-tiny", 32)
    assert counted == [("cnn-tiny", 32, None)] and first == real("cnn-tiny", 32) == 15929088.0
    [entry] = (tmp_path / "flops").glob("*.json")
    key = {"model": "cnn-tiny", "image_size": 32, "seq_len": None, "torch": metadata.version("torch"),
           "torchvision": metadata.version("torchvision"), "code": flops.cache_key("cnn-tiny", 32, None)["code"]}
    assert json.loads(entry.read_text()) == {"schema": "flops-1", "key": key, "flops_per_sample": first}
    flops.flops_per_sample.cache_clear()
    assert flops.flops_per_sample("cnn-tiny", 32) == first and len(counted) == 1  # read back
    entry.write_text("{not json")
    flops.flops_per_sample.cache_clear()
    assert flops.flops_per_sample("cnn-tiny", 32) == first and len(counted) == 2  # garbled: counted, and rewritten
    assert json.loads(entry.read_text())["flops_per_sample"] == first
    entry.write_text(json.dumps({"schema": "flops-1", "key": {**key, "torch": "0.1"}, "flops_per_sample": 1.0}))
    flops.flops_per_sample.cache_clear()
    assert flops.flops_per_sample("cnn-tiny", 32) == first and len(counted) == 3  # another key's count: not read
    # another torch: another key, counted again, beside the first entry
    monkeypatch.setattr(flops, "cache_key", lambda *a, k=flops.cache_key: {**k(*a), "torch": "9.9.9"})
    flops.flops_per_sample.cache_clear()
    assert flops.flops_per_sample("cnn-tiny", 32) == first and len(counted) == 4
    assert len(list((tmp_path / "flops").glob("*.json"))) == 2
    monkeypatch.undo()
    # an edited model (any file of backends/models/) is another key
    package = tmp_path / "models"
    package.mkdir()
    for f in flops._PACKAGE.glob("*.py"):
        (package / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(flops, "_PACKAGE", package)
    before = flops.cache_key("cnn-tiny", 32, None)
    assert before == flops.cache_key("cnn-tiny", 32, None)  # the same files, the same key
    (package / "__init__.py").write_text((package / "__init__.py").read_text() + "\n# edited\n")
    assert flops.cache_key("cnn-tiny", 32, None) == {**before, "code": flops.cache_key("cnn-tiny", 32, None)["code"]}
    assert flops.cache_key("cnn-tiny", 32, None)["code"] != before["code"]
    # and so is another size in bench/core/workloads.py (cnn-tiny's widths, a GPT's layers)
    sizes = tmp_path / "workloads.py"
    sizes.write_bytes(flops._WORKLOADS.read_bytes())
    monkeypatch.setattr(flops, "_WORKLOADS", sizes)
    before = flops.cache_key("cnn-tiny", 32, None)
    sizes.write_text(sizes.read_text().replace('SMALL_CNNS = {"cnn-tiny": ((16, 32, 64), 10)}',
                                               'SMALL_CNNS = {"cnn-tiny": ((32, 64, 128), 10)}'))
    assert flops.cache_key("cnn-tiny", 32, None)["code"] != before["code"]
    # a cache that cannot be written (its folder is a file): the count all the same
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("BENCH_FLOPS_CACHE", str(tmp_path / "file" / "flops"))
    flops.flops_per_sample.cache_clear()
    assert flops.flops_per_sample("cnn-tiny", 32) == first
    flops.flops_per_sample.cache_clear()
    assert not list((tmp_path / "flops").glob(".tmp-*"))  # every write renamed into place, nothing left


def test_adamw_and_sgd_are_built_as_stated_for_every_backend_kind():
    p = [torch.nn.Parameter(torch.zeros(2))]
    adamw = make_optimizer(cfg_for(), p)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["betas"] == (0.9, 0.95)
    assert adamw.defaults["weight_decay"] == 0.1 and adamw.defaults["fused"] is True  # backends/test_base.py: why
    sgd = make_optimizer(cfg_for("resnet18", device_type="cpu"), p)
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.9


def test_activation_checkpointing_recomputes_each_block_in_backward_and_keeps_the_names():
    plain, ckpt = build_model(cfg_for(seq_len=8)), build_model(cfg_for(seq_len=8))
    assert checkpoint_blocks(ckpt) == 2 and ckpt._bench_checkpointed == 2
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in ckpt.named_parameters()]
    calls, saved = {"plain": 0, "ckpt": 0}, {"plain": 0, "ckpt": 0}
    x, y = models.for_config(cfg_for(seq_len=8)).batch(2, torch.Generator().manual_seed(0))
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        model.blocks[0].mlp.register_forward_pre_hook(lambda *a, name=name: calls.__setitem__(name, calls[name] + 1))
        count = lambda t, name=name: saved.__setitem__(name, saved[name] + 1) or t  # noqa: E731
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            out = model(x)
        torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()).backward()
    assert calls == {"plain": 1, "ckpt": 2}  # the block's forward again, in backward
    assert saved["ckpt"] * 3 < saved["plain"], saved  # each block keeps its input only
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)  # the same gradients
    with pytest.raises(ValueError, match="--activation-checkpointing: Linear has no blocks to checkpoint"):
        checkpoint_blocks(torch.nn.Linear(2, 2))


def test_fsdp2_shards_a_transformer_block_by_block():
    from backends import fsdp2

    model = build_model(cfg_for(seq_len=8))
    assert fsdp2.blocks(model) == list(model.blocks)


def test_the_user_model_contract():
    w = models.for_config(cfg_for("tests.user_model:factory"))
    torch.manual_seed(0)
    a = w.build()
    torch.manual_seed(0)
    b = w.build()
    assert a is not b and all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))  # seeded builds
    assert models.find_blocks(a) == [a[0], a[2], a[4]]
    x, y = w.batch(5, torch.Generator().manual_seed(1))
    assert x.shape == (5, 32) and y.shape == (5,) and w.loss(a(x), y).item() > 0
    with pytest.raises(TypeError, match=r"--model tests.user_model:broken: the factory must return a torch.nn.Module "
                                        r"as `model` and a `batch\(n, generator\)` function \(got dict\)"):
        models.for_config(cfg_for("tests.user_model:broken"))
    with pytest.raises(TypeError, match="--model tests.user_model:nothing: tests.user_model has no callable 'nothing'"):
        models.for_config(cfg_for("tests.user_model:nothing"))


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt-huge"], "bench: error: --model 'gpt-huge': unknown GPT size; choose from gpt-micro, gpt-tiny, "),
    (["--model", "resnet18", "--seq-len", "64"], "bench: error: --seq-len is for the gpt-<size> models; resnet18 is "
                                                 "not one"),
    (["--model", "gpt-micro", "--seq-len", "0"], "bench: error: --seq-len must be a positive integer, got 0"),
    (["--model", "gpt-micro", "--optimizer", "lamb"], "bench: error: --optimizer 'lamb': unknown optimizer; choose from sgd, adamw"),
    (["--model", ":factory"], "bench: error: --model ':factory': your own model is package.module:factory"),
])
def test_bad_workload_input_is_one_line(results_dir, args, message, capsys):
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, "--device", "cpu", *args,
                          "--results", results_dir)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message), err


@pytest.mark.slow
def test_the_tiny_gpt_passes_verify_with_adamw_on_every_backend_at_two_ranks(tmp_path):
    proc = bench_inproc("verify", "--device", "cpu", "--model", "gpt-micro", "--seq-len", 16, "--batch-size", 2, "--steps",
                 4, "--eval-samples", 9, "--gpus", 2, "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = (tmp_path / "verify").glob("summary-*.json")
    rows = {r["backend"]: r for r in json.loads(path.read_text())["rows"]}
    cpu_skips = {"dp", "ddp_amp_syncbn"}  # no CPU replicas; SyncBatchNorm refuses CPU modules
    assert set(rows) == set(__import__("backends").names()) - {"single"}
    for name, row in rows.items():
        assert row["verdict"] == ("skipped" if name in cpu_skips else "pass"), row
        if name not in cpu_skips:
            assert row["eval_samples"] == 9 and row["param_distance"] < 1e-3, row
    assert "gpt-micro seq 16, adamw, batch 2/device" in proc.stdout
    assert "BatchNorm normalises" not in proc.stdout  # a transformer has no BatchNorm


@pytest.mark.slow
def test_a_user_model_and_a_checkpointed_gpt_train_on_two_ranks_with_identical_replicas(tmp_path):
    raw = tmp_path / "raw"
    user = bench_inproc("run", "--backends", "fsdp2", "--gpus", 2, "--device", "cpu", "--model",
                 "tests.user_model:factory", "--batch-size", 4, "--warmup", 2, "--steps", 2, "--windows", 2,
                 "--results", raw)
    gpt = bench_inproc("run", "--backends", "ds_zero3", "--gpus", 2, "--device", "cpu", "--model", "gpt-micro", "--seq-len",
                16, "--batch-size", 2, "--warmup", 2, "--steps", 2, "--windows", 2, "--activation-checkpointing",
                "--results", raw)
    assert user.returncode == 0 and gpt.returncode == 0, user.stdout + user.stderr + gpt.stdout + gpt.stderr
    recs = {(r["model"], r["backend"]): r for r in records(raw)}
    for key in (("tests.user_model:factory", "fsdp2"), ("gpt-micro", "ds_zero3")):
        rec = recs[key]
        assert rec["status"] == "ok" and rec["replicas_consistent"] is True, rec
    mine = recs[("tests.user_model:factory", "fsdp2")]
    assert mine["flops_per_sample"] is None and mine["optimizer"] == "adamw"  # not counted in the harness
    z3 = recs[("gpt-micro", "ds_zero3")]
    assert z3["options"] == {"activation_checkpointing": True}
    assert z3["backend_info"]["activation_checkpointing_blocks"] == 2
    assert z3["tokens_per_second"] == pytest.approx(z3["throughput"] * 16)
    assert "sample/s global" in user.stdout and "tokens/s global" in gpt.stdout


# --- bench run --find-max-model -------------------------------------------------------------------------------------

def test_one_workload_descriptor_says_kind_unit_shape_and_default_optimizer():
    """bench/core/workloads.py classifies a model once: of() for a name and its flags, of_record() for records and a
    report's rows (sizes as ints where a table holds NaN); the key lists that group runs are built from FIELDS."""
    assert workloads.of("resnet50", 224) == workloads.Workload("resnet50", "vision", 224)
    gpt = workloads.of_record({"model": "gpt-tiny", "image_size": float("nan"), "seq_len": 64.0})
    assert (gpt.kind, gpt.unit, gpt.shape, gpt.optimizer) == ("language", "seq", "seq 64", "adamw")
    user = workloads.of_record({"model": "tests.user_model:factory", "optimizer": "sgd"})
    assert (user.kind, user.unit, user.shape, user.optimizer) == ("custom", "sample", "", "sgd")
    assert workloads.of("vit_b_16", 224).default_optimizer == "sgd" and cfg_for().workload.kind == "language"
    from bench.report import common
    from bench.report.inputbound import SAME

    for keys in (results.CONFIG_KEYS, common.BASELINE_MATCH, common.WORKLOAD, common.CSV_FIRST, SAME):
        assert set(workloads.FIELDS) <= set(keys), keys


def test_a_user_model_scores_its_samples_by_its_own_loss_with_no_accuracy():
    """Evaluation asked a user's model for cross-entropy and top-1 whatever its loss: a model with its own loss and
    targets that are not class indices crashed there (tests/user_model.py regression)."""
    workload = models.workload("tests.user_model:regression", None, None, False)
    out, y = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 0.0, 1.0])
    losses, correct = workload.per_sample(out, y)
    assert losses.tolist() == [0.0, 4.0, 9.0] and correct is None
    classifier = models.workload("tests.user_model:factory", None, None, False)
    losses, correct = classifier.per_sample(torch.tensor([[0.0, 5.0], [5.0, 0.0]]), torch.tensor([1, 1]))
    assert correct.tolist() == [1.0, 0.0] and losses[0] < losses[1]


@pytest.mark.slow
def test_a_user_model_with_its_own_loss_trains_verifies_and_evaluates(tmp_path):
    """The model (``regression``, watched) also says when Python's cyclic garbage collector was on: off while each
    rank builds it (bench/rank/startup.py); in the run's two ranks under torchrun off at every loss too (the timed loop's
    policy: collections between windows only), in verify's four rank processes (2 under torchrun, the reference and its
    twin in process) on at every loss, as a user's script has it."""
    model = ["--model", "tests.user_model:regression_watched", "--device", "cpu", "--gpus", 2]
    run = bench_inproc("run", "--backends", "ddp", *model, "--batch-size", 4, "--warmup", 2, "--steps", 2, "--windows", 2,
                "--eval", "--eval-samples", 9, "--results", tmp_path / "run",
                env={"BENCH_TEST_GC_LOG": tmp_path / "gc-run.log"})
    assert run.returncode == 0, run.stdout + run.stderr
    [rec] = records(tmp_path / "run")
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True, rec["reason"]
    assert rec["eval_samples"] == 9 and rec["eval_loss"] > 0 and rec["eval_accuracy"] is None
    verify = bench_inproc("verify", "--backends", "ddp", *model, "--steps", 4, "--results", tmp_path / "verify",
                          env={"BENCH_TEST_GC_LOG": tmp_path / "gc-verify.log"})
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "| ddp     │ 2 " not in verify.stdout and " pass " in verify.stdout
    for log, losses, count in (("gc-run.log", "False", 2), ("gc-verify.log", "True", 4)):
        ranks: dict[str, list[tuple[str, str]]] = {}
        for pid, what, on, where in (ln.split() for ln in (tmp_path / log).read_text().splitlines()):
            if where == "rank":
                ranks.setdefault(pid, []).append((what, on))
        assert len(ranks) == count, (log, ranks)
        for calls in ranks.values():  # built (the factory is asked twice) with the collector off, then every loss
            built = calls.index(("loss", losses))
            assert built and set(calls[:built]) == {("set-up", "False")}, (log, calls)
            assert set(calls[built:]) == {("loss", losses)} and len(calls) - built >= 4, (log, calls)
    assert rec["gc_policy"] == ("automatic collection off in every rank from set-up on; one full collection before "
                                "warm-up and gc.collect(1) before each timed window, outside it (torchtitan's policy)")
    report = bench_inproc("report", "--results", tmp_path / "run", "--out", tmp_path / "rep")
    assert report.returncode == 0, report.stderr
    assert "| none: scored by its own loss |" in (tmp_path / "rep" / "REPORT.md").read_text()


def test_the_model_search_walks_the_ladder_up_to_the_first_size_that_does_not_fit():
    from bench.core import searches
    from bench.plan import maxmodel as _maxmodel

    cfg = cfg_for(seq_len=16)
    answers = {"gpt-micro": "ok", "gpt-tiny": "ok", "gpt-small": "out of memory: batch 2 ...", "gpt-medium": "ok"}
    asked = []

    def probe(model):
        asked.append(model)
        ok = answers[model] == "ok"
        return {"status": "ok" if ok else "failed", "reason": None if ok else answers[model], "run_id": model,
                "state_bytes": [{"parameters": 1}] if ok else None}

    row = _maxmodel.search(cfg, ["gpt-micro", "gpt-tiny", "gpt-small", "gpt-medium"], probe)
    assert asked == ["gpt-micro", "gpt-tiny", "gpt-small"]  # nothing above the first size that ran out of memory
    assert (row["max_model"], row["capped"], row["error"]) == ("gpt-tiny", False, None)
    assert row["max_parameters"] == workloads.gpt_parameters("gpt-tiny", 16)
    assert [p["result"] for p in row["probes"]] == ["fits", "fits", "out of memory"]
    assert searches.max_model(row) == "gpt-tiny (5.3 M parameters)"
    answers["gpt-micro"] = "rank 0 exited with code 1"
    row = _maxmodel.search(cfg, ["gpt-micro", "gpt-tiny"], probe)
    assert (row["max_model"], row["error"]) == (None, "rank 0 exited with code 1")
    assert searches.max_model(row) == "error: rank 0 exited with code 1"
    answers["gpt-micro"] = "ok"
    row = _maxmodel.search(cfg, ["gpt-micro", "gpt-tiny"], probe)
    assert row["capped"] and searches.max_model(row).endswith("the ladder's largest: nothing ran out of memory")


def test_a_rung_the_host_cannot_even_build_is_not_launched(monkeypatch):
    """Every rank built the whole fp32 model on the host before sharding it: ~27 GB per rank for gpt-6.7b, 216 GB with 8
    ranks. A rung whose build does not fit the host's available memory stops the walk with that reason, unlaunched;
    FSDP2's probes build only their shard (meta_init) and need a world size's share of it."""
    import psutil

    from bench.core import searches
    from bench.plan import maxmodel as _maxmodel

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("vm", (), {"available": 60 * 2 ** 30})())
    ddp = cfg_for("gpt-1.3b", backend="ddp", launcher="torchrun", world_size=8, seq_len=1024)
    fsdp2 = cfg_for("gpt-1.3b", backend="fsdp2", launcher="torchrun", world_size=8, seq_len=1024)
    params = workloads.gpt_parameters("gpt-6.7b", 1024)
    assert _maxmodel.host_need(ddp, "gpt-6.7b") == (int(1.25 * 8 * 4 * params), "model")
    assert _maxmodel.host_need(fsdp2, "gpt-6.7b") == (int(1.25 * 8 * 4 * params / 8), "shard")
    asked = []

    def probe(model):
        asked.append(model)
        return {"status": "ok", "reason": None, "run_id": model, "state_bytes": None}

    row = _maxmodel.search(ddp, ["gpt-1.3b", "gpt-2.7b", "gpt-6.7b"], probe)
    assert asked == ["gpt-1.3b"]  # gpt-2.7b x 8 ranks (~100 GiB to build) is not launched on 60 GiB
    assert (row["max_model"], row["capped"], row["error"]) == ("gpt-1.3b", False, None)
    assert row["host_limit"] == ("host memory: building gpt-2.7b takes ~98.7 GiB here (8 rank(s) x the fp32 model), "
                                 "60.0 GiB available; not launched")
    assert searches.max_model(row) == f"gpt-1.3b ({row['max_parameters'] / 1e6:,.1f} M parameters); the next size " \
                                      + row["host_limit"]
    asked.clear()
    row = _maxmodel.search(fsdp2, ["gpt-1.3b", "gpt-2.7b", "gpt-6.7b"], probe)
    assert asked == ["gpt-1.3b", "gpt-2.7b", "gpt-6.7b"] and row["capped"] and row["host_limit"] is None
    from bench.launch import default_timeout

    assert _maxmodel.probe_timeout(ddp, "gpt-6.7b") == pytest.approx(default_timeout(ddp) + 60 * params / 1e9)


@pytest.mark.parametrize("args,message", [
    (["--ladder", "gpt-tiny,gpt-micro"], "bench: error: --ladder gpt-tiny,gpt-micro: give each size once, smallest "
                                         "first"),
    (["--ladder", "gpt-micro,resnet50"], "bench: error: --ladder 'gpt-micro,resnet50': resnet50; choose GPT sizes "
                                         "from gpt-micro, "),
    (["--model", "gpt-tiny"], "bench: error: --find-max-model walks the GPT ladder: give the sizes with --ladder, "
                              "not --model gpt-tiny"),
    (["--find-max-batch"], "bench: error: --find-max-model runs no timed run; search one thing at a time"),
])
def test_bad_model_search_input_is_one_line(results_dir, args, message, capsys):
    code, err = cli_error(capsys, "run", "--find-max-model", "--backends", "ddp", "--gpus", 2, "--device", "cpu",
                          *args, "--results", results_dir)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message), err
    code, err = cli_error(capsys, "run", "--ladder", "gpt-micro", "--device", "cpu", "--results", results_dir)
    assert code == 2 and err.strip() == "bench: error: --ladder is for --find-max-model"


@pytest.mark.slow
def test_find_max_model_on_two_ranks_measures_the_shards_and_the_report_shows_them(tmp_path):
    from tests.test_report import make, run_report, write

    raw = tmp_path / "raw"
    proc = bench_inproc("run", "--find-max-model", "--backends", "ddp,fsdp2", "--gpus", 2, "--device", "cpu", "--ladder",
                 "gpt-micro,gpt-tiny", "--seq-len", 16, "--batch-size", 2, "--memory-limit-gib", 2, "--results", raw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = (raw / "maxmodel").glob("summary-*.json")
    doc = json.loads(path.read_text())
    rows = {r["backend"]: r for r in doc["rows"]}
    assert doc["ladder"] == ["gpt-micro", "gpt-tiny"] and doc["memory_limit_gib"] == 2
    for row in rows.values():
        assert (row["max_model"], row["capped"], row["optimizer"], row["seq_len"]) == ("gpt-tiny", True, "adamw", 16)
    ddp, fsdp2 = (rows[b]["probes"][-1]["state_bytes"] for b in ("ddp", "fsdp2"))
    params = workloads.gpt_parameters("gpt-tiny", 16)
    # DDP: the whole model on each rank, its gradient, AdamW's two moments; FSDP2: half of each, per rank
    assert [s["parameters"] for s in ddp] == [4 * params] * 2 and ddp[0]["optimizer_state"] >= 8 * params
    assert max(s["parameters"] for s in fsdp2) < 0.55 * 4 * params
    assert max(s["optimizer_state"] for s in fsdp2) < 0.55 * ddp[0]["optimizer_state"]
    assert "largest model that trains: gpt-tiny (5.3 M parameters), the ladder's largest" in proc.stdout
    # FSDP2's probes never hold the whole model on a rank: built on the meta device, each rank materialises its shard
    inits = {json.loads(p.read_text())["backend"]: json.loads(p.read_text())["backend_info"].get("init")
             for p in (raw / "maxmodel").glob("*.json") if not p.name.startswith("summary")}
    assert inits == {"ddp": None, "fsdp2": "meta device, each rank's shard materialised"}
    out = tmp_path / "rep"
    write(tmp_path, make("ddp", 2, 100.0, device="cpu"))  # a report needs a timed record beside the summary
    assert run_report(raw, out)[0] == 0
    md = (out / "REPORT.md").read_text()
    section = md.split("## Largest model that trains (bench run --find-max-model)")[1]
    assert "| ddp | 2 | fp32 | gpt-tiny (5.3 M parameters), the ladder's largest: nothing ran out of memory | 0.020 |" \
        in section and "![max model](plots/maxmodel-" in section


@pytest.mark.gpu
def test_a_gpt_on_a_gpu_has_its_memory_broken_down_with_activations(gpu_plan):
    """On a GPU (the GPU check's gpt-memory launch: ddp and fsdp2): tokens/s, MFU from the FLOP counter, and the
    per-rank breakdown with the rest of the peak (activations and buffers) measured against the device's peak
    allocated bytes."""
    from backends import models

    # AdamW keeps two fp32 moments per element and a 4-byte `step` tensor per parameter tensor
    tensors = len(list(models.workload("gpt-tiny", None, 256, False).build().parameters()))
    for rec in [gpu_plan.record("gpt-memory", b) for b in ("ddp", "fsdp2")]:
        [state] = rec["state_bytes"]
        params = workloads.gpt_parameters("gpt-tiny", 256)
        assert state["parameters"] == 4 * params, rec["backend"]
        assert state["optimizer_state"] == 8 * params + 4 * tensors, rec["backend"]
        assert state["activations"] > 0 and rec["tokens_per_second"] == pytest.approx(rec["throughput"] * 256)
        assert rec["flops_per_sample"] == pytest.approx(flops.flops_per_sample("gpt-tiny", None, 256))
        assert rec["mfu"] is None or 0 < rec["mfu"] < 1


def test_the_report_reads_the_newest_readable_model_search_and_says_which_it_skipped(tmp_path):
    from bench.report import maxmodel

    folder = tmp_path / "maxmodel"
    folder.mkdir()
    (folder / "summary-1.json").write_text(json.dumps({"schema": 1, "kind": "maxmodel", "rows": [], "ladder": []}))
    (folder / "summary-2.json").write_text("{half")
    (folder / "summary-3.json").write_text(json.dumps({"schema": 1, "kind": "maxbatch"}))
    warned = []
    doc = maxmodel.latest(tmp_path, warned.append)
    assert doc["_path"] == str(folder / "summary-1.json")
    assert warned[0] == f"skipping {folder / 'summary-3.json'}: not a schema-1 max-model summary"
    assert warned[1].startswith(f"skipping {folder / 'summary-2.json'}: not a readable max-model summary (JSONDecode")
    assert maxmodel.section(tmp_path / "none", tmp_path, warned.append) == []


def test_the_gate_compares_a_gpt_workload_only_with_itself(tmp_path, capsys):
    from tests.test_compare import gate, pair, runs

    gpt = {"model": "gpt-125m", "image_size": None, "seq_len": 1024, "optimizer": "adamw", "batch_per_device": 8}
    base = runs(1, **gpt) + runs(3)  # the GPT configuration, and a ResNet one
    b, c = pair(tmp_path, base, runs(2, scale=1.25, **gpt) + runs(4, **{**gpt, "optimizer": "sgd"}))
    code, _, out, _ = gate(capsys, b, c)
    assert code == 1
    header = next(line for line in out.splitlines() if line.startswith("| config"))
    assert "| baseline samples/s (img or seq) | current samples/s (img or seq) |" in header
    slower = next(line for line in out.splitlines() if line.startswith("| ddp x2 gpt-125m seq 1024 b8/dev fp32 adamw"))
    assert "**slower**" in slower and "| 0.80" in slower
    # the same model trained with SGD is another configuration: no baseline for it, never compared with AdamW's
    assert any(line.startswith("| ddp x2 gpt-125m seq 1024 b8/dev fp32 |") for line in out.splitlines())


def test_the_verdict_and_the_tables_never_mix_two_workloads(tmp_path):
    from tests.test_report import make, run_report, write

    gpt = {"model": "gpt-tiny", "image_size": None, "seq_len": 64, "optimizer": "adamw"}
    raw = write(tmp_path, *[make("ddp", 2, 100.0, stamp=f"2026010{i}T000000Z", **gpt) for i in range(3)],
                *[make("fsdp2", 2, 300.0, stamp=f"2026010{i}T000000Z") for i in range(3)])
    out = tmp_path / "rep"
    assert run_report(raw, out)[0] == 0
    md = (out / "REPORT.md").read_text()
    # fsdp2 is 3x faster, but on a ResNet: each workload has its own verdict, table and units
    # (the table behind the report mixes the two, so its image sizes and sequence lengths are floats or NaN: 224px,
    # not 224.0px)
    assert "gpt-tiny seq 64 (adamw) batch 64/device synthetic, fp32, 2 GPUs\n\n**Only ddp ran here" in md
    assert "resnet50 224px batch 64/device synthetic, fp32, 2 GPUs\n\n**Only fsdp2 ran here" in md
    assert "### gpt-tiny seq 64 (adamw), batch 64/device, fp32, synthetic data" in md
    assert "| 100.0 seq/s |" in md and "| 6,400 tokens/s |" in md and "| 300.0 img/s |" in md


@pytest.mark.slow
def test_cnn_tiny_is_planned_and_built_without_torchvision():
    """Importing torchvision imports torch._dynamo (1.5 s of CPU): the planner's model checks, the rank's model
    build and the numerics probe's search for residual blocks import it for a torchvision model only, so a cnn-tiny
    run (the tests' TINY) and its harness start without."""
    code = ("import sys; from bench.plan.sweep import check_image_size, check_model; from backends import models; "
            "check_model('cnn-tiny'); check_image_size('cnn-tiny', 32); "
            "model = models.workload('cnn-tiny', 32, None, False).build(); "
            "assert models.find_blocks(model) == list(model.blocks); "  # the numerics probe asks it in every rank
            "print(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
