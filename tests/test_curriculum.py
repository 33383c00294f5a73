"""The schedule: SPEC §2 golden values, DeepSpeed parity, invariants, and the scheduler API."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm import CurriculumConfig, CurriculumScheduler, difficulty_at, load_config
from seqwarm.config import ConfigError
from seqwarm.curriculum import aligned_min


def block(lo, hi, step, total, kind="fixed_linear", **extra):
    return {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": lo, "max_difficulty": hi,
            "schedule_type": kind,
            "schedule_config": {"total_curriculum_step": total, "difficulty_step": step, **extra}}


GOLDEN = [
    (block(8, 1024, 8, 15000), [1, 2, 100, 7500, 14999, 15000, 20000], [8, 8, 8, 512, 1016, 1024, 1024]),
    (block(8, 1024, 8, 15000, "fixed_root", root_degree=2), [1, 2, 100, 7500, 14999, 15000, 20000],
     [16, 16, 88, 720, 1016, 1024, 1024]),
    (block(8, 1024, 16, 15000), [0, 1, 118, 119, 7500, 15000], [16, 16, 16, 16, 512, 1024]),
    (block(16, 1000, 16, 15000), [1, 7500, 14999, 15000, 20000], [16, 496, 992, 1000, 1000]),
    (block(10, 1024, 8, 100), [0, 1, 2, 50, 99, 100], [16, 16, 24, 512, 1008, 1024]),
    (block(2, 10, 2, 8), list(range(1, 11)), [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]),
    ({"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 1, "max_difficulty": 3,
      "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]}},
     list(range(0, 13)), [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3]),
]


@pytest.mark.parametrize("blk,steps,expected", GOLDEN)
def test_golden_values(blk, steps, expected):
    assert [difficulty_at(s, blk) for s in steps] == expected
    for value in (difficulty_at(s, blk) for s in steps):
        assert type(value) is int


def deepspeed_current(step, lo, hi, quantum, total, degree=1.0):
    """DeepSpeed's fixed_root/linear after its 2026 fix, written from SPEC §2 (no exact-max rule)."""
    value = math.floor((step / total) ** (1.0 / degree) * (hi - lo) + lo)
    value -= value % quantum
    value = max(value, aligned_min(lo, quantum))
    return min(value, hi)


schedules = st.tuples(
    st.integers(1, 256), st.integers(1, 4096), st.integers(1, 64), st.integers(1, 20000),
    st.sampled_from([1.0, 2.0, 3.0, 1.5]),
).filter(lambda t: t[0] <= t[1] and aligned_min(t[0], t[2]) <= t[1])


@settings(max_examples=300, deadline=None)
@given(schedules, st.integers(0, 30000))
def test_matches_deepspeed_except_exact_max(sched, step):
    lo, hi, quantum, total, degree = sched
    kind = "fixed_linear" if degree == 1.0 else "fixed_root"
    extra = {} if degree == 1.0 else {"root_degree": degree}
    ours = difficulty_at(step, block(lo, hi, quantum, total, kind, **extra))
    theirs = deepspeed_current(min(step, total), lo, hi, quantum, total, degree)
    if step >= total:
        assert ours == hi  # the one documented difference
        if hi % quantum == 0:
            assert theirs == hi
    else:
        assert ours == theirs


