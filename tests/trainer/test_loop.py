"""`seqwarm train` end to end on CPU: budget, growing length, full-length eval, resume, bad input.

The slow, end-to-end tests of this file are in tests/e2e/test_train.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm import load_config
from seqwarm.cli import main

FAST = [*FAST_TRAIN_FLAGS, "--log-interval", "1"]


def train(args, capsys=None):
    code = main(["train", *FAST, *args])
    return code


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--data", "/nonexistent/prepared"], "no such folder"),
        (["--rampup-batch-size", "4", "4", "100"], "cannot be combined with a sequence-length curriculum"),
        (["--resume"], "no checkpoint"),
        (["--seq-length", "32"], "exceeds the model's sequence length"),
        (["--lr", "-1"], "negative"),
        (["--model", "gpt5"], "choose one of tiny, nano, gpt2-124m"),
        (["--n-embd", "100", "--n-head", "3"], "--n-embd 100 is not a multiple of --n-head 3"),
        (["--n-layer", "0", "--n-head", "-1"], "--n-layer 0: must be >= 1; --n-head -1: must be >= 1"),
    ],
)
def test_bad_input_exits_2_without_traceback(tmp_path, byte_data, capsys, extra, fragment):
    cfg = small_config(tmp_path / "c.json")
    args = ["train", *FAST, "--config", str(cfg), "--out", str(tmp_path / "r")]
    if "--data" not in extra:
        args += ["--data", str(byte_data)]
    try:
        code = main(args + extra)
    except SystemExit as exc:  # argparse rejects some flags itself, also with code 2
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_existing_run_dir_needs_resume(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json")
    out = tmp_path / "r"
    out.mkdir()
    (out / "something").write_text("x")
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(out)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_bad_config_file_exits_2(tmp_path, byte_data, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_batch_size": 8, "curriculum_learning": {"enabled": true, "min_difficulty": 0}}')
    assert train(["--config", str(bad), "--data", str(byte_data), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "curriculum_learning.min_difficulty" in err and "Traceback" not in err


def test_default_recipe_file_matches_code():
    from seqwarm.config.defaults import default_train_config

    shipped = json.loads((Path(__file__).resolve().parents[2] / "examples" / "tiny_cpu.json").read_text())
    assert shipped == default_train_config()
    for world in (1, 2):  # the global batch stays 16 whatever the number of ranks
        cfg = load_config(shipped, world_size=world)
        assert cfg.train_batch_size == 16 and cfg.micro_batch_size == 16 // world


def test_custom_schedule_is_refused_by_train(tmp_path, byte_data, capsys):
    raw = json.loads(small_config(tmp_path / "c.json").read_text())
    raw["curriculum_learning"] = {"enabled": True, "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "custom"}
    (tmp_path / "c.json").write_text(json.dumps(raw))
    assert train(["--config", str(tmp_path / "c.json"), "--data", str(byte_data), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "custom" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_a_val_split_smaller_than_asked_is_said_once(byte_data, caplog):
    """More eval windows asked than the split holds: all are used, and the notice comes once, not at
    every evaluation."""
    import logging

    import torch

    from seqwarm.data import open_prepared
    from seqwarm.trainer.evaluator import Evaluator

    class Engine:  # what Evaluator calls: module.training, eval(), train(mode), engine(batch) -> loss
        module = torch.nn.Linear(1, 1)

        def eval(self):
            self.module.eval()

        def train(self, mode=True):
            self.module.train(mode)

        def __call__(self, batch):
            return batch["input_ids"].float().mean()

    data = open_prepared(byte_data)
    total = len(data.windows("val", 64))
    evaluator = Evaluator(data, 64, 4, total, torch.device("cpu"))  # total batches of 4 > total windows
    with caplog.at_level(logging.WARNING, logger="seqwarm.trainer.evaluator"):
        losses = [evaluator(Engine()) for _ in range(3)]
    notices = [r.getMessage() for r in caplog.records if "evaluation uses all of them" in r.getMessage()]
    assert notices == [
        f"the val split has {total} windows of 65 tokens; every evaluation uses all of them, "
        f"not {4 * total} (--eval-iters {total} x micro-batch 4)"
    ]
    assert not [r for r in caplog.records if "evaluating all of them" in r.getMessage()]  # the data layer's
    every = Evaluator(data, 64, 4, -(-total // 4), torch.device("cpu"))(Engine())  # exactly all windows
    assert losses == [pytest.approx(every)] * 3


def test_a_closed_stdout_stops_the_console_lines_not_the_run(tmp_path, byte_data):
    """`seqwarm train | head -3`: the reader goes away; training goes on to the end (its record is the run
    folder), with one notice on stderr and no traceback."""
    cfg = small_config(tmp_path / "c.json", train_tokens=1500)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "seqwarm",
        "train",
        "--config",
        str(cfg),
        "--data",
        str(byte_data),
        "--out",
        str(out),
        "--no-progress",
        "--no-tensorboard",
        "--log-interval",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `head` exiting before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err.count("stdout was closed (its reader went away): training goes on") == 1, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] >= 1500 and summary["stop_reason"].startswith("reached the token budget")


def _tiny_run(tmp_path, byte_data, name, builder=None, config=None, model=None, **opts):
    from helpers import tiny_run

    config = config or small_config(tmp_path / "c.json", train_tokens=3000)
    return tiny_run(tmp_path / name, byte_data, config, builder=builder, model=model, **opts)


def test_an_oom_on_the_memory_probe_says_what_to_lower(tmp_path, byte_data):
    import torch

    from seqwarm.util.errors import UserError

    run = _tiny_run(tmp_path, byte_data, "oom", memory_probe=True)

    def oom(batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    run.engine.probe_memory = oom
    with pytest.raises(UserError, match="full length 64 with micro-batch 4.*lower train_micro_batch_size_per_gpu"):
        run._probe_memory()


def test_a_megatron_style_run_reads_eval_iters_as_megatron_does(tmp_path, byte_data):
    """Under Megatron-DeepSpeed's rules --eval-iters 3 with accumulation 2 and micro-batch 4 reads 3 x 2 x 4
    windows per evaluation (one rank here); under seqwarm's, 3 micro-batches of 4."""
    from conftest import small_config
    from helpers import tiny_run

    megatron = small_config(tmp_path / "m.json", megatron=True, train_iters=6, lr=1e-3)
    run = tiny_run(tmp_path / "m", byte_data, megatron, eval_iters=3)
    assert run.cfg.lr.rule == "megatron" and run.cfg.gradient_accumulation_steps == 2
    assert run.evaluator.megatron and run.evaluator.num_windows == 24
    plain = tiny_run(tmp_path / "s", byte_data, small_config(tmp_path / "s.json"), eval_iters=3)
    assert not plain.evaluator.megatron and plain.evaluator.num_windows == 12
