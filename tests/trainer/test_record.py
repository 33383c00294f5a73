"""What a run prints about itself: the start lines (once each, no raw JSON) and the end line."""

import logging
from pathlib import Path
from types import SimpleNamespace

from helpers import tiny_run
from seqwarm import load_config
from seqwarm.trainer.backends import RunChoices
from seqwarm.trainer.record import TrainResult, finish_lines, format_start

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny_cpu.json"


def _result(steps: int) -> TrainResult:
    summary = {"final_val_loss": 5.0, "final_val_ppl": 148.4, "steps": steps, "tokens": 4096, "wall_time_s": 3.0}
    return TrainResult(Path("runs/x"), steps, 4096, 5.0, "reached the token budget", {**summary, "tokens_per_s": 1})


def test_the_end_line_counts_steps_in_english():
    assert "after 1 step, 4,096 tokens" in finish_lines(_result(1))[1]
    assert "after 2 steps, 4,096 tokens" in finish_lines(_result(2))[1]


def test_the_data_line_names_the_tokenizer_not_its_record():
    tokenizer = {"name": "bpe:8192", "vocab_size": 8192, "eod_id": 0, "files": ["tokenizer.json"]}
    run = SimpleNamespace(
        resolved={
            "model": {"preset": "tiny", "num_params": 5.3e6, "n_layer": 4, "n_embd": 256, "n_head": 4,
                      "seq_length": 256, "vocab_size": 8192},
            "data": {"folder": "data/x", "train_tokens": 1000, "val_tokens": 100, "tokenizer": tokenizer},
            "parallelism": "none",
        },
        run_dir=Path("runs/x"),
        device="cpu",
        info=SimpleNamespace(world_size=1),
        cfg=load_config(TINY),
        choices=RunChoices("fp32", "default on cpu", None),
        precision_info={"source": "default on cpu", "tf32_matmul": False},
    )  # fmt: skip
    lines = format_start(run)
    [data] = [line for line in lines if line.startswith("data:")]
    assert data.endswith("(1,000 train / 100 val tokens, tokenizer bpe:8192)") and "{" not in data
    assert [line for line in lines if "precision" in line] == ["precision:   fp32 (default on cpu)"]


def test_the_precision_is_said_once_by_the_start_lines_not_logged_again(tmp_path, byte_data, caplog):
    with caplog.at_level(logging.INFO):
        tiny_run(tmp_path / "run", byte_data, TINY)
    assert not [r for r in caplog.records if r.getMessage().startswith("precision")]
