"""A prepared folder (``meta.json`` + ``SPLIT.bin/.idx``, written by :mod:`seqwarm.data.prepare`), checked
when opened, and the windows and batches of its splits (:mod:`seqwarm.data.dataset`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from seqwarm.data.dataset import Batch, TokenWindows, TrainBatches, iter_eval_batches
from seqwarm.data.indexed import SPLITS, IndexedTokens, check_token_ids, read_meta, verify_files
from seqwarm.data.tokenizer import Tokenizer, load_tokenizer
from seqwarm.util.errors import UserError

__all__ = ["PreparedData", "open_prepared"]

logger = logging.getLogger(__name__)


class PreparedData:
    """A prepared folder: ``meta``, the memory-mapped splits, its tokenizer, and batch iterators.

    Opening checks every file's size against ``meta.json``, and its SHA-256 unless
    ``verify_checksums=False`` (hashing runs at disk speed, ~1 s per GB; each file once per process).
    """

    def __init__(self, folder: str | Path, *, verify_checksums: bool = True):
        self.folder = Path(folder)
        self.meta = read_meta(self.folder)
        verify_files(self.folder, self.meta, checksums=verify_checksums)
        self.vocab_size: int = int(self.meta["vocab_size"])
        self.eod_id: int = int(self.meta["eod_id"])
        self._splits: dict[str, IndexedTokens] = {}
        self._tokenizer: Tokenizer | None = None
        for name in SPLITS:
            split = self.split(name)
            expected = self.meta["splits"][name]
            if (split.num_tokens, split.num_docs) != (expected["tokens"], expected["documents"]):
                raise UserError(
                    f"{split.idx_path}: {split.num_docs} documents / {split.num_tokens} tokens, "
                    f"but meta.json says {expected['documents']} / {expected['tokens']}; "
                    "re-run seqwarm prepare"
                )
            if verify_checksums:  # with the checksums: both read every byte once, before any training
                check_token_ids(split, self.vocab_size)

    def split(self, name: str) -> IndexedTokens:
        if name not in SPLITS:
            raise UserError(f"unknown split {name!r}; choose from {', '.join(SPLITS)}")
        if name not in self._splits:
            self._splits[name] = IndexedTokens(self.folder / name)
        return self._splits[name]

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.meta, folder=self.folder)
        return self._tokenizer

    def windows(
        self,
        split: str,
        seq_length: int,
        *,
        eod_mask_loss: bool = False,
        reset_position_ids: bool = False,
        label_style: str = "megatron",
        document_masking: bool = False,
    ) -> TokenWindows:
        """``split`` as windows of ``seq_length + 1`` tokens; ``label_style``: "megatron" or "hf";
        ``document_masking``: batches carry ``document_ids`` (see :func:`build_batch`)."""
        return TokenWindows(
            self.split(split).tokens,
            seq_length,
            eod_id=self.eod_id,
            eod_mask_loss=eod_mask_loss,
            reset_position_ids=reset_position_ids,
            name=split,
            label_style=label_style,
            document_masking=document_masking,
            source=self.split(split),
        )

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
    ) -> TrainBatches:
        windows = self.windows(
            "train",
            seq_length,
            eod_mask_loss=eod_mask_loss,
            reset_position_ids=reset_position_ids,
            label_style=label_style,
            document_masking=document_masking,
        )
        return TrainBatches(windows, micro_batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle)

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
        return iter_eval_batches(windows, micro_batch_size, num_windows=num_windows, rank=rank, world_size=world_size)


def open_prepared(folder: str | Path, *, verify_checksums: bool = True) -> PreparedData:
    """Open a folder written by ``seqwarm prepare`` (see :class:`PreparedData`)."""
    return PreparedData(folder, verify_checksums=verify_checksums)
