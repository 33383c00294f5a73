"""Shared fixtures: a small prepared dataset made in the test session (byte tokenizer, no downloads)."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAST_TRAIN_FLAGS = ["--model", "tiny", "--eval-iters", "2", "--no-progress", "--no-tensorboard"]
"""The flags every quick CPU training run in the tests shares: tiny model, 2 validation batches, no
progress bar, no TensorBoard events. Tests add what they need (--log-interval, --eval-interval, ...)."""

WORDS = (
    "the curriculum grows the sequence length while the model learns short context first and "
    "long context later so that large batches and learning rates stay stable"
).split()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread is as fast and does not fight other work for the cores (restored after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_corpus(folder: Path, docs: int = 40, words_per_doc: int = 700, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        text = " ".join(rng.choice(WORDS) for _ in range(words_per_doc))
        (folder / f"doc{i:03d}.txt").write_text(text.capitalize() + ".\n")
    return folder


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory) -> Path:
    """A prepared folder (byte tokenizer) of ~200 KB of synthetic text."""
    from seqwarm.data import prepare_dataset

    base = tmp_path_factory.mktemp("data")
    corpus = make_corpus(base / "corpus")
    out = base / "prepared"
    prepare_dataset(out, [corpus], tokenizer="byte", val_fraction=0.1, workers=1, progress=False)
    return out


def small_config(
    path: Path,
    *,
    total_step: int = 6,
    train_tokens: int = 6000,
    seq: int = 64,
    batch: int = 8,
    micro: int = 4,
    **seqwarm_extra,
) -> Path:
    """A DeepSpeed-style config for a fast CPU run: curriculum 8 -> seq over total_step steps."""
    cfg = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": micro,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": seq,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": total_step, "difficulty_step": 8},
        },
        "seqwarm": {
            "seq_length": seq,
            "train_tokens": train_tokens,
            "lr_warmup_iters": 2,
            "lr_decay_style": "cosine",
            "min_lr": 0.0002,
            **seqwarm_extra,
        },
    }
    path.write_text(json.dumps(cfg))
    return path


def run_torchrun(argv: list[str], nproc: int = 2) -> str:
    """``python -m torch.distributed.run --standalone`` with ``argv``; asserts success, returns stdout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def train_rows(run_dir: Path) -> list[dict]:
    """The ``kind: train`` rows of a run's metrics.jsonl."""
    from seqwarm.trainer.metrics import read_metrics

    return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r["kind"] == "train"]
