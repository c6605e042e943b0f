"""The result record: schema, environment metadata, atomic save and tolerant load.

One JSON file per run. Reports and the CI gate read these keys, so their names are fixed; bump SCHEMA
when a key changes meaning. Units are in the key names (``_bytes``, ``_seconds``) or documented here:
``throughput`` is global samples (images) per second.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import uuid
import warnings
from pathlib import Path

from bench.core import workloads

SCHEMA = 2  # 2: peaks are the timed windows' (warm-up peaks separate); repeats; cudnn knob
LOADER_SCHEMA = "loader-1"  # bench loader's records (RESULTS/loader), read by the report's "Input bound" section
STATUSES = ("ok", "skipped", "failed")

# Every record carries these keys (values may be null when a run did not get that far).
REQUIRED_KEYS = (
    "schema", "run_id", "status", "reason", "backend", "launcher", "world_size", "device_type", "model",
    "image_size", "precision", "batch_per_device", "global_batch", "warmup_steps", "steps_per_window",
    "window_seconds", "throughput", "throughput_ci95", "memory", "memory_imbalance", "data",
    "replicas_consistent", "cudnn_benchmark", "repeat_index", "repeats", "env",
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def new_run_id(backend: str, world_size: int) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{backend}-w{world_size}-{uuid.uuid4().hex[:6]}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def skeleton(cfg: dict, run_id: str, env: dict) -> dict:
    """A record with every required key, filled from the run's config; measurement keys are null."""
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "status": None,
        "reason": None,
        "note": cfg.get("note"),
        "backend": cfg["backend"],
        "launcher": cfg["launcher"],
        "world_size": cfg["world_size"],
        "nnodes": cfg.get("nnodes", 1),
        "nproc_per_node": cfg["world_size"] // cfg.get("nnodes", 1),
        "device_type": cfg["device_type"],
        "model": cfg["model"],
        "image_size": cfg["image_size"],
        "seq_len": cfg.get("seq_len"),
        "optimizer": workloads.of_record(cfg).optimizer,
        "tokens_per_second": None,
        "precision": cfg["precision"],
        "batch_per_device": cfg["batch_size"],
        "global_batch": cfg["batch_size"] * cfg["world_size"],
        "warmup_steps": cfg["warmup"],
        "steps_per_window": cfg["steps"],
        "window_s": cfg.get("window_s"),  # windows sized by time: the seconds asked for (steps_per_window: the count)
        "order_seed": cfg.get("order_seed"),
        "order_index": cfg.get("order_index"),
        "windows": cfg["windows"],
        "window_seconds": [],
        "throughput": None,
        "throughput_ci95": None,
        "per_device_throughput": None,
        "memory": [],
        "memory_imbalance": None,
        "data": cfg.get("data", "synthetic"),
        "data_dir": cfg.get("data_dir"),
        "workers": cfg.get("workers"),
        "data_wait_seconds": None,
        "loader": cfg.get("loader"),
        "decode": cfg.get("decode"),
        "empty_classes": None,
        "options": cfg.get("options", {}),
        "cudnn_benchmark": cfg.get("cudnn_benchmark"),
        "repeat_index": cfg.get("repeat_index", 1),
        "repeats": cfg.get("repeats", 1),
        "replicas_consistent": None,
        "flops_per_sample": cfg.get("flops_per_sample"),
        "eval": cfg.get("eval", False),
        "eval_samples": None,
        "eval_loss": None,
        "eval_accuracy": None,
        "eval_throughput": None,
        "env": env,
    }


