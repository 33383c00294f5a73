"""Megatron indexed datasets read in place: ``PREFIX.bin`` / ``PREFIX.idx`` as megatron-core writes them.

``PREFIX.idx`` (little-endian), the published ``MMIDIDX`` layout::

    offset  size  field
    0       9     magic b"MMIDIDX\\x00\\x00"
    9       8     version (uint64) = 1
    17      1     dtype code (uint8): 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                  7 float32, 8 uint16
    18      8     sequence count S (uint64)
    26      8     document index length D + 1 (uint64)
    34      4*S   sequence lengths (int32), in tokens
    ..      8*S   sequence pointers (int64), byte offsets of each sequence in .bin
    ..      8*(D+1) document index (int64): document d is sequences doc[d] .. doc[d+1]-1;
                  doc[0] = 0, doc[D] = S
    ..      S     (multimodal files only) sequence modes (int8), ignored here

``PREFIX.bin`` holds the sequences back to back with no header, so the whole file is one token stream;
Megatron's ``preprocess_data.py --append-eod`` ends every document with EOD, which makes that stream
exactly the one ``seqwarm prepare`` writes for the same documents. It is memory-mapped, never converted.

Splits follow Megatron's ``--split 969,30,1`` (the test part is not used), and a blend
``--data-path 0.3 A 0.7 B`` draws training samples from the sources in proportion to their weights, as
Megatron's blended dataset does; both are :mod:`seqwarm.data.blend`'s. This module reads the files
(:class:`MegatronIndexed`) and makes them the data a run trains on (:class:`MegatronData`,
:func:`open_megatron`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.data.blend import (
    SPLIT_ROUNDINGS,
    BlendedBatches,
    ConcatWindows,
    blend_eval_indices,
    parse_data_path,
    split_documents,
)
from seqwarm.data.dataset import Batch, TokenWindows, TrainBatches, iter_eval_batches
from seqwarm.data.tokenizer import build_tokenizer
from seqwarm.util.errors import UserError

__all__ = ["MEGATRON_MAGIC", "MEGATRON_DTYPES", "MegatronIndexed", "MegatronData", "open_megatron"]

logger = logging.getLogger(__name__)

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document index length
MEGATRON_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
"""megatron-core's dtype codes."""
DEFAULT_SPLIT = "969,30,1"
_FIX = "re-run Megatron's tools/preprocess_data.py for it"


def _bad(path: Path, what: str) -> UserError:
    return UserError(f"{str(path)!r}: {what}; {_FIX}")


