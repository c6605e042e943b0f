"""The learning-rate schedule of ``bench run --to-accuracy`` (bench/core/schedule.py): the scaling rules, the warm-up
and both decays at chosen steps, against values worked out by hand. Pure arithmetic: no torch, nothing launched."""
import math

import pytest

from bench.core import schedule
from bench.core.schedule import Schedule, scaled_lr


@pytest.mark.parametrize("rule, expected", [("linear", 0.4), ("sqrt", 0.2), ("none", 0.1)])
def test_scaling_rules_at_four_times_the_base_batch(rule, expected):
    assert scaled_lr(0.1, 256, 1024, rule) == pytest.approx(expected, rel=1e-12)


def test_scaling_rules_below_the_base_batch_and_at_it():
    assert scaled_lr(0.1, 64, 16, "linear") == pytest.approx(0.025)
    assert scaled_lr(0.1, 64, 16, "sqrt") == pytest.approx(0.05)
    assert [scaled_lr(0.05, 32, 32, r) for r in schedule.RULES] == [0.05, 0.05, 0.05]
    with pytest.raises(ValueError, match="unknown scaling rule 'cubic'"):
        scaled_lr(0.1, 1, 2, "cubic")


def test_warmup_then_cosine_at_chosen_steps():
    # base 0.1 at batch 32, global batch 64, linear: peak 0.2; 10 warm-up steps of 100
    s = Schedule(0.1, 32, 64, "linear", warmup_steps=10, total_steps=100, decay="cosine")
    assert s.peak == pytest.approx(0.2)
    assert s.lr(0) == pytest.approx(0.02)  # peak x 1/10: the first step is already moving
    assert s.lr(4) == pytest.approx(0.1)
    assert s.lr(9) == pytest.approx(0.2)  # the warm-up's last step reaches the peak
    assert s.lr(10) == pytest.approx(0.2)  # cosine starts at the peak
    assert s.lr(55) == pytest.approx(0.1)  # half way through the 90 decay steps: half the peak
    assert s.lr(99) == pytest.approx(0.1 * (1 + math.cos(math.pi * 89 / 90)))
    assert s.lr(100) == pytest.approx(0.0) and s.lr(500) == pytest.approx(0.0)  # past the plan: stays at 0
    rates = [s.lr(k) for k in range(100)]
    assert rates[:10] == sorted(rates[:10]) and rates[10:] == sorted(rates[10:], reverse=True)


def test_step_decay_by_epochs():
    # 8 planned epochs of 10 steps: x0.1 from epoch 4 (step 40) and again from epoch 6 (step 60)
    s = Schedule.for_epochs(0.05, 32, 32, "none", warmup_epochs=0, max_epochs=8, steps_per_epoch=10, decay="step")
    assert s.milestones == (40, 60) and s.warmup_steps == 0 and s.total_steps == 80
    assert [s.lr(k) for k in (0, 39, 40, 59, 60, 79)] == pytest.approx([0.05, 0.05, 0.005, 0.005, 0.0005, 0.0005])


def test_fractional_warmup_epochs_round_to_steps_and_none_decay_is_constant():
    s = Schedule.for_epochs(0.1, 8, 16, "sqrt", warmup_epochs=0.5, max_epochs=4, steps_per_epoch=7, decay="none")
    assert s.warmup_steps == 4 and s.total_steps == 28  # round(3.5) = 4 (banker's rounding: even)
    peak = 0.1 * math.sqrt(2)
    assert [s.lr(k) for k in (0, 3, 4, 27)] == pytest.approx([peak / 4, peak, peak, peak])


def test_describe_keeps_every_setting_and_the_peak():
    d = Schedule.for_epochs(0.1, 32, 128, "linear", 1, 10, 5, "cosine").describe()
    assert d == {"base_lr": 0.1, "base_batch": 32, "global_batch": 128, "scaling": "linear", "warmup_steps": 5,
                 "total_steps": 50, "decay": "cosine", "milestones": [], "peak_lr": pytest.approx(0.4),
                 "warmup": "linear from peak/W to the peak over W steps",
                 "decay_rule": "cosine to 0 over the planned steps after the warm-up"}
    with pytest.raises(ValueError, match="unknown decay 'linear'"):
        Schedule.for_epochs(0.1, 1, 1, "none", 0, 1, 1, "linear")
