"""The learning-rate schedule of ``bench run --to-accuracy``: a pure function of the step, no torch.

- **Scaling to the global batch** (``--lr-scaling``): the peak learning rate is ``--base-lr`` at ``--base-batch``
  samples, scaled to the run's global batch B: ``linear`` x B / base (Goyal et al. 2017, "Accurate, Large Minibatch
  SGD"), ``sqrt`` x sqrt(B / base) (Krizhevsky 2014; Hoffer et al. 2017), ``none`` unchanged.
- **Warm-up** (``--warmup-epochs``): linear from peak / W to the peak over the first W steps (step s, counted from
  0, runs at peak x (s + 1) / W, as nanoGPT's ``get_lr`` does), so a large scaled rate is not taken from the first
  step.
- **Decay** after the warm-up, over the planned steps (``--max-epochs`` x steps per epoch, whether or not the run
  stops earlier at its target, as MLPerf's reference schedules do): ``cosine`` to zero (Loshchilov & Hutter 2017,
  no restarts), ``step`` x 0.1 at 1/2 and again at 3/4 of the planned epochs (Goyal et al.'s 30-60-80 of 90 epochs,
  in proportion), ``none`` constant.

Everything the rank applies is ``Schedule.lr(step)``; ``Schedule.describe()`` is what the record keeps.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

RULES = ("linear", "sqrt", "none")
DECAYS = ("cosine", "step", "none")
STEP_GAMMA = 0.1  # step decay's factor at each milestone
STEP_AT = (0.5, 0.75)  # step decay's milestones, as fractions of the planned epochs


def scaled_lr(base_lr: float, base_batch: int, global_batch: int, rule: str) -> float:
    """The peak learning rate at ``global_batch`` samples per step, from ``base_lr`` at ``base_batch``."""
    if rule not in RULES:
        raise ValueError(f"unknown scaling rule {rule!r}; choose from {', '.join(RULES)}")
    ratio = global_batch / base_batch
    return base_lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]


def milestone_steps(max_epochs: int, steps_per_epoch: int) -> tuple[int, ...]:
    """Step decay's milestones in steps: the first step of the epochs at STEP_AT of ``max_epochs`` (rounded, at least
    epoch 1), so every step of one epoch runs at one rate."""
    return tuple(max(1, round(f * max_epochs)) * steps_per_epoch for f in STEP_AT)


@dataclass(frozen=True)
class Schedule:
    base_lr: float
    base_batch: int
    global_batch: int
    scaling: str  # linear | sqrt | none
    warmup_steps: int
    total_steps: int  # the planned steps: max epochs x steps per epoch
    decay: str  # cosine | step | none
    milestones: tuple[int, ...] = ()  # step decay: the steps from which the rate is STEP_GAMMA lower again

    @classmethod
    def for_epochs(cls, base_lr: float, base_batch: int, global_batch: int, scaling: str, warmup_epochs: float,
                   max_epochs: int, steps_per_epoch: int, decay: str) -> "Schedule":
        """The schedule of a run of ``max_epochs`` epochs of ``steps_per_epoch`` steps; the warm-up rounded to whole
        steps."""
        if decay not in DECAYS:
            raise ValueError(f"unknown decay {decay!r}; choose from {', '.join(DECAYS)}")
        return cls(base_lr, base_batch, global_batch, scaling, round(warmup_epochs * steps_per_epoch),
                   max_epochs * steps_per_epoch, decay,
                   milestone_steps(max_epochs, steps_per_epoch) if decay == "step" else ())

    @property
    def peak(self) -> float:
        return scaled_lr(self.base_lr, self.base_batch, self.global_batch, self.scaling)

    def lr(self, step: int) -> float:
        """The learning rate of step ``step`` (0 is the first)."""
        peak = self.peak
        if step < self.warmup_steps:
            return peak * (step + 1) / self.warmup_steps
        if self.decay == "cosine":
            span = max(1, self.total_steps - self.warmup_steps)
            progress = min(1.0, (step - self.warmup_steps) / span)
            return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.decay == "step":
            return peak * STEP_GAMMA ** sum(step >= m for m in self.milestones)
        return peak

    def describe(self) -> dict:
        """The record's ``schedule``: every setting, the peak it scaled to and the warm-up's and decay's rules."""
        return {**asdict(self), "milestones": list(self.milestones), "peak_lr": self.peak,
                "warmup": "linear from peak/W to the peak over W steps" if self.warmup_steps else "none",
                "decay_rule": {"cosine": "cosine to 0 over the planned steps after the warm-up",
                               "step": f"x{STEP_GAMMA:g} at {' and '.join(f'{f:g}' for f in STEP_AT)} of the planned "
                                       "epochs",
                               "none": "constant after the warm-up"}[self.decay]}
