"""Faults found by running seqwarm as users run it (issue #39, item 2), end to end with the real CLI:
``seqwarm prepare --force`` over the data folder a live run reads is refused (exit 2, naming the run), the
run goes on and stops gracefully (75), its data unchanged; a run killed with SIGKILL blocks nothing.

The fast checks of the readers lock are in tests/data/test_data_readers.py; a legacy locale in
tests/e2e/test_legacy_locale.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, make_corpus, small_config

pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}


def seqwarm(*args, env=None, timeout=300):
    full = {k: v for k, v in {**ENV, **(env or {})}.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "seqwarm", *args], capture_output=True, text=True, env=full, timeout=timeout
    )


def prepare(corpus, out, *extra, env=None):
    return seqwarm("prepare", "--no-progress", "--tokenizer", "byte", "--input", str(corpus), "--out", str(out),
                   *extra, env=env)  # fmt: skip


def start_run(tmp_path, data, run):
    cfg = small_config(tmp_path / "c.json", train_tokens=10_000_000, total_step=4)
    cmd = [sys.executable, "-m", "seqwarm", "train", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--data", str(data),
           "--out", str(run), "--train-iters", "100000", "--eval-interval", "0", "--save-interval", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.time() + 180
    while time.time() < end and proc.poll() is None:  # config.json: the run has opened its data
        if (run / "config.json").exists():
            return proc
        time.sleep(0.05)
    out = proc.communicate(timeout=60)[0] if proc.poll() is not None else ""
    proc.kill()
    raise AssertionError(f"the run never started: {out[-2000:]}")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_prepare_force_refuses_to_replace_the_data_a_live_run_reads(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=20, words_per_doc=400)
    data, run = tmp_path / "data", tmp_path / "run"
    assert prepare(corpus, data).returncode == 0
    before = snapshot(data)
    proc = start_run(tmp_path, data, run)
    try:
        other = make_corpus(tmp_path / "other", docs=10, words_per_doc=300, seed=1)
        res = prepare(other, data, "--force")
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"pid {proc.pid}" in res.stderr and str(run) in res.stderr and "running seqwarm run" in res.stderr
        assert "Traceback" not in res.stderr
        assert snapshot(data) == before  # nothing replaced
        assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or p.name.startswith("data.new")]
        assert proc.poll() is None  # the run goes on
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 75, out[-3000:]  # a graceful stop with its checkpoint, not exit 2
    assert "must not change" not in out
    assert not (tmp_path / ".data.readers").exists()  # the run released it
    assert prepare(other, data, "--force").returncode == 0  # with the run gone, --force replaces the data
    assert snapshot(data) != before


def test_a_run_killed_with_sigkill_does_not_block_prepare_force(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=20, words_per_doc=400)
    data, run = tmp_path / "data", tmp_path / "run"
    assert prepare(corpus, data).returncode == 0
    proc = start_run(tmp_path, data, run)
    proc.kill()
    proc.communicate(timeout=60)
    res = prepare(make_corpus(tmp_path / "other", docs=10, words_per_doc=300, seed=1), data, "--force")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / ".data.readers").exists()
