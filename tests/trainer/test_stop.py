"""A graceful stop (seqwarm.trainer.stop): the stop request, its signals and wall-clock limit, and the loop
stopping at a step boundary with a checkpoint, also when the signal comes during an evaluation or a save.

The subprocess runs (SIGTERM / SIGUSR1 then --resume, torchrun) are in tests/e2e/test_stop_runs.py.
"""

import os
import signal
from pathlib import Path

import pytest

from conftest import small_config
from helpers import tiny_run
from seqwarm.cli import main
from seqwarm.trainer.checkpoint import list_checkpoints
from seqwarm.trainer.distributed import DistInfo
from seqwarm.trainer.metrics import read_metrics
from seqwarm.trainer.stop import EXIT_STOPPED, REPEAT_WINDOW_S, RunStopped, StopNow, StopRequest


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_first_signal_asks_a_second_stops_at_once_and_a_forwarded_repeat_is_the_first():
    clock = Clock()
    stop = StopRequest(clock=clock)
    assert stop.reason() is None and stop.agreed(DistInfo()) is None
    stop.handle(signal.SIGTERM)
    assert stop.reason() == "SIGTERM" and stop.agreed(DistInfo()) == "SIGTERM"
    clock.now += REPEAT_WINDOW_S / 2
    stop.handle(signal.SIGTERM)  # torchrun forwarding what the terminal already sent: still a graceful stop
    clock.now += REPEAT_WINDOW_S
    with pytest.raises(StopNow) as err:
        stop.handle(signal.SIGTERM)
    assert err.value.exit_code == 128 + signal.SIGTERM and isinstance(err.value, KeyboardInterrupt)
    assert "SIGTERM again: stopped at once" in str(err.value)

    other = StopRequest(clock=clock)
    other.handle(signal.SIGUSR1)
    with pytest.raises(StopNow) as err:  # another signal, however soon: at once
        other.handle(signal.SIGINT)
    assert err.value.exit_code == 130


def test_the_wall_clock_limit_counts_from_the_request():
    clock = Clock()
    stop = StopRequest(minutes=2, clock=clock)
    clock.now += 119
    assert stop.reason() is None
    clock.now += 1
    assert stop.reason() == "--exit-duration-in-mins 2 reached"
    assert StopRequest(clock=clock).reason() is None  # no limit


def test_install_puts_the_handlers_back_and_nests():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)}
    stop = StopRequest()
    with stop:
        with stop:  # run_training's, then Run.train's
            pass
        assert all(signal.getsignal(s) == stop.handle for s in before)
        os.kill(os.getpid(), signal.SIGUSR1)  # its default action would end the test process
        os.kill(os.getpid(), signal.SIGUSR1)  # forwarded again at once: the same request
    assert {s: signal.getsignal(s) for s in before} == before
    assert stop.reason() == "SIGUSR1"


def test_the_stop_message_says_what_was_kept_and_how_to_continue():
    class P:
        step, tokens = 7, 1234

    stopped = RunStopped("SIGTERM", P(), Path("run/checkpoints/step_00000007.pt"))
    stopped.resume_command = "seqwarm train --out run --resume"
    text = str(stopped)
    assert "stopped early (SIGTERM) after step 7 (1,234 tokens)" in text
    assert "checkpoint run/checkpoints/step_00000007.pt" in text and f"Exit code {EXIT_STOPPED}" in text
    assert text.endswith("continue with: seqwarm train --out run --resume")
    P.step = 0
    assert "no checkpoint" in str(RunStopped("SIGINT", P(), Path("x")))


# -- the loop, in process -------------------------------------------------------------------------------


@pytest.fixture
def cfg(tmp_path):
    return small_config(tmp_path / "c.json", train_tokens=100_000, total_step=4)


def _train_rows(run_dir):
    return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r["kind"] == "train"]


def test_a_signal_during_an_evaluation_finishes_it_then_saves_that_step(
    tmp_path, byte_data, cfg, one_thread, monkeypatch
):
    from seqwarm.trainer.evaluator import Evaluator

    run = tiny_run(tmp_path / "r", byte_data, cfg, eval_interval=3)
    real = Evaluator.__call__

    def evaluate_and_get_signalled(evaluator, engine):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(evaluator, engine)

    monkeypatch.setattr(Evaluator, "__call__", evaluate_and_get_signalled)
    with pytest.raises(RunStopped) as err:
        run.train()
    assert err.value.step == 3 and err.value.reason == "SIGTERM"
    assert [s for s, _ in list_checkpoints(run.ckpt_dir)] == [3]
    evals = [r for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3]  # the evaluation under way was finished and logged
    assert not (run.run_dir / "summary.json").exists()  # not a finished run
    assert signal.getsignal(signal.SIGTERM) is not run.stop.handle


def test_a_signal_during_a_save_lets_it_finish_and_a_second_one_leaves_the_last_checkpoint(
    tmp_path, byte_data, cfg, one_thread
):
    saved = []

    def signalled_save(real, step_signals):
        def save(step, state):
            saved.append(step)
            for signum in step_signals.get(step, []):
                os.kill(os.getpid(), signum)
            return real(step, state)

        return save

    run = tiny_run(tmp_path / "r", byte_data, cfg, save_interval=2)
    run.checkpointer.save = signalled_save(run.checkpointer.save, {2: [signal.SIGUSR1]})
    with pytest.raises(RunStopped) as err:
        run.train()
    # the save of step 2 completed and was not written twice; the run stopped right after it
    assert err.value.step == 2 and [s for s, _ in list_checkpoints(run.ckpt_dir)] == [2] and saved == [2]
    assert [r["step"] for r in _train_rows(run.run_dir)] == [1, 2]

    run = tiny_run(tmp_path / "r", byte_data, cfg, save_interval=2, resume=True)
    assert run.resume()
    run.checkpointer.save = signalled_save(run.checkpointer.save, {4: [signal.SIGTERM, signal.SIGINT]})
    with pytest.raises(StopNow) as err:  # a second signal during the save of step 4: at once, without it
        run.train()
    assert err.value.exit_code == 130
    assert "step_00000002.pt" in str(err.value)
    assert [s for s, _ in list_checkpoints(run.ckpt_dir)] == [2]
    assert not [p for p in run.ckpt_dir.iterdir() if ".tmp-" in p.name]


def test_the_wall_clock_limit_stops_at_a_step_boundary_with_a_checkpoint(tmp_path, byte_data, cfg, one_thread):
    clock = Clock()
    calls = []

    def tick():  # 20 seconds a step boundary: the limit of 1 minute is reached at the third
        calls.append(1)
        return clock.now + 20 * (len(calls) - 1)

    run = tiny_run(tmp_path / "r", byte_data, cfg)
    run.stop = StopRequest(minutes=1, clock=tick)
    with pytest.raises(RunStopped) as err:
        run.train()
    assert err.value.reason == "--exit-duration-in-mins 1 reached"
    assert err.value.step == 2 and [s for s, _ in list_checkpoints(run.ckpt_dir)] == [2]


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_bad_exit_duration_is_an_exit_2_naming_the_flag(tmp_path, byte_data, cfg, capsys, value):
    code = main(["train", "--config", str(cfg), "--data", str(byte_data), "--out", str(tmp_path / "r"),
                 "--exit-duration-in-mins", value])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--exit-duration-in-mins" in err and "must be a number of minutes > 0" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()
