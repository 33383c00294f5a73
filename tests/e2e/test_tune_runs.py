"""`seqwarm tune`: the search against fake probes (monotone threshold, all fail, all pass, parallel rounds,
resume), the fluctuation verdict, the written config, one tiny real search, and bad input.

The slow, end-to-end part; the fast tests are in tests/experiments/test_tune.py.
"""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import main

FAST = FAST_TRAIN_FLAGS


@pytest.mark.slow
def test_tiny_real_search(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=6000, total_step=6)
    out = tmp_path / "tune"
    args = [
        "tune",
        *FAST,
        "--config",
        str(cfg),
        "--data",
        str(byte_data),
        "--out",
        str(out),
        "--probe-steps",
        "4",
        "--probe-evals",
        "2",
        "--lo",
        "2",
        "--hi",
        "8",
        "--resolution",
        "3",
        # every probe passes: this tests the search on real probe runs, not a tiny model's stability
        # (4 steps at lr 2e-3 can swing the full-length val ppl tenfold, depending on the init)
        "--fluctuation",
        "1000000",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "probe T=     8: pass" in printed and "chosen total_curriculum_step = 8" in printed
    tuned = json.loads((out / "tuned_config.json").read_text())
    assert tuned["curriculum_learning"]["schedule_config"]["total_curriculum_step"] == 8
    assert (out / "probes" / "T8.log").read_text().count("step ") >= 2
    assert not (out / "probes" / "T8" / "checkpoints").exists()
    state = json.loads((out / "tune_state.json").read_text())
    assert state["probes"]["8"]["steps"] == [2, 4]
