"""A prepared folder (``meta.json`` + ``train``/``val`` ``.bin``/``.idx``, written by
:mod:`seqwarm.data.prepare`), checked when opened and read as a one-source blend: the same windows and
batches as a ``--data-path`` source (:class:`~seqwarm.data.megatron.TokenData`), its train and val parts
being its two files."""

from __future__ import annotations

from pathlib import Path

from seqwarm.data.indexed import PREPARE_FIX, MegatronIndexed
from seqwarm.data.megatron import Source, TokenData
from seqwarm.data.meta import SPLITS, read_meta, verify_files
from seqwarm.data.tokenizer import Tokenizer, load_tokenizer
from seqwarm.util.errors import UserError

__all__ = ["PreparedData", "open_prepared"]

_IDS_FIX = "meta.json's vocabulary and the token files do not belong together; re-run seqwarm prepare"


class PreparedData(TokenData):
    """A prepared folder: ``meta``, the memory-mapped splits, its tokenizer, and batch iterators.

    Opening checks every file's size against ``meta.json``, and its SHA-256 unless
    ``verify_checksums=False`` (hashing runs at disk speed, ~1 s per GB; each file once per process).
    A folder in seqwarm's old ``SEQWIDX`` format is refused with the command that converts it.
    """

    def __init__(self, folder: str | Path, *, verify_checksums: bool = True):
        folder = Path(folder)
        meta = read_meta(folder)
        verify_files(folder, meta, checksums=verify_checksums)
        files = tuple(MegatronIndexed(folder / name, fix=PREPARE_FIX) for name in SPLITS)
        for name, split in zip(SPLITS, files):
            expected = meta["splits"][name]
            if (split.num_tokens, split.num_docs) != (expected["tokens"], expected["documents"]):
                raise UserError(
                    f"{split.idx_path}: {split.num_docs} documents / {split.num_tokens} tokens, "
                    f"but meta.json says {expected['documents']} / {expected['tokens']}; {PREPARE_FIX}"
                )
            if verify_checksums:  # with the checksums: both read every byte once, before any training
                split.check_ids(int(meta["vocab_size"]), _IDS_FIX)
        ranges = ((0, len(files[0])), (0, len(files[1])))
        source = Source(1.0, files, ranges, SPLITS)
        super().__init__([source], vocab_size=meta["vocab_size"], eod_id=meta["eod_id"], meta=meta, folder=folder)
        self._tokenizer: Tokenizer | None = None

    def split(self, name: str) -> MegatronIndexed:
        """The memory-mapped token file of split ``name`` (train or val)."""
        if name not in SPLITS:
            raise UserError(f"unknown split {name!r}; choose from {', '.join(SPLITS)}")
        return self.sources[0].files[SPLITS.index(name)]

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.meta, folder=self.folder)
        return self._tokenizer


def open_prepared(folder: str | Path, *, verify_checksums: bool = True) -> PreparedData:
    """Open a folder written by ``seqwarm prepare`` (see :class:`PreparedData`)."""
    return PreparedData(folder, verify_checksums=verify_checksums)
