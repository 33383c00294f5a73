"""Indexed token files in Megatron's ``MMIDIDX`` format: ``PREFIX.bin`` (token ids) + ``PREFIX.idx``.

One format for both directions: ``seqwarm prepare`` writes it (:class:`IndexedWriter`), and
:class:`MegatronIndexed` memory-maps it, whether seqwarm or Megatron's ``tools/preprocess_data.py``
(megatron-core's ``IndexedDatasetBuilder``) wrote it. ``PREFIX.idx`` (little-endian)::

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

``PREFIX.bin`` holds the sequences back to back with no header, so the whole file is one token stream.
seqwarm writes one sequence per document, each ending with EOD (Megatron's ``--append-eod``), as
``uint16`` when the vocabulary fits (``vocab_size <= 65536``), else ``int32``. The writer streams: tokens
go to ``.bin`` as they come, the index is assembled at :meth:`IndexedWriter.close`.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from seqwarm.util.errors import UserError

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document index length
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
MAX_VOCAB = 2**31
"""The largest vocabulary seqwarm's token files hold (``int32`` ids)."""
PREPARE_FIX = "re-run seqwarm prepare"
MEGATRON_FIX = "re-run Megatron's tools/preprocess_data.py for it"


def choose_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (``vocab_size <= 65536``), else ``int32``."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size > MAX_VOCAB:
        raise ValueError(f"vocab_size {vocab_size:,} is more than the {MAX_VOCAB:,} ids a token file holds")
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<i4")


def dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def dtype_code(dtype: np.dtype) -> int:
    name = np.dtype(dtype).name
    return next(code for code, t in MEGATRON_DTYPES.items() if np.dtype(t).name == name)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class IndexedWriter:
    """Append documents to ``PREFIX.bin`` / ``PREFIX.idx`` (one sequence per document); :meth:`close`
    writes the index. The SHA-256 of ``.bin`` is computed while writing, so the file is never read back;
    the sequence lengths and pointers wait in a side file (``PREFIX.idx.part``), not in memory."""

    def __init__(self, prefix: str | Path, dtype: np.dtype):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.code = dtype_code(self.dtype)
        self.bin_path = Path(f"{self.prefix}.bin")
        self.idx_path = Path(f"{self.prefix}.idx")
        self._part_path = Path(f"{self.prefix}.idx.part")
        self._bin: BinaryIO = open(self.bin_path, "wb")
        self._idx: BinaryIO = open(self.idx_path, "wb")
        self._part: BinaryIO = open(self._part_path, "w+b")  # the pointers, appended to .idx at close
        self._idx.write(b"\0" * HEADER.size)  # placeholder, rewritten by close()
        self._sha = hashlib.sha256()
        self.num_docs = 0
        self.num_tokens = 0
        self.closed = False

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents given as their concatenated tokens and each one's length."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ValueError("lengths do not add up to the number of tokens")
        if len(lengths) == 0:
            return
        if lengths.max() >= 2**31:
            raise ValueError(f"a document of {int(lengths.max()):,} tokens: an MMIDIDX sequence holds < 2**31")
        data = np.ascontiguousarray(tokens, dtype=self.dtype).tobytes()
        self._bin.write(data)
        self._sha.update(data)
        ends = self.num_tokens + np.cumsum(lengths)
        self._idx.write(lengths.astype("<i4").tobytes())
        self._part.write(((ends - lengths) * self.dtype.itemsize).astype("<i8").tobytes())
        self.num_docs += len(lengths)
        self.num_tokens += len(tokens)

    def close(self) -> dict[str, Any]:
        """Finish both files; return ``{"documents", "tokens", "files": {name: {bytes, sha256}}}``."""
        if not self.closed:
            self._bin.close()
            self._part.seek(0)
            while block := self._part.read(1 << 22):
                self._idx.write(block)
            for start in range(0, self.num_docs + 1, 1 << 20):  # the document index 0..D: one sequence each
                self._idx.write(np.arange(start, min(start + (1 << 20), self.num_docs + 1), dtype="<i8").tobytes())
            self._idx.seek(0)
            n = self.num_docs
            self._idx.write(HEADER.pack(MEGATRON_MAGIC, MEGATRON_VERSION, self.code, n, n + 1))
            self._idx.close()
            self._part.close()
            self._part_path.unlink()
            self.closed = True
        return {
            "documents": self.num_docs,
            "tokens": self.num_tokens,
            "files": {
                self.bin_path.name: {"bytes": self.bin_path.stat().st_size, "sha256": self._sha.hexdigest()},
                self.idx_path.name: {"bytes": self.idx_path.stat().st_size, "sha256": sha256_file(self.idx_path)},
            },
        }

    def abort(self) -> None:
        for f in (self._bin, self._idx, self._part):
            f.close()
        self._part_path.unlink(missing_ok=True)
        self.closed = True