def save(record: dict, directory: str | os.PathLike) -> Path:
    """Write ``record`` as ``<directory>/<run_id>.json`` atomically and without ever overwriting."""
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"record lacks keys {missing}")
    if record["status"] not in STATUSES:
        raise ValueError(f"record status {record['status']!r} is not one of {STATUSES}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{record['run_id']}.json"
    write_json_atomic(record, final)
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file (read once, at import: umask is process-wide)


def user_cache_dir(name: str, variable: str) -> Path:
    """A cache of this machine's user, shared by every checkout: ``$variable`` when set, else
    ``$XDG_CACHE_HOME/torch-parallel-bench/<name>``, else ``~/.cache/torch-parallel-bench/<name>``."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch-parallel-bench" / name


def write_json_atomic(obj, final: Path, overwrite: bool = False) -> None:
    """Write JSON to a temporary file in the same directory, fsync it, then move it into place: a reader
    sees either no file or the whole file. Without ``overwrite`` the file is hard-linked into place, which
    fails with FileExistsError rather than replace an existing file, even if another writer raced us."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=final.parent)
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp's 0600 would hide a shared results directory's records from the others
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, final)
        else:
            os.link(tmp, final)
    except OSError as e:
        if e.filename is None:  # a failed write (a full disk, a quota) names no file: name the one it was for
            raise OSError(e.errno, e.strerror, str(final)) from e
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_json(files, what: str, warn):
    """(path, parsed JSON) for each of ``files`` in order; one that cannot be read or parsed is skipped with one
    warning naming it and ``what`` it should have been. Every reader of RESULTS/ files goes through here."""
    for f in files:
        try:
            yield f, json.loads(Path(f).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            warn(f"skipping {f}: not a readable {what} ({type(e).__name__}: {e})")


def load(path: str | os.PathLike, warn=warnings.warn) -> list[dict]:
    """Records from a file or a directory (non-recursive, ``*.json``).

    Unreadable, half-written or other-schema files are skipped with one warning each, never raised.
    A file may hold one record or a list of records (a saved baseline).
    """
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    out = []
    for f, data in read_json(files, "JSON record", warn):
        items = data.get("records") if isinstance(data, dict) and "records" in data else data
        for rec in items if isinstance(items, list) else [items]:
            if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
                found = rec.get("schema") if isinstance(rec, dict) else type(rec).__name__
                warn(f"skipping {f}: schema {found!r}, this version reads schema {SCHEMA}")
                continue
            missing = [k for k in REQUIRED_KEYS if k not in rec]
            if missing:
                warn(f"skipping {f}: record lacks keys {missing}")
                continue
            rec.setdefault("_path", str(f))
            out.append(rec)
    return out


# ---------------------------------------------------------------------------------------------------
# Grouping: runs of the same configuration on the same kind of hardware. Reports and the regression gate
# both group with this, so "the same configuration" means one thing across the suite.

CONFIG_KEYS = ("backend", "world_size", *workloads.FIELDS, "precision", "batch_per_device", "data", "loader", "decode",
               "device_type", "hardware", "options", "cudnn_benchmark", "nnodes")


def hardware(rec: dict) -> str:
    """The device model the numbers came from: the GPU name, or the CPU model for CPU runs."""
    env = rec.get("env") or {}
    if rec.get("device_type") == "cuda":
        names = [m.get("device_name") for m in rec.get("memory") or [] if m.get("device_name")]
        names = names or env.get("gpu_names") or ["unknown GPU"]
        return names[0]
    return f"CPU: {env.get('cpu_model') or 'unknown'}"


def config_key(rec: dict) -> tuple:
    """A hashable key: equal for records of the same configuration on the same hardware model."""
    values = {k: rec.get(k) for k in CONFIG_KEYS}
    values["hardware"] = hardware(rec)
    values["nnodes"] = rec.get("nnodes") or 1
    # records from before --optimizer trained the torchvision models with SGD
    values["optimizer"] = workloads.of_record(rec).optimizer
    if rec.get("data") not in (None, "synthetic"):  # records from before --loader read with torchvision on the CPU
        values["loader"], values["decode"] = rec.get("loader") or "torchvision", rec.get("decode") or "cpu"
    values["options"] = json.dumps(rec.get("options") or {}, sort_keys=True)
    return tuple(values[k] for k in CONFIG_KEYS)
