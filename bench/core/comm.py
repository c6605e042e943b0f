"""The collectives' vocabulary, shared by the command that measures them, the ranks that time them, the report and
``bench predict``: nccl-tests' bus-bandwidth factors, DDP's bucket size, and how their records are read back."""
from __future__ import annotations

from pathlib import Path

from bench.core.errors import warn

COLLECTIVES_SCHEMA = "collectives-1"
# busbw = algbw x factor(n) (nccl-tests' PERFORMANCE.md): comparable across n and with the links' bandwidth
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "horovod_allreduce": lambda n: 2 * (n - 1) / n}
DDP_BUCKET_MB = 25


def load(results_dir: Path, warn=warn) -> list[dict]:
    """The ok collectives records in RESULTS/collectives."""
    from bench.core.results import read_json

    out = []
    for f, rec in read_json(sorted((Path(results_dir) / "collectives").glob("*.json")), "collectives record", warn):
        if isinstance(rec, dict) and rec.get("schema") == COLLECTIVES_SCHEMA and rec.get("status") == "ok":
            out.append(rec)
    return out