class MegatronIndexed:
    """One memory-mapped Megatron ``PREFIX.bin`` + ``PREFIX.idx``: the token stream and its documents.

    ``tokens`` is the whole ``.bin`` as one 1-D array; ``doc_offsets`` (D+1, int64) are the documents'
    token offsets in it.
    """

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.idx_path = Path(f"{self.prefix}.idx")
        self.bin_path = Path(f"{self.prefix}.bin")
        raw = _read(self.idx_path, _HEADER.size)
        magic, version, code, seqs, docs = _HEADER.unpack(raw)
        if magic != MEGATRON_MAGIC:
            hint = " (a seqwarm index: give its folder to --data)" if magic.startswith(b"SEQWIDX") else ""
            raise UserError(
                f"{str(self.idx_path)!r} is not a Megatron index file (bad magic bytes {magic!r}, "
                f"expected {MEGATRON_MAGIC!r}){hint}"
            )
        if version != MEGATRON_VERSION:
            raise _bad(self.idx_path, f"index version {version}, but seqwarm reads version {MEGATRON_VERSION}")
        if code not in MEGATRON_DTYPES:
            raise _bad(self.idx_path, f"unknown dtype code {code} (Megatron's codes are 1-8)")
        self.dtype = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
        if self.dtype.kind == "f":
            raise _bad(self.idx_path, f"dtype {self.dtype.name}: token ids must be integers")
        if docs < 1:
            raise _bad(self.idx_path, "empty document index (it needs at least its leading 0)")
        self.num_sequences, self.num_docs = int(seqs), int(docs) - 1
        size = _size(self.idx_path)
        expected = _HEADER.size + 12 * seqs + 8 * docs
        if size not in (expected, expected + seqs):  # + seqs: the int8 modes of a multimodal file
            what = "truncated" if size < expected else "longer than its header says"
            raise _bad(
                self.idx_path,
                f"{what}: {size} bytes, but its header ({seqs} sequences, {docs - 1} documents) needs {expected}",
            )
        off = _HEADER.size
        self.lengths = (
            np.memmap(self.idx_path, dtype="<i4", mode="r", offset=off, shape=(seqs,))
            if seqs
            else np.zeros(0, dtype="<i4")
        )
        pointers = (
            np.memmap(self.idx_path, dtype="<i8", mode="r", offset=off + 4 * seqs, shape=(seqs,))
            if seqs
            else np.zeros(0, dtype="<i8")
        )
        doc_index = np.memmap(self.idx_path, dtype="<i8", mode="r", offset=off + 12 * seqs, shape=(docs,))
        if (self.lengths < 0).any():
            raise _bad(self.idx_path, "negative sequence lengths")
        seq_offsets = np.zeros(seqs + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=seq_offsets[1:])
        if not np.array_equal(pointers, seq_offsets[:-1] * self.dtype.itemsize):
            raise _bad(
                self.idx_path,
                "its sequence pointers are not the sequences back to back (a damaged "
                "index, or a layout seqwarm cannot map as one stream)",
            )
        if doc_index[0] != 0 or doc_index[-1] != seqs or (np.diff(doc_index) < 0).any():
            raise _bad(self.idx_path, f"its document index must rise from 0 to the sequence count {seqs}")
        self.num_tokens = int(seq_offsets[-1])
        self.doc_offsets = seq_offsets[np.asarray(doc_index)]
        bin_size = _size(self.bin_path)
        if bin_size != self.num_tokens * self.dtype.itemsize:
            what = "truncated" if bin_size < self.num_tokens * self.dtype.itemsize else "longer than its index says"
            raise _bad(
                self.bin_path,
                f"{what}: {bin_size} bytes, but {self.idx_path.name} says "
                f"{self.num_tokens} tokens of {self.dtype.itemsize} bytes",
            )
        self.tokens = (
            np.memmap(self.bin_path, dtype=self.dtype, mode="r", shape=(self.num_tokens,))
            if self.num_tokens
            else np.zeros(0, dtype=self.dtype)
        )

    def __len__(self) -> int:
        return self.num_docs

    def document(self, i: int) -> np.ndarray:
        return self.tokens[int(self.doc_offsets[i]) : int(self.doc_offsets[i + 1])]

    def check_ids(self, vocab_size: int, chunk: int = 1 << 24) -> None:
        """Exit 2 naming the file when a token id is negative or ``>= vocab_size`` (one pass over .bin,
        skipped when the dtype cannot hold such an id)."""
        info = np.iinfo(self.dtype)
        if info.min >= 0 and info.max < vocab_size:
            return
        key = (str(self.bin_path.resolve()), self.bin_path.stat().st_mtime_ns, vocab_size)
        if key in _CHECKED:
            return
        for start in range(0, self.num_tokens, chunk):
            part = self.tokens[start : start + chunk]
            low, high = int(part.min()), int(part.max())
            if low < 0 or high >= vocab_size:
                bad = low if low < 0 else high
                raise UserError(
                    f"{str(self.bin_path)!r} holds token id {bad}, outside the vocabulary "
                    f"0..{vocab_size - 1}; give the tokenizer the data was made with "
                    "(--tokenizer) or its padded size (--vocab-size)"
                )
        _CHECKED.add(key)


_CHECKED: set[tuple] = set()


