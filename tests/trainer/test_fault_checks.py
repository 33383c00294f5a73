"""Faults and hostile input against prepare / train / eval: nothing lost, nothing run, every failure a clear
exit 2 (3 for divergence). Safe checkpoint loading, resume that never restarts silently, one run per folder,
no non-finite checkpoint, OS errors (disk full via RLIMIT_FSIZE, no root needed), checks before the work,
``prepare --force`` on prepared data only; and SIGKILL at random moments and mid-checkpoint, resumed exactly.

The slow, end-to-end tests of this file are in tests/e2e/test_faults.py.
"""

import json
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_corpus, small_config
from seqwarm.cli import main
from seqwarm.data import prepare_dataset
from seqwarm.trainer.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    load_latest_for_resume,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from seqwarm.trainer.run_folder import LOCK_FILE, RunLock, RunLocked
from seqwarm.util.atomic import WriteError, write_text

FAST = ["--model", "tiny", "--eval-iters", "1", "--no-progress", "--no-tensorboard", "--log-interval", "1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SRC = str(Path(__file__).resolve().parents[2] / "src")


def train(args):
    try:
        return main(["train", *FAST, *args])
    except SystemExit as exc:  # argparse refuses some values itself, with 2
        return exc.code


class Payload:
    """What an attacker's pickle does: run a command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, byte_data):
    """A tiny finished run with checkpoints at steps 2 and 3 (copy it before changing it)."""
    base = tmp_path_factory.mktemp("finished")
    cfg = small_config(base / "c.json", train_tokens=100_000, total_step=2)
    out = base / "run"
    assert (
        train(
            [
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(out),
                "--train-iters",
                "3",
                "--save-interval",
                "2",
                "--eval-interval",
                "0",
            ]
        )
        == 0
    )
    return cfg, out


def copy_run(finished_run, tmp_path):
    cfg, out = finished_run
    dst = tmp_path / "run"
    shutil.copytree(out, dst)
    return cfg, dst


# -- 1. loading never executes code ---------------------------------------------------------------------


def test_a_crafted_checkpoint_is_refused_and_never_runs(tmp_path, finished_run, byte_data, capsys):
    cfg, run = copy_run(finished_run, tmp_path)
    marker = tmp_path / "pwned"
    torch.save(
        {"format": "seqwarm.checkpoint/1", "step": 9, "model": Payload(marker)},
        run / "checkpoints" / "step_00000009.pt",
    )
    with pytest.raises(CheckpointError, match="step_00000009.pt"):
        load_checkpoint(run / "checkpoints" / "step_00000009.pt")
    assert main(["eval", str(run), "--val", "--checkpoint", "9", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "step_00000009.pt" in err and "refused" in err and "Traceback" not in err
    # --resume falls back to the good checkpoint and moves the crafted one aside; nothing ran
    assert (
        train(
            [
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(run),
                "--resume",
                "--train-iters",
                "3",
                "--save-interval",
                "2",
                "--eval-interval",
                "0",
            ]
        )
        == 0
    )
    assert not marker.exists()
    assert (run / "checkpoints" / "step_00000009.pt.unloadable").is_file()


def test_new_checkpoints_load_with_plain_weights_only(tmp_path):
    random.random(), np.random.rand()
    path = save_checkpoint(tmp_path, 1, {"model": {"w": torch.ones(2)}, "rng": rng_state()})
    state = torch.load(path, weights_only=True)  # no allow-list needed
    expected = (np.random.rand(), random.random())
    set_rng_state(state["rng"])
    assert (np.random.rand(), random.random()) == expected


def test_checkpoints_of_earlier_versions_still_load(tmp_path):
    """Today's main wrote the numpy RNG state as an array and torch's version object: both load safely."""
    from torch.torch_version import TorchVersion

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    path = tmp_path / "step_00000004.pt"
    torch.save(
        {
            "format": "seqwarm.checkpoint/1",
            "step": 4,
            "model": {"w": torch.ones(1)},
            "rng": state,
            "config": {"versions": {"torch": TorchVersion(torch.__version__)}},
        },
        path,
    )
    loaded = load_checkpoint(path)
    expected = np.random.rand()
    np.random.rand()
    set_rng_state(loaded["rng"])
    assert np.random.rand() == expected


def test_a_foreign_file_is_an_exit_2_naming_it(tmp_path):
    path = tmp_path / "step_00000001.pt"
    path.write_bytes(os.urandom(300))
    with pytest.raises(CheckpointError, match="step_00000001.pt"):
        load_checkpoint(path)
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="not a seqwarm checkpoint"):
        load_checkpoint(path)


# -- 2. resume never silently restarts ------------------------------------------------------------------


def test_resume_with_no_loadable_checkpoint_exits_2_naming_each(tmp_path, finished_run, byte_data, capsys):
    cfg, run = copy_run(finished_run, tmp_path)
    for _, path in list_checkpoints(run / "checkpoints"):
        path.write_bytes(b"garbage")
    rows = (run / "metrics.jsonl").read_text()
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "step_00000002.pt" in err and "step_00000003.pt" in err and "Traceback" not in err
    assert (run / "metrics.jsonl").read_text() == rows  # nothing restarted, nothing rewritten
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2, 3]


def test_broken_newer_checkpoints_leave_the_rotation(tmp_path):
    save_checkpoint(tmp_path, 2, {"model": {}})
    (tmp_path / "step_00000009.pt").write_bytes(b"torn")
    path, state = load_latest_for_resume(tmp_path)
    assert state["step"] == 2 and (tmp_path / "step_00000009.pt.unloadable").is_file()
    save_checkpoint(tmp_path, 3, {"model": {}}, keep=1)  # the fresh one survives the rotation
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3]


# -- 3. one run per folder ------------------------------------------------------------------------------


def _hold_lock(folder):
    code = (
        f"import sys, time; sys.path.insert(0, {SRC!r}); from seqwarm.trainer.run_folder import RunLock; "
        f"RunLock({str(folder)!r}).acquire(); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_on_a_busy_folder_exits_2_naming_the_holder(tmp_path, byte_data, capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = _hold_lock(run)
    try:
        with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
            RunLock(run).acquire()
        cfg = small_config(tmp_path / "c.json")
        assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(run)]) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    # the killed holder's lock (its file is still there) is recovered by the next one
    assert (run / LOCK_FILE).exists()
    lock = RunLock(run)
    lock.acquire()
    assert (run / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()
    assert not (run / LOCK_FILE).exists()


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    outer, inner = RunLock(tmp_path), RunLock(tmp_path)
    outer.acquire()
    inner.acquire()
    inner.release()
    assert (tmp_path / LOCK_FILE).exists()
    outer.release()
    assert not (tmp_path / LOCK_FILE).exists()


def _adam_model():
    """Two layers and an Adam that has stepped once (so it holds exp_avg, exp_avg_sq and step)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture
def host_reads(monkeypatch):
    """Counts the ways a tensor's value comes back to Python (each one a host sync on a GPU)."""
    reads = []
    for method in ("__bool__", "item", "tolist"):
        real = getattr(torch.Tensor, method)

        def counted(self, *args, _real=real, _method=method):
            reads.append(_method)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, method, counted)
    return reads


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
def test_a_nonfinite_weight_or_optimizer_state_is_found_in_one_host_read(poison, host_reads):
    from seqwarm.trainer.checkpoint import first_nonfinite

    model, optimizer = _adam_model()
    host_reads.clear()  # Adam's own step reads its step count
    assert first_nonfinite(model, optimizer) is None and len(host_reads) == 1
    with torch.no_grad():
        model[1].bias[0] = poison
        model[0].weight[2, 1] = poison  # the first parameter in named_parameters order is the one named
    assert first_nonfinite(model, optimizer) == "parameter 0.weight"

    model, optimizer = _adam_model()
    optimizer.state[model[1].weight]["exp_avg_sq"][0, 0] = poison
    host_reads.clear()
    assert first_nonfinite(model, optimizer) == "optimizer state exp_avg_sq" and len(host_reads) == 1


