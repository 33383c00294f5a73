"""``seqwarm export RUN --hf OUT``: the Transformers model computes seqwarm's logits, loads with
``from_pretrained``, generates, carries the tokenizer; rotary runs export as GPT-NeoX; bad input exits 2.

The slow, end-to-end part; the fast tests are in tests/evaluation/test_export.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import small_config
from seqwarm.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (conftest)

transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")


def export(capsys, run, out, *extra):
    code = main(["export", str(run), "--hf", str(out), *extra])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.slow
def test_trained_run_end_to_end(tmp_path, capsys, byte_data):
    """One real (tiny) seqwarm train run, exported by the CLI, loaded by transformers."""
    from seqwarm.evaluation.runs import load_run

    cfg = small_config(tmp_path / "c.json", train_tokens=1500)
    code = main(
        [
            "train",
            "--model",
            "tiny",
            "--eval-iters",
            "1",
            "--no-progress",
            "--no-tensorboard",
            "--config",
            str(cfg),
            "--data",
            str(byte_data),
            "--out",
            str(tmp_path / "run"),
            "--eval-interval",
            "0",
        ]
    )
    assert code == 0
    capsys.readouterr()
    code, out, err = export(capsys, tmp_path / "run", tmp_path / "hf")
    assert code == 0, err
    assert "GPT2LMHeadModel" in out
    gpt = load_run(tmp_path / "run", device="cpu").model
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.arange(64).reshape(1, 64) % 257
    with torch.no_grad():
        assert (gpt(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-5
    hf.generate(ids[:, :4], attention_mask=torch.ones(1, 4, dtype=torch.long), max_new_tokens=3, do_sample=False)