def _read(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(n)
    except FileNotFoundError:
        raise UserError(f"{str(path)!r} is missing (--data-path names PREFIX for PREFIX.bin and PREFIX.idx)") from None
    except OSError as err:
        raise UserError(f"cannot read {str(path)!r}: {err.strerror or err}") from None
    if len(raw) < n:
        raise _bad(path, f"truncated: {len(raw)} bytes, shorter than the {n}-byte header")
    return raw


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise UserError(f"{str(path)!r} is missing (--data-path names PREFIX for PREFIX.bin and PREFIX.idx)") from None


# --------------------------------------------------------------------------------------------------
# the data a run trains on


@dataclass(frozen=True)
class _Source:
    weight: float
    indexed: MegatronIndexed
    ranges: list[tuple[int, int]]

    def stream(self, split: int) -> np.ndarray:
        start, stop = self.ranges[split]
        return self.indexed.tokens[int(self.indexed.doc_offsets[start]) : int(self.indexed.doc_offsets[stop])]


class MegatronData:
    """Megatron ``--data-path`` sources with the interface of :class:`~seqwarm.data.PreparedData`
    (``vocab_size``, ``eod_id``, ``meta``, ``train_batches``, ``val_batches``, ``tokenizer``)."""

    def __init__(
        self,
        data_path: Sequence[str],
        *,
        split: str = DEFAULT_SPLIT,
        split_rounding: str = SPLIT_ROUNDINGS[0],
        tokenizer: str | None = None,
        vocab_size: int | None = None,
        eod_id: int | None = None,
    ):
        if tokenizer and tokenizer.strip().lower().startswith("bpe:"):
            raise UserError(
                f"--tokenizer {tokenizer} trains a new tokenizer; --data-path data was tokenized "
                "already: give the tokenizer it was made with (gpt2, hf:PATH) or --vocab-size/--eod-id"
            )
        self._tokenizer = build_tokenizer(tokenizer) if tokenizer else None
        if vocab_size is None:
            if self._tokenizer is None:
                raise UserError("--data-path needs the vocabulary: give --tokenizer (gpt2, hf:PATH) or --vocab-size")
            vocab_size = self._tokenizer.vocab_size
        if eod_id is None:
            if self._tokenizer is None:
                raise UserError("--data-path needs the end-of-document id: give --tokenizer or --eod-id")
            eod_id = self._tokenizer.eod_id
        if self._tokenizer is not None and vocab_size < self._tokenizer.vocab_size:
            raise UserError(
                f"--vocab-size {vocab_size} is smaller than the {tokenizer} vocabulary ({self._tokenizer.vocab_size})"
            )
        if not 0 <= eod_id < vocab_size:
            raise UserError(f"--eod-id {eod_id} is outside the vocabulary 0..{vocab_size - 1}")
        self.vocab_size, self.eod_id = int(vocab_size), int(eod_id)
        self.sources: list[_Source] = []
        self._said: set[tuple[int, int]] = set()
        parsed = parse_data_path(data_path)
        for weight, prefix in parsed:
            indexed = MegatronIndexed(prefix)
            indexed.check_ids(self.vocab_size)
            self.sources.append(_Source(weight, indexed, split_documents(len(indexed), split, split_rounding)))
            _warn_without_eod(indexed, self.eod_id)
        if parsed[0][0] is None:  # a list without weights: each source weighs its training tokens
            sizes = [len(s.stream(0)) for s in self.sources]
            if not sum(sizes):
                raise UserError(f"--data-path {' '.join(map(str, data_path))}: no source has training tokens")
            self.sources = [replace(s, weight=n / sum(sizes)) for s, n in zip(self.sources, sizes)]
        self.folder = self.sources[0].indexed.prefix.parent
        counts = {
            name: {
                "tokens": sum(len(s.stream(i)) for s in self.sources),
                "documents": sum(s.ranges[i][1] - s.ranges[i][0] for s in self.sources),
            }
            for i, name in enumerate(("train", "val"))
        }
        self.meta: dict[str, Any] = {
            "format": "megatron",
            "vocab_size": self.vocab_size,
            "eod_id": self.eod_id,
            "split": split,
            "split_rounding": split_rounding,
            "tokenizer": (
                self._tokenizer.describe()
                if self._tokenizer
                else {"name": None, "vocab_size": self.vocab_size, "eod_id": self.eod_id}
            ),
            "sources": [
                {
                    "prefix": str(s.indexed.prefix),
                    "weight": s.weight,
                    "dtype": s.indexed.dtype.name,
                    "documents": len(s.indexed),
                }
                for s in self.sources
            ],
            "splits": counts,
        }

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            raise UserError("this --data-path run has no tokenizer: give --tokenizer")
        return self._tokenizer

    def _windows(self, split: int, seq_length: int, **opts: Any) -> list[TokenWindows]:
        name = ("train", "val")[split]
        out = []
        for s in self.sources:
            label = f"{name} split of {s.indexed.prefix} (--split {self.meta['split']})"
            out.append(TokenWindows(s.stream(split), seq_length, eod_id=self.eod_id, name=label, **opts))
        return out

    def windows(
        self,
        split: str,
        seq_length: int,
        *,
        eod_mask_loss: bool = False,
        reset_position_ids: bool = False,
        label_style: str = "megatron",
        document_masking: bool = False,
    ) -> TokenWindows | ConcatWindows:
        """``split`` (train or val) of every source as windows of ``seq_length + 1`` tokens."""
        if split not in ("train", "val"):
            raise UserError(f"unknown split {split!r}; choose from train, val")
        parts = self._windows(
            ("train", "val").index(split),
            seq_length,
            eod_mask_loss=eod_mask_loss,
            reset_position_ids=reset_position_ids,
            label_style=label_style,
            document_masking=document_masking,
        )
        return parts[0] if len(parts) == 1 else ConcatWindows(parts, split)

    def train_batches(
        self,
        seq_length: int,
        micro_batch_size: int,
        *,
        seed: int = 1234,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        eod_mask_loss: bool = False,
        reset_position_ids: bool = False,
        label_style: str = "megatron",
        document_masking: bool = False,
    ):
        windows = self._windows(
            0,
            seq_length,
            eod_mask_loss=eod_mask_loss,
            reset_position_ids=reset_position_ids,
            label_style=label_style,
            document_masking=document_masking,
        )
        if len(windows) == 1:  # one source: exactly the order of a prepared folder's split
            return TrainBatches(
                windows[0], micro_batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle
            )
        return BlendedBatches(
            windows,
            [s.weight for s in self.sources],
            micro_batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            shuffle=shuffle,
        )

    def val_batches(
        self,
        seq_length: int,
        micro_batch_size: int,
        *,
        num_windows: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        eod_mask_loss: bool = False,
        reset_position_ids: bool = False,
        label_style: str = "megatron",
        document_masking: bool = False,
    ) -> Iterator[Batch]:
        windows = self.windows(
            "val",
            seq_length,
            eod_mask_loss=eod_mask_loss,
            reset_position_ids=reset_position_ids,
            label_style=label_style,
            document_masking=document_masking,
        )
        if not isinstance(windows, ConcatWindows):
            return iter_eval_batches(
                windows, micro_batch_size, num_windows=num_windows, rank=rank, world_size=world_size
            )
        # a blend: its sources in proportion to their weights, as Megatron's validation blend draws them
        picks = blend_eval_indices([len(p) for p in windows.parts], [s.weight for s in self.sources], num_windows)
        if num_windows is not None and len(picks) < num_windows and (seq_length, num_windows) not in self._said:
            self._said.add((seq_length, num_windows))  # once, not at every evaluation
            logger.warning(
                "the blend's val split holds %d windows of %d tokens at its weights; evaluating those, not %d",
                len(picks),
                seq_length + 1,
                num_windows,
            )
        mine = picks[: len(picks) - len(picks) % world_size][rank::world_size]  # as many on every rank
        return (windows.batch(mine[i : i + micro_batch_size]) for i in range(0, len(mine), micro_batch_size))


def _warn_without_eod(indexed: MegatronIndexed, eod_id: int, probe: int = 1000) -> None:
    """Warn when documents do not end with EOD (data preprocessed without --append-eod)."""
    ends = indexed.doc_offsets[1:]
    ends = ends[ends > indexed.doc_offsets[:-1]]  # non-empty documents
    if not len(ends):
        return
    sample = ends[np.unique(np.linspace(0, len(ends) - 1, min(probe, len(ends))).astype(np.int64))]
    missing = int((np.asarray(indexed.tokens[sample - 1]) != eod_id).sum())
    if missing:
        logger.warning(
            "warning: %d of %d documents probed in %s do not end with EOD id %d (preprocessed "
            "without --append-eod?): training windows run across document boundaries unmarked",
            missing,
            len(sample),
            indexed.bin_path,
            eod_id,
        )


def open_megatron(data_path: Sequence[str], **kwargs: Any) -> MegatronData:
    """Open ``--data-path`` sources (see :class:`MegatronData`)."""
    return MegatronData(data_path, **kwargs)