def _bad(path: Path, what: str, fix: str) -> UserError:
    return UserError(f"{str(path)!r}: {what}; {fix}")


class MegatronIndexed:
    """One memory-mapped ``PREFIX.bin`` + ``PREFIX.idx``: the token stream and its documents.

    ``tokens`` is the whole ``.bin`` as one 1-D array; ``doc_offsets`` (D+1, int64) are the documents'
    token offsets in it. ``fix`` ends every error about the files (how to make them again).
    :meth:`check_unchanged` says whether ``.bin`` is still the file opened.
    """

    def __init__(self, prefix: str | Path, *, fix: str = MEGATRON_FIX):
        self.prefix = Path(prefix)
        self.fix = fix
        self.idx_path = Path(f"{self.prefix}.idx")
        self.bin_path = Path(f"{self.prefix}.bin")
        raw = _read(self.idx_path, HEADER.size, fix)
        magic, version, code, seqs, docs = HEADER.unpack(raw)
        if magic != MEGATRON_MAGIC:
            hint = (
                f" (seqwarm's old SEQWIDX format: convert its folder with seqwarm prepare --convert "
                f"{self.prefix.parent})"
                if magic.startswith(b"SEQWIDX")
                else ""
            )
            raise UserError(
                f"{str(self.idx_path)!r} is not a Megatron index file (bad magic bytes {magic!r}, "
                f"expected {MEGATRON_MAGIC!r}){hint}"
            )
        if version != MEGATRON_VERSION:
            raise _bad(self.idx_path, f"index version {version}, but seqwarm reads version {MEGATRON_VERSION}", fix)
        if code not in MEGATRON_DTYPES:
            raise _bad(self.idx_path, f"unknown dtype code {code} (Megatron's codes are 1-8)", fix)
        self.dtype = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
        if self.dtype.kind == "f":
            raise _bad(self.idx_path, f"dtype {self.dtype.name}: token ids must be integers", fix)
        if docs < 1:
            raise _bad(self.idx_path, "empty document index (it needs at least its leading 0)", fix)
        self.num_sequences, self.num_docs = int(seqs), int(docs) - 1
        size = _size(self.idx_path, fix)
        expected = HEADER.size + 12 * seqs + 8 * docs
        if size not in (expected, expected + seqs):  # + seqs: the int8 modes of a multimodal file
            what = "truncated" if size < expected else "longer than its header says"
            raise _bad(
                self.idx_path,
                f"{what}: {size} bytes, but its header ({seqs} sequences, {docs - 1} documents) needs {expected}",
                fix,
            )
        off = HEADER.size
        self.lengths = _map(self.idx_path, "<i4", off, seqs)
        pointers = _map(self.idx_path, "<i8", off + 4 * seqs, seqs)
        doc_index = _map(self.idx_path, "<i8", off + 12 * seqs, docs)
        if (self.lengths < 0).any():
            raise _bad(self.idx_path, "negative sequence lengths", fix)
        seq_offsets = np.zeros(seqs + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=seq_offsets[1:])
        if not np.array_equal(pointers, seq_offsets[:-1] * self.dtype.itemsize):
            raise _bad(
                self.idx_path,
                "its sequence pointers are not the sequences back to back (a damaged "
                "index, or a layout seqwarm cannot map as one stream)",
                fix,
            )
        if doc_index[0] != 0 or doc_index[-1] != seqs or (np.diff(doc_index) < 0).any():
            raise _bad(self.idx_path, f"its document index must rise from 0 to the sequence count {seqs}", fix)
        self.num_tokens = int(seq_offsets[-1])
        self.doc_offsets = seq_offsets[np.asarray(doc_index)]
        bin_size = _size(self.bin_path, fix)
        if bin_size != self.num_tokens * self.dtype.itemsize:
            what = "truncated" if bin_size < self.num_tokens * self.dtype.itemsize else "longer than its index says"
            raise _bad(
                self.bin_path,
                f"{what}: {bin_size} bytes, but {self.idx_path.name} says "
                f"{self.num_tokens} tokens of {self.dtype.itemsize} bytes",
                fix,
            )
        self.tokens = _map(self.bin_path, self.dtype, 0, self.num_tokens)
        self._identity = _identity(self.bin_path)

    @property
    def offsets(self) -> np.ndarray:
        """``doc_offsets`` (the name the old seqwarm index reader gave them)."""
        return self.doc_offsets

    def __len__(self) -> int:
        return self.num_docs

    def document(self, i: int) -> np.ndarray:
        """Tokens of document ``i`` (a view into the memmap)."""
        return self.tokens[int(self.doc_offsets[i]) : int(self.doc_offsets[i + 1])]

    def check_unchanged(self) -> None:
        """UserError naming ``.bin`` when it is no longer the file opened (truncated, rewritten, replaced):
        one ``stat`` (size, modification time, inode), cheap enough for every batch read."""
        now = _identity(self.bin_path)
        if now == self._identity:
            return
        if now is None:
            change = "was removed"
        elif self._identity is not None and now[0] < self._identity[0]:
            change = f"was truncated ({now[0]:,} bytes, {self._identity[0]:,} when the run opened it)"
        else:
            change = "was changed or replaced (its size, modification time or inode differ from when it was opened)"
        raise UserError(
            f"{str(self.bin_path)!r} {change} while the run was reading it; the data under a run must not "
            "change: prepare the new data into another folder, and start a run on it"
        )

    def check_ids(self, vocab_size: int, fix: str, chunk: int = 1 << 24) -> None:
        """UserError naming the file when a token id is negative or ``>= vocab_size`` (the model's
        embedding would fail on it mid-run); one pass over .bin per process, skipped when the dtype
        cannot hold such an id. ``fix`` says what to do about it."""
        info = np.iinfo(self.dtype)
        if info.min >= 0 and info.max < vocab_size:
            return
        key = (str(self.bin_path.resolve()), self._identity, vocab_size)
        if key in _CHECKED:
            return
        for start in range(0, self.num_tokens, chunk):
            part = self.tokens[start : start + chunk]
            low, high = int(part.min()), int(part.max())
            if low < 0 or high >= vocab_size:
                bad = low if low < 0 else high
                raise UserError(
                    f"{str(self.bin_path)!r} holds token id {bad}, outside the vocabulary 0..{vocab_size - 1}; {fix}"
                )
        _CHECKED.add(key)


