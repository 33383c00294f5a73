"""What `seqwarm train --curriculum-mode variable` prints at its start (run.training._print_variable_plan):
the plan's bucket table and warnings, or one line instead when the budget is too long to replay there."""

from types import SimpleNamespace

import numpy as np

from seqwarm.curriculum.decompose import decompose
from seqwarm.curriculum.plan_variable import plan_variable
from seqwarm.run import training

TPS = 1024
LONG = decompose(np.concatenate([[0], np.cumsum(np.random.default_rng(1).integers(2000, 2100, 200))]), 16, 256)


class Batches:
    tokens_per_step = TPS
    settings = SimpleNamespace(max_length=256)

    def __init__(self):
        self.planned = 0

    def describe(self):
        return "variable:    the mode line"

    def plan(self, cfg):
        self.planned += 1
        return plan_variable(LONG, TPS, curriculum="linear", total_steps=50, train_tokens=cfg.train_tokens)


def _start(train_tokens):
    said, expected = [], []
    cfg = SimpleNamespace(train_tokens=train_tokens, train_iters=None, train_samples=None, warnings=[])
    log = SimpleNamespace(expect=lambda steps, tokens: expected.append((steps, tokens)))
    run = SimpleNamespace(batches=Batches(), engine=SimpleNamespace(global_steps=0), log=log)
    training._print_variable_plan(cfg, run, lambda text, **_: said.append(text))
    return said, expected, run.batches.planned


def test_the_start_prints_the_plans_bucket_table_and_its_repetition_warning(caplog):
    said, expected, planned = _start(100 * TPS)
    plan = plan_variable(LONG, TPS, curriculum="linear", total_steps=50, train_tokens=100 * TPS)
    assert said[0] == "variable:    the mode line" and planned == 1
    assert said[1].split()[:3] == ["length", "chunks", "share"] and len(said) == 2 + len(plan.buckets) + 1
    rows = {int(line.split()[0]): int(line.split()[5]) for line in said[2 : 2 + len(plan.buckets)]}
    assert rows == {b.length: b.steps for b in plan.buckets}
    assert said[-1].startswith("plan:        100 steps") and expected == [(100, 100 * TPS)]
    assert [r.getMessage() for r in caplog.records if "over and over" in r.getMessage()]


def test_a_budget_too_long_to_replay_is_said_in_one_line(monkeypatch):
    monkeypatch.setattr(training, "VARIABLE_PLAN_STEPS", 99)
    said, expected, planned = _start(100 * TPS)
    assert planned == 0 and len(said) == 2 and "too many to replay here" in said[1]
    assert "seqwarm plan --curriculum-mode variable" in said[1] and expected == [(100, 100 * TPS)]
