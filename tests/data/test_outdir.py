"""prepare's output folder (seqwarm.data.outdir): the lock, --force through a symbolic link, leftovers,
and names too long for the file system."""

from __future__ import annotations

import os
import pathlib

import pytest

from seqwarm.cli import main
from seqwarm.data import outdir
from seqwarm.data.meta import read_meta
from seqwarm.data.prepare import prepare_dataset
from seqwarm.util.errors import UserError


def write_docs(folder: pathlib.Path, n: int = 6, word: str = "alpha") -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"d{i}.txt").write_text(f"{word} document {i} " * 20, encoding="utf-8")
    return folder


def prep(out, src, **kw):
    return prepare_dataset(out, [src], tokenizer="byte", workers=1, progress=False, **kw)


def test_a_second_holder_is_refused_naming_the_pid(tmp_path):
    out = tmp_path / "data"
    with outdir.out_lock(out):
        lock = outdir.lock_path(out)
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(UserError, match=rf"being written by another seqwarm prepare \(pid {os.getpid()}\)"):
            outdir._acquire(lock, out, wait=False)  # another open file: what a second process does
        with outdir.out_lock(out):  # re-entrant in one process
            pass
        assert lock.exists()
    assert not lock.exists()  # removed on release: nothing left beside the data


def test_prepare_refuses_while_another_holds_the_folder(tmp_path, monkeypatch):
    src = write_docs(tmp_path / "in")
    out = tmp_path / "data"
    real_acquire = outdir._acquire

    def busy(path, shown, wait):
        held = real_acquire(path, shown, wait)  # "another process" holds it (flock: another open file)
        try:
            return real_acquire(path, shown, wait)
        finally:
            os.close(held)

    monkeypatch.setattr(outdir, "_acquire", busy)
    with pytest.raises(UserError, match=r"--out .*data.* is being written by another seqwarm prepare"):
        prep(out, src)
    assert not out.exists()


def test_force_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    scratch = tmp_path / "scratch" / "tokens"
    prep(scratch, write_docs(tmp_path / "a", word="alpha"))
    link = tmp_path / "data"
    link.symlink_to(scratch)
    before = read_meta(scratch)["files"]["train.bin"]["sha256"]
    res = prep(link, write_docs(tmp_path / "b", word="omega"), force=True)
    assert link.is_symlink() and link.resolve() == scratch.resolve()  # the link is kept
    assert res.out == link
    assert read_meta(scratch)["files"]["train.bin"]["sha256"] != before  # the target holds the new data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "data", "scratch"]
    assert sorted(p.name for p in scratch.parent.iterdir()) == ["tokens"]  # no .tokens.old-*, no lock


def test_without_force_a_link_to_data_is_refused_naming_both(tmp_path, capsys):
    scratch = tmp_path / "scratch"
    prep(scratch, write_docs(tmp_path / "a"))
    (tmp_path / "data").symlink_to(scratch)
    code = main(
        ["prepare", "--no-progress", "--tokenizer", "byte", "--input", str(tmp_path / "a")]
        + ["--out", str(tmp_path / "data")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "already exists" in err and f"-> {scratch}" in err and "--force" in err


def test_a_parked_symlink_left_by_an_old_replace_is_removed_not_followed(tmp_path):
    scratch = tmp_path / "scratch"
    prep(scratch, write_docs(tmp_path / "a"))
    out = tmp_path / "data"
    prep(out, write_docs(tmp_path / "b"))
    parked = tmp_path / ".data.old-1234abcd"
    parked.symlink_to(scratch)
    outdir.clear_leftovers(out)
    assert not parked.is_symlink() and read_meta(scratch)  # the link is gone, its target untouched
    parked.symlink_to(scratch)
    os.rename(out, tmp_path / "moved")
    outdir.clear_leftovers(out)  # killed between parking and moving in: the link is put back
    assert out.is_symlink() and out.resolve() == scratch.resolve()


@pytest.mark.parametrize("length", [240, 300])
def test_a_name_too_long_is_named_as_such(tmp_path, capsys, length):
    src = write_docs(tmp_path / "in")
    out = tmp_path / ("x" * length)
    code = main(["prepare", "--no-progress", "--tokenizer", "byte", "--input", str(src), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "name is too long" in err and "Free some space" not in err
    assert "Traceback" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    ok = tmp_path / ("y" * (limit - outdir.SIBLING_EXTRA))
    prep(ok, src)  # the longest name the message allows works
    assert read_meta(ok)


def test_a_long_name_inside_the_path_is_named_too(tmp_path):
    src = write_docs(tmp_path / "in")
    with pytest.raises(UserError, match="in its path is too long") as err:
        prep(tmp_path / ("z" * 300) / "data", src)
    assert "Free some space" not in str(err.value)
