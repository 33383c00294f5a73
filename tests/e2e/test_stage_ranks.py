"""Stages on two CPU processes under torchrun (gloo DDP, issue #36): both ranks set the same rotary positions
at the same optimizer step, their tables end equal to the last stage's, and the run trains the same losses as
one process seeing the same windows."""

from __future__ import annotations

import pytest

from conftest import FAST_TRAIN_FLAGS, run_torchrun, small_config, train_rows
from seqwarm.trainer.metrics import read_metrics

pytestmark = [pytest.mark.dist, pytest.mark.slow]

STAGES = [
    {"start_tokens": 2000, "length": 48, "rope_theta": 40000.0},
    {"start_tokens": 3500, "length": 64, "rope_scaling": {"type": "yarn", "factor": 2.0}},
]

RECORDING_TRAIN = """
import os, sys
import torch
from seqwarm.cli import main
from seqwarm.curriculum.engine import CurriculumEngine

calls, rotary = [], []
set_positions = CurriculumEngine._set_positions

def recorded(self, positions, length=None):  # the optimizer step whose begin_step set them, and what it set
    set_positions(self, positions, length)
    if positions is not None:
        calls.append([self.slw.progress.step + 1, positions])
        rotary[:] = [m for m in self.module.modules() if getattr(m, "rope_cos", None) is not None][:1]  # the GPT

CurriculumEngine._set_positions = recorded
code = main(["train", *sys.argv[2:]])
rank = os.environ["RANK"]  # the process group is gone once the run ended
model = rotary[0]
torch.save({"code": code, "calls": calls, "cos": model.rope_cos.clone(), "sin": model.rope_sin.clone(),
            "positions": model.positions, "config": model.config}, f"{sys.argv[1]}/rank{rank}.pt")
"""


def _train(tmp_path, name, common, nproc):
    """``seqwarm train`` under torchrun, each rank recording the positions it set: (run folder, per-rank dumps)."""
    import torch

    script = tmp_path / "recording_train.py"
    script.write_text(RECORDING_TRAIN)
    dump = tmp_path / f"{name}-ranks"
    dump.mkdir()
    run_torchrun([str(script), str(dump), *common, "--out", str(tmp_path / name)], nproc=nproc)
    return tmp_path / name, [torch.load(p, weights_only=False) for p in sorted(dump.glob("rank*.pt"))]


@pytest.mark.parametrize("extra", [[], ["--fsdp"]], ids=["ddp", "fsdp2"])
def test_two_ranks_change_positions_at_the_same_step_and_match_one_process(tmp_path, byte_data, extra):
    import torch

    from seqwarm.trainer.model import GPT

    # --seq-length 32 (the warmup's top); the stages read windows of 48 and 64, one row per micro-batch
    cfg = small_config(tmp_path / "c.json", total_step=4, train_tokens=4000, seq=32, batch=8, micro=2, stages=STAGES)
    common = [*FAST_TRAIN_FLAGS, "--rotary", "--log-interval", "1", "--eval-interval", "0", "--save-interval", "0"]
    common += ["--config", str(cfg), "--data", str(byte_data), *extra]
    two, ranks = _train(tmp_path, "two", common, nproc=2)
    assert len(ranks) == 2 and all(r["code"] == 0 for r in ranks)
    stages = [r for r in read_metrics(two / "metrics.jsonl") if r["kind"] == "stage"]
    assert [(r["stage"], r["seqlen"], r["reason"]) for r in stages] == [(1, 48, "begins"), (2, 64, "begins")]
    assert ranks[0]["config"].seq_length == 64 and [r["micro_batch_size"] for r in stages] == [1, 1]
    # every rank set each stage's positions at the step the stage row names, and nothing else
    expected = [[r["step"], {"rope_theta": r["rope_theta"], "rope_scaling": r["rope_scaling"]}] for r in stages]
    assert ranks[0]["calls"] == ranks[1]["calls"] == expected
    assert expected[1][1]["rope_theta"] == 40000.0 and expected[1][1]["rope_scaling"]["type"] == "yarn"
    # the tables both ranks ended with are the last stage's, bit for bit (DDP broadcasts buffers from rank 0
    # at each forward, FSDP2 does not: there each rank's own set_positions made them)
    fresh = GPT(ranks[0]["config"])
    fresh.set_positions(**expected[1][1])
    for rank in ranks:
        assert rank["positions"] == {"rope_theta": 40000.0, "rope_scaling": expected[1][1]["rope_scaling"]}
        assert torch.equal(rank["cos"], fresh.rope_cos) and torch.equal(rank["sin"], fresh.rope_sin)
    assert not torch.equal(fresh.rope_cos, GPT(ranks[0]["config"]).rope_cos)  # the stage changed them
    rows = train_rows(two)
    assert {r["seqlen"] for r in rows if r["step"] >= stages[1]["step"]} == {64}
    tokens = {r["step"]: r["tokens"] for r in rows}  # 1 row x 2 micro-batches x 2 ranks per step
    assert {tokens[k] - tokens[k - 1] for k in tokens if k > stages[1]["step"]} == {4 * 64}

    if extra:
        return
    # one process with accumulation 4 sees the same 8 windows per step: the same stages, the same losses
    one, single = _train(tmp_path, "one", common, nproc=1)
    assert single[0]["calls"] == expected
    a, b = train_rows(two), train_rows(one)
    assert [(r["seqlen"], r["tokens"]) for r in a] == [(r["seqlen"], r["tokens"]) for r in b]
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-5)
    for x, y in zip(a[1:], b[1:]):  # gradients all-reduced in another order: rounding only (test_distributed)
        assert x["loss"] == pytest.approx(y["loss"], rel=2e-3), f"step {x['step']}"
