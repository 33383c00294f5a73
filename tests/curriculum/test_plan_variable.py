"""plan_variable: the variable-length run ahead of time is the sampler's run, counted without a token read."""

import math
from collections import Counter

import numpy as np
import pytest

from seqwarm.curriculum.clock import Progress, advance
from seqwarm.curriculum.decompose import decompose
from seqwarm.curriculum.lr import LRConfig, lr_at
from seqwarm.curriculum.plan_variable import plan_variable
from seqwarm.curriculum.variable import VariableLengthSampler
from seqwarm.util.errors import UserError

TPS = 2048
SIZES = np.random.default_rng(5).integers(1, 1500, 600)
CHUNKS = decompose(np.concatenate([[0], np.cumsum(SIZES)]), 16, 256)


@pytest.mark.parametrize(
    "curriculum, extra", [("natural", {}), ("grow_p2", {"num_cycles": 3}), ("linear", {"total_steps": 40})]
)
def test_the_plan_is_the_samplers_run_to_the_budget(curriculum, extra):
    budget = 700 * TPS + 5  # not a whole number of steps: the last step passes it
    plan = plan_variable(CHUNKS, TPS, curriculum=curriculum, seed=9, train_tokens=budget, **extra)
    sampler = VariableLengthSampler(CHUNKS, TPS, curriculum=curriculum, seed=9, **extra)
    drawn = [sampler.next_step() for _ in range(plan.total_steps)]
    assert plan.total_steps == math.ceil(budget / TPS) == 701 and plan.total_tokens == 701 * TPS
    assert plan.total_samples == sum(TPS // s.length for s in drawn)
    counts = Counter(s.length for s in drawn)
    assert {b.length: b.steps for b in plan.buckets} == {b.length: counts.get(b.length, 0) for b in plan.buckets}
    assert sum(b.run_tokens for b in plan.buckets) == plan.total_tokens
    assert plan.epochs == pytest.approx(701 / sampler.steps_per_epoch) and plan.epochs > 1
    assert plan.skipped_steps == sampler.skipped_steps
    # the points cover the run: their last is its end, and each one's lengths are those of its steps
    assert plan.points[-1].step == plan.total_steps and len(plan.points) == 24
    start = 0
    for p in plan.points:
        part = [s.length for s in drawn[start : p.step]]
        assert (p.shortest, p.longest, p.mean_length) == (min(part), max(part), pytest.approx(np.mean(part)))
        assert (p.epoch, p.cycle) == (drawn[p.step - 1].epoch, drawn[p.step - 1].cycle)
        start = p.step


def test_the_buckets_and_what_the_decomposition_drops():
    plan = plan_variable(CHUNKS, TPS, train_iters=10)
    stats = VariableLengthSampler(CHUNKS, TPS).stats()
    assert [b.length for b in plan.buckets] == [16, 32, 64, 128, 256]
    for b in plan.buckets:
        s = stats["buckets"][b.length]
        assert (b.chunks, b.tokens, b.steps_per_epoch, b.left_over_per_epoch) == (
            s["chunks"],
            s["tokens"],
            s["steps_per_epoch"],
            s["chunks_left_over_per_epoch"],
        )
        assert b.rows_per_step == TPS // b.length and b.tokens == b.chunks * b.length
    assert sum(b.share for b in plan.buckets) == pytest.approx(1)
    assert plan.dropped_tokens == CHUNKS.dropped_tokens > 0 and plan.empty_documents == CHUNKS.empty_documents > 0
    # every position of every document is in a chunk or dropped (shift 1: a document of n tokens has n - 1)
    assert plan.chunk_tokens + plan.dropped_tokens == int(np.maximum(SIZES - 1, 0).sum())
    assert plan.total_steps == 10 and plan.stop_reason.startswith("reached train_iters")


def test_a_cap_grows_to_the_longest_length_and_a_short_budget_is_said():
    plan = plan_variable(CHUNKS, TPS, curriculum="linear", total_steps=100, train_tokens=200 * TPS)
    assert plan.caps[0] == (1, 16) and plan.caps[-1] == (100, 256)
    assert [c for _, c in plan.caps] == [16, 32, 64, 128, 256]
    assert all(b.steps > 0 for b in plan.buckets)
    short = plan_variable(CHUNKS, TPS, curriculum="linear", total_steps=100, train_tokens=30 * TPS)
    assert short.caps[-1][1] < 256 and any("never train" in w for w in short.warnings)
    assert {b.length for b in short.buckets if b.steps} <= {c for _, c in short.caps}
    block = {
        "min_difficulty": 16,
        "max_difficulty": 256,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [16, 64, 256], "max_step": [5, 20]},
    }
    discrete = plan_variable(CHUNKS, TPS, curriculum="schedule", schedule=block, train_iters=30)
    assert discrete.caps == ((1, 16), (6, 64), (21, 256))


