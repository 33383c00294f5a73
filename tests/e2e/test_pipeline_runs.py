"""A 2-stage DeepSpeed pipeline (2 CPU processes, gloo, torchrun) as a Megatron-DeepSpeed user runs it: a
Megatron-preprocessed blend (--data-path), ZeRO stage 1, the length growing 16 -> 64 over 4 steps, and an
evaluation after every step, so that training resumes at each new length right after a full-length
evaluation. Every run trains, evaluates and ends; one stops mid-curriculum and resumes.

Each evaluation reads every window of a validation split whose window count is not a multiple of the
micro-batch size: its last batch has fewer rows than the others. DeepSpeed sizes the buffers that
receive activations from the first micro-batch after a reset; without a reset per evaluation batch
shape the last stage reads the partial batch's activations into the full batch's buffer and crashes
with a size mismatch against the labels (issue #39). The pipeline's evaluation loss also equals the
plain GPT's on the exported weights.

The modes a pipeline accepts (truncate, reshape, truncate with a length bucket), with and without
gradient accumulation, in five launches; the truncate run stopped mid-curriculum resumes to exactly the
losses of the run that was not stopped. The ZeRO runs that resume exactly, and the pipeline's match with
ZeRO-2, are in test_deepspeed_runs.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_deepspeed_runs import torchrun_test
from test_megatron_runs import BYTE_EOD, write_megatron

from conftest import run_torchrun, train_rows
from seqwarm.trainer.metrics import read_metrics

MICRO = {1: 8, 2: 4}
"""Micro-batch size per accumulation: 8 sequences per step on the one data-parallel rank."""


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """Two MMIDIDX prefixes (byte tokens) whose 90,10,0 split, read at the weights 0.3 / 0.7, gives an
    evaluation of 23 windows of 65 tokens: batches of 4 rows and a last one of 3, or 8, 8 and 7."""
    base = tmp_path_factory.mktemp("blend")
    rng = np.random.default_rng(0)
    prefixes = []
    for name, docs in (("A", 12), ("B", 26)):
        documents = [np.append(rng.integers(0, 256, size=int(rng.integers(300, 500))), BYTE_EOD) for _ in range(docs)]
        prefixes.append(write_megatron(base / f"{name}_text_document", documents, np.uint16))
    return prefixes


def zero1_json(path, **seqwarm):
    """ZeRO stage 1, 8 sequences per step, fixed_linear 8 -> 64 over 4 steps in steps of 8 (+ seqwarm's block)."""
    cfg = {
        "train_batch_size": 8,
        "zero_optimization": {"stage": 1},
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 64,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8},
        },
    }
    if seqwarm:
        cfg["seqwarm"] = seqwarm
    path.write_text(json.dumps(cfg))
    return path


def pipeline_run(blend, config, out, accumulation, *extra):
    """The issue's command line, on the blend, evaluating after every step at full length on every window."""
    a, b = blend
    args = [
        *("-m", "seqwarm", "train", "--deepspeed", "--config", str(config), "--pipeline-stages", "2"),
        *("--gradient-accumulation-steps", str(accumulation), "--micro-batch-size", str(MICRO[accumulation])),
        *("--global-batch-size", "8", "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--seq-length", "64"),
        *("--train-iters", "6", "--lr", "6e-4", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine"),
        *("--min-lr", "1e-5", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--data-path", "0.3", a, "0.7", b),
        *("--tokenizer", "byte", "--split", "90,10,0", "--log-interval", "1", "--eval-interval", "1"),
        *("--eval-iters", "50", "--seed", "1234", "--no-progress", "--no-tensorboard", "--save", str(out)),
        *extra,
    ]
    return run_torchrun(args, nproc=2)


class _Plain:
    """seqwarm's GPT on one process, with the surface evaluate() drives."""

    def __init__(self, model):
        self.module = model

    def eval(self):
        self.module.eval()

    def train(self, mode=True):
        self.module.train(mode)

    def __call__(self, batch):
        return self.module(**batch)


def check_run(run, steps, micro):
    """Lengths 16, 32, 48, then 64; an evaluation at full length after every step, on a partial last batch;
    the final one equal to the plain GPT's on the exported weights."""
    from seqwarm.evaluation.runs import load_run
    from seqwarm.trainer.evaluator import evaluate

    rows = train_rows(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [r["seqlen"] for r in rows] == [16, 32, 48, 64, 64, 64][:steps]
    assert all(np.isfinite(r["loss"]) for r in rows)
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"]
    assert sorted({e["step"] for e in evals}) == list(range(1, steps + 1))
    assert {e["seqlen"] for e in evals} == {64} and all(np.isfinite(e["val_loss"]) for e in evals)
    loaded = load_run(run, device="cpu")
    assert loaded.step == steps
    data = loaded.val_data()
    sizes = [len(b["input_ids"]) for b in data.val_batches(64, micro)]  # what every evaluation read
    assert sizes[0] == micro > sizes[-1]  # a partial last batch
    plain = evaluate(_Plain(loaded.model), data, 64, micro, None, torch.device("cpu"))
    final = json.loads((run / "summary.json").read_text())["final_val_loss"]
    assert final == pytest.approx(plain, rel=1e-5)
    return rows, evals


@torchrun_test
def test_truncate_with_accumulation_evaluates_every_length_and_resumes_exactly(blend, tmp_path):
    """The issue's run: accumulation 2, stopped at step 3 (length 48), resumed to step 6: the same steps,
    lengths, tokens and losses, training and evaluation, as the run that was not interrupted."""
    cfg, run, whole = zero1_json(tmp_path / "zero1.json"), tmp_path / "pp2", tmp_path / "whole"
    pipeline_run(blend, cfg, run, 2, "--train-iters", "3")
    first, _ = check_run(run, 3, MICRO[2])
    out = pipeline_run(blend, cfg, run, 2, "--resume", "--allow-config-change")
    assert "resuming at step 3" in out
    rows, evals = check_run(run, 6, MICRO[2])
    assert rows[:3] == first
    assert [r["tokens"] for r in rows] == [128, 384, 768, 1280, 1792, 2304]  # 8 sequences x the length, per step
    pipeline_run(blend, cfg, whole, 2)
    whole_rows, whole_evals = check_run(whole, 6, MICRO[2])
    assert [(r["step"], r["seqlen"], r["tokens"], r["loss"]) for r in rows] == [
        (r["step"], r["seqlen"], r["tokens"], r["loss"]) for r in whole_rows
    ]
    assert [(e["step"], e["val_loss"]) for e in evals] == [(e["step"], e["val_loss"]) for e in whole_evals]


@torchrun_test
def test_reshape_without_accumulation_evaluates_every_length(blend, tmp_path):
    cfg = zero1_json(tmp_path / "zero1.json", curriculum_mode="reshape")
    pipeline_run(blend, cfg, tmp_path / "run", 1)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run"]["curriculum"]["mode"] == "reshape"
    check_run(tmp_path / "run", 6, MICRO[1])


@torchrun_test
def test_length_bucket_with_accumulation_evaluates_every_length(blend, tmp_path):
    """Truncate into buckets of 32 columns (the loss masked past the length): 16 trains in 32 columns."""
    cfg = zero1_json(tmp_path / "zero1.json", length_bucket=32)
    pipeline_run(blend, cfg, tmp_path / "run", 2)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run"]["length_bucket"] == 32
    check_run(tmp_path / "run", 6, MICRO[2])
