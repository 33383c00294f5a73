"""The one runner of compare, tune and sweep (seqwarm.experiments.runner): what it does with a finished arm
and one that diverged before, its state file, the flags every experiment command refuses, and the reading
of an arm's folder. No training here: the end-to-end runs are in tests/e2e/test_{compare,sweep,tune}_runs.py.
"""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import main
from seqwarm.experiments.runner import Arm, ArmRunner, read_arm, refuse_run_flags
from seqwarm.run.command import train_argv
from seqwarm.run.spec import RunSpec
from seqwarm.util.errors import UserError


def test_a_finished_arm_is_reused_and_one_that_diverged_is_not_trained_again(tmp_path):
    finished, failed = RunSpec(out=tmp_path / "finished"), RunSpec(out=tmp_path / "failed", seed=7)
    finished.out.mkdir()
    (finished.out / "summary.json").write_text(json.dumps({"final_val_loss": 3.0}))
    state = tmp_path / "state.json"
    before = {"failed": {"status": "diverged", "argv": train_argv(failed), "message": "loss became nan"}}
    state.write_text(json.dumps(before))
    lines = []
    done = ArmRunner(state, echo=lines.append).run([Arm("finished", finished), Arm("failed", failed)])
    assert done["finished"]["status"] == "reused" and done["failed"] == before["failed"]
    assert lines[0].startswith("\n=== finished: seqwarm train") and lines[2].startswith("\n=== failed: ")
    assert lines[1] == f"finished: reusing the finished run in {finished.out}"
    assert lines[3] == "failed: diverged before (loss became nan); not run again"
    assert not (tmp_path / "failed").exists()  # nothing was trained
    saved = json.loads(state.read_text())
    assert list(saved) == ["failed", "finished"] and saved["finished"]["argv"] == train_argv(finished)


def test_an_arm_in_a_folder_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "arm").mkdir()
    (tmp_path / "arm" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a seqwarm run"):
        ArmRunner(tmp_path / "state.json", echo=lambda line: None).run([Arm("arm", RunSpec(out=tmp_path / "arm"))])


def test_refused_flags_name_the_command_and_what_it_does_instead():
    with pytest.raises(UserError, match="--resume is not a sweep flag: sweep runs the baseline with"):
        refuse_run_flags(RunSpec(resume=True), "sweep")
    with pytest.raises(UserError, match="--allow-config-change is not a tune flag: tune searches"):
        refuse_run_flags(RunSpec(allow_config_change=True), "tune", "tune searches ...")
    refuse_run_flags(RunSpec(), "compare")  # nothing refused


@pytest.mark.parametrize("command", ["compare", "tune", "sweep"])
@pytest.mark.parametrize("flag", ["--no-curriculum", "--resume", "--allow-config-change"])
def test_every_experiment_command_refuses_the_flags_it_decides_itself(tmp_path, capsys, command, flag):
    cfg = small_config(tmp_path / "c.json")
    assert main([command, *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path / "o"), flag]) == 2
    err = capsys.readouterr().err
    assert f"{flag} is not a {command} flag" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_reading_an_arm_keeps_one_evaluation_per_step_and_tolerates_missing_files(tmp_path):
    rows = [
        {"kind": "train", "step": 1, "tokens": 10, "loss": 5.0},
        {"kind": "eval", "step": 2, "tokens": 20, "val_loss": 4.0},
        {"kind": "train", "step": 2, "tokens": 20, "loss": float("nan")},
        {"kind": "eval", "step": 2, "tokens": 20, "val_loss": 3.9},  # a resumed run logs the step again
        {"kind": "eval", "step": 1, "tokens": 10, "val_loss": 4.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    arm = read_arm(tmp_path)
    assert [(r["step"], r["val_loss"]) for r in arm.evals] == [(1, 4.5), (2, 3.9)]
    assert arm.finite_losses() == [5.0] and len(arm.train) == 2
    assert arm.summary == {} and arm.config == {} and arm.run == {}
    empty = read_arm(tmp_path / "absent")
    assert empty.rows == [] and empty.evals == []
