"""What the plan, the report and the gate share about ``bench run --to-accuracy``'s records: where they live, how to
read them back, and what makes two of them the same question (bench/plan/accuracy.py runs them, bench/report/accuracy.py
shows them, bench/commands/compare.py gates them)."""
from __future__ import annotations

from pathlib import Path

KIND = "accuracy"  # RESULTS/accuracy/, and the records' ``task``


def rules_label(rules: list[str]) -> str:
    return " = ".join(rules)


# What makes two to-accuracy runs the same question, beside their configuration (results.config_key): the target and
# every setting of the schedule but the rate it scaled to (which follows from them and the global batch)
SETTINGS = ("target", "scaling", "base_lr", "base_batch", "warmup_epochs", "decay", "max_epochs", "eval_every",
            "momentum", "weight_decay", "train_samples")


def is_accuracy(rec: dict) -> bool:
    return rec.get("task") == KIND


def records(src: Path, warn) -> list[dict]:
    """The to-accuracy records in ``src/accuracy/``, and any in ``src`` itself (read quietly: the report warns about
    src's unreadable files once, when it reads the timed runs)."""
    from bench.core import results

    found = []
    for d, say in ((Path(src), lambda m: None), (Path(src) / KIND, warn)):
        if d.is_dir():
            found += [r for r in results.load(d, warn=say) if is_accuracy(r)]
    return found


def rules_of(rec: dict) -> list[str]:
    """The scaling rules a to-accuracy run stands for: one, or several that gave its global batch the same rate."""
    a = rec.get("accuracy_settings") or {}
    return list(a.get("rules") or [a.get("scaling") or (rec.get("schedule") or {}).get("scaling")])


def settings_key(rec: dict) -> tuple:
    a = rec.get("accuracy_settings") or {}
    return tuple((k, a.get(k)) for k in SETTINGS)


def reached_epochs(rec: dict) -> float:
    """Epochs to accuracy; infinity for a run that did not reach the target."""
    return rec["epochs_to_accuracy"] if rec.get("reached") else float("inf")