_CHECKED: set[tuple] = set()
"""Files whose ids were checked in this process."""


def _map(path: Path, dtype: Any, offset: int, count: int) -> np.ndarray:
    if not count:  # numpy cannot map an empty range
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(int(count),))


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _missing(path: Path, fix: str) -> UserError:
    if fix == MEGATRON_FIX:
        return UserError(f"{str(path)!r} is missing (--data-path names PREFIX for PREFIX.bin and PREFIX.idx)")
    return UserError(f"{str(path)!r} is missing; {fix}")


def _read(path: Path, n: int, fix: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(n)
    except FileNotFoundError:
        raise _missing(path, fix) from None
    except OSError as err:
        raise UserError(f"cannot read {str(path)!r}: {err.strerror or err}") from None
    if len(raw) < n:
        raise _bad(path, f"truncated: {len(raw)} bytes, shorter than the {n}-byte header", fix)
    return raw


def _size(path: Path, fix: str) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise _missing(path, fix) from None


def write_index(path: str | Path, lengths: np.ndarray, dtype: np.dtype) -> None:
    """Write ``path`` as the ``MMIDIDX`` index of documents of ``lengths`` tokens (one sequence each)
    stored back to back as ``dtype`` in its ``.bin`` (:class:`IndexedWriter` streams the same bytes)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 0 or lengths.max() >= 2**31):
        raise ValueError("document lengths must be in 0 .. 2**31 - 1 tokens")
    pointers = np.zeros(len(lengths), dtype="<i8")
    np.cumsum(lengths[:-1] * np.dtype(dtype).itemsize, out=pointers[1:])
    n = len(lengths)
    with open(path, "wb") as f:
        f.write(HEADER.pack(MEGATRON_MAGIC, MEGATRON_VERSION, dtype_code(dtype), n, n + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())
