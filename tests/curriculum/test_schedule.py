"""The schedule: golden values, DeepSpeed parity, invariants, and the scheduler API."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm import CurriculumScheduler, difficulty_at, load_config
from seqwarm.config import ConfigError
from seqwarm.curriculum.checks import aligned_min
from seqwarm.curriculum.schedule import CurriculumConfig


def block(lo, hi, step, total, kind="fixed_linear", **extra):
    return {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": lo,
        "max_difficulty": hi,
        "schedule_type": kind,
        "schedule_config": {"total_curriculum_step": total, "difficulty_step": step, **extra},
    }


GOLDEN = [
    (block(8, 1024, 8, 15000), [1, 2, 100, 7500, 14999, 15000, 20000], [8, 8, 8, 512, 1016, 1024, 1024]),
    (
        block(8, 1024, 8, 15000, "fixed_root", root_degree=2),
        [1, 2, 100, 7500, 14999, 15000, 20000],
        [16, 16, 88, 720, 1016, 1024, 1024],
    ),
    (block(8, 1024, 16, 15000), [0, 1, 118, 119, 7500, 15000], [16, 16, 16, 16, 512, 1024]),
    (block(16, 1000, 16, 15000), [1, 7500, 14999, 15000, 20000], [16, 496, 992, 1000, 1000]),
    (block(10, 1024, 8, 100), [0, 1, 2, 50, 99, 100], [16, 16, 24, 512, 1008, 1024]),
    (block(2, 10, 2, 8), list(range(1, 11)), [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]),
    (
        {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 1,
            "max_difficulty": 3,
            "schedule_type": "fixed_discrete",
            "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]},
        },
        list(range(0, 13)),
        [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3],
    ),
]


@pytest.mark.parametrize("blk,steps,expected", GOLDEN)
def test_golden_values(blk, steps, expected):
    assert [difficulty_at(s, blk) for s in steps] == expected
    for value in (difficulty_at(s, blk) for s in steps):
        assert type(value) is int


DEEPSPEED_TABLE = Path(__file__).parents[1] / "data" / "deepspeed_curriculum_table.json"
"""DeepSpeed 0.19.8's own CurriculumScheduler, recorded step by step by
tests/data/make_deepspeed_curriculum_table.py (the command is in the file). Only the JSON is read here:
these tests never import DeepSpeed."""
TABLE = json.loads(DEEPSPEED_TABLE.read_text())


def deepspeed_values(entry):
    """DeepSpeed's update_difficulty(step) for step = 1..last_step, from the table's runs."""
    values = []
    for first, last, value in entry["runs"]:
        assert first == len(values) + 1 and last >= first, f"{entry['name']}: runs must tile 1..last_step"
        values.extend([value] * (last - first + 1))
    assert len(values) == entry["last_step"]
    return values


def exact_max_from_total(blk, step):
    """True where seqwarm deliberately gives max_difficulty and DeepSpeed may not.

    README "Differences, all deliberate" and seqwarm.curriculum.schedule's docstring: "for any step >=
    total_curriculum_step the length is exactly max_difficulty, even when it is not a multiple of
    difficulty_step (DeepSpeed reached it some steps later)". Only fixed_linear and fixed_root have a
    total_curriculum_step (and a difficulty_step); fixed_discrete follows DeepSpeed at every step.
    """
    kind = blk["schedule_type"]
    return kind in ("fixed_linear", "fixed_root") and step >= blk["schedule_config"]["total_curriculum_step"]


@pytest.mark.parametrize("entry", TABLE["configs"], ids=[e["name"] for e in TABLE["configs"]])
def test_matches_deepspeed_recorded_table(entry):
    """The scheduler (driven like the engine: update_difficulty(step) for every step in order) and the
    pure difficulty_at give DeepSpeed's recorded value at every step, except the documented exact max."""
    blk, theirs = entry["block"], deepspeed_values(entry)
    hi = blk["max_difficulty"]
    sched = CurriculumScheduler(blk)  # a fresh scheduler per config, as the table was made
    cfg = sched.config
    wrong = []
    for step, ds in enumerate(theirs, start=1):
        expected = hi if exact_max_from_total(blk, step) else ds
        ours, pure = sched.update_difficulty(step), difficulty_at(step, cfg)
        assert type(ours) is int and type(pure) is int
        if ours != expected or pure != expected:
            wrong.append(
                f"step {step}: DeepSpeed {ds}, expected {expected}, update_difficulty {ours}, difficulty_at {pure}"
            )
    assert not wrong, f"{entry['name']}: {len(wrong)} steps differ:\n" + "\n".join(wrong[:10])
    # the exception is as narrow as documented: it changes a value only when max_difficulty is not a
    # multiple of difficulty_step, and DeepSpeed does reach max within the table ("some steps later")
    if any(exact_max_from_total(blk, s) and ds != hi for s, ds in enumerate(theirs, start=1)):
        assert hi % blk["schedule_config"]["difficulty_step"] != 0, entry["name"]
    if blk["schedule_type"] != "fixed_discrete":
        assert theirs[-1] == hi


