"""A folder prepared by seqwarm before 0.2.0 (its own SEQWIDX index) is refused with the one command that
converts it, and ``seqwarm prepare --convert DIR`` converts it in place: the same documents and .bin bytes,
the same data fingerprint (so its runs resume), Megatron's MMIDIDX index (seqwarm.data.legacy).

The old folders are made by tests/helpers.py's make_seqwarm_v1_folder from the old layout (documented in
seqwarm/data/legacy.py): a prepared folder's index rewritten as seqwarm 0.1.0 wrote it (checked by hand against
seqwarm 0.1.0 at commit 1ae54fa: the same corpus gives byte-identical files and meta.json)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from helpers import make_seqwarm_v1_folder
from seqwarm.cli import main
from seqwarm.data import convert_folder, data_fingerprint, open_prepared, prepare_dataset, read_meta
from seqwarm.data.meta import read_meta_file
from seqwarm.util.errors import UserError


@pytest.fixture
def old(tmp_path, byte_data):
    """(a copy of byte_data in the old format, the fingerprint the old seqwarm gave it, the original)."""
    folder = tmp_path / "old"
    shutil.copytree(byte_data, folder)
    make_seqwarm_v1_folder(folder)
    return folder, data_fingerprint(read_meta_file(folder)), byte_data


def _documents(data, split):
    part = data.split(split)
    return [part.document(i).tolist() for i in range(len(part))]


def test_an_old_folder_is_refused_with_the_command_that_converts_it(old):
    folder, _, _ = old
    with pytest.raises(UserError, match=rf"old SEQWIDX .*: seqwarm prepare --convert {folder}$"):
        open_prepared(folder)


def test_convert_keeps_documents_bin_bytes_and_fingerprint(old):
    folder, fingerprint, original = old
    bins = {s: (folder / f"{s}.bin").stat().st_ino for s in ("train", "val")}
    meta = convert_folder(folder)
    assert meta == read_meta(folder) and (meta["format_version"], meta["dtype"]) == (2, "uint16")
    assert meta["converted_from"]["format"] == "SEQWIDX" and data_fingerprint(meta) == fingerprint
    assert fingerprint != data_fingerprint(read_meta(original))  # the old index was another file
    converted, fresh = open_prepared(folder), open_prepared(original)
    for split in ("train", "val"):
        assert _documents(converted, split) == _documents(fresh, split)
        # the .bin is kept (hard-linked into the new folder), the .idx is what prepare writes today
        assert (folder / f"{split}.bin").stat().st_ino == bins[split]
        assert (folder / f"{split}.idx").read_bytes() == (original / f"{split}.idx").read_bytes()
    a, b = converted.train_batches(64, 4, seed=3), fresh.train_batches(64, 4, seed=3)
    for _ in range(3):
        x, y = a.next_batch(), b.next_batch()
        assert all(bool((x[k] == y[k]).all()) for k in x)
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted(["old"])  # no leftovers beside it


def test_convert_a_big_vocabulary_uint32_becomes_int32(tmp_path):
    # a 70000-token GPT-2-style vocabulary (EOD = 69999): uint32 in the old files, int32 in MMIDIDX
    from tokenizers import pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"filler{i}": i for i in range(len(vocab), 69999)})
    vocab["<|endoftext|>"] = 69999
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(6):
        (texts / f"d{i}.txt").write_text(f"document {i} " * (i + 2))
    out = tmp_path / "data"
    files = {"vocab_file": tmp_path / "vocab.json", "merges_file": tmp_path / "merges.txt"}
    prepare_dataset(out, [texts], tokenizer="gpt2", workers=1, progress=False, **files)
    before = _documents(open_prepared(out), "train")
    make_seqwarm_v1_folder(out)
    assert read_meta_file(out)["dtype"] == "uint32"
    meta = convert_folder(out)
    assert meta["dtype"] == "int32" and open_prepared(out).split("train").dtype == np.dtype("<i4")
    assert _documents(open_prepared(out), "train") == before and before[0][-1] == 69_999


def test_a_damaged_old_folder_is_not_converted_and_left_as_it_was(old):
    folder, _, _ = old
    with open(folder / "train.bin", "r+b") as f:
        f.write(b"\xff\xff")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(UserError, match="does not match its checksum"):
        convert_folder(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    assert sorted(p.name for p in folder.parent.iterdir()) == ["old"]


def test_the_convert_command(old, capsys):
    folder, fingerprint, _ = old
    assert main(["prepare", "--convert", str(folder), "--out", "x"]) == 2
    assert "--convert DIR converts DIR in place; it takes no --out" in capsys.readouterr().err
    assert main(["prepare", "--convert", str(folder)]) == 0
    assert "converted" in capsys.readouterr().out and data_fingerprint(read_meta(folder)) == fingerprint
    assert main(["prepare", "--convert", str(folder)]) == 2  # twice: nothing left to convert
    assert "holds Megatron's MMIDIDX token files already; nothing to convert" in capsys.readouterr().err
    assert main(["prepare", "--no-progress"]) == 2
    assert "needs --out DIR (or --convert DIR)" in capsys.readouterr().err
