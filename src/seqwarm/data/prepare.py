"""Corpus -> tokenizer -> ``train/val .bin/.idx`` + ``meta.json`` (what ``seqwarm prepare`` runs).

Three streaming passes over the documents, none holding the corpus or its tokens in memory:

1. count: read and validate every input (bad files fail here, before any work), count documents
   and UTF-8 bytes, then pick the validation documents (whole documents, from the seed);
2. ``bpe:N`` only: train the tokenizer on the training documents;
3. tokenize chunks of documents in worker processes (at most ``2 * workers`` chunks in flight), append
   each document's tokens (ending with EOD) to ``train`` or ``val`` (:mod:`seqwarm.data.encode`).

This module checks the options, runs the passes, writes ``meta.json`` and swaps the result in: everything
is written into a hidden sibling folder that replaces ``out`` only once complete, while this process holds
the output folder's lock; an ``out`` that is a symbolic link has its target replaced
(:mod:`seqwarm.data.outdir`: the lock, the checks of the folder and its name, the swap).
It also keeps the embedded corpus prepared once in a cache folder (:func:`embedded_data_dir`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.config.defaults import DEFAULT_TOKENIZER
from seqwarm.data import corpus
from seqwarm.data.encode import tokenize_and_write
from seqwarm.data.indexed import choose_dtype, dtype_name, sha256_file
from seqwarm.data.meta import META_FILE, META_FORMAT, META_FORMAT_VERSION
from seqwarm.data.outdir import (
    cache_dir,
    check_inputs_outside,
    check_name_length,
    check_out,
    clear_leftovers,
    name_too_long,
    out_lock,
    replace_dir,
    resolve_out,
    writable_cache_dir,
)
from seqwarm.data.tokenizer import build_tokenizer, parse_tokenizer_name
from seqwarm.util.atomic import WriteError, write_json
from seqwarm.util.errors import UserError
from seqwarm.util.units import counted
from seqwarm.util.version import __version__

logger = logging.getLogger(__name__)

DEFAULT_VAL_FRACTION = 0.05
DEFAULT_SEED = 1234
DEFAULT_CHUNK_BYTES = 1 << 20  # text per worker task: big enough to amortise IPC, small enough to balance


def embedded_data_dir(tokenizer: str = DEFAULT_TOKENIZER) -> Path:
    """The embedded corpus prepared with ``tokenizer``: prepared into :func:`cache_dir` on first use, then reused.

    The folder name carries the tokenizer and the seqwarm version, so an upgrade prepares afresh. A cached
    folder is reused only if its ``meta.json`` records the same corpus parts and package versions as are
    installed now (:func:`seqwarm.data.corpus.corpus_identity`); otherwise it is prepared again, so a
    cache made from part of the corpus is never taken for the whole. A cache folder that cannot be
    written (a read-only home) is still read when it holds the prepared corpus; else the corpus is
    prepared in a folder of this user's under the system's temporary folder, said once
    (:func:`writable_cache_dir`).
    """
    name = f"embedded-{tokenizer.replace(':', '')}-v{__version__}"
    configured = cache_dir() / name
    if _cached_identity(configured) == corpus.corpus_identity():
        # Prepared data is swapped in whole, so a meta.json means a complete folder: no lock needed,
        # and a read-only cache (a container image's) is used as it is.
        return configured
    folder = writable_cache_dir() / name
    with out_lock(folder, wait=True):  # a second process waits for the first one's cache, then reuses it
        return _embedded_locked(folder, tokenizer)


def _cached_meta(folder: Path) -> dict[str, Any]:
    """A prepared folder's ``meta.json``, unchecked (empty when missing or unreadable)."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _cached_identity(folder: Path) -> Any:
    """The corpus parts a prepared folder's ``meta.json`` records (None when it has none, is unreadable,
    or holds another format version: such a cache is prepared again)."""
    meta = _cached_meta(folder)
    packages = (meta.get("corpus") or {}).get("packages") if isinstance(meta.get("corpus"), dict) else None
    return packages if meta.get("format_version") == META_FORMAT_VERSION else None


