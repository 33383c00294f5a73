"""Dataset Decomposition: documents cut into power-of-2 chunks, each chunk inside one document.

The variable-length mode (docs/VARIABLE.md; Pouransari et al., "Dataset Decomposition", NeurIPS 2024)
trains rows that each come from a single document, so no attention ever crosses a document boundary and
there is nothing to mask. :func:`decompose` works on any indexed token data: it takes the documents'
offsets into one token stream (``offsets[i]:offsets[i + 1]`` is document ``i``, as Megatron's index and
seqwarm's prepared folders hold them) and returns the chunks as ``(start, length)`` pairs into that same
stream; it never reads a token.

A document is cut by the binary decomposition of its length, largest chunk first: with ``min_length=32``,
``max_length=512`` and ``shift=0``, a 700-token document gives 512 + 128 + 32 and 28 tokens dropped
(700 = 512 + 128 + 32 + 16 + 8 + 4, and 16 + 8 + 4 < 32); a 1,500-token document gives 512, 512, 256,
128 and 64, and 28 dropped (1,500 = 2 x 512 + 476, 476 = 256 + 128 + 64 + 28). The remainder shorter
than ``min_length`` is **dropped and counted** (:attr:`Decomposition.dropped`, per document, and
:attr:`Decomposition.dropped_tokens`); a document
shorter than ``min_length`` (plus ``shift``) gives no chunk at all (:attr:`Decomposition.empty_documents`).

``shift`` is how many tokens a row holds beyond its length. With ``shift=1`` (the default, for a loop that
trains ``inputs = row[:-1]`` on ``targets = row[1:]``) a chunk of length ``L`` reads ``L + 1`` tokens and
the next chunk of the document starts on the last of them, so each of a document's ``n - 1`` next-token
predictions is trained at most once and the decomposition is that of ``n - 1``. With ``shift=0`` a chunk is
``L`` tokens (a model that shifts its labels inside the row) and the decomposition is that of ``n``.

Plain numpy, vectorised over documents: one pass per power of 2 between the two lengths.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from seqwarm.util.errors import UserError


def is_power_of_two(n: int) -> bool:
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 and (n & (n - 1)) == 0


@dataclass(frozen=True, eq=False)
class Decomposition:
    """The chunks of a corpus, grouped in buckets of one length each (shortest bucket first).

    Chunk ``i`` is ``tokens[starts[i] : starts[i] + lengths[i] + shift]`` of the token stream the offsets
    index, inside document ``documents[i]``. The chunks of bucket ``b`` are the indices
    ``bounds[b]:bounds[b + 1]`` (ordered by start), all of length ``bucket_lengths[b]``.
    """

    min_length: int
    max_length: int
    shift: int
    starts: np.ndarray = field(repr=False)
    """(chunks,) int64: where each chunk begins in the token stream."""
    lengths: np.ndarray = field(repr=False)
    """(chunks,) int64: each chunk's length L (the row reads L + shift tokens)."""
    documents: np.ndarray = field(repr=False)
    """(chunks,) int64: the document each chunk comes from."""
    dropped: np.ndarray = field(repr=False)
    """(documents,) int64: per document, the positions shorter than ``min_length`` left over (dropped)."""
    bucket_lengths: tuple[int, ...]
    """Every power of 2 from ``min_length`` to ``max_length``, ascending (a bucket may be empty)."""
    bounds: np.ndarray = field(repr=False)
    """(buckets + 1,) int64: bucket ``b``'s chunks are ``bounds[b]:bounds[b + 1]``."""

    @property
    def num_chunks(self) -> int:
        return int(self.starts.size)

    @property
    def num_documents(self) -> int:
        return int(self.dropped.size)

    @property
    def dropped_tokens(self) -> int:
        """Positions dropped in all: the remainders shorter than ``min_length``."""
        return int(self.dropped.sum())

    @property
    def empty_documents(self) -> int:
        """Documents that gave no chunk (shorter than ``min_length + shift`` tokens)."""
        return int(self.num_documents - np.unique(self.documents).size)

    def chunks_per_bucket(self) -> tuple[int, ...]:
        return tuple(int(n) for n in np.diff(self.bounds))

    def tokens_per_bucket(self) -> tuple[int, ...]:
        """The trained tokens (chunk lengths) each bucket holds."""
        return tuple(n * length for n, length in zip(self.chunks_per_bucket(), self.bucket_lengths))

    def rows(self, tokens: np.ndarray, indices) -> np.ndarray:
        """The chunks ``indices`` (all of one length L) read from ``tokens`` as a ``(len(indices), L + shift)``
        array; ``tokens`` is the stream the offsets index (a numpy array or memmap)."""
        idx = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[idx]
        if idx.size == 0 or (lengths != lengths[0]).any():
            raise ValueError("rows() takes one step's chunk indices: at least one, all of one length")
        width = int(lengths[0]) + self.shift
        return np.asarray(tokens)[self.starts[idx][:, None] + np.arange(width)]  # (rows, L + shift)

    def fingerprint(self) -> str:
        """A hash of the settings and every chunk: a resume on another corpus or cut is refused with it."""
        h = hashlib.sha256(f"{self.min_length},{self.max_length},{self.shift};".encode())
        for arr in (self.starts, self.lengths, self.dropped):
            h.update(np.ascontiguousarray(arr, dtype="<i8").tobytes())
        return h.hexdigest()[:16]


