"""Write tests/data/megatron_indexed_files.json: small MMIDIDX files written by megatron-core itself.

Run by hand, from the repository root, with megatron-core installed beside torch and numpy (its
``IndexedDataset`` needs no GPU; megatron-core 0.19.2 imports with ``triton`` installed too):

    python tests/data/make_megatron_indexed_files.py

For each case below it writes ``PREFIX.bin`` / ``PREFIX.idx`` with megatron-core's own
``IndexedDatasetBuilder`` (``add_document`` with the lengths of the document's sequences, then
``finalize``), as ``tools/preprocess_data.py`` does, reads them back with megatron-core's
``IndexedDataset`` (each document as the concatenation of its sequences, via ``document_indices``), and
records the documents given, the dtype, both files' bytes (hex) and what ``IndexedDataset`` read back.

tests/data/test_megatron_format.py reads the JSON only; it never imports Megatron.
"""

from __future__ import annotations

import json
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

OUT = Path(__file__).resolve().with_name("megatron_indexed_files.json")
EOD = 256

CASES = [
    # name, dtype, documents (each a list of sequences; one sequence per document is what prepare writes)
    ("byte_uint16", "uint16", [[[72, 105, 33, EOD]], [[10, EOD]], [[0, 255, 65, 66, 67, EOD]], [[EOD]]]),
    ("gpt2_uint16", "uint16", [[[15496, 995, 50256]], [[464, 2068, 7586, 21831, 50256]], [[65535, 0, 50256]]]),
    ("big_vocab_int32", "int32", [[[69999, 65536, 1, 69999]], [[2**31 - 1, 0, 69999]], [[123456, 69999]]]),
    ("sentences_uint16", "uint16", [[[1, 2, 3], [4, 5, EOD]], [[6, EOD]], [[7, 8], [9], [10, EOD]]]),
]


def build(prefix: Path, dtype: str, documents: list[list[list[int]]]) -> None:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=getattr(np, dtype))
    for sequences in documents:
        tokens = torch.tensor([t for s in sequences for t in s], dtype=torch.int64)
        builder.add_document(tokens, [len(s) for s in sequences])
    builder.finalize(f"{prefix}.idx")


def read_back(prefix: Path) -> list[list[int]]:
    dataset = IndexedDataset(str(prefix), mmap=True)
    bounds = dataset.document_indices
    return [
        [int(t) for i in range(int(bounds[d]), int(bounds[d + 1])) for t in dataset[i]] for d in range(len(bounds) - 1)
    ]


def main() -> None:
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, documents in CASES:
            prefix = Path(tmp) / name
            build(prefix, dtype, documents)
            cases.append(
                {
                    "name": name,
                    "dtype": dtype,
                    "documents": documents,
                    "bin": prefix.with_suffix(".bin").read_bytes().hex(),
                    "idx": prefix.with_suffix(".idx").read_bytes().hex(),
                    "read_back": read_back(prefix),
                }
            )
    record = {
        "description": "MMIDIDX .bin/.idx written by megatron-core's IndexedDatasetBuilder and read back by its "
        "IndexedDataset; documents are lists of sequences; bin/idx are the files' bytes in hex",
        "command": "python tests/data/make_megatron_indexed_files.py",
        "megatron_core": metadata.version("megatron-core"),
        "cases": cases,
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
