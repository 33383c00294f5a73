"""Pass 3 of ``seqwarm prepare``: tokenizing a stream of documents into ``train``/``val`` ``.bin``/``.idx``.

Given a ready tokenizer, the documents and the held-out mask chosen by :mod:`seqwarm.data.prepare`,
:func:`tokenize_and_write` groups the documents into chunks of about ``chunk_bytes`` of text, tokenizes
them in-process or in ``spawn`` worker processes (ordered, at most ``2 * workers`` chunks in flight, so
memory stays flat) and appends each document's tokens (ending with EOD) to the ``train`` or ``val``
:class:`~seqwarm.data.indexed.IndexedWriter`. It writes token files only; choosing the split, the
tokenizer, ``meta.json`` and the output folder are :mod:`seqwarm.data.prepare`'s.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.data.corpus import Document
from seqwarm.data.indexed import IndexedWriter
from seqwarm.data.tokenizer import Tokenizer, tokenizer_from_payload
from seqwarm.util.errors import UserError

# --------------------------------------------------------------------------------------------------
# Worker side (module level, so that "spawn" workers can import it)

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(payload: tuple) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer_from_payload(payload)


def encode_documents(tok: Tokenizer, texts: Sequence[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize texts as documents (each ends with EOD): concatenated tokens and per-document lengths."""
    arrays = [tok.encode_array(t, dtype) for t in texts]
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)
    return tokens, lengths


def _encode_chunk(texts: list[str], dtype_str: str) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_TOKENIZER is not None, "worker not initialised"
    return encode_documents(_WORKER_TOKENIZER, texts, np.dtype(dtype_str))


# --------------------------------------------------------------------------------------------------
# Main side


def _chunks(docs: Iterator[Document], chunk_bytes: int) -> Iterator[tuple[list[str], int, int]]:
    """Group documents into ``(texts, index of the first, UTF-8 bytes)`` of about ``chunk_bytes``."""
    texts: list[str] = []
    first, size, index = 0, 0, 0
    for _, text in docs:
        texts.append(text)
        size += len(text.encode("utf-8"))
        index += 1
        if size >= chunk_bytes:
            yield texts, first, size
            texts, first, size = [], index, 0
    if texts:
        yield texts, first, size


def tokenize_and_write(
    folder: Path,
    tok: Tokenizer,
    dtype: np.dtype,
    docs: Iterator[Document],
    val_mask: np.ndarray,
    n_workers: int,
    chunk_bytes: int,
    total_bytes: int,
    progress: bool,
) -> dict[str, dict[str, Any]]:
    """Write ``folder/train`` and ``folder/val`` (``.bin``/``.idx``); document ``i`` goes to ``val`` when
    ``val_mask[i]``. Returns each split's documents, tokens, file names and ``files`` (sizes, hashes)."""
    from tqdm.auto import tqdm

    writers = {"train": IndexedWriter(folder / "train", dtype), "val": IndexedWriter(folder / "val", dtype)}
    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        desc=f"tokenizing ({tok.name})",
        file=sys.stderr,
        disable=None if progress else True,
        dynamic_ncols=True,
    )

    def consume(first: int, size: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if first + len(lengths) > len(val_mask):
            raise UserError(
                "the inputs changed while they were being prepared (more documents than "
                "counted); run seqwarm prepare again"
            )
        is_val = val_mask[first : first + len(lengths)]
        if not is_val.any():
            writers["train"].add_documents(tokens, lengths)
        elif is_val.all():
            writers["val"].add_documents(tokens, lengths)
        else:
            token_is_val = np.repeat(is_val, lengths)
            writers["train"].add_documents(tokens[~token_is_val], lengths[~is_val])
            writers["val"].add_documents(tokens[token_is_val], lengths[is_val])
        bar.update(size)

    try:
        chunks = _chunks(docs, chunk_bytes)
        if n_workers == 1:
            for texts, first, size in chunks:
                consume(first, size, *encode_documents(tok, texts, dtype))
        else:
            _run_pool(tok, dtype, chunks, n_workers, consume)
        results = {name: w.close() for name, w in writers.items()}
        if sum(r["documents"] for r in results.values()) != len(val_mask):
            raise UserError(
                "the inputs changed while they were being prepared (fewer documents than "
                "counted); run seqwarm prepare again"
            )
    finally:
        bar.close()
        for w in writers.values():
            if not w.closed:
                w.abort()
    return {
        name: {
            "documents": r["documents"],
            "tokens": r["tokens"],
            "bin": f"{name}.bin",
            "idx": f"{name}.idx",
            "files": r["files"],
        }
        for name, r in results.items()
    }


def _run_pool(
    tok: Tokenizer,
    dtype: np.dtype,
    chunks: Iterator[tuple[list[str], int, int]],
    n_workers: int,
    consume: Callable[..., None],
) -> None:
    """Ordered, bounded fan-out: at most ``2 * n_workers`` chunks are queued, so memory stays flat.

    "spawn" workers: a fork after ``tokenizers`` has started its thread pool (BPE training) is unsafe.
    """
    ctx = mp.get_context("spawn")
    with ctx.Pool(n_workers, initializer=_init_worker, initargs=(tok.worker_payload(),)) as pool:
        pending: deque = deque()
        for texts, first, size in chunks:
            pending.append((first, size, pool.apply_async(_encode_chunk, (texts, dtype.str))))
            if len(pending) >= 2 * n_workers:
                first0, size0, res = pending.popleft()
                consume(first0, size0, *res.get())
        while pending:
            first0, size0, res = pending.popleft()
            consume(first0, size0, *res.get())
