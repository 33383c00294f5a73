"""Indexed token files: ``SPLIT.bin`` (token ids) + ``SPLIT.idx`` (document offsets), and ``meta.json``.

``SPLIT.bin``: the token ids of all documents of the split, back to back (each document ends with EOD),
little-endian ``uint16`` when the vocabulary fits (``vocab_size <= 65536``), else ``uint32``. No header,
so it can be memory-mapped directly.

``SPLIT.idx`` (little-endian)::

    offset  size  field
    0       8     magic b"SEQWIDX\\0"
    8       4     format version (uint32) = 1
    12      4     token item size in bytes (uint32): 2 = uint16, 4 = uint32
    16      8     number of documents D (uint64)
    24      8     number of tokens N (uint64)
    32      8*(D+1) document offsets (int64), in tokens: offsets[0] = 0, offsets[D] = N;
                  document d is bin[offsets[d]:offsets[d+1]]

The writer streams: tokens and offsets go to disk as they come (the header is written last), so memory
does not grow with the corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from seqwarm.util.errors import UserError

IDX_MAGIC = b"SEQWIDX\x00"
IDX_VERSION = 1
IDX_HEADER = struct.Struct("<8sIIQQ")  # magic, version, itemsize, num_docs, num_tokens
META_FILE = "meta.json"
META_FORMAT = "seqwarm-tokens"
META_FORMAT_VERSION = 1
SPLITS = ("train", "val")
MAX_VOCAB = 2**32
"""The largest vocabulary a token file holds (``uint32`` ids)."""


def choose_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (``vocab_size <= 65536``), else ``uint32``."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def dtype_name(dtype: np.dtype) -> str:
    return {2: "uint16", 4: "uint32"}[np.dtype(dtype).itemsize]


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class IndexedWriter:
    """Append documents to ``PREFIX.bin`` / ``PREFIX.idx``; :meth:`close` writes the header.

    The SHA-256 of ``.bin`` is computed while writing, so the file is never read back.
    """

    def __init__(self, prefix: str | Path, dtype: np.dtype):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.bin_path = self.prefix.with_suffix(".bin")
        self.idx_path = self.prefix.with_suffix(".idx")
        self._bin: BinaryIO = open(self.bin_path, "wb")
        self._idx: BinaryIO = open(self.idx_path, "wb")
        self._idx.write(b"\0" * IDX_HEADER.size)  # placeholder, rewritten by close()
        self._idx.write(np.zeros(1, dtype="<i8").tobytes())  # offsets[0]
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
        data = np.ascontiguousarray(tokens, dtype=self.dtype).tobytes()
        self._bin.write(data)
        self._sha.update(data)
        offsets = self.num_tokens + np.cumsum(lengths)
        self._idx.write(offsets.astype("<i8").tobytes())
        self.num_docs += len(lengths)
        self.num_tokens += len(tokens)

    def close(self) -> dict[str, Any]:
        """Finish both files; return ``{"documents", "tokens", "files": {name: {bytes, sha256}}}``."""
        if not self.closed:
            self._bin.close()
            self._idx.seek(0)
            self._idx.write(
                IDX_HEADER.pack(IDX_MAGIC, IDX_VERSION, self.dtype.itemsize, self.num_docs, self.num_tokens)
            )
            self._idx.close()
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
        for f in (self._bin, self._idx):
            f.close()
        self.closed = True


class IndexedTokens:
    """A memory-mapped ``PREFIX.bin`` + ``PREFIX.idx`` pair: ``tokens`` (1-D) and ``offsets`` (D+1)."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.bin_path = self.prefix.with_suffix(".bin")
        self.idx_path = self.prefix.with_suffix(".idx")
        header = _read_header(self.idx_path)
        _, _, itemsize, self.num_docs, self.num_tokens = header
        self.dtype = np.dtype({2: "<u2", 4: "<u4"}[itemsize])
        expect_idx = IDX_HEADER.size + 8 * (self.num_docs + 1)
        _check_size(self.idx_path, expect_idx, "its header")
        _check_size(self.bin_path, self.num_tokens * itemsize, f"{self.idx_path.name}")
        self.offsets = np.memmap(
            self.idx_path, dtype="<i8", mode="r", offset=IDX_HEADER.size, shape=(self.num_docs + 1,)
        )
        if self.num_tokens:
            self.tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r", shape=(self.num_tokens,))
        else:  # numpy cannot map an empty file
            self.tokens = np.zeros(0, dtype=self.dtype)
        if self.offsets[0] != 0 or self.offsets[-1] != self.num_tokens:
            raise UserError(
                f"{self.idx_path}: document offsets do not match the token count; "
                "the file is corrupted, re-run seqwarm prepare"
            )
        self._identity = _identity(self.bin_path)

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

    def __len__(self) -> int:
        return self.num_docs

    def document(self, i: int) -> np.ndarray:
        """Tokens of document ``i`` (a view into the memmap; its last token is EOD)."""
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])]


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _read_header(path: Path) -> tuple:
    try:
        with open(path, "rb") as f:
            raw = f.read(IDX_HEADER.size)
    except FileNotFoundError:
        raise UserError(f"{str(path)!r} is missing; re-run seqwarm prepare") from None
    except OSError as err:
        raise UserError(f"cannot read {str(path)!r}: {err.strerror or err}") from None
    if len(raw) < IDX_HEADER.size:
        raise UserError(
            f"{str(path)!r} is truncated ({len(raw)} bytes, shorter than its header); re-run seqwarm prepare"
        )
    header = IDX_HEADER.unpack(raw)
    if header[0] != IDX_MAGIC:
        raise UserError(f"{str(path)!r} is not a seqwarm index file (bad magic bytes)")
    if header[1] != IDX_VERSION:
        raise UserError(
            f"{str(path)!r} has index format version {header[1]}; this seqwarm reads "
            f"version {IDX_VERSION}; re-run seqwarm prepare"
        )
    if header[2] not in (2, 4):
        raise UserError(f"{str(path)!r}: unsupported token size {header[2]} bytes")
    return header