@settings(max_examples=200, deadline=None)
@given(schedules)
def test_invariants(sched):
    lo, hi, quantum, total, degree = sched
    kind = "fixed_linear" if degree == 1.0 else "fixed_root"
    extra = {} if degree == 1.0 else {"root_degree": degree}
    blk = block(lo, hi, quantum, total, kind, **extra)
    steps = sorted({0, 1, total - 1, total, total + 1, total * 2} | set(range(0, total + 2, max(1, total // 50))))
    values = [difficulty_at(s, blk) for s in steps]
    floor = aligned_min(lo, quantum)
    for s, v in zip(steps, values):
        assert floor <= v <= hi
        if s >= total:
            assert v == hi
        else:
            assert v % quantum == 0
    assert values == sorted(values)  # non-decreasing


def test_scheduler_update_rule_and_state():
    sched = CurriculumScheduler(block(2, 10, 2, 8))
    assert sched.get_current_difficulty() == 2
    seen = [sched.update_difficulty(s) for s in range(1, 11)]
    assert seen == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]
    # once at max it stays there, whatever step is asked for
    assert sched.update_difficulty(1) == 10
    state = sched.state_dict()
    other = CurriculumScheduler(block(2, 10, 2, 8))
    other.load_state_dict(state)
    assert other.get_current_difficulty() == 10
    assert other.get_state()["current_difficulty"] == 10
    other.set_state({"current_difficulty": 4})
    assert other.get_current_difficulty() == 4
    assert other.get_difficulty(6) == 8 and other.get_current_difficulty() == 4  # getter never mutates


def test_custom_schedule():
    blk = {"enabled": True, "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "custom"}
    sched = CurriculumScheduler(blk)
    with pytest.raises(RuntimeError, match="set_custom_get_difficulty"):
        sched.update_difficulty(1)
    sched.set_custom_get_difficulty(lambda step: min(64, 8 * step))
    assert [sched.update_difficulty(s) for s in (1, 2, 8, 9)] == [8, 16, 64, 64]
    with pytest.raises(ValueError, match="custom"):
        difficulty_at(3, blk)


@pytest.mark.parametrize("bad,fragment", [
    (block(8, 1024, 0, 15000), "difficulty_step = 0"),
    (block(8, 1024, 8, 0), "total_curriculum_step = 0"),
    (block(2048, 1024, 8, 10), "must not exceed max_difficulty"),
    ({"enabled": True, "min_difficulty": 8, "max_difficulty": 64}, "schedule_type = (missing)"),
])
def test_scheduler_rejects_bad_blocks_with_config_error(bad, fragment):
    # the reference raised ZeroDivisionError / KeyError / froze; we raise one ConfigError
    with pytest.raises(ConfigError) as info:
        CurriculumScheduler(bad)
    assert fragment in str(info.value)


def test_difficulty_at_takes_a_curriculum_config():
    from seqwarm.curriculum import validate_curriculum_block

    cfg = validate_curriculum_block(block(2, 10, 2, 8))
    assert isinstance(cfg, CurriculumConfig)
    assert [difficulty_at(s, cfg) for s in range(1, 11)] == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]
    loaded = load_config({"train_batch_size": 8, "curriculum_learning": block(2, 10, 2, 8)}).curriculum
    assert difficulty_at(5, loaded) == difficulty_at(5, block(2, 10, 2, 8)) == 6


@pytest.mark.parametrize("bad,fragment", [
    ("scheduler", "call scheduler.get_difficulty(step)"),
    ([8, 1024], "got a list"),
    (None, "got a NoneType"),
    ({"schedule_type": "fixed_linear"}, "without min_difficulty, max_difficulty"),
])
def test_difficulty_at_rejects_what_is_not_a_curriculum(bad, fragment):
    if bad == "scheduler":
        bad = CurriculumScheduler(block(2, 10, 2, 8))  # raised "'dict' object is not callable" before
    with pytest.raises(TypeError) as info:
        difficulty_at(50, bad)
    assert "CurriculumConfig" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("step", [2.0, "3", None, True])
def test_difficulty_at_rejects_a_non_integer_step(step):
    with pytest.raises(TypeError, match=r"step must be an integer \(the optimizer step\)"):
        difficulty_at(step, block(2, 10, 2, 8))
    with pytest.raises(TypeError, match="step must be an integer"):
        CurriculumScheduler(block(2, 10, 2, 8)).get_difficulty(step)


def test_a_block_is_checked_once(monkeypatch):
    import seqwarm.curriculum as curriculum

    calls = []
    real = curriculum._check_schedule  # every check of a block checks its schedule_config
    monkeypatch.setattr(curriculum, "_check_schedule", lambda *a: calls.append(1) or real(*a))

    cfg = load_config({"train_batch_size": 8, "curriculum_learning": block(2, 10, 2, 8)})
    assert len(calls) == 1
    sched = CurriculumScheduler(cfg.curriculum)  # the engine's path: a checked config, used as it is
    assert len(calls) == 1 and sched.config is cfg.curriculum
    assert sched.get_state() == {**block(2, 10, 2, 8), "current_difficulty": 2}
    CurriculumScheduler(block(2, 10, 2, 8))  # DeepSpeed-ported code passes a raw dict: checked once
    assert len(calls) == 2


def test_scheduler_refuses_other_types():
    with pytest.raises(TypeError, match="CurriculumConfig or a curriculum block dict, got a list"):
        CurriculumScheduler([2, 10])
