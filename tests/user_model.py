"""An example of your own model for ``--model package.module:factory`` (docs/workloads.md: Your own model), used by the
tests: ``--model tests.user_model:factory`` from the repository's root. A small classifier on random feature vectors."""
import torch


def factory():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))

    def batch(n, generator):
        """n samples: 32 random features each, and a class out of 10 (drawn from the generator the harness seeds)."""
        return torch.randn(n, 32, generator=generator), torch.randint(0, 10, (n,), generator=generator)

    # loss: omitted, so cross-entropy; blocks: the modules FSDP2 shards one by one (and checkpointing wraps)
    return {"model": model, "batch": batch, "blocks": [model[0], model[2], model[4]]}


def regression():
    """A model with its own loss and targets that are not classes: one real number per sample from 16 features, mean
    squared error. Evaluation scores it by that loss, sample by sample, with no accuracy."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1), torch.nn.Flatten(0))

    def batch(n, generator):
        x = torch.randn(n, 16, generator=generator)
        return x, x[:, :4].sum(1) + 0.1 * torch.randn(n, generator=generator)

    return {"model": model, "batch": batch, "loss": torch.nn.functional.mse_loss}


def regression_watched():
    """``regression``, saying whether Python's cyclic garbage collector was on when the harness built it (set-up) and
    at each loss it computed (the steps, evaluation): a line per call, appended to $BENCH_TEST_GC_LOG as "PID WHAT ON
    RANK", RANK "rank" in a rank process (``python -m bench.rank``). bench/rank/startup.py: off for set-up, on from
    the first step."""
    import gc
    import os
    import sys

    where = "rank" if sys.argv[0].endswith(os.path.join("bench", "rank", "__main__.py")) else "other"

    def note(what):
        with open(os.environ["BENCH_TEST_GC_LOG"], "a") as f:
            f.write(f"{os.getpid()} {what} {gc.isenabled()} {where}\n")

    def loss(output, target):
        note("loss")
        return torch.nn.functional.mse_loss(output, target)

    note("set-up")
    return {**regression(), "loss": loss}


def broken():
    """A factory that breaks the contract (no batch function): the run fails, and says why."""
    return {"model": torch.nn.Linear(2, 2)}