def _check_size(path: Path, expected: int, source: str) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UserError(f"{str(path)!r} is missing; re-run seqwarm prepare") from None
    if size != expected:
        what = "truncated" if size < expected else "longer than expected"
        raise UserError(
            f"{str(path)!r} is {what}: {size} bytes, but {source} says {expected}; "
            "the file is damaged or was changed, re-run seqwarm prepare"
        )


# --------------------------------------------------------------------------------------------------
# meta.json


def _prepare_hint(folder: Path) -> str:
    """How to make a prepared folder where ``folder`` is not one: from its own text when it holds some."""
    if any(p.suffix.lower() in (".txt", ".jsonl", ".parquet") for p in folder.iterdir() if p.is_file()):
        prepared = folder.with_name(folder.name + "-prepared")
        return (
            f"it holds text: tokenize it with: seqwarm prepare --input {folder} --out {prepared}, "
            f"then train with --data {prepared}"
        )
    return f"make one from your text with: seqwarm prepare --input TEXT --out {folder} (TEXT: .txt/.jsonl files)"


def read_meta_file(folder: str | Path) -> Any:
    """The parsed ``meta.json`` of a prepared folder, unchecked (UserError when it is missing or unreadable)."""
    folder = Path(folder)
    path = folder / META_FILE
    if not folder.is_dir():
        raise UserError(
            f"{str(folder)!r} is not a prepared data folder (it does not exist); make one from your text "
            f"with: seqwarm prepare --input TEXT --out {folder} (TEXT: .txt/.jsonl/.parquet files or folders)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{str(folder)!r} is not a prepared data folder (no {META_FILE}); {_prepare_hint(folder)}"
        ) from None
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {str(path)!r}: {err}") from None


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The checked ``meta.json`` of a prepared folder (its format and version are this seqwarm's)."""
    path = Path(folder) / META_FILE
    meta = read_meta_file(folder)
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise UserError(f"{str(path)!r} is not a seqwarm prepared-data description")
    if meta.get("format_version") != META_FORMAT_VERSION:
        raise UserError(
            f"{str(path)!r} has format version {meta.get('format_version')}; this seqwarm "
            f"reads version {META_FORMAT_VERSION}; re-run seqwarm prepare"
        )
    problems = _meta_problems(meta)
    if problems:
        raise UserError(f"{str(path)!r} is damaged or was edited: {'; '.join(problems)}; re-run seqwarm prepare")
    return meta


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _meta_problems(meta: Mapping[str, Any]) -> list[str]:
    """What a reader of the folder needs from meta.json and does not find there."""
    problems = []
    vocab, eod = meta.get("vocab_size"), meta.get("eod_id")
    if not _count(vocab) or not vocab:
        problems.append(f"vocab_size {vocab!r} is not a positive integer")
    elif vocab > MAX_VOCAB:  # token files hold uint32 ids at most; a model could not embed it either
        problems.append(f"vocab_size {vocab:,} is more than the {MAX_VOCAB:,} token ids a token file can hold")
    elif meta.get("dtype") not in (None, dtype_name(choose_dtype(vocab))):
        problems.append(
            f"dtype {meta.get('dtype')!r} is not the {dtype_name(choose_dtype(vocab))} that prepare writes "
            f"for vocab_size {vocab:,}"
        )
    if not _count(eod) or (_count(vocab) and eod >= vocab):
        problems.append(f"eod_id {eod!r} is not a token id below vocab_size")
    splits = meta.get("splits")
    for name in SPLITS:
        split = splits.get(name) if isinstance(splits, Mapping) else None
        if not isinstance(split, Mapping) or not all(_count(split.get(k)) for k in ("tokens", "documents")):
            problems.append(f"splits.{name} lacks whole-number tokens and documents")
        elif split["documents"] > split["tokens"]:  # every document holds at least its EOD
            problems.append(f"splits.{name} has more documents ({split['documents']:,}) than tokens")
    files = meta.get("files")
    if isinstance(files, Mapping):
        for name, info in files.items():
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                problems.append(f"file name {name!r} leaves the data folder (only plain names are allowed)")
            elif (
                not isinstance(info, Mapping)
                or not _count(info.get("bytes"))
                or not isinstance(info.get("sha256"), str)
            ):
                problems.append(f"files.{name} lacks its bytes and sha256")
    return problems


def check_token_ids(split: IndexedTokens, vocab_size: int, chunk: int = 1 << 24) -> None:
    """UserError when a token id in ``split`` is not below ``vocab_size`` (the model's embedding would
    fail on it mid-run); reads the split once per process, in chunks."""
    st = split.bin_path.stat() if split.num_tokens else None
    key = (str(split.bin_path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, vocab_size) if st else None
    if key is None or key in _IDS_OK:
        return
    for start in range(0, split.num_tokens, chunk):
        top = int(split.tokens[start : start + chunk].max())
        if top >= vocab_size:
            raise UserError(
                f"{split.bin_path} holds token id {top}, but meta.json says the vocabulary has "
                f"{vocab_size} tokens: the files do not belong together; re-run seqwarm prepare"
            )
    _IDS_OK.add(key)


_IDS_OK: set[tuple] = set()
"""Splits whose ids were checked in this process (keyed like ``_VERIFIED``)."""


def data_fingerprint(meta: Mapping[str, Any]) -> str:
    """SHA-256 over the token files' checksums in ``meta["files"]`` (``*.bin`` / ``*.idx``): two prepared
    folders have the same fingerprint exactly when they hold the same tokens and documents."""
    files = meta.get("files") or {}
    if not files and meta.get("format") == "megatron":
        # Megatron files read in place carry no checksums (and may be terabytes): fingerprint what
        # describes them instead — each source's path, weight, dtype and documents, the split, the counts
        keys = ("sources", "split", "splits", "vocab_size", "eod_id")
        return hashlib.sha256(json.dumps({k: meta.get(k) for k in keys}, sort_keys=True).encode()).hexdigest()
    lines = [f"{name}:{info['sha256']}\n" for name, info in sorted(files.items()) if name.endswith((".bin", ".idx"))]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


# In-process cache of verified checksums, keyed by file identity, so that opening the same folder
# several times (train and val datasets, every test) hashes each file once.
_VERIFIED: dict[tuple, str] = {}


def verify_files(folder: str | Path, meta: Mapping[str, Any], *, checksums: bool = True) -> None:
    """Check every file listed in ``meta["files"]``: it exists, has its size, and (optionally) its SHA-256."""
    folder = Path(folder)
    files = meta.get("files")
    if not isinstance(files, Mapping) or not files:
        raise UserError(f"{folder / META_FILE}: no file list; re-run seqwarm prepare")
    for name, info in files.items():
        path = folder / name
        if not path.is_file():  # a device or a folder under a listed name: never read it
            raise UserError(
                f"{str(path)!r} (listed in {META_FILE}) is missing or not a regular file; re-run seqwarm prepare"
            )
        _check_size(path, int(info["bytes"]), META_FILE)
        if not checksums:
            continue
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        digest = _VERIFIED.get(key) or sha256_file(path)
        if digest != info["sha256"]:
            raise UserError(
                f"{str(path)!r} does not match its checksum in {META_FILE} (sha256 "
                f"{digest[:12]}... vs {str(info['sha256'])[:12]}...): the file is corrupted "
                "or was changed; re-run seqwarm prepare"
            )
        _VERIFIED[key] = digest