def _embedded_locked(folder: Path, tokenizer: str) -> Path:
    meta = _cached_meta(folder)
    if meta and meta.get("format_version") not in (None, META_FORMAT_VERSION):
        logger.warning("the cached embedded corpus in %s is in an older token-file format; preparing it again", folder)
    elif (folder / META_FILE).exists():
        held = _cached_identity(folder)
        if held == corpus.corpus_identity():
            return folder
        logger.warning(
            "the cached embedded corpus in %s was made from %s, not from the installed %s; preparing it again",
            folder,
            _describe_identity(held),
            _describe_identity(corpus.corpus_identity()),
        )
    else:
        logger.info("preparing the embedded public-domain corpus with %s into %s (once)", tokenizer, folder)
    prepare_dataset(folder, None, tokenizer=tokenizer, force=True)
    return folder


def _describe_identity(identity: Any) -> str:
    if not isinstance(identity, list):
        return "unrecorded parts"
    return (
        ", ".join(
            f"{p.get('key')} ({p.get('distribution')} {p.get('version')})" for p in identity if isinstance(p, dict)
        )
        or "nothing"
    )


def default_workers() -> int:
    """CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class PrepareResult:
    """What :func:`prepare_dataset` did: the folder, its ``meta.json`` and timings."""

    out: Path
    meta: dict[str, Any]
    input_bytes: int
    tokenize_seconds: float  # the tokenize-and-write pass
    tokenizer_seconds: float  # training the BPE (0 for gpt2/byte)
    total_seconds: float
    workers: int

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.meta["splits"].values())

    @property
    def mb_per_second(self) -> float:
        return self.input_bytes / 1e6 / max(self.tokenize_seconds, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.tokenize_seconds, 1e-9)

    def summary(self) -> str:
        m = self.meta
        tr, va = m["splits"]["train"], m["splits"]["val"]
        lines = [
            f"wrote {self.out}: tokenizer {m['tokenizer']['name']} (vocab {m['vocab_size']}, "
            f"EOD {m['eod_id']}, {m['dtype']})",
            f"  train: {counted(tr['documents'], 'document')}, {counted(tr['tokens'], 'token')}",
            f"  val:   {counted(va['documents'], 'document')}, {counted(va['tokens'], 'token')}",
            f"  tokenized {self.input_bytes / 1e6:.1f} MB in {self.tokenize_seconds:.1f} s with "
            f"{counted(self.workers, 'worker')}: {self.mb_per_second:.2f} MB/s, {self.tokens_per_second:,.0f} tokens/s"
            + (f"; tokenizer training {self.tokenizer_seconds:.1f} s" if self.tokenizer_seconds else "")
            + f"; total {self.total_seconds:.1f} s",
        ]
        return "\n".join(lines)


def _non_empty(docs: Iterator[corpus.Document]) -> Iterator[corpus.Document]:
    for name, text in docs:
        if text.strip():
            yield name, text
        else:
            logger.debug("skipping empty document %s", name)


def choose_val_documents(num_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the held-out documents: ``round(fraction * n)`` of them, at least 1 and at most
    ``n - 1``, chosen by a seeded permutation (so the same seed and corpus give the same split)."""
    if num_docs < 2:
        raise UserError(
            f"the corpus has {num_docs} non-empty document(s); at least 2 are needed to hold "
            "out a validation split by whole documents (split the text into several .txt "
            "files or .jsonl lines, or at a separator of yours: --split-on TEXT)"
        )
    k = min(max(1, round(val_fraction * num_docs)), num_docs - 1)
    mask = np.zeros(num_docs, dtype=bool)
    mask[np.random.default_rng(seed).permutation(num_docs)[:k]] = True
    return mask


