"""Short `seqwarm train` runs give the lengths, tokens, LRs and losses recorded before the curriculum object
was restructured (issue "One curriculum object, one step, one cut": no behaviour change for CLI users).

The figures in ``data/golden_runs.json`` were written by ``python tests/e2e/test_golden_run.py --record`` at
commit 87f7249 (before the change), on the CPU with one thread; the runs are bit-for-bit deterministic
there (same torch build, same thread count). Every mode that cuts a batch is covered: inject (the GPT's
forward takes ``curriculum_seqlen``), truncate, reshape, a length bucket, loss-mask token counts, and
gradient accumulation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
GOLDEN = HERE / "data" / "golden_runs.json"

# name -> extra keys of the config's "seqwarm" block and flags
CASES = {
    "inject_accum2": ({}, []),
    "truncate": ({"curriculum_mode": "truncate"}, []),
    "reshape": ({"curriculum_mode": "reshape"}, []),
    "bucket16_loss_mask": ({"length_bucket": 16, "count_tokens_by": "loss_mask"}, []),
    "no_curriculum": ({}, ["--no-curriculum"]),
}


def _config(path: Path, extra: dict) -> Path:
    cfg = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 64,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8},
        },
        "seqwarm": {
            "seq_length": 64,
            "train_tokens": 5000,
            "lr_warmup_iters": 2,
            "lr_decay_style": "cosine",
            "min_lr": 0.0002,
            **extra,
        },
    }
    path.write_text(json.dumps(cfg))
    return path


def run_case(name: str, folder: Path, data: Path) -> dict:
    """One short run; its per-step figures (every step is a log row) and final validation loss."""
    import torch

    from seqwarm.cli import main
    from seqwarm.trainer.metrics import read_metrics

    extra, flags = CASES[name]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = folder / name
        code = main(
            [
                "train",
                "--model",
                "tiny",
                "--eval-iters",
                "2",
                "--no-progress",
                "--no-tensorboard",
                "--log-interval",
                "1",
                "--eval-interval",
                "0",
                "--save-interval",
                "0",
                "--seed",
                "7",
                "--config",
                str(_config(folder / f"{name}.json", extra)),
                "--data",
                str(data),
                "--out",
                str(out),
                *flags,
            ]
        )
    finally:
        torch.set_num_threads(before)
    assert code == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "steps": [[r["step"], r["seqlen"], r["tokens"], r["samples"], r["lr"], r["loss"]] for r in rows],
        "final_val_loss": summary["final_val_loss"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_short_run_is_bit_identical_to_the_recorded_one(name, tmp_path, byte_data):
    recorded = json.loads(GOLDEN.read_text())["runs"][name]
    got = run_case(name, tmp_path, byte_data)
    assert got["steps"] == recorded["steps"]  # step, seqlen, tokens, samples, lr, loss: exact
    assert got["final_val_loss"] == recorded["final_val_loss"]


def _record() -> None:  # pragma: no cover - run by hand, once, before a change
    import subprocess
    import tempfile

    sys.path.insert(0, str(HERE))
    from conftest import make_corpus
    from seqwarm.data import prepare_dataset

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        data = base / "prepared"
        prepare_dataset(
            data, [make_corpus(base / "corpus")], tokenizer="byte", val_fraction=0.1, workers=1, progress=False
        )
        runs = {name: run_case(name, base, data) for name in sorted(CASES)}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(
        json.dumps(
            {"command": "python tests/e2e/test_golden_run.py --record", "commit": commit, "runs": runs}, indent=1
        )
        + "\n"
    )
    print(f"wrote {GOLDEN}")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    _record()
