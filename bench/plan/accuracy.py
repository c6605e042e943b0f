"""``bench run --to-accuracy A``: train every planned configuration until its held-out top-1 reaches A or
``--max-epochs``, under a learning-rate schedule scaled to its global batch, each run its own process tree (the rank
task ``accuracy``: bench/rank/accuracy.py); records in ``RESULTS/accuracy/``. Planned for ``bench run`` (which
dispatches here, as it does to maxbatch.py and maxmodel.py beside this file); the report's *Time to accuracy* section
and ``bench compare`` read the records through bench/core/accuracy_records.py.

The schedule's flags (``--base-lr`` at ``--base-batch``, ``--lr-scaling``, ``--warmup-epochs``, ``--lr-decay``,
``--momentum``, ``--weight-decay``) travel to the ranks in the spec and come back in the record. ``--lr-scaling`` takes
several rules, comma-separated: every configuration runs once under each, except where rules give the same learning
rate (at ``--base-batch`` itself every rule gives ``--base-lr``, so at world size 1 linear, sqrt and none are one
training): there one run stands for all of them, labelled with each (``linear = none``; ``rules`` below, and the
record's ``accuracy_settings.rules``). ``--repeat N`` runs each N times from seeds
0..N-1 (the model's initialisation and the data order; the learnable task itself is fixed), so the spread of the time
to accuracy includes the spread of convergence, which the verdict needs before it names a fastest backend.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from bench.core.accuracy_records import KIND, rules_label, rules_of
from bench.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from bench.core.schedule import DECAYS, RULES, scaled_lr

DEFAULTS = {"max_epochs": 20, "eval_every": 1, "lr_scaling": "linear", "warmup_epochs": 0.0, "lr_decay": "cosine"}
LEARNABLE_MODEL, LEARNABLE_IMAGE_SIZE = "cnn-tiny", 16  # --data learnable without --model / --image-size
# the flags that mean something only with --to-accuracy (argparse dest names)
OWN_FLAGS = ("max_epochs", "eval_every", "base_lr", "base_batch", "lr_scaling", "warmup_epochs", "lr_decay",
             "momentum", "weight_decay", "train_samples")
# bench run's flags that go with a timed sweep only
NOT_WITH = {"find_max_batch": "--find-max-batch", "find_max_model": "--find-max-model", "trace": "--trace",
            "external": "--external", "nnodes": "--nnodes", "wait_quiet": "--wait-quiet-s", "resume": "--resume"}
# per sample and epoch, the time limit's allowance (a guard against hangs, not a prediction: --timeout-s overrides it)
SECONDS_PER_SAMPLE = {"cpu": 0.05, "cuda": 0.005}


def check_flags(args) -> None:
    """Before planning: --to-accuracy's own flags without it, learnable data without it, and the modes it cannot go
    with, each refused in one line; with it, the learnable task's default model and image size."""
    if getattr(args, "to_accuracy", None) is None:
        given = [f"--{d.replace('_', '-')}" for d in OWN_FLAGS if getattr(args, d, None) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --to-accuracy A")
        if args.data == "learnable":
            raise UsageError("--data learnable is --to-accuracy's task (a model can learn it); a timed run uses "
                             "--data synthetic or imagenet")
        return
    clash = [flag for dest, flag in NOT_WITH.items() if getattr(args, dest, None) not in (None, False)
             and not (dest == "nnodes" and args.nnodes == 1)]
    if clash:
        raise UsageError(f"--to-accuracy trains to a target in epochs; it cannot go with {', '.join(clash)}")
    if args.data == "synthetic":
        raise UsageError("--to-accuracy needs data a model can learn: --data learnable (a synthetic task) or --data "
                         "imagenet --data-dir DIR; --data synthetic is one fixed batch with random labels")
    if args.data == "learnable" and args.model is None:
        args.model = LEARNABLE_MODEL
        if args.image_size is None:
            args.image_size = LEARNABLE_IMAGE_SIZE


def settings(args, configs) -> dict:
    """The spec's ``accuracy`` settings from the flags, every one checked (one line each); ``scaling`` is the list of
    rules (one run each)."""
    from bench.core import workloads

    a = args.to_accuracy
    if not 0 < a <= 1:
        raise UsageError(f"--to-accuracy {a:g}: the held-out top-1 to reach, as a fraction: 0 < A <= 1 (0.9 = 90%)")
    pick = lambda dest: DEFAULTS[dest] if getattr(args, dest) is None else getattr(args, dest)  # noqa: E731
    max_epochs, eval_every, warmup = pick("max_epochs"), pick("eval_every"), pick("warmup_epochs")
    if max_epochs < 1:
        raise UsageError(f"--max-epochs {max_epochs}: a positive number of epochs")
    if eval_every < 1:
        raise UsageError(f"--eval-every {eval_every}: a positive number of epochs")
    if not 0 <= warmup < max_epochs:
        raise UsageError(f"--warmup-epochs {warmup:g}: from 0 to below --max-epochs ({max_epochs})")
    rules = [r.strip() for r in pick("lr_scaling").split(",") if r.strip()]
    bad = [r for r in rules if r not in RULES]
    if bad or not rules:
        raise UsageError(f"--lr-scaling {args.lr_scaling!r}: choose from {', '.join(RULES)} (or several, "
                         "comma-separated)")
    decay = pick("lr_decay")
    if decay not in DECAYS:
        raise UsageError(f"--lr-decay {decay!r}: choose from {', '.join(DECAYS)}")
    cfg = configs[0]
    if workloads.of(cfg.model).kind != "vision":
        raise UsageError(f"--to-accuracy trains an image classifier to a top-1 target; {cfg.model} is not one (a "
                         "torchvision model or cnn-tiny)")
    from backends.base import OPTIMIZERS

    base_lr = OPTIMIZERS[cfg.optimizer][1]["lr"] if args.base_lr is None else args.base_lr
    if not base_lr > 0:
        raise UsageError(f"--base-lr {base_lr:g}: a positive learning rate")
    base_batch = cfg.batch_size if args.base_batch is None else args.base_batch
    if base_batch < 1:
        raise UsageError(f"--base-batch {base_batch}: a positive number of samples")
    if args.momentum is not None and not 0 <= args.momentum < 1:
        raise UsageError(f"--momentum {args.momentum:g}: from 0 to below 1")
    if args.weight_decay is not None and not args.weight_decay >= 0:
        raise UsageError(f"--weight-decay {args.weight_decay:g}: 0 or more")
    train_samples = None
    if cfg.data == "learnable":
        from bench.rank import learnable

        train_samples = learnable.TRAIN_SAMPLES if args.train_samples is None else args.train_samples
        biggest = max(configs, key=lambda c: c.global_batch)
        if train_samples // biggest.world_size // biggest.batch_size < 1:
            raise UsageError(f"--train-samples {train_samples}: not one step of {biggest.global_batch} samples "
                             f"({biggest.backend} x{biggest.world_size}); give more samples or a smaller batch")
    else:
        if args.train_samples is not None:
            raise UsageError("--train-samples sizes --data learnable's training set; imagenet's is DIR/train")
        if (args.loader or "torchvision") != "torchvision":
            raise UsageError(f"--to-accuracy reads real data with the torchvision loader (its epochs have a known "
                             f"length); not --loader {args.loader}")
        from bench.rank import data

        data.check_eval(args.data_dir)  # the held-out set is DIR/val
    return {"target": a, "max_epochs": max_epochs, "eval_every": eval_every, "base_lr": base_lr,
            "base_batch": base_batch, "scaling": rules, "warmup_epochs": warmup, "decay": decay,
            "momentum": args.momentum, "weight_decay": args.weight_decay, "train_samples": train_samples}


def default_timeout(cfg, train_samples: int, max_epochs: int) -> float:
    """A guard against hangs: start-up, and an allowance per sample trained or evaluated over every planned epoch."""
    per = SECONDS_PER_SAMPLE["cuda" if cfg.device_type == "cuda" else "cpu"]
    return 300.0 + per * (train_samples + cfg.eval_samples) * max_epochs


def rule_groups(settings: dict, global_batch: int) -> list[list[str]]:
    """The scaling rules of ``settings`` that give one configuration (``global_batch``) different runs: rules whose
    learning rate at that batch is the same train the same model the same way, so they are one run (the first rule
    runs, labelled with all of them)."""
    groups: dict[float, list[str]] = {}
    for rule in settings["scaling"]:
        lr = scaled_lr(settings["base_lr"], settings["base_batch"], global_batch, rule)
        same = next((k for k in groups if abs(k - lr) <= 1e-12 * max(1.0, abs(lr))), lr)
        groups.setdefault(same, []).append(rule)
    return list(groups.values())


def run(args, configs, notes) -> int:
    import backends
    from bench import launch
    from bench.plan import progress
    from bench.plan.sweep import check_writable, interleave, loader_unavailable
    from bench.core import environment
    from bench.launch import machine

    s = settings(args, configs)
    results_dir = Path(args.results) / KIND
    check_writable(results_dir)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    train_samples = s["train_samples"] or _train_images(args.data_dir)
    # one run per configuration and rule, but one for rules that give its global batch the same rate
    runs = [(dataclasses.replace(c, seed=c.repeat_index - 1), rules)
            for c in interleave(configs, args.repeat or 1, shuffle=False) for rules in rule_groups(s, c.global_batch)]
    env_meta = environment.collect_env(backends.environment(c.backend for c, _ in runs))
    records = []
    with progress.Sweep(len(runs)) as bar:
        for cfg, rules in runs:
            rep = f" (repeat {cfg.repeat_index}/{cfg.repeats}, seed {cfg.seed})" if cfg.repeats > 1 else ""
            same = " (the same rate: one run)" if len(rules) > 1 else ""
            bar.start(f"{cfg.backend} x{cfg.world_size} to {100 * s['target']:g}% top-1: {cfg.model} "
                      f"{cfg.data} data, global batch {cfg.global_batch}, {rules_label(rules)} scaling{same}{rep}")
            spec = {**s, "scaling": rules[0], "rules": rules}
            with machine.Watch(cfg.device_type, machine.run_gpus(cfg.device_type, cfg.world_size)) as watch:
                rec = launch.run_one(cfg, results_dir, env_meta, backends.create(cfg.backend),
                                     unavailable=loader_unavailable(cfg),
                                     extra_spec={"task": KIND, KIND: spec},
                                     timeout=default_timeout(cfg, train_samples, s["max_epochs"]))
            if rec["status"] == "ok":
                rec = reword(machine.attach(rec, watch, results_dir), results_dir)
            else:
                rec = tag(rec, results_dir, spec)
            records.append(rec)
            bar.finish(one_line(rec))
    print("\n".join(table(records)))
    print(f"\nrecords: {results_dir}; the report's 'Time to accuracy' section: python -m bench report --results "
          f"{args.results}")
    return EXIT_FAILED if any(r["status"] == "failed" or r.get("replicas_consistent") is False for r in records) \
        else EXIT_OK


# What a to-accuracy run's machine watch covered: no timed windows, its training from the first step to the last
# evaluation (the record's windows_wall_span)
DURING = "its training (first step to last evaluation)"


def reword(rec: dict, results_dir: Path) -> dict:
    """A disturbed to-accuracy run's reasons in its own words: the harness's watch (bench/launch/machine.py) judges a
    span it calls the timed windows; here that span is the training, which has none."""
    from bench.core import results, trust

    if not rec.get("disturbed") or not isinstance(rec.get("machine"), dict):
        return rec
    rec = {**rec, "disturbed_reasons": trust.machine_reasons(rec["machine"], rec["device_type"], windows=DURING)}
    path = results_dir / f"{rec['run_id']}.json"
    if path.exists():
        results.write_json_atomic({k: v for k, v in rec.items() if not k.startswith("_")}, path, overwrite=True)
    return rec


def tag(rec: dict, results_dir: Path, spec: dict) -> dict:
    """A skipped or failed run's record (written by the launcher, which knows no task) marked as a to-accuracy run's,
    with its settings, so the report and the gate put it beside its configuration's ok runs."""
    from bench.core import results

    rec = {**rec, "task": KIND, "accuracy_settings": spec}
    path = results_dir / f"{rec['run_id']}.json"
    if path.exists():
        results.write_json_atomic({k: v for k, v in rec.items() if not k.startswith("_")}, path, overwrite=True)
    return rec


def _train_images(data_dir: str | None) -> int:
    from bench.rank import folders

    return len(folders.scan(Path(data_dir) / "train")[1]) if data_dir else 0


def one_line(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"{rec['status']}: {rec['reason']}"
    s = rec["schedule"]
    lr = f"lr {s['peak_lr']:.3g} peak ({rules_label(rules_of(rec))}), {rec['final_lr']:.3g} final"
    if rec["reached"]:
        line = (f"reached {100 * rec['curve'][-1]['accuracy']:.1f}% at epoch {rec['epochs_to_accuracy']} (step "
                f"{rec['steps_to_accuracy']}) in {rec['time_to_accuracy_seconds']:.1f} s, of which evaluation "
                f"{rec['eval_seconds_to_accuracy']:.1f} s; {lr}")
    else:
        line = f"{rec['outcome']}; {lr}"
    if rec.get("replicas_consistent") is False:
        line += "; replicas DIFFER"
    return line + (f"; ⚠ disturbed: {'; '.join(rec.get('disturbed_reasons') or [])}" if rec.get("disturbed") else "")


def table(records: list[dict]) -> list[str]:
    from bench.core.text import md_table

    rows = []
    for r in records:
        if r["status"] != "ok":
            rows.append([r["backend"], r["world_size"], r["global_batch"], "-", "-", r["status"], "-", "-", "-"])
            continue
        s = r["schedule"]
        rows.append([r["backend"], r["world_size"], r["global_batch"], rules_label(rules_of(r)), f"{s['peak_lr']:.4g}",
                     r["epochs_to_accuracy"] or "not reached", seconds(r["time_to_accuracy_seconds"]),
                     seconds(r["eval_seconds_to_accuracy"]), f"{100 * r['best_accuracy']:.1f}%"])
    return ["", md_table(["backend", "N", "global batch", "scaling", "peak lr", "epochs to accuracy", "time to accuracy",
                          "of which evaluation", "best top-1"], rows, {1, 2, 4, 5, 6, 7, 8})]


def seconds(x) -> str:
    return "-" if x is None else f"{x:.1f} s"
