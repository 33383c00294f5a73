"""seqwarm's token files are Megatron's MMIDIDX, checked against megatron-core's own writer and reader.

megatron_indexed_files.json holds files that megatron-core 0.19.2's ``IndexedDatasetBuilder`` wrote and its
``IndexedDataset`` read back (made by make_megatron_indexed_files.py, run by hand). seqwarm's writer must
produce the same bytes for the same documents and dtype, and its reader must read those files as the
same documents. With megatron-core installed, the last test also has ``IndexedDataset`` read a folder
``seqwarm prepare`` wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqwarm.data.indexed import IndexedWriter, MegatronIndexed, write_index

RECORD = json.loads(Path(__file__).with_name("megatron_indexed_files.json").read_text())
CASES = {c["name"]: c for c in RECORD["cases"]}
ONE_SEQUENCE = [n for n, c in CASES.items() if all(len(doc) == 1 for doc in c["documents"])]


def _documents(case) -> list[list[int]]:
    return [[t for seq in doc for t in seq] for doc in case["documents"]]


def test_the_record_is_megatron_cores():
    assert RECORD["megatron_core"] == "0.19.2" and len(ONE_SEQUENCE) == 3 and "sentences_uint16" in CASES
    for case in CASES.values():  # what megatron-core read back is what it was given
        assert case["read_back"] == _documents(case)


@pytest.mark.parametrize("name", ONE_SEQUENCE)
def test_the_writer_makes_megatron_cores_bytes(tmp_path, name):
    case = CASES[name]
    docs = _documents(case)
    writer = IndexedWriter(tmp_path / name, np.dtype(case["dtype"]))
    for part in (docs[:1], docs[1:]):  # two appends: the index is assembled across them
        writer.add_documents(np.concatenate([np.asarray(d) for d in part]), np.array([len(d) for d in part]))
    info = writer.close()
    assert (tmp_path / f"{name}.bin").read_bytes().hex() == case["bin"]
    assert (tmp_path / f"{name}.idx").read_bytes().hex() == case["idx"]
    assert (info["documents"], info["tokens"]) == (len(docs), sum(map(len, docs)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.bin", f"{name}.idx"]  # no side file left
    write_index(tmp_path / "converted.idx", np.array([len(d) for d in docs]), np.dtype(case["dtype"]))
    assert (tmp_path / "converted.idx").read_bytes().hex() == case["idx"]  # prepare --convert's index too


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reader_reads_megatron_cores_files_as_its_documents(tmp_path, name):
    case = CASES[name]
    (tmp_path / f"{name}.bin").write_bytes(bytes.fromhex(case["bin"]))
    (tmp_path / f"{name}.idx").write_bytes(bytes.fromhex(case["idx"]))
    indexed = MegatronIndexed(tmp_path / name)
    assert indexed.dtype == np.dtype(case["dtype"]) and len(indexed) == len(case["documents"])
    assert indexed.num_sequences == sum(len(doc) for doc in case["documents"])
    assert [indexed.document(i).tolist() for i in range(len(indexed))] == case["read_back"]


def test_megatron_core_reads_a_prepared_folder(tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (optional live cross-check)")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from seqwarm.data import open_prepared, prepare_dataset

    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(12):
        (texts / f"d{i:02d}.txt").write_text(f"document {i}: " + "words and more words " * (i + 1))
    prepare_dataset(tmp_path / "data", [texts], tokenizer="byte", workers=1, progress=False)
    data = open_prepared(tmp_path / "data")
    for split in ("train", "val"):
        theirs = IndexedDataset(str(tmp_path / "data" / split))
        ours = data.split(split)
        assert len(theirs) == len(ours) and list(theirs.document_indices) == list(range(len(ours) + 1))
        assert [theirs[i].tolist() for i in range(len(theirs))] == [ours.document(i).tolist() for i in range(len(ours))]


def test_indexed_tokens_is_a_deprecated_alias_of_megatron_indexed():
    import seqwarm.data

    with pytest.warns(DeprecationWarning, match=r"use seqwarm\.data\.MegatronIndexed"):
        assert seqwarm.data.IndexedTokens is MegatronIndexed
