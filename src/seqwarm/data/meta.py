"""A prepared folder's ``meta.json``: what it holds, its checks, and the fingerprint of its tokens.

``meta.json`` (format ``seqwarm-tokens``, version 2) records the tokenizer, ``vocab_size``, ``eod_id``,
the token ``dtype``, each split's documents and tokens, and every file's size and SHA-256; the token files
beside it are Megatron's ``MMIDIDX`` (:mod:`seqwarm.data.indexed`). Version 1 folders hold seqwarm's old
``SEQWIDX`` index: they are refused with the command that converts them (:mod:`seqwarm.data.legacy`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seqwarm.data.indexed import MAX_VOCAB, choose_dtype, dtype_name, sha256_file
from seqwarm.util.errors import UserError

META_FILE = "meta.json"
META_FORMAT = "seqwarm-tokens"
META_FORMAT_VERSION = 2
"""2: Megatron's MMIDIDX token files; 1: seqwarm's old SEQWIDX index (converted by ``prepare --convert``)."""
LEGACY_FORMAT_VERSION = 1
SPLITS = ("train", "val")


def convert_hint(folder: str | Path) -> str:
    return f"convert it in place (its documents are kept) with: seqwarm prepare --convert {folder}"


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


def read_meta(folder: str | Path, *, version: int = META_FORMAT_VERSION) -> dict[str, Any]:
    """The checked ``meta.json`` of a prepared folder of format ``version`` (this seqwarm's unless asked)."""
    path = Path(folder) / META_FILE
    meta = read_meta_file(folder)
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise UserError(f"{str(path)!r} is not a seqwarm prepared-data description")
    found = meta.get("format_version")
    if found != version:
        if found == LEGACY_FORMAT_VERSION:
            raise UserError(f"{str(folder)!r} holds seqwarm's old SEQWIDX token files; {convert_hint(folder)}")
        if version == LEGACY_FORMAT_VERSION and found == META_FORMAT_VERSION:
            raise UserError(f"{str(folder)!r} holds Megatron's MMIDIDX token files already; nothing to convert")
        raise UserError(
            f"{str(path)!r} has format version {found}; this seqwarm reads version {version}; re-run seqwarm prepare"
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
    legacy = meta.get("format_version") == LEGACY_FORMAT_VERSION
    top = 2**32 if legacy else MAX_VOCAB  # the old files held uint32 ids
    if not _count(vocab) or not vocab:
        problems.append(f"vocab_size {vocab!r} is not a positive integer")
    elif vocab > top:  # a model could not embed it either
        problems.append(f"vocab_size {vocab:,} is more than the {top:,} token ids a token file can hold")
    elif not legacy and meta.get("dtype") not in (None, dtype_name(choose_dtype(vocab))):
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


def data_fingerprint(meta: Mapping[str, Any]) -> str:
    """SHA-256 over the token files' checksums in ``meta["files"]`` (``*.bin`` / ``*.idx``): two prepared
    folders have the same fingerprint exactly when they hold the same tokens and documents. A folder
    converted from the old format keeps the fingerprint it had (``converted_from``): its documents are
    the same, so a run started on it still resumes."""
    converted = meta.get("converted_from")
    if isinstance(converted, Mapping) and isinstance(converted.get("fingerprint"), str):
        return converted["fingerprint"]
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


def check_size(path: Path, expected: int, source: str) -> None:
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
        check_size(path, int(info["bytes"]), META_FILE)
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
