"""The host-overhead probe's model (``bench overhead``): three small linear blocks on a batch of 4 feature vectors, so
that a step's compute is negligible and its time is what a backend does around it on the host, per step (hooks,
wrappers, copies, bookkeeping, collectives on one rank). That fixed cost is what becomes idle GPU time when the kernels
are fast. Used as ``--model backends.models.overhead:factory`` (bench/core/workloads.py: a user-style factory)."""
import torch

WIDTH = 32
MODEL = "backends.models.overhead:factory"


def factory():
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10))

    def batch(n, generator):
        return torch.randn(n, WIDTH, generator=generator), torch.randint(0, 10, (n,), generator=generator)

    # the blocks FSDP2 shards one by one, as it would a transformer's layers
    return {"model": model, "batch": batch, "blocks": [model[0], model[2], model[4]]}
