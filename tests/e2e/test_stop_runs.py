"""A graceful stop, end to end: SIGTERM / SIGUSR1 mid-run finishes the step, saves, prints the command that
continues the run and exits 75; that command ends with the same losses and tokens as a run never stopped.
Under torchrun (2 gloo ranks) a signal that reaches one rank, or the whole process group (Ctrl-C: the
launcher forwards it a second time), stops every rank at the same step with a checkpoint.

The fast tests (the stop request, signals during an evaluation or a save, the wall-clock limit) are in
tests/trainer/test_stop.py.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config, train_rows
from seqwarm.cli import main
from seqwarm.trainer.checkpoint import list_checkpoints
from seqwarm.trainer.metrics import read_metrics
from seqwarm.trainer.stop import EXIT_STOPPED

pytestmark = pytest.mark.slow

FAST = [*FAST_TRAIN_FLAGS, "--eval-iters", "1", "--log-interval", "1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}


def _rows(run_dir):
    keys = ("kind", "step", "tokens", "loss", "val_loss")
    return [tuple(r.get(k) for k in keys) for r in read_metrics(run_dir / "metrics.jsonl")]


def _wait_for_step(run_dir, step, proc, deadline_s=120):
    end = time.time() + deadline_s
    while time.time() < end and proc.poll() is None:
        if any(r["step"] >= step for r in train_rows(run_dir)) if (run_dir / "metrics.jsonl").exists() else False:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {step}: {proc.poll()=}")


def _children(pid):
    """The processes whose parent is ``pid`` (torchrun's workers)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _rank(pid):
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(int(v[5:]) for v in env if v.startswith(b"RANK="))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, byte_data, one_thread):
    """A config and the losses of the run never stopped."""
    base = tmp_path_factory.mktemp("stop")
    cfg = small_config(base / "c.json", train_tokens=100_000, total_step=4)
    common = ["--config", str(cfg), "--data", str(byte_data), "--train-iters", "12", "--eval-interval", "5",
              "--save-interval", "0"]  # fmt: skip
    assert main(["train", *FAST, *common, "--out", str(base / "ref")]) == 0
    ref = json.loads((base / "ref" / "summary.json").read_text())
    return common, _rows(base / "ref"), ref["tokens"]


def test_a_signal_mid_run_saves_and_the_printed_command_resumes_to_the_same_losses(tmp_path, setup):
    """SIGTERM (SIGUSR1 takes the same path: the torchrun test below sends it, tests/trainer/test_stop.py
    checks every signal's handler)."""
    signum = signal.SIGTERM
    common, expected, expected_tokens = setup
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "seqwarm", "train", *FAST, *common, "--out", str(run)]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_step(run, 3, proc)
    proc.send_signal(signum)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == EXIT_STOPPED, out[-2000:]
    assert "Traceback" not in out and not (run / "summary.json").exists()
    stopped_at = train_rows(run)[-1]["step"]
    assert f"stopped early ({signal.Signals(signum).name}) after step {stopped_at}" in out
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [stopped_at] and stopped_at < 12

    command = out.split("continue with: ")[1].splitlines()[0]
    argv = shlex.split(command)
    assert argv[:2] == ["seqwarm", "train"] and argv[-1] == "--resume"
    resumed = subprocess.run([sys.executable, "-m", *argv], env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resuming at step {stopped_at}" in resumed.stdout
    assert _rows(run) == expected
    assert json.loads((run / "summary.json").read_text())["tokens"] == expected_tokens


def _torchrun(args, **kwargs):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "seqwarm", "train", *FAST, *args]  # fmt: skip
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


@pytest.mark.dist
def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, setup):
    """SIGUSR1 to rank 1 alone: rank 0 learns it in the step's all-reduce, and rank 0 saves that step."""
    common, _, _ = setup
    one = tmp_path / "one"
    proc = _torchrun([*common, "--out", str(one)])
    _wait_for_step(one, 3, proc)
    rank1 = next(pid for pid in _children(proc.pid) if _rank(pid) == 1)
    os.kill(rank1, signal.SIGUSR1)
    out = proc.communicate(timeout=120)[0]
    stopped_at = train_rows(one)[-1]["step"]
    assert out.count("stopped early (SIGUSR1)") == 1, out[-3000:]  # said once, by rank 0
    assert f"after step {stopped_at} " in out and "exitcode  : 75" in out  # torchrun lists the workers' code
    assert [s for s, _ in list_checkpoints(one / "checkpoints")] == [stopped_at] and stopped_at < 12


@pytest.mark.dist
def test_under_torchrun_ctrl_c_forwarded_twice_is_one_graceful_stop_and_resume_finishes(tmp_path, setup):
    """Ctrl-C: SIGINT to the whole process group, which torchrun forwards to its workers once more."""
    common, _, _ = setup
    group = tmp_path / "group"
    proc = _torchrun([*common, "--out", str(group)], start_new_session=True)
    _wait_for_step(group, 3, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    stopped_at = train_rows(group)[-1]["step"]
    assert "stopped early (SIGINT)" in out and "stopped at once" not in out, out[-3000:]
    assert [s for s, _ in list_checkpoints(group / "checkpoints")] == [stopped_at] and stopped_at < 12

    proc = _torchrun([*common, "--out", str(group), "--resume"])
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0 and f"resuming at step {stopped_at}" in out, out[-3000:]
    assert [r["step"] for r in train_rows(group)] == list(range(1, 13))
