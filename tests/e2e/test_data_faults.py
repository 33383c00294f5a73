"""Data that changes under a run, a run too big for the machine's memory, and two prepares into one folder:
each a clear exit 2 naming the file, the sizes or the holder, never a traceback or a different run.

Subprocesses of the real CLI (issues #26.4, #29.3, #29.4); the pure parts are tested in
tests/trainer/test_memory.py, tests/data/test_outdir.py and tests/data/test_dataset.py."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, make_corpus, small_config, train_rows

pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}


def seqwarm(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "seqwarm", *args],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=timeout,
    )


def train(tmp_path, data, *extra, env=None):
    cfg = small_config(tmp_path / "c.json", train_tokens=4000, total_step=2)
    args = ["train", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--data", str(data), "--out", str(tmp_path / "run")]
    return seqwarm(*args, "--train-iters", "2", *extra, env=env)


def copy_data(byte_data, tmp_path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(byte_data, data)
    return data


def test_a_token_file_changed_after_prepare_same_size_is_refused(tmp_path, byte_data):
    data = copy_data(byte_data, tmp_path)
    raw = bytearray((data / "train.bin").read_bytes())
    raw[100:104] = raw[200:204]  # other ids, same size: only the checksum can tell
    (data / "train.bin").write_bytes(bytes(raw))
    res = train(tmp_path, data)
    assert res.returncode == 2, res.stderr
    assert "train.bin" in res.stderr and "checksum" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_absurd_vocabulary_in_meta_json_is_refused(tmp_path, byte_data):
    data = copy_data(byte_data, tmp_path)
    meta = json.loads((data / "meta.json").read_text())
    meta["vocab_size"] = 10**12
    (data / "meta.json").write_text(json.dumps(meta))
    res = train(tmp_path, data)
    assert res.returncode == 2, res.stderr
    assert "meta.json" in res.stderr and "vocab_size 1,000,000,000,000" in res.stderr
    assert "Traceback" not in res.stderr and "allocate" not in res.stderr


def test_a_model_too_big_for_the_memory_stops_before_it_is_built(tmp_path, byte_data):
    big = ["--n-layer", "64", "--n-embd", "4096", "--n-head", "32"]
    t0 = time.perf_counter()
    res = train(tmp_path, byte_data, *big, env={"SEQWARM_MEMORY_LIMIT": "24GiB"})
    assert res.returncode == 2, res.stderr
    err = res.stderr
    assert "not enough memory on cpu" in err and "AdamW states" in err and "SEQWARM_MEMORY_LIMIT=24GiB" in err
    assert "smaller --model" in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 60  # refused from the config: no 200 GB allocated first
    assert not (tmp_path / "run").exists()  # the folder it made for the run is removed again
    tiny = train(tmp_path, byte_data, env={"SEQWARM_MEMORY_LIMIT": "1MiB"})  # a limit applies to any model
    assert tiny.returncode == 2 and "1.0 MiB is available" in tiny.stderr
    ok = train(tmp_path, byte_data, env={"SEQWARM_MEMORY_LIMIT": "8GiB"})
    assert ok.returncode == 0, ok.stderr


def test_two_prepares_into_one_folder_the_second_names_the_first(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=8, words_per_doc=100)
    out = tmp_path / "data"
    holder = subprocess.Popen(  # a prepare in progress: it holds the folder's lock
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from seqwarm.data.outdir import out_lock\n"
            "with out_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        args = ["prepare", "--no-progress", "--tokenizer", "byte", "--input", str(corpus), "--out", str(out)]
        res = seqwarm(*args)
        assert res.returncode == 2, res.stderr
        assert f"another seqwarm prepare (pid {holder.pid})" in res.stderr and "Traceback" not in res.stderr
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    res = seqwarm(*args)  # the holder was killed: the kernel dropped its lock
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "data"]


def test_prepare_force_through_a_symlink(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=8, words_per_doc=100)
    scratch = tmp_path / "scratch" / "tokens"
    args = ["prepare", "--no-progress", "--tokenizer", "byte", "--input", str(corpus)]
    assert seqwarm(*args, "--out", str(scratch)).returncode == 0
    (tmp_path / "data").symlink_to(scratch)
    res = seqwarm(*args, "--val-fraction", "0.3", "--force", "--out", str(tmp_path / "data"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "data").is_symlink()
    assert json.loads((scratch / "meta.json").read_text())["split"]["val_fraction"] == 0.3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "data", "scratch"]
    assert sorted(p.name for p in scratch.parent.iterdir()) == ["tokens"]


def test_a_run_on_an_old_format_folder_resumes_after_convert(tmp_path, byte_data):
    """A run on a folder of seqwarm < 0.2.0 (SEQWIDX): --resume is refused with the convert command, then
    after ``seqwarm prepare --convert`` it resumes to the losses of an uninterrupted run.

    The run's first steps are trained on a converted copy of the old folder: what a run records of its data
    is the fingerprint, and a converted folder's is the old folder's (asserted against the old formula
    over the old meta.json), which is what seqwarm 0.1.0 recorded for a run on the old folder."""
    from helpers import make_seqwarm_v1_folder
    from seqwarm.data import data_fingerprint
    from seqwarm.data.meta import read_meta_file

    old = make_seqwarm_v1_folder(copy_data(byte_data, tmp_path))
    early = tmp_path / "early-data"
    shutil.copytree(old, early)
    assert seqwarm("prepare", "--convert", str(early)).returncode == 0
    cfg = small_config(tmp_path / "c.json", train_tokens=100_000, total_step=3)
    common = [*FAST_TRAIN_FLAGS, "--config", str(cfg), "--train-iters", "4", "--save-interval", "2"]
    common += ["--eval-interval", "0", "--log-interval", "1", "--keep-checkpoints", "0"]
    full = seqwarm("train", *common, "--data", str(early), "--out", str(tmp_path / "full"), timeout=300)
    assert full.returncode == 0, full.stderr
    recorded = json.loads((tmp_path / "full" / "config.json").read_text())["data"]["fingerprint"]
    assert recorded == data_fingerprint(read_meta_file(old))  # what the old seqwarm recorded for `old`
    run = tmp_path / "run"
    shutil.copytree(tmp_path / "full", run)
    (run / "summary.json").unlink()
    (run / "checkpoints" / "step_00000004.pt").unlink()  # as if stopped after step 2
    res = seqwarm("train", *common, "--data", str(old), "--out", str(run), "--resume", timeout=300)
    assert res.returncode == 2 and f"seqwarm prepare --convert {old}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert seqwarm("prepare", "--convert", str(old)).returncode == 0
    res = seqwarm("train", *common, "--data", str(old), "--out", str(run), "--resume", timeout=300)
    assert res.returncode == 0, res.stderr
    events = [json.loads(line)["event"] for line in (run / "history.jsonl").read_text().splitlines()]
    assert events.count("resume") == 1 and (run / "checkpoints" / "step_00000004.pt").exists()
    losses = [r["loss"] for r in train_rows(run)]
    assert len(losses) == 4 and losses == [r["loss"] for r in train_rows(tmp_path / "full")]