def test_deepspeed_table_covers_the_cases_that_matter():
    """A regenerated table must still exercise every schedule type, the step sizes and the exact-max rule."""
    assert TABLE["command"] == ".venv/bin/python tests/data/make_deepspeed_curriculum_table.py"
    assert TABLE["deepspeed_version"] and TABLE["scheduler_class"].endswith("curriculum_scheduler.CurriculumScheduler")
    blocks = [e["block"] for e in TABLE["configs"]]
    assert {b["schedule_type"] for b in blocks} == {"fixed_linear", "fixed_root", "fixed_discrete"}
    assert len({b["schedule_config"]["root_degree"] for b in blocks if b["schedule_type"] == "fixed_root"}) >= 2
    steps = {b["schedule_config"].get("difficulty_step") for b in blocks}
    assert {1, 8, 64} <= steps
    assert any(b["min_difficulty"] % b["schedule_config"].get("difficulty_step", 1) for b in blocks)
    later = [
        e["name"]
        for e in TABLE["configs"]
        if any(
            exact_max_from_total(e["block"], s) and v != e["block"]["max_difficulty"]
            for s, v in enumerate(deepspeed_values(e), start=1)
        )
    ]
    assert len(later) >= 2, "no config shows DeepSpeed reaching an unaligned max after total_curriculum_step"
    assert max(e["last_step"] for e in TABLE["configs"]) >= 15000


@pytest.mark.parametrize("entry", TABLE["skipped"], ids=[e["name"] for e in TABLE["skipped"]])
def test_configs_deepspeed_cannot_run_are_refused(entry):
    """Where DeepSpeed's scheduler raised (AssertionError, ZeroDivisionError) or ran pathologically (a
    length above max, an inverted or frozen schedule, no length a multiple of difficulty_step), seqwarm
    refuses the block up front: README "bad configs raise one error listing every problem instead of
    AssertionError, KeyError or a ZeroDivisionError at the first step; min > max and lists out of range
    are refused". (Three refusals here are not named there: root_degree <= 0, unsorted difficulty
    levels, and a difficulty_step with no multiple in [min_difficulty, max_difficulty].)"""
    with pytest.raises(ConfigError):
        CurriculumScheduler(entry["block"])


schedules = st.tuples(
    st.integers(1, 256),
    st.integers(1, 4096),
    st.integers(1, 64),
    st.integers(1, 20000),
    st.sampled_from([1.0, 2.0, 3.0, 1.5]),
).filter(lambda t: t[0] <= t[1] and aligned_min(t[0], t[2]) <= t[1])


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


@pytest.mark.parametrize(
    "bad,fragment",
    [
        (block(8, 1024, 0, 15000), "difficulty_step = 0"),
        (block(8, 1024, 8, 0), "total_curriculum_step = 0"),
        (block(2048, 1024, 8, 10), "must not exceed max_difficulty"),
        ({"enabled": True, "min_difficulty": 8, "max_difficulty": 64}, "schedule_type = (missing)"),
    ],
)
def test_scheduler_rejects_bad_blocks_with_config_error(bad, fragment):
    # the reference raised ZeroDivisionError / KeyError / froze; we raise one ConfigError
    with pytest.raises(ConfigError) as info:
        CurriculumScheduler(bad)
    assert fragment in str(info.value)


def test_difficulty_at_takes_a_curriculum_config():
    from seqwarm.curriculum.schedule import validate_curriculum_block

    cfg = validate_curriculum_block(block(2, 10, 2, 8))
    assert isinstance(cfg, CurriculumConfig)
    assert [difficulty_at(s, cfg) for s in range(1, 11)] == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]
    loaded = load_config({"train_batch_size": 8, "curriculum_learning": block(2, 10, 2, 8)}).curriculum
    assert difficulty_at(5, loaded) == difficulty_at(5, block(2, 10, 2, 8)) == 6


@pytest.mark.parametrize(
    "bad,fragment",
    [
        ("scheduler", "call scheduler.get_difficulty(step)"),
        ([8, 1024], "got a list"),
        (None, "got a NoneType"),
        ({"schedule_type": "fixed_linear"}, "without min_difficulty, max_difficulty"),
    ],
)
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
    import seqwarm.curriculum.checks as checks

    calls = []
    real = checks._check_schedule  # every check of a block checks its schedule_config
    monkeypatch.setattr(checks, "_check_schedule", lambda *a: calls.append(1) or real(*a))

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