def prepare_dataset(
    out: str | Path,
    inputs: Sequence[str | Path] | None = None,
    *,
    tokenizer: str = DEFAULT_TOKENIZER,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    json_key: str = "text",
    text_field: str | None = None,
    eod_token: str | None = None,
    vocab_file: str | Path | None = None,
    merges_file: str | Path | None = None,
    workers: int | None = None,
    seed: int = DEFAULT_SEED,
    force: bool = False,
    progress: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    split_on: str | None = None,
) -> PrepareResult:
    """Tokenize ``inputs`` (files/folders of .txt/.jsonl/.parquet, ``datasets`` folders; ``None`` = the
    embedded corpus) into ``out``. ``text_field`` is the text column of tables (default: ``json_key``);
    ``eod_token`` names the EOD of an ``hf:`` tokenizer that declares no eos token. ``.txt`` files are one
    document each, but a single one given alone is split at blank lines, and ``split_on`` splits every one
    at that separator (:func:`seqwarm.data.corpus.iter_input_documents`).

    Raises :class:`UserError` for every mistake the user can fix, before anything is written where
    possible; on any failure ``out`` is left as it was.
    """
    t_start = time.perf_counter()
    out = Path(out).expanduser()
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if not json_key:
        raise UserError("--json-key must not be empty")
    text_field = json_key if text_field is None else text_field
    if not text_field:
        raise UserError("--text-field must not be empty")
    kind, _ = parse_tokenizer_name(tokenizer)
    if kind != "gpt2" and (vocab_file or merges_file):
        raise UserError(f"--vocab-file/--merges-file only apply to --tokenizer gpt2, not {tokenizer!r}")
    if kind != "hf" and eod_token is not None:
        raise UserError(f"--eod-token only applies to --tokenizer hf:PATH, not {tokenizer!r}")
    real = resolve_out(out)  # a link: its target is replaced, the link kept
    check_name_length(out, real)
    try:  # an OSError here comes from taking the lock: a read-only parent, a name too long in the path
        with out_lock(out, real):  # one prepare per output folder
            return _prepare_locked(
                out,
                real,
                inputs,
                tokenizer=tokenizer,
                kind=kind,
                val_fraction=val_fraction,
                json_key=json_key,
                text_field=text_field,
                eod_token=eod_token,
                vocab_file=vocab_file,
                merges_file=merges_file,
                workers=workers,
                seed=seed,
                force=force,
                progress=progress,
                chunk_bytes=chunk_bytes,
                t_start=t_start,
                split_on=split_on,
            )
    except OSError as err:
        raise _write_error(err, real, out) from None


def _write_error(err: OSError, where: Path, out: Path) -> WriteError:
    kept = "is untouched" if out.exists() else "was not written"
    if name_too_long(err):
        return WriteError(
            f"cannot write the prepared data ({err.filename or where}: name too long); {str(out)!r} {kept}. "
            "Choose a shorter --out (each name at most 255 bytes on most file systems)"
        )
    return WriteError(
        f"cannot write the prepared data ({err.filename or where}: {err.strerror or err}); {str(out)!r} {kept}. "
        "Free some space or choose a writable --out"
    )


