"""Training data as a blend of token-file sources: Megatron's ``--data-path`` and seqwarm's prepared folders.

Every source is Megatron's ``MMIDIDX`` ``PREFIX.bin`` / ``PREFIX.idx`` (:mod:`seqwarm.data.indexed`),
memory-mapped, never converted: ``PREFIX.bin`` is one token stream, and Megatron's
``preprocess_data.py --append-eod`` ends every document with EOD, which makes that stream exactly the one
``seqwarm prepare`` writes for the same documents. :class:`TokenData` reads its sources' train and val
parts as windows and batches, whichever way they were opened: :class:`MegatronData` (``--data-path``: each
file split by Megatron's ``--split 969,30,1``, the test part unused; a blend ``--data-path 0.3 A 0.7 B``
draws training samples in proportion to the weights, as Megatron's blended dataset does; both are
:mod:`seqwarm.data.blend`'s) or :class:`~seqwarm.data.prepared.PreparedData` (a prepared folder: one
source, its ``train`` and ``val`` files).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.data.blend import BlendedBatches, ConcatWindows, blend_eval_indices
from seqwarm.data.data_path import SPLIT_ROUNDINGS, parse_data_path, source_weights, split_documents
from seqwarm.data.dataset import Batch, TokenWindows, TrainBatches, iter_eval_batches
from seqwarm.data.indexed import MEGATRON_DTYPES, MEGATRON_MAGIC, MegatronIndexed
from seqwarm.data.tokenizer import build_tokenizer
from seqwarm.util.errors import UserError

__all__ = ["MEGATRON_MAGIC", "MEGATRON_DTYPES", "MegatronIndexed", "TokenData", "MegatronData", "open_megatron"]

logger = logging.getLogger(__name__)

DEFAULT_SPLIT = "969,30,1"
_IDS_FIX = "give the tokenizer the data was made with (--tokenizer) or its padded size (--vocab-size)"


@dataclass(frozen=True)
class Source:
    """One source of a blend: its weight, and for each split (train, val) the file, its document range
    and the name errors give it."""

    weight: float
    files: tuple[MegatronIndexed, MegatronIndexed]
    ranges: tuple[tuple[int, int], tuple[int, int]]
    names: tuple[str, str]

    def stream(self, split: int) -> np.ndarray:
        indexed, (start, stop) = self.files[split], self.ranges[split]
        return indexed.tokens[int(indexed.doc_offsets[start]) : int(indexed.doc_offsets[stop])]


class TokenData:
    """Sources read as one data set: ``vocab_size``, ``eod_id``, ``meta``, ``folder``, ``tokenizer``,
    and the windows and batches of the train and val parts (one source: exactly its own order)."""

    def __init__(self, sources: Sequence[Source], *, vocab_size: int, eod_id: int, meta: dict[str, Any], folder: Path):
        self.sources = list(sources)
        self.vocab_size, self.eod_id = int(vocab_size), int(eod_id)
        self.meta, self.folder = meta, folder
        self._said: set[tuple[int, int]] = set()

    @property
    def tokenizer(self):
        raise UserError("this data has no tokenizer: give --tokenizer")

    def _windows(self, split: int, seq_length: int, **opts: Any) -> list[TokenWindows]:
        return [
            TokenWindows(
                s.stream(split), seq_length, eod_id=self.eod_id, name=s.names[split], source=s.files[split], **opts
            )
            for s in self.sources
        ]

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


def split_counts(sources: Sequence[Source]) -> dict[str, dict[str, int]]:
    """The tokens and documents of the sources' train and val parts together."""
    return {
        name: {
            "tokens": sum(len(s.stream(i)) for s in sources),
            "documents": sum(s.ranges[i][1] - s.ranges[i][0] for s in sources),
        }
        for i, name in enumerate(("train", "val"))
    }


class MegatronData(TokenData):
    """Megatron ``--data-path`` sources, each file split into train / val / test by ``--split``."""

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
        sources = []
        parsed = parse_data_path(data_path)
        for weight, prefix in parsed:
            indexed = MegatronIndexed(prefix)
            indexed.check_ids(vocab_size, _IDS_FIX)
            train, val = split_documents(len(indexed), split, split_rounding)[:2]
            names = tuple(f"{name} split of {indexed.prefix} (--split {split})" for name in ("train", "val"))
            sources.append(Source(weight, (indexed, indexed), (train, val), names))
            _warn_without_eod(indexed, eod_id)
        if parsed[0][0] is None:  # a list without weights: each source weighs its training tokens
            sizes = [len(s.stream(0)) for s in sources]
            weights = source_weights([w for w, _ in parsed], sizes, " ".join(map(str, data_path)))
            sources = [replace(s, weight=w) for s, w in zip(sources, weights)]
        meta: dict[str, Any] = {
            "format": "megatron",
            "vocab_size": vocab_size,
            "eod_id": eod_id,
            "split": split,
            "split_rounding": split_rounding,
            "tokenizer": (
                self._tokenizer.describe()
                if self._tokenizer
                else {"name": None, "vocab_size": vocab_size, "eod_id": eod_id}
            ),
            "sources": [
                {
                    "prefix": str(s.files[0].prefix),
                    "weight": s.weight,
                    "dtype": s.files[0].dtype.name,
                    "documents": len(s.files[0]),
                }
                for s in sources
            ],
            "splits": split_counts(sources),
        }
        super().__init__(
            sources, vocab_size=vocab_size, eod_id=eod_id, meta=meta, folder=sources[0].files[0].prefix.parent
        )

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            raise UserError("this --data-path run has no tokenizer: give --tokenizer")
        return self._tokenizer


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