def decompose(offsets, min_length: int, max_length: int, *, shift: int = 1) -> Decomposition:
    """Cut every document into power-of-2 chunks between ``min_length`` and ``max_length`` (both powers
    of 2): as many ``max_length`` chunks as fit, then the binary decomposition of the rest, largest first;
    a remainder shorter than ``min_length`` is dropped and counted (see the module's docstring)."""
    if not (is_power_of_two(min_length) and is_power_of_two(max_length)) or min_length > max_length:
        raise UserError(
            f"variable lengths: min_length {min_length} and max_length {max_length} must be powers of 2 with "
            "min_length <= max_length (e.g. 64 and 1024)"
        )
    if shift not in (0, 1):
        raise UserError(f"variable lengths: shift must be 0 or 1, got {shift!r}")
    off = np.asarray(offsets)
    if off.ndim != 1 or off.size < 2 or not np.issubdtype(off.dtype, np.integer):
        raise UserError("variable lengths: offsets must be a 1-D integer array of document boundaries (n + 1)")
    off = off.astype(np.int64)
    sizes = np.diff(off)
    if off[0] < 0 or (sizes < 0).any():
        raise UserError("variable lengths: document offsets must start at 0 or more and never decrease")
    kmin, kmax = min_length.bit_length() - 1, max_length.bit_length() - 1
    positions = np.maximum(sizes - shift, 0)  # what a document can train: its next-token predictions
    full = positions >> kmax  # (docs,) max_length chunks per document
    rest = positions & (max_length - 1)
    starts, docs = [], []
    for k in range(kmin, kmax):  # ascending buckets; each bit of the rest is one chunk
        (d,) = np.nonzero((rest >> k) & 1)
        starts.append(off[d] + full[d] * max_length + ((rest[d] >> (k + 1)) << (k + 1)))
        docs.append(d)
    d = np.repeat(np.arange(sizes.size), full)  # the max_length chunks, in document order
    first = np.repeat(np.cumsum(full) - full, full)
    starts.append(off[d] + (np.arange(d.size) - first) * max_length)
    docs.append(d)
    counts = np.array([s.size for s in starts], dtype=np.int64)
    lengths = np.repeat(np.array([1 << k for k in range(kmin, kmax + 1)], dtype=np.int64), counts)
    return Decomposition(
        min_length=int(min_length),
        max_length=int(max_length),
        shift=int(shift),
        starts=np.concatenate(starts).astype(np.int64),
        lengths=lengths,
        documents=np.concatenate(docs).astype(np.int64),
        dropped=rest & (min_length - 1),
        bucket_lengths=tuple(1 << k for k in range(kmin, kmax + 1)),
        bounds=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
    )