def test_empty_and_non_tensor_state_are_not_checked():
    from seqwarm.trainer.checkpoint import first_nonfinite

    model, optimizer = _adam_model()
    optimizer.state[model[0].weight]["note"] = float("nan")  # not a tensor: not the model's state
    optimizer.state[model[0].weight]["empty"] = torch.empty(0)
    assert first_nonfinite(model, optimizer) is None
    assert first_nonfinite(model, object()) is None  # an optimizer seqwarm cannot read the state of


# -- 5. every OS failure is an exit 2 -------------------------------------------------------------------


def _limited(args, limit_bytes, timeout=240):
    """``python -m seqwarm ARGS`` with files limited to ``limit_bytes`` (a full disk, without root)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = {**ENV, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "seqwarm", *args],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limit,
        timeout=timeout,
    )


def _leftovers(folder):
    return [p for p in Path(folder).rglob("*") if ".tmp-" in p.name]


def test_disk_full_during_prepare_force_keeps_the_old_data(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=30)
    out = tmp_path / "data"
    prepare_dataset(out, [corpus], tokenizer="byte", workers=1, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    big = make_corpus(tmp_path / "big", docs=60, words_per_doc=3000)
    proc = _limited(["prepare", "--input", str(big), "--tokenizer", "byte", "--out", str(out), "--force"], 200_000)
    assert proc.returncode == 2 and "File too large" in proc.stderr and "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not _leftovers(tmp_path)


def test_prepare_clears_the_temporary_folders_of_killed_runs(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=10)
    out = tmp_path / "data"
    prepare_dataset(out, [corpus], tokenizer="byte", workers=1, progress=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leaked = tmp_path / f".data.tmp-{dead.stdout.strip()}-0123abcd"
    leaked.mkdir()
    (leaked / "train.bin").write_bytes(b"x")
    prepare_dataset(out, [corpus], tokenizer="byte", workers=1, progress=False, force=True)
    assert not leaked.exists()


def test_out_that_is_a_file_and_unwritable_paths_are_exit_2(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(blocker)]) == 2
    assert "is not a folder" in capsys.readouterr().err and blocker.read_text() == "x"
    with pytest.raises(WriteError, match="cannot write"):
        write_text(blocker / "inside.json", "{}")  # its folder is a file: NotADirectoryError, named


def test_eval_on_a_read_only_folder_is_an_exit_2(tmp_path, finished_run, capsys, monkeypatch):
    import seqwarm.util.atomic

    _, run = copy_run(finished_run, tmp_path)
    (run / "eval.json").write_text("{}")

    class ReadOnlyOs:  # the os module as seqwarm.util.atomic sees it, on a file system mounted read-only
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def replace(src, dst):
            raise OSError(30, "Read-only file system", str(dst))

    monkeypatch.setattr(seqwarm.util.atomic, "os", ReadOnlyOs())
    assert main(["eval", str(run), "--val", "--val-windows", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "eval.json" in err and "Read-only file system" in err and "Traceback" not in err
    assert (run / "eval.json").read_text() == "{}" and not _leftovers(run)


# -- 6. checked before the work -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--eval-iters", "0"], "--eval-iters"),
        (["--save-interval", "-1"], "--save-interval"),
        (["--device", "mps"], "--device"),
        (["--device", "tpu:0"], "--device"),
    ],
)
def test_bad_arguments_are_refused_before_the_run(tmp_path, byte_data, capsys, extra, fragment):
    cfg = small_config(tmp_path / "c.json")
    out = tmp_path / "run"
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not out.exists()


def _edited_data(byte_data, tmp_path, edit):
    data = tmp_path / "data"
    shutil.copytree(byte_data, data)
    meta = json.loads((data / "meta.json").read_text())
    edit(meta)
    (data / "meta.json").write_text(json.dumps(meta))
    return data


@pytest.mark.parametrize(
    "edit,fragment",
    [
        (lambda m: m.pop("vocab_size"), "vocab_size"),
        (lambda m: m["splits"].pop("val"), "splits.val"),
        (lambda m: m["files"].update({"/dev/zero": {"bytes": 0, "sha256": "0" * 64}}), "/dev/zero"),
        (lambda m: m["files"].update({"../escape.bin": {"bytes": 1, "sha256": "0" * 64}}), "leaves the data folder"),
        (lambda m: m.update(vocab_size=100, eod_id=10), "token id"),
    ],
)
def test_a_damaged_data_folder_is_refused_before_the_run(tmp_path, byte_data, capsys, edit, fragment):
    data = _edited_data(byte_data, tmp_path, edit)
    cfg = small_config(tmp_path / "c.json")
    out = tmp_path / "run"
    assert train(["--config", str(cfg), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not out.exists()  # a failed start leaves no empty run folder


@pytest.mark.parametrize(
    "text,fragment",
    [
        ('{"a": ' * 5000 + "1" + "}" * 5000, "cannot be read"),
        ('{"a": ' * 40 + "1" + "}" * 40, "nested more than"),
        ('{"train_batch_size": ' + "9" * 5000 + "}", "cannot be read"),
        ('{"train_batch_size": 8, "seqwarm": {"train_tokens": ' + "9" * 400 + "}}", "digits"),
    ],
)
def test_absurd_configs_are_exit_2(tmp_path, capsys, text, fragment):
    path = tmp_path / "c.json"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_allow_config_change_does_not_cover_the_sequence_length(tmp_path, finished_run, byte_data, capsys):
    _, run = copy_run(finished_run, tmp_path)
    cfg = small_config(tmp_path / "c32.json", train_tokens=100_000, total_step=2, seq=32)
    assert (
        train(["--config", str(cfg), "--data", str(byte_data), "--out", str(run), "--resume", "--allow-config-change"])
        == 2
    )
    err = capsys.readouterr().err
    assert "seq_length" in err and "Traceback" not in err


# -- 7. prepare --force replaces prepared data only ------------------------------------------------------


def test_prepare_force_refuses_a_training_run(tmp_path, finished_run):
    _, run = copy_run(finished_run, tmp_path)
    corpus = make_corpus(tmp_path / "corpus", docs=5)
    with pytest.raises(Exception, match="holds a training run"):
        prepare_dataset(run, [corpus], tokenizer="byte", workers=1, progress=False, force=True)
    assert list_checkpoints(run / "checkpoints")
