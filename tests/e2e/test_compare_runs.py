"""`seqwarm compare`: the curve arithmetic on synthetic curves, the report of two tiny real runs, reuse and
resume of run folders, the scaled and quick plans, and bad input.

The slow, end-to-end part; the fast tests are in tests/experiments/test_compare.py.
"""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import main
from seqwarm.data import data_fingerprint, read_meta
from seqwarm.experiments.launch import run_state

FAST = FAST_TRAIN_FLAGS


# -- two tiny real runs ------------------------------------------------------------------------------


@pytest.mark.slow
def test_compare_two_tiny_runs_report_reuse_and_resume(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=1200, total_step=4)
    out = tmp_path / "cmp"
    args = ["compare", *FAST, "--config", str(cfg), "--data", str(byte_data), "--eval-interval", "2", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "report.md" in printed
    report = json.loads((out / "report.json").read_text())
    for key in (
        "baseline",
        "curriculum",
        "speedup_tokens",
        "speedup_time",
        "stability",
        "commands",
        "reached",
        "target",
        "settings",
        "tokens_to_target",
        "time_to_target",
    ):
        assert key in report
    assert report["baseline"]["total_curriculum_step"] is None
    assert report["curriculum"]["total_curriculum_step"] == 4
    assert report["target"] == pytest.approx(report["baseline"]["final_val_loss"])
    assert "--no-curriculum" in report["commands"]["baseline"]
    assert "--no-curriculum" not in report["commands"]["curriculum"]
    for name in ("baseline", "curriculum"):
        assert report[name]["status"] == "trained" and report[name]["final_val_loss"] > 0
        assert report["stability"][name]["points"] >= 3  # compare logs every step by default
        assert run_state(out / name) == "finished"
        recorded = json.loads((out / name / "config.json").read_text())["data"]["fingerprint"]
        assert recorded == data_fingerprint(read_meta(byte_data))
    for png in ("compare_val.png", "compare_stability.png"):
        assert (out / png).stat().st_size > 10_000
    md = (out / "report.md").read_text()
    assert "## Stability" in md and "seqwarm train --config" in md

    # a second compare reuses both finished runs
    metrics_before = (out / "baseline" / "metrics.jsonl").read_text()
    assert main(args) == 0
    assert "reusing the finished run" in capsys.readouterr().out
    again = json.loads((out / "report.json").read_text())
    assert again["baseline"]["status"] == again["curriculum"]["status"] == "reused"
    assert (out / "baseline" / "metrics.jsonl").read_text() == metrics_before
    assert again["speedup_tokens"] == report["speedup_tokens"]

    # a run with checkpoints but no summary is resumed
    (out / "curriculum" / "summary.json").unlink()
    assert main(args) == 0
    capsys.readouterr()
    third = json.loads((out / "report.json").read_text())
    assert third["curriculum"]["status"] == "resumed" and third["baseline"]["status"] == "reused"
    assert third["curriculum"]["final_val_loss"] == pytest.approx(report["curriculum"]["final_val_loss"])

    # but a finished run made with other settings is not passed off as this experiment's
    assert main([*args, "--lr", "0.005"]) == 2
    assert "different lr" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_two_seeds_of_tiny_runs(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=800, total_step=3)
    out = tmp_path / "cmp"
    args = [
        "compare",
        *FAST,
        "--config",
        str(cfg),
        "--data",
        str(byte_data),
        "--eval-interval",
        "2",
        "--seed",
        "5",
        "--seeds",
        "2",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "over 2 seeds [5, 6]" in printed and "seed spread" in printed
    for folder in ("baseline", "curriculum", "seed-6/baseline", "seed-6/curriculum"):
        assert run_state(out / folder) == "finished"
    assert json.loads((out / "seed-6" / "curriculum" / "config.json").read_text())["options"]["seed"] == 6
    report = json.loads((out / "report.json").read_text())
    assert [r["seed"] for r in report["seeds"]] == [5, 6]
    assert report["baseline"]["run_dir"] == str(out / "baseline")  # today's keys: the first seed's
    assert report["aggregate"]["n_seeds"] == 2 and report["aggregate"]["final_val_loss"]["baseline"]["n"] == 2
    assert report["seeds"][0]["final_val_loss"] != report["seeds"][1]["final_val_loss"]
    assert "## Seeds" in (out / "report.md").read_text()
    assert main(args) == 0  # everything is reused
    assert capsys.readouterr().out.count("reusing the finished run") == 4


@pytest.mark.slow
def test_compare_modes_trains_the_baseline_once_per_seed_and_reports_one_row_per_mode(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=800, total_step=3)  # 8 runs: keep each one short
    out = tmp_path / "cmp"
    args = ["compare", *FAST, "--config", str(cfg), "--data", str(byte_data), "--eval-interval", "2", "--out", str(out)]
    args += ["--seed", "5", "--seeds", "2", "--modes", "truncate,reshape,window"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    modes = ("truncate", "reshape", "window")
    for arm in ("baseline", *modes):  # every arm of every seed trained exactly once, in its own folder
        assert printed.count(f"=== {arm}: ") == printed.count(f"=== seed-6/{arm}: ") == 1
        for folder in (out / arm, out / "seed-6" / arm):
            assert run_state(folder) == "finished"
            recorded = json.loads((folder / "config.json").read_text())["run"]["curriculum"]
            assert (recorded or {}).get("mode") == (None if arm == "baseline" else arm)
    assert not (out / "curriculum").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["arms"] == ["baseline", *modes] and list(report["modes"]) == list(modes)
    for mode in modes:
        m = report["modes"][mode]
        assert m["curriculum"]["status"] == "trained" and m["aggregate"]["n_seeds"] == 2
        # the time per token of each run's training steps, read from its metrics (evaluations left out)
        assert m["curriculum"]["step_us_per_token"] > 0 and m["aggregate"]["step_us_per_token"]["curriculum"]["n"] == 2
        assert [r["run_dirs"] for r in m["seeds"]] == [
            {"baseline": str(out / "baseline"), "curriculum": str(out / mode)},
            {"baseline": str(out / "seed-6" / "baseline"), "curriculum": str(out / "seed-6" / mode)},
        ]
    assert report["curriculum"]["run_dir"] == str(out / "truncate")  # the one-mode keys: the first mode's
    table = (out / "report.md").read_text().split("## Modes against the baseline")[1].split("## Runs")[0]
    assert [row.split("|")[1].strip() for row in table.splitlines() if row.startswith("| ")][1:] == ["baseline", *modes]
    lines = [line.split()[0] for line in printed.splitlines() if "steps, spikes" in line]
    assert lines == ["baseline", *modes]
    assert main(args) == 0  # finished runs in DIR/<mode> are reused
    assert capsys.readouterr().out.count("reusing the finished run") == 8
