"""Data pipeline: embedded corpus and user inputs (text, JSONL, tables), tokenizers, indexed token
files, datasets.

    corpus -> tokenizer -> SPLIT.bin/.idx (Megatron's MMIDIDX) + meta.json (prepare_dataset)
        -> PreparedData, a one-source TokenData as Megatron's --data-path is (MegatronData) -> batches

Names are imported lazily, so that ``import seqwarm.data`` (and the tokenizing worker processes) do
not pay for importing torch; only the dataset part needs it.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_EXPORTS = {
    # corpus
    "iter_default_documents": "corpus",
    "default_corpus_sources": "corpus",
    "describe_default_corpus": "corpus",
    "iter_input_documents": "corpus",
    "resolve_inputs": "corpus",
    "iter_parquet": "tables",
    "iter_arrow": "tables",
    "strip_gutenberg_boilerplate": "corpus",
    "CorpusSource": "corpus",
    "corpus_identity": "corpus",
    # tokenizers
    "Tokenizer": "tokenizer",
    "ByteTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "build_tokenizer": "tokenizer",
    "gpt2_tokenizer": "tokenizer",
    "hf_tokenizer": "tokenizer",
    "train_bpe": "tokenizer",
    "load_tokenizer": "tokenizer",
    "parse_tokenizer_name": "tokenizer",
    "EOD_TOKEN": "tokenizer",
    # on-disk format
    "MegatronIndexed": "indexed",
    "IndexedWriter": "indexed",
    "choose_dtype": "indexed",
    "read_meta": "meta",
    "data_fingerprint": "meta",
    "verify_files": "meta",
    "convert_folder": "legacy",
    # preparing
    "DEFAULT_TOKENIZER": "prepare",
    "prepare_dataset": "prepare",
    "embedded_data_dir": "prepare",
    "PrepareResult": "prepare",
    # batches
    "PreparedData": "prepared",
    "open_prepared": "prepared",
    "TokenData": "megatron",
    "MegatronData": "megatron",
    "open_megatron": "megatron",
    "TokenWindows": "dataset",
    "TrainBatches": "dataset",
    "iter_eval_batches": "dataset",
    "build_batch": "dataset",
}

_DEPRECATED = {"IndexedTokens": ("MegatronIndexed", "indexed")}
"""Old names kept for a release: (the new name, its module)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new, module = _DEPRECATED[name]
        warnings.warn(
            f"seqwarm.data.{name} is deprecated; use seqwarm.data.{new} (prepared folders are Megatron's "
            "MMIDIDX token files since 0.2.0)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(f"seqwarm.data.{module}"), new)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seqwarm.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"seqwarm.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