def _prepare_locked(
    shown: Path,
    out: Path,
    inputs: Sequence[str | Path] | None,
    *,
    tokenizer: str,
    kind: str,
    val_fraction: float,
    json_key: str,
    text_field: str,
    eod_token: str | None,
    vocab_file: str | Path | None,
    merges_file: str | Path | None,
    workers: int,
    seed: int,
    force: bool,
    progress: bool,
    chunk_bytes: int,
    t_start: float,
    split_on: str | None = None,
) -> PrepareResult:
    """The body of :func:`prepare_dataset`, holding the output folder's lock; ``out`` is the folder
    written (the target when ``shown``, the user's ``--out``, is a link)."""
    clear_leftovers(out)
    check_out(out, force, shown)
    # A fixed tokenizer is loaded before the corpus is read, so a bad one fails in seconds.
    fixed = (
        None
        if kind == "bpe"
        else build_tokenizer(tokenizer, vocab_file=vocab_file, merges_file=merges_file, eod_token=eod_token)
    )

    if inputs:
        files = corpus.resolve_inputs(inputs)
        check_inputs_outside(out, inputs)

        def documents() -> Iterator[corpus.Document]:
            return _non_empty(corpus.iter_input_documents(files, json_key, text_field, split_on))

        source_desc: dict[str, Any] = {"inputs": [str(p) for p in inputs], "json_key": json_key, "files": len(files)}
        if corpus.splits_text(files, split_on):  # .txt files split into documents
            source_desc["split_on"] = "blank lines" if split_on is None else split_on
        if any(f.kind in corpus.TABLE_KINDS for f in files):
            source_desc["text_field"] = text_field
    else:
        sources = corpus.default_corpus_sources()

        def documents() -> Iterator[corpus.Document]:
            return _non_empty(corpus.iter_default_documents())

        source_desc = {"embedded": [s.key for s in sources], "packages": corpus.corpus_identity(sources)}

    # Pass 1: validate and count.
    logger.info("reading the corpus ...")
    num_docs, total_bytes = 0, 0
    for _, text in documents():
        num_docs += 1
        total_bytes += len(text.encode("utf-8"))
    if num_docs == 0:
        raise UserError(
            "the corpus is empty: no document has any text"
            + (f" (inputs: {', '.join(map(str, inputs))})" if inputs else "")
        )
    val_mask = choose_val_documents(num_docs, val_fraction, seed)
    logger.info(
        "%s, %.1f MB; %d held out for validation", counted(num_docs, "document"), total_bytes / 1e6, int(val_mask.sum())
    )

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        # Pass 2: the tokenizer (bpe:N learns from the training documents only).
        t0 = time.perf_counter()
        if kind == "bpe":
            logger.info("training the %s tokenizer on %s ...", tokenizer, counted(int((~val_mask).sum()), "document"))
            train_texts = (t for i, (_, t) in enumerate(documents()) if not val_mask[i])
            tok = build_tokenizer(
                tokenizer,
                train_texts,
                num_documents=int((~val_mask).sum()),
                show_progress=progress and sys.stderr.isatty(),
            )
        else:
            assert fixed is not None
            tok = fixed
        tokenizer_seconds = time.perf_counter() - t0 if kind == "bpe" else 0.0
        dtype = choose_dtype(tok.vocab_size)

        # Pass 3: tokenize and write.
        # Worker processes only pay off when tokenizing costs more than shipping the text to them:
        # not for `byte` (tens of MB/s in-process), nor for a corpus of a single chunk.
        n_workers = 1 if kind == "byte" else max(1, min(workers, math.ceil(total_bytes / chunk_bytes)))
        t0 = time.perf_counter()
        splits = tokenize_and_write(
            tmp, tok, dtype, documents(), val_mask, n_workers, chunk_bytes, total_bytes, progress
        )
        tokenize_seconds = time.perf_counter() - t0

        tok_files = tok.save(tmp)
        files: dict[str, Any] = {}
        for info in splits.values():
            files.update(info.pop("files"))
        for name in tok_files:
            files[name] = {"bytes": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
        meta = {
            "format": META_FORMAT,
            "format_version": META_FORMAT_VERSION,
            "seqwarm_version": __version__,
            "tokenizer": {**tok.describe(), "files": tok_files},
            "vocab_size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "dtype": dtype_name(dtype),
            "corpus": {**source_desc, "documents": num_docs, "bytes": total_bytes},
            "split": {"by": "document", "val_fraction": val_fraction, "seed": seed},
            "splits": splits,
            "files": files,
        }
        write_json(tmp / META_FILE, meta)
        replace_dir(tmp, out)
    except OSError as err:  # disk full, read-only, permissions: the previous data stays as it was
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(err, tmp, shown) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PrepareResult(
        out=shown,
        meta=meta,
        input_bytes=total_bytes,
        tokenize_seconds=tokenize_seconds,
        tokenizer_seconds=tokenizer_seconds,
        total_seconds=time.perf_counter() - t_start,
        workers=n_workers,
    )
