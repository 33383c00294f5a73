"""The console's ETA: the planned steps and tokens left times the measured cost per step and per token."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from seqwarm.config import load_config
from seqwarm.curriculum.plan import make_plan
from seqwarm.trainer.eta import EtaEstimator
from seqwarm.trainer.metrics import MetricsLogger

DEMO = Path(__file__).resolve().parents[2] / "examples" / "tiny_cpu.json"

# Step-time profiles, seconds = per_step + per_token * tokens, the first step a little longer (the trial
# before it paid the start-up; the first update still allocates the optimizer's state): the CPU demo
# (tiny GPT, 2 threads: ~0.13 s at 128 tokens, ~1.1 s at 4096) and a GPU run whose fixed part (the update,
# launches) is more than a full-length forward + backward.
PROFILES = {"cpu-demo": (0.10, 2.5e-4, 0.03), "gpu": (0.02, 2.0e-6, 0.003)}


def planned_tokens(budget: int | None = None) -> list[int]:
    """Tokens of each optimizer step of the demo recipe (examples/tiny_cpu.json), from its plan."""
    cfg = load_config(DEMO, overrides={"train_tokens": budget} if budget else None)
    plan = make_plan(cfg, keep_series=True)
    return [b - a for a, b in zip([0, *plan.cum_tokens], plan.cum_tokens)]


def simulate(per_step: float, per_token: float, startup: float, tokens: list[int], noise: float, seed: int = 0):
    """Each step's time under the profile, with +-``noise`` jitter; the first step also pays ``startup``."""
    rng = random.Random(seed)
    times = [(per_step + per_token * n) * (1 + rng.uniform(-noise, noise)) for n in tokens]
    times[0] += startup
    return times


@pytest.mark.parametrize("profile", PROFILES)
def test_the_eta_at_step_1_is_within_25_percent_of_the_planned_run(profile):
    per_step, per_token, startup = PROFILES[profile]
    tokens = planned_tokens()
    times = simulate(per_step, per_token, startup, tokens, noise=0.1)
    eta = EtaEstimator(len(tokens), sum(tokens))
    full = 16 * 256  # the trial: one micro-batch (16 rows) at the full length, forward + backward
    eta.trial(full, 0.95 * per_token * full)  # a forward + backward: no update
    eta.observe(tokens[0], times[0])
    truth = sum(times[1:])
    estimate = eta.seconds_left(1, tokens[0])
    assert estimate == pytest.approx(truth, rel=0.25), (estimate, truth)
    # what the console showed before: the first step's tokens per second over the tokens left
    naive = (sum(tokens) - tokens[0]) / (tokens[0] / times[0])
    assert naive > 2 * truth


@pytest.mark.parametrize("budget", [None, 200_000])
def test_the_eta_stays_within_25_percent_at_every_step(budget):
    per_step, per_token, startup = PROFILES["cpu-demo"]
    tokens = planned_tokens(budget)
    times = simulate(per_step, per_token, startup, tokens, noise=0.3, seed=1)
    eta = EtaEstimator(len(tokens), sum(tokens))
    eta.trial(16 * 256, per_token * 16 * 256 * 0.95)
    done = 0
    for step, (n, t) in enumerate(zip(tokens, times), 1):
        eta.observe(n, t)
        done += n
        truth = sum(times[step:])
        if truth > 5 * (per_step + per_token * 4096):  # the last few steps: seconds, jitter dominates
            assert eta.seconds_left(step, done) == pytest.approx(truth, rel=0.25), step
    assert eta.seconds_left(len(tokens), done) == 0


def test_without_a_trial_the_fit_separates_the_costs_once_lengths_differ():
    eta = EtaEstimator(100, 100_000)
    assert eta.seconds_left(0, 0) is None
    eta.observe(100, 5.0)  # the first step (start-up) only counts until another is measured
    assert eta.cost() == (0.0, 0.05)
    for n in (200, 400, 800, 1600):
        eta.observe(n, 0.5 + 0.001 * n)
    per_step, per_token = eta.cost()
    assert per_step == pytest.approx(0.5) and per_token == pytest.approx(0.001)
    assert eta.seconds_left(5, 3100) == pytest.approx(95 * 0.5 + 96_900 * 0.001)


def test_one_length_only_is_a_cost_per_token():
    eta = EtaEstimator(10, 10 * 512)
    for _ in range(4):
        eta.observe(512, 1.0)
    assert eta.seconds_left(4, 4 * 512) == pytest.approx(6.0)


def test_the_console_line_shows_the_planned_eta(tmp_path, capsys):
    log = MetricsLogger(
        tmp_path, budget_tokens=10_000, is_main=True, log_interval=1, progress_bar=False, tensorboard=False
    )
    log.expect(total_steps=11, total_tokens=10_000)
    log.open(0)
    log.trial(1000, 1.0)  # 1 ms per token at the full length
    head = {"step": 1, "tokens": 100, "samples": 10, "seqlen": 10, "lr": 1e-3}
    log.step(100, 100, 5.0, 0.6)  # the short first step: 0.1 s of tokens, 0.5 s of update
    log.train_row(head, {}, None)
    log.close()
    line = capsys.readouterr().out.strip()
    # 10 steps at 0.5 s and 9,900 tokens at 1 ms: 14.9 s, not the 59 s that 167 tok/s over 9,900 tokens says
    assert line.endswith("eta 14s"), line
