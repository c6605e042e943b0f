"""Small stand-ins shared by the in-process tests of the backends, the data shards and the record: a config, a tiny
model that remembers where it was moved, a process group that is rank 0 of 2 without starting one, and fixed batches.
Nothing here starts a process group or launches a run.

torch._dynamo (imported by an optimizer's first step) and torchvision (build_model) are imported here, at collection,
on purpose: `make mutation` forks every mutant's test run from a process that collected the tests and ran none, so
what collection imports is paid once, not seconds per mutant (tests/README.md: Mutation testing)."""
import torch
import torch._dynamo  # noqa: F401
import torchvision  # noqa: F401

from bench.core.config import RunConfig


def cfg_for(backend="ddp", launcher="torchrun", world_size=2, batch_size=3, **over):
    return RunConfig(backend=backend, launcher=launcher, world_size=world_size, device_type="cpu", model="resnet18",
                     image_size=8, batch_size=batch_size, warmup=2, steps=1, windows=1, **over).validate()


class Moved:
    """A model that remembers where ``.to`` moved it: on CPU, ``.to(None)`` and ``.to(cpu)`` look alike."""

    moved_to = "never"

    def to(self, *args, **kwargs):
        self.moved_to = args[0] if args else kwargs.get("device")
        return super().to(*args, **kwargs)


class Tiny(Moved, torch.nn.Sequential):
    pass


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return Tiny(torch.nn.Flatten(), torch.nn.Linear(12, 5))


class NormModel(Moved, torch.nn.Sequential):
    pass


def norm_model():
    """Two residual blocks between a stem with its own BatchNorm and a head: FSDP2's blocks and norm groups."""
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    return NormModel(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), BasicBlock(4, 4), BasicBlock(4, 4),
                     torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 5))


def built(model, name):
    """backends' build_model, handing out ``model`` for a config of backend ``name`` only."""
    def build_model(cfg):
        assert cfg.backend == name, cfg
        return model

    return build_model


def fake_init(b, name, local_rank=0, device=torch.device("cpu")):
    """DDP.init_process_group without a process group: rank 0 of 2, on the CPU (or ``device``, which nothing here
    touches)."""
    def init_process_group(cfg):
        assert cfg.backend == name, cfg
        b.rank, b.world_size, b.local_rank, b.device = 0, 2, local_rank, device

    return init_process_group


def tiny_batches(n, batch=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 2, 2, generator=gen), torch.randint(0, 5, (batch,), generator=gen)) for _ in range(n)]
