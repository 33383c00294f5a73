"""Token files that change under a run (truncated, rewritten, removed) and meta.json values that cannot be
true: each an error naming the file (seqwarm.data.indexed, seqwarm.data.meta, seqwarm.data.dataset)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from seqwarm.data.meta import read_meta
from seqwarm.data.prepared import open_prepared
from seqwarm.util.errors import UserError


@pytest.fixture
def data(byte_data, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(byte_data, folder)
    return folder


def test_a_bin_truncated_while_a_run_reads_it_is_named(data):
    batches = open_prepared(data).train_batches(64, 2, seed=0)
    batches.next_batch()
    size = (data / "train.bin").stat().st_size
    os.truncate(data / "train.bin", size // 2)  # what a second prepare or a full disk's copy leaves
    with pytest.raises(UserError, match=rf"train\.bin' was truncated \({size // 2:,} bytes, {size:,} when"):
        batches.next_batch()  # not a SIGBUS from the memory map


def test_a_bin_rewritten_or_removed_while_a_run_reads_it_is_named(data):
    prepared = open_prepared(data)
    val = prepared.windows("val", 32)
    val.batch([0])
    raw = (data / "val.bin").read_bytes()
    (data / "val.bin").write_bytes(raw[::-1])  # same size, other content
    with pytest.raises(UserError, match=r"val\.bin' was changed or replaced"):
        val.batch([0])
    train = open_prepared(data, verify_checksums=False).windows("train", 32).with_label_style("hf")
    os.remove(data / "train.bin")
    with pytest.raises(UserError, match=r"train\.bin' was removed while the run was reading it"):
        train.batch([0])


def test_reads_of_an_unchanged_file_go_on(data):
    batches = open_prepared(data).train_batches(64, 2, seed=0)
    first = [batches.next_batch()["input_ids"] for _ in range(3)]
    assert all(b.shape == (2, 64) for b in first)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        ({"vocab_size": 10**12}, "vocab_size 1,000,000,000,000 is more than the 2,147,483,648 token ids"),
        ({"vocab_size": 70_000}, "dtype 'uint16' is not the int32"),
        ({"splits": {"train": {"tokens": 5, "documents": 9}}}, "splits.train has more documents (9) than tokens"),
    ],
)
def test_absurd_meta_values_are_named(data, edit, fragment):
    meta = json.loads((data / "meta.json").read_text())
    for key, value in edit.items():
        meta[key] = {**meta[key], **value} if isinstance(value, dict) else value
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError) as err:
        read_meta(data)
    assert "meta.json" in str(err.value) and fragment in str(err.value)