def test_grow_p2_cycles_run_short_to_long_and_each_epoch_holds_its_cycles():
    plan = plan_variable(CHUNKS, TPS, curriculum="grow_p2", num_cycles=4, train_iters=None)
    assert plan.total_steps == plan.steps_per_epoch and "one epoch" in plan.warnings[0]
    assert [(c.epoch, c.cycle) for c in plan.cycles] == [(0, i) for i in range(4)]
    assert [c.first_step for c in plan.cycles[1:]] == [c.last_step + 1 for c in plan.cycles[:-1]]
    # short buckets weigh most: each cycle's first half is shorter on average than its second half
    sampler = VariableLengthSampler(CHUNKS, TPS, curriculum="grow_p2", num_cycles=4)
    lengths = [sampler.next_step().length for _ in range(plan.total_steps)]
    for c in plan.cycles:
        part = lengths[c.first_step - 1 : c.last_step]
        half = len(part) // 2
        assert np.mean(part[:half]) < np.mean(part[half:])
        assert (c.first_length, c.last_length) == (part[0], part[-1])


def test_the_lr_follows_the_token_clock_and_the_errors_are_the_samplers():
    lr = LRConfig(lr=1e-3, min_lr=1e-4, warmup_tokens=20 * TPS, decay_style="cosine")
    plan = plan_variable(CHUNKS, TPS, train_tokens=120 * TPS, lr=lr, rows=6)
    sampler = VariableLengthSampler(CHUNKS, TPS)
    progress, full = Progress(), LRConfig(lr=1e-3, min_lr=1e-4, warmup_tokens=20 * TPS, decay_style="cosine",
                                          decay_tokens=120 * TPS)  # fmt: skip
    by_step = {}
    for _ in range(120):
        length = sampler.next_step().length
        progress = advance(progress, TPS // length, TPS, full)
        by_step[progress.step] = lr_at(progress, full)
    assert [p.lr for p in plan.points] == [pytest.approx(by_step[p.step]) for p in plan.points]
    assert plan.points[-1].lr == pytest.approx(1e-4)
    with pytest.raises(UserError, match="must be a multiple of max_length"):
        plan_variable(CHUNKS, 1000, train_iters=5)
    with pytest.raises(UserError, match="not one of natural"):
        plan_variable(CHUNKS, TPS, curriculum="cosine", train_iters=5)


def test_a_draw_without_indices_moves_the_state_as_a_draw_with_them():
    a, b = (VariableLengthSampler(CHUNKS, TPS, curriculum="grow_p2", num_cycles=2, seed=3) for _ in range(2))
    for _ in range(250):
        x, y = a.next_step(), b.next_step(indices=False)
        assert (x.length, x.epoch, x.cycle) == (y.length, y.epoch, y.cycle) and y.indices == []
    assert a.state_dict() == b.state_dict()


def _offsets(sizes):
    return np.concatenate([[0], np.cumsum(sizes)])


# 300 documents of 2,000 to 2,100 tokens, as books are: between 16 and 256 nearly every token is in a
# chunk of 256, and each document gives at most one chunk of each shorter length
LONG = decompose(_offsets(np.random.default_rng(1).integers(2000, 2100, 300)), 16, 256)


@pytest.mark.parametrize("curriculum, extra", [("linear", {"total_steps": 100}), ("schedule", {})])
def test_a_cap_on_long_documents_repeats_the_short_chunks_and_says_so(curriculum, extra):
    if curriculum == "schedule":  # a DeepSpeed block's fixed_linear as the cap
        extra = {"schedule": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 16,
                              "max_difficulty": 256, "schedule_type": "fixed_linear",
                              "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8}}}  # fmt: skip
    plan = plan_variable(LONG, TPS, curriculum=curriculum, seed=3, train_iters=200, **extra)
    sampler = VariableLengthSampler(LONG, TPS, curriculum=curriculum, seed=3, **extra)
    drawn = [sampler.next_step() for _ in range(200)]
    by_length = {b.length: b for b in plan.buckets}
    for length, b in by_length.items():  # passes: the times a chunk is trained, counted from the draw itself
        trained = Counter(i for s in drawn if s.length == length for i in s.indices)
        assert b.passes == pytest.approx(sum(trained.values()) / b.chunks if b.chunks else 0.0)
        assert b.epochs_used == len({s.epoch for s in drawn if s.length == length})
    short, longest = by_length[64], by_length[256]
    assert short.passes > 4 * longest.passes and short.passes > 1 and short.epochs_used > 1
    said = [w for w in plan.warnings if "over and over" in w]
    assert len(said) == 1 and "\n" not in said[0]
    assert f"({curriculum})" in said[0] and "more than 4x" in said[0]
    assert "--variable-curriculum natural or grow_p2" in said[0] and "shorter documents" in said[0]


@pytest.mark.parametrize("curriculum, extra", [("natural", {}), ("grow_p2", {"num_cycles": 4})])
def test_the_uncapped_curricula_train_every_bucket_alike_and_do_not_warn(curriculum, extra):
    epoch = plan_variable(LONG, TPS, curriculum=curriculum, **extra).steps_per_epoch  # no budget: one epoch
    plan = plan_variable(LONG, TPS, curriculum=curriculum, seed=3, train_iters=3 * epoch, **extra)
    trained = [b for b in plan.buckets if b.steps_per_epoch]
    assert 0 < min(b.passes for b in trained) and max(b.passes for b in trained) <= 3  # an epoch: a pass at most
    assert {b.epochs_used for b in trained} == {3}
    assert not [w for w in plan.warnings if "over and over" in w]


def test_a_cap_on_short_documents_does_not_warn():
    short_docs = decompose(_offsets(np.random.default_rng(2).integers(17, 300, 3000)), 16, 256)
    plan = plan_variable(short_docs, TPS, curriculum="linear", total_steps=100, seed=3, train_iters=200)
    assert not [w for w in plan.warnings if "over and over" in w], [b.passes for b in plan.buckets]


def test_a_blend_is_planned_per_source_with_its_weights_as_the_steps_draw_it():
    from seqwarm.curriculum.variable_blend import VariableSteps

    parts = [CHUNKS, LONG]
    plan = plan_variable(parts, TPS, weights=[1, 3], names=["a", "b"], curriculum="grow_p2", num_cycles=2, seed=4,
                         train_iters=400, keep_steps=True)  # fmt: skip
    steps = VariableSteps(parts, [1, 3], TPS, seed=4, curriculum="grow_p2", num_cycles=2)
    drawn = [steps.next_step() for _ in range(400)]
    assert list(plan.lengths) == [s.length for _, s in drawn]
    assert [s.steps for s in plan.sources] == [100, 300] and [s.name for s in plan.sources] == ["a", "b"]
    for b in plan.buckets:
        assert b.steps == sum(1 for k, s in drawn if k == b.source and s.length == b.length)
    assert plan.documents == CHUNKS.num_documents + LONG.num_documents
