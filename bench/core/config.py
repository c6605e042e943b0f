"""One run's configuration: a dataclass that validates itself and travels to the workers as JSON."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from bench.core import workloads
from bench.core.errors import UsageError

PRECISIONS = ("fp32", "fp16", "bf16")
DEVICE_TYPES = ("cuda", "cpu")
ON_OFF = {"on": True, "off": False}
# synthetic: one fixed random batch (throughput); imagenet: a class-folder tree through a real loader; learnable: the
# to-accuracy mode's synthetic task, class patterns plus noise that a model can learn (bench/rank/learnable.py)
DATA_KINDS = ("synthetic", "imagenet", "learnable")

# Untimed steps needed before the timed windows are steady. Step 1 pays lazy initialisation, cuDNN's
# algorithm search and DDP's first iteration; DDP rebuilds its gradient buckets at the start of step 2
# (torch/nn/parallel/distributed.py, _rebuild_buckets). Backends that need more say so (Backend.min_warmup).
MIN_WARMUP = 2

# Defaults that finish quickly: a real ImageNet-size run on GPU; on CPU a small model at a small
# image size, so a 2-core machine runs the whole default suite in a few minutes.
DEFAULTS = {
    "cuda": {"model": "resnet50", "image_size": 224, "batch_size": 64, "warmup": 10, "steps": 10, "windows": 5},
    "cpu": {"model": "resnet18", "image_size": 64, "batch_size": 8, "warmup": 3, "steps": 3, "windows": 5},
}
# Per-device batches that fit the workload, where the device's default does not: a GPT's sample is a sequence of 1024
# tokens on a GPU, and 64 of them would hold ~13 GB of logits alone for gpt-125m, so activations, not the sharded state,
# would decide every comparison of memory. 8 sequences (8,192 tokens) per device.
WORKLOAD_BATCH = {("cuda", "language"): 8}


# The flag that sets each checked field (every error names its flag: docs/command-line.md)
FLAGS = {"world_size": "--gpus", "image_size": "--image-size", "seq_len": "--seq-len", "batch_size": "--batch-size",
         "steps": "--steps", "windows": "--windows", "eval_samples": "--eval-samples", "window_s": "--window-s"}


def default_batch(device_type: str, kind: str) -> int:
    """The per-device batch a run gets when --batch-size is not given (docs/command-line.md: defaults)."""
    return WORKLOAD_BATCH.get((device_type, kind), DEFAULTS[device_type]["batch_size"])


@dataclass
class RunConfig:
    backend: str
    launcher: str
    world_size: int
    device_type: str
    model: str
    image_size: int | None  # vision workloads; None for the others
    batch_size: int  # per device; the global batch is batch_size x world_size for every backend
    warmup: int
    steps: int  # per timed window
    windows: int
    precision: str = "fp32"
    data: str = "synthetic"
    data_dir: str | None = None
    loader: str | None = None  # real data: torchvision | dali (bench/rank/loaders); None for synthetic data
    decode: str | None = None  # real data: cpu | gpu (nvJPEG / DALI mixed)
    workers: int | None = None  # DataLoader processes per rank (real data only)
    seed: int = 0
    timeout: float | None = None
    note: str | None = None
    options: dict = field(default_factory=dict)  # backend-specific knobs, recorded as they ran
    cudnn_benchmark: bool | None = None  # torch.backends.cudnn.benchmark on CUDA (None on CPU: no cuDNN)
    repeat_index: int = 1  # this run is repetition repeat_index of repeats (bench run --repeat)
    repeats: int = 1
    eval: bool = False  # evaluate after training (DistributedSampler shards, all-reduced sums)
    eval_samples: int = 300  # size of the synthetic evaluation set
    nnodes: int = 1  # machines in the run; world_size = nnodes x processes per node
    flops_per_sample: float | None = None  # training FLOPs per image (backends/models/flops.py), counted once per workload
    peak_tflops: float | None = None  # --peak-tflops: the device's dense peak, overriding bench.rank.mfu.PEAKS
    seq_len: int | None = None  # gpt-<size>: tokens per sample (bench/core/workloads.py)
    optimizer: str | None = None  # sgd | adamw; None: the workload's default (Workload.default_optimizer)
    # --find-max-model's probes: a backend that shards its parameters (FSDP2) builds the model on the meta device and
    # materialises only its own shard, filled with the workload's initialisation but not the seeded values (the
    # probe measures memory, not training); the others build the whole model, as always
    meta_init: bool = False
    # CPU sweeps: every rank of every run gets the same share of the cores, the one-process baseline included (with
    # all of them, single@1 was the run a busy machine slowed most, and every efficiency built on it was inflated)
    threads: int | None = None
    # --window-s: windows sized by time. Each window then runs as many steps as fill this many seconds at the step time
    # warm-up measured (the slowest rank's; bench/rank/train.py), and ``steps`` is that count once the run has it
    window_s: float | None = None
    # the sweep's order (bench/plan/sweep.py interleave): the seed that shuffled it and this run's place in its
    # repetition (1 = first), so that no configuration is always first or last
    order_seed: int | None = None
    order_index: int | None = None

    def validate(self) -> "RunConfig":
        kind = self.workload.kind
        if kind != "language" and self.seq_len is not None:
            raise UsageError(f"--seq-len is for the gpt-<size> models; {self.model} is not one")
        if kind == "language" and self.seq_len is None:
            self.seq_len = workloads.DEFAULT_SEQ_LEN.get(self.device_type, 64)
        if kind != "vision":
            self.image_size = None  # no images
        self.optimizer = self.optimizer or self.workload.default_optimizer
        if self.optimizer not in workloads.OPTIMIZERS:
            raise UsageError(f"--optimizer {self.optimizer!r}: unknown optimizer; choose from "
                             f"{', '.join(workloads.OPTIMIZERS)}")
        sizes = ("image_size",) if kind == "vision" else ("seq_len",) if kind == "language" else ()
        for name in ("world_size", *sizes, "batch_size", "steps", "windows", "eval_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"{FLAGS[name]} must be a positive integer, got {value!r}")
        if not isinstance(self.warmup, int) or self.warmup < MIN_WARMUP:
            raise UsageError(f"--warmup {self.warmup!r} is too short to reach steady state; use at least {MIN_WARMUP} "
                              f"(step 1 pays lazy initialisation and cuDNN's algorithm search, and DDP rebuilds its "
                              f"gradient buckets at step 2)")
        if not (isinstance(self.repeats, int) and self.repeats >= 1 and 1 <= self.repeat_index <= self.repeats):
            raise UsageError(f"--repeat must be a positive integer, got {self.repeats!r}")
        if self.window_s is not None and not (isinstance(self.window_s, (int, float)) and self.window_s > 0):
            raise UsageError(f"--window-s must be a positive number of seconds, got {self.window_s!r}")
        if self.timeout is not None and not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise UsageError(f"--timeout-s must be a positive number of seconds, got {self.timeout!r}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision {self.precision!r}: unknown precision; choose from {', '.join(PRECISIONS)}")
        if self.data not in DATA_KINDS:
            raise UsageError(f"--data {self.data!r}: unknown data; choose from {', '.join(DATA_KINDS)}")
        if self.data == "imagenet":  # the names are checked by the planner, which asks the loader registry
            self.loader, self.decode = self.loader or "torchvision", self.decode or "cpu"
        elif self.loader or self.decode:
            raise UsageError("--loader and --decode are for --data imagenet; synthetic data is a fixed batch on the "
                              "device")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 0):
            raise UsageError(f"--workers must be a non-negative integer, got {self.workers!r}")
        if self.device_type not in DEVICE_TYPES:
            raise UsageError(f"--device {self.device_type!r}: unknown device type; choose from {', '.join(DEVICE_TYPES)}")
        if not isinstance(self.nnodes, int) or self.nnodes < 1 or self.world_size % self.nnodes:
            raise UsageError(f"--nnodes must be a positive integer dividing the world size, got {self.nnodes!r}")
        if self.device_type == "cpu":
            self.cudnn_benchmark = None  # nothing to switch: recorded as not applicable
        elif self.cudnn_benchmark is None:
            self.cudnn_benchmark = True  # what users run
        return self

    @property
    def workload(self) -> workloads.Workload:
        """What this run trains (bench/core/workloads.py): kind, unit, shape, default optimizer."""
        return workloads.of(self.model, self.image_size, self.seq_len, self.optimizer)

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


@dataclass
class Nodes:
    """How a multi-node run is started (bench run --nnodes ...): launch settings, not part of the configuration.
    Every node runs the same bench command; torchrun's c10d rendezvous at ``endpoint`` joins them."""
    nnodes: int
    node_rank: int
    endpoint: str  # HOST:PORT of the rendezvous, on the first node
    rdzv_id: str
    join_timeout: float  # seconds the rendezvous waits for every node
    hosts: str | None = None  # horovodrun -H host1:slots,host2:slots (node 0 starts Horovod runs)
    local_addr: str | None = None  # torchrun --local-addr: this node's address as the others reach it
