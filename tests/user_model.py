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


def broken():
    """A factory that breaks the contract (no batch function): the run fails, and says why."""
    return {"model": torch.nn.Linear(2, 2)}
