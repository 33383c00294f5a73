"""The readers lock of a prepared data folder (issue #39): a run holds ``.NAME.readers`` shared while it
reads NAME; ``prepare --force`` refuses to replace NAME while any live reader holds it -- before it starts,
and at the swap itself (the finished data is then kept as ``NAME.new``) -- and a killed reader holds nothing.
The end-to-end runs are in tests/e2e/test_faults_found.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from seqwarm.data import outdir
from seqwarm.data.prepare import prepare_dataset
from seqwarm.util.errors import UserError
from seqwarm.util.lock import live_readers, readers_path, release_shared, share_lock, take_lock

SRC = str(Path(__file__).resolve().parents[2] / "src")


def write_docs(folder: Path, n: int = 6, word: str = "alpha") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"d{i}.txt").write_text(f"{word} document {i} " * 20, encoding="utf-8")
    return folder


def prep(out, src, **kw):
    return prepare_dataset(out, [src], tokenizer="byte", workers=1, progress=False, **kw)


@pytest.fixture
def data(tmp_path):
    out = tmp_path / "data"
    prep(out, write_docs(tmp_path / "in"))
    return out


def test_force_is_refused_while_a_reader_holds_the_folder_and_names_it(tmp_path, data):
    before = (data / "train.bin").read_bytes()
    path = readers_path(data)
    fd = share_lock(path, "seqwarm train, run folder runs/a")
    try:
        with pytest.raises(UserError, match=rf"pid {os.getpid()}, seqwarm train, run folder runs/a.*wait for it"):
            prep(data, write_docs(tmp_path / "other", word="beta"), force=True)
        assert (data / "train.bin").read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == [".data.readers", "data", "in", "other"]
    finally:
        release_shared(path, fd)
    assert not path.exists()  # the last reader out removes it
    prep(data, tmp_path / "other", force=True)
    assert (data / "train.bin").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "in", "other"]


def test_a_run_that_starts_during_the_prepare_keeps_its_data_and_the_new_data_is_kept(tmp_path, data, monkeypatch):
    """The reader arrives after the first check (a run started while prepare tokenized): the swap is
    refused, the run's data stays, and the finished data waits in NAME.new."""
    before = (data / "train.bin").read_bytes()
    held: list[int] = []
    real_replace = outdir.replace_dir

    def arrive_then_replace(tmp, out):
        held.append(share_lock(readers_path(out), "seqwarm train, run folder late"))
        real_replace(tmp, out)

    monkeypatch.setattr("seqwarm.data.prepare.replace_dir", arrive_then_replace)
    with pytest.raises(UserError, match=r"run folder late.*the new data is in '.*data\.new'"):
        prep(data, write_docs(tmp_path / "other", word="beta"), force=True)
    release_shared(readers_path(data), held[0])
    assert (data / "train.bin").read_bytes() == before
    assert (tmp_path / "data.new" / "meta.json").is_file()
    assert (tmp_path / "data.new" / "train.bin").read_bytes() != before
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_a_killed_reader_holds_nothing(tmp_path, data):
    code = (
        "import sys, time; from pathlib import Path; from seqwarm.util.lock import readers_path, share_lock; "
        "share_lock(readers_path(Path(sys.argv[1])), 'seqwarm train, run folder killed'); print('held', flush=True); "
        "time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", code, str(data)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"pid {proc.pid}, seqwarm train, run folder killed"):
            outdir.check_out(data, force=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert readers_path(data).exists()  # left behind by the killed reader, its lock dropped by the kernel
    assert live_readers(readers_path(data)) == []
    outdir.check_out(data, force=True)  # not held: --force goes on
    prep(data, write_docs(tmp_path / "other", word="beta"), force=True)
    assert not readers_path(data).exists()


def test_readers_share_and_a_reader_waits_for_the_swap(tmp_path, data):
    path = readers_path(data)
    a = share_lock(path, "one")
    b = share_lock(path, "two")  # any number of readers at once
    assert [line.split(" ", 1)[1] for line in live_readers(path)] == ["one", "two"]
    release_shared(path, a)
    assert path.exists()  # b still reads
    release_shared(path, b)
    assert not path.exists()

    fd = take_lock(path, lambda pid: AssertionError("free"))  # a swap under way
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(share_lock(path, "waits")))
    reader.start()
    time.sleep(0.3)
    assert not got  # the reader waits for the swap
    path.unlink()
    os.close(fd)
    reader.join(timeout=10)
    assert got and path.exists() and live_readers(path)[0].endswith(" waits")  # on the new file
    release_shared(path, got[0])


def test_a_link_and_its_target_share_one_readers_lock(tmp_path, data):
    link = tmp_path / "link"
    link.symlink_to(data)
    assert readers_path(link) == readers_path(data) == tmp_path.resolve() / ".data.readers"
