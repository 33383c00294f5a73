"""`seqwarm sweep`: the grid plan (no training), bad input, and a 2x1 grid of tiny runs, reused on rerun.

The slow, end-to-end part; the fast tests are in tests/experiments/test_sweep.py.
"""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import main
from seqwarm.experiments.launch import run_state


@pytest.mark.slow
def test_sweep_2x1_grid_of_tiny_runs_continues(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=800, total_step=3)
    out = tmp_path / "sw"
    args = [
        "sweep",
        *FAST_TRAIN_FLAGS,
        "--config",
        str(cfg),
        "--data",
        str(byte_data),
        "--eval-interval",
        "2",
        "--lr",
        "1e-3,4e-3",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    assert "report:" in capsys.readouterr().out
    report = json.loads((out / "sweep.json").read_text())
    assert [c["lr"] for c in report["cells"]] == [1e-3, 4e-3]
    for cell in report["cells"]:
        for arm in ("baseline", "curriculum"):
            run = cell["seeds"][0][arm]
            assert run_state(out / cell["name"] / arm) == "finished" and run["final_val_loss"] > 0
            assert isinstance(run["diverged"], bool) and run["max_loss_ratio"] >= 1.0
        assert cell["seeds"][0]["tokens_to_target"]["target"] == cell["seeds"][0]["baseline"]["final_val_loss"]
    assert (out / "sweep.png").stat().st_size > 10_000 and "| curriculum |" in (out / "sweep.md").read_text()
    assert [(r["arm"], r["lrs"]) for r in report["stability_limits"]] == [
        ("baseline", [1e-3, 4e-3]),
        ("curriculum", [1e-3, 4e-3]),
    ]
    # a killed sweep continues: a finished run is reused, one removed is trained again
    import shutil

    shutil.rmtree(out / report["cells"][1]["name"] / "curriculum")
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count("reusing the finished run") == 3
