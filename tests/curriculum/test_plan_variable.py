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
