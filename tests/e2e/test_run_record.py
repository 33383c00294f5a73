"""``--resume`` never destroys what a run folder holds (issue #28) and one command starts or continues a
run (``--resume auto``, issue #29), on tiny byte-level runs: a finished run whose checkpoints are deleted
or dangle is not started over; a resume with other settings keeps config.json and appends to
history.jsonl; a run stopped between its last evaluation and its summary gets no duplicate row; a
metrics line that is not a row stops the resume with exit 2; 1 -> 2 -> 1 processes under torchrun.

The fast tests of the same rules are in tests/trainer/test_history.py."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_torchrun, small_config
from seqwarm.cli import main
from seqwarm.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

FAST = ["--model", "tiny", "--eval-iters", "1", "--no-progress", "--no-tensorboard", "--log-interval", "1"]
RUN = ["--train-iters", "6", "--save-interval", "2", "--eval-interval", "3", "--keep-checkpoints", "0"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def train(args):
    try:
        return main(["train", *FAST, *RUN, *args])
    except SystemExit as exc:  # argparse refuses some values itself, with 2
        return exc.code


def subprocess_train(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "seqwarm", "train", *FAST, *RUN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def keys(run):
    return [(r["kind"], r["step"]) for r in read_metrics(Path(run) / "metrics.jsonl")]


def losses(run):
    return {(r["kind"], r["step"]): r.get("loss", r.get("val_loss")) for r in read_metrics(Path(run) / "metrics.jsonl")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, byte_data):
    """A finished 6-step run (checkpoints at 2, 4, 6; evaluations at 3 and 6) and its command; copy it."""
    base = tmp_path_factory.mktemp("record")
    cfg = small_config(base / "c.json", train_tokens=100_000, total_step=2)
    common = ["--config", str(cfg), "--data", str(byte_data)]
    assert train([*common, "--out", str(base / "finished")]) == 0
    return base / "finished", common


def copy(setup, tmp_path, name="run"):
    out = tmp_path / name
    shutil.copytree(setup[0], out, symlinks=True)
    return out


@pytest.mark.parametrize("damage", ["deleted", "dangling"])
def test_a_finished_run_whose_checkpoints_are_gone_is_not_started_over(setup, tmp_path, damage):
    run = copy(setup, tmp_path)
    shutil.rmtree(run / "checkpoints")
    if damage == "dangling":  # a link to scratch space that is not mounted
        (run / "checkpoints").symlink_to(tmp_path / "scratch" / "checkpoints")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = subprocess_train([*setup[1], "--out", str(run), "--resume"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert "is a link to" in message if damage == "dangling" else f"{run / 'checkpoints'} is missing" in message
    assert "summary.json (a finished run, 6 steps)" in message and "metrics.jsonl (8 rows, to step 6)" in message
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing rewritten

    # starting over takes --start-over, and keeps the old record whole in previous-1
    assert train([*setup[1], "--out", str(run), "--start-over"]) == 0
    old = run / "previous-1"
    assert {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()} == before
    assert (old / "checkpoints").is_symlink() == (damage == "dangling")
    assert losses(run) == losses(setup[0])
    assert json.loads((run / "history.jsonl").read_text().splitlines()[0])["moved_aside"] == "previous-1"


def test_a_resume_with_other_settings_keeps_config_json_and_appends_what_changed(setup, tmp_path, capsys, caplog):
    run = copy(setup, tmp_path)
    (run / "summary.json").unlink()
    for step in (4, 6):
        (run / "checkpoints" / f"step_{step:08d}.pt").unlink()
    config = (run / "config.json").read_bytes()
    changes = ["--weight-decay", "0.05", "--clip-grad", "0.5", "--lr", "0.001"]
    assert train([*setup[1], "--out", str(run), "--resume", *changes]) == 2
    err = capsys.readouterr().err
    for part in (
        "run.optimizer.weight_decay 0.1 -> 0.05",
        "run.gradient_clipping 1.0 -> 0.5",
        "run.lr.lr 0.002 -> 0.001",
    ):
        assert part in err
    assert train([*setup[1], "--out", str(run), "--resume", *changes, "--allow-config-change"]) == 0
    assert (run / "config.json").read_bytes() == config  # what the first steps were trained with
    resume = [e for e in map(json.loads, (run / "history.jsonl").read_text().splitlines()) if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 2
    changed = resume[0]["changed"]
    assert changed["run.optimizer.weight_decay"] == [0.1, 0.05] and changed["run.gradient_clipping"] == [1.0, 0.5]
    assert "changed since the checkpoint of step 2" in caplog.text
    # the new weight decay is the one trained with (loading the optimizer state brought back the old one)
    state = torch.load(run / "checkpoints" / "step_00000006.pt", weights_only=False)
    assert state["engine"]["optimizer"]["param_groups"][0]["weight_decay"] == 0.05

    # other training data of the same size (the case: the data position fits, the tokens differ)
    other = other_data(Path(setup[1][3]), tmp_path / "other-data")
    args = [setup[1][0], setup[1][1], "--data", str(other), "--out", str(run), "--resume"]
    assert train(args) == 2
    assert "training data (fingerprint " in capsys.readouterr().err
    assert train([*args, *changes, "--allow-config-change"]) == 0
    assert (run / "config.json").read_bytes() == config
    last = json.loads((run / "history.jsonl").read_text().splitlines()[-2])  # then a checkpoint line
    assert (
        last["event"] == "resume" and last["changed"]["data.fingerprint"][0] != last["changed"]["data.fingerprint"][1]
    )


def other_data(data, out):
    """A copy of the prepared folder ``data`` whose validation tokens are reversed (same size, other data)."""
    shutil.copytree(data, out)
    tokens = np.fromfile(out / "val.bin", dtype=np.uint16)[::-1].copy()
    tokens.tofile(out / "val.bin")
    meta = json.loads((out / "meta.json").read_text())
    meta["files"]["val.bin"]["sha256"] = hashlib.sha256((out / "val.bin").read_bytes()).hexdigest()
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_a_run_stopped_after_its_last_evaluation_gets_no_duplicate_row(setup, tmp_path):
    """The state a run killed after its final evaluation and checkpoint, before summary.json, leaves."""
    run = copy(setup, tmp_path)
    (run / "summary.json").unlink()
    (run / "curves.png").unlink()
    assert keys(run)[-1] == ("eval", 6)
    proc = subprocess_train([*setup[1], "--out", str(run), "--resume"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert keys(run) == keys(setup[0]) and len(set(keys(run))) == len(keys(run))
    assert losses(run) == losses(setup[0]) and (run / "summary.json").exists()


@pytest.mark.parametrize("line", ["[1, 2]", '{"kind": "train", "step": "3"}'])
def test_a_metrics_line_that_is_not_a_row_stops_the_resume_naming_it(setup, tmp_path, line):
    run = copy(setup, tmp_path)
    (run / "summary.json").unlink()
    rows = (run / "metrics.jsonl").read_text().splitlines()
    rows[2] = line
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    before = (run / "metrics.jsonl").read_bytes()
    proc = subprocess_train([*setup[1], "--out", str(run), "--resume"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{run / 'metrics.jsonl'} line 3" in proc.stderr.strip().splitlines()[-1]
    assert (run / "metrics.jsonl").read_bytes() == before


def test_resume_auto_is_one_command_for_the_first_launch_and_every_requeue(setup, tmp_path):
    run = tmp_path / "job"
    args = [*setup[1], "--out", str(run), "--resume", "auto"]
    assert train(args) == 0  # first launch: no folder yet
    assert losses(run) == losses(setup[0])
    (run / "summary.json").unlink()
    (run / "checkpoints" / "step_00000006.pt").unlink()
    assert train(args) == 0  # requeued: continues from step 4
    assert losses(run) == losses(setup[0])
    assert [e["event"] for e in map(json.loads, (run / "history.jsonl").read_text().splitlines())].count("resume") == 1
    shutil.rmtree(run / "checkpoints")
    assert train(args) == 2  # the same safety checks: a run that wrote checkpoints is never restarted


@pytest.mark.dist
def test_resume_on_one_two_and_one_process_with_the_same_global_batch(setup, tmp_path):
    """Global batch 8: micro 4 x accumulation 2 on one process, micro 4 x 2 processes on two."""
    run = copy(setup, tmp_path)
    (run / "summary.json").unlink()
    for step in (4, 6):
        (run / "checkpoints" / f"step_{step:08d}.pt").unlink()
    out = run_torchrun(["-m", "seqwarm", "train", *FAST, *RUN, *setup[1], "--out", str(run), "--resume"], nproc=2)
    assert "resuming at step 2" in out
    (run / "summary.json").unlink()
    (run / "checkpoints" / "step_00000006.pt").unlink()
    assert train([*setup[1], "--out", str(run), "--resume"]) == 0
    ref = losses(setup[0])
    assert keys(run) == keys(setup[0])
    assert all(abs(v - ref[k]) < 1e-4 for k, v in losses(run).items())  # all-reduce order: rounding only
    worlds = [e["changed"].get("world_size") for e in map(json.loads, (run / "history.jsonl").read_text().splitlines())
              if e["event"] == "resume"]  # fmt: skip
    assert worlds == [[1, 2], [2, 1]]
