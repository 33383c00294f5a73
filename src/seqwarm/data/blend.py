"""Blends of ``--data-path`` sources: the argument's weights and prefixes, Megatron's ``--split``, batches.

``--data-path PREFIX``, a blend ``W1 P1 W2 P2 ...`` (``--data-path 0.3 A 0.7 B``) or a list of prefixes
without weights (``--data-path A B``, as megatron-core accepts it) is parsed by :func:`parse_data_path`
(weights normalised to sum 1; ``None`` for a list: the sources weigh what they hold);
:func:`split_documents` cuts a source's documents in file order into train / valid / test parts in
proportion to Megatron's ``--split 969,30,1`` weights, rounded as Megatron-DeepSpeed or megatron-core does
(both live in :mod:`seqwarm.data.data_path`, which imports no torch, and are re-exported here).

:class:`BlendedBatches` draws each training sample from source ``k`` so that after ``n`` samples source
``k`` has served ``round(w_k * n)`` of them give or take one (the source whose share lags its weight the
most goes next, as in Megatron's blended dataset, see :func:`blend_choices`, which the variable mode's
steps share: :mod:`seqwarm.curriculum.variable_blend`); validation reads every
source's val split (one :class:`ConcatWindows`) in the same proportions (:func:`blend_eval_indices`).
Nothing here reads files: the sources are :class:`~seqwarm.data.dataset.TokenWindows`, whichever format
they come from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from seqwarm.curriculum.variable_blend import blend_choices
from seqwarm.data.data_path import SPLIT_ROUNDINGS, parse_data_path, split_documents
from seqwarm.data.dataset import Batch, TokenWindows, TrainBatches, build_batch, eval_window_indices
from seqwarm.util.errors import UserError

__all__ = [
    "SPLIT_ROUNDINGS",
    "parse_data_path",
    "split_documents",
    "ConcatWindows",
    "blend_choices",
    "blend_eval_indices",
    "BlendedBatches",
]


# --------------------------------------------------------------------------------------------------
# batches of several sources


class ConcatWindows:
    """Several :class:`TokenWindows` of one sequence length as one indexable set (the blend's val split)."""

    def __init__(self, parts: Sequence[TokenWindows], name: str):
        self.parts, self.name = list(parts), name
        self.seq_length = self.parts[0].seq_length
        self._starts = np.cumsum([0] + [len(p) for p in self.parts])
        first = self.parts[0]
        self._opts = {
            "eod_id": first.eod_id,
            "eod_mask_loss": first.eod_mask_loss,
            "reset_position_ids": first.reset_position_ids,
            "label_style": first.label_style,
            "document_masking": first.document_masking,
        }

    def __len__(self) -> int:
        return int(self._starts[-1])

    def batch(self, indices) -> Batch:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        part = np.searchsorted(self._starts, idx, side="right") - 1
        rows = [self.parts[p].window_array([i - self._starts[p]])[0] for p, i in zip(part, idx)]
        return build_batch(np.stack(rows), **self._opts)


def blend_eval_indices(lengths: Sequence[int], weights: Sequence[float], num_windows: int | None) -> np.ndarray:
    """Which windows of a blend's val split (the sources' windows one after the other, ``lengths`` each)
    an evaluation of ``num_windows`` reads: source ``k`` gives ``weights[k]`` of them (largest remainders
    round), spread evenly over its own split, the sources interleaved. ``None``, or more than the
    sources hold at these weights: as many as they hold, i.e. every window of the source that runs out first."""
    n_len = np.asarray(lengths, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    fits = min(int(n_len[k] / w[k] + 1e-9) for k in range(len(w)) if w[k] > 0)
    n = fits if num_windows is None else min(int(num_windows), fits)
    exact = w * n
    counts = np.floor(exact).astype(np.int64)
    extra = n - int(counts.sum())
    if extra > 0:  # the largest remainders get one more (ties: the lower index)
        order = np.lexsort((np.arange(len(w)), -(exact - counts)))
        counts[order[:extra]] += 1
    counts = np.minimum(counts, n_len)
    starts = np.concatenate([[0], np.cumsum(n_len)[:-1]])
    picks, places = [], []
    for k, c in enumerate(counts):
        if c:
            picks.append(eval_window_indices(int(n_len[k]), int(c)) + starts[k])
            places.append((np.arange(c) + 0.5) / c)  # each source's windows evenly over the evaluation
    if not picks:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(np.concatenate(places), kind="stable")
    return np.concatenate(picks)[order]


class BlendedBatches:
    """Training micro-batches from several sources in proportion to their weights (deterministic).

    Every global micro-batch of ``micro_batch_size * world_size`` samples is assigned to sources by
    :func:`blend_choices`; source ``k`` serves its samples in the order of its own :class:`TrainBatches`
    (seeded shuffle per epoch, seed + k). Rank ``r`` takes the ``r``-th block of the global micro-batch.
    The position is the global sample count plus each source's (epoch, index).
    """

    def __init__(
        self,
        sources: Sequence[TokenWindows],
        weights: Sequence[float],
        micro_batch_size: int,
        *,
        seed: int = 1234,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ):
        self.weights = [float(w) for w in weights]
        self.micro_batch_size, self.rank, self.world_size = int(micro_batch_size), int(rank), int(world_size)
        self.global_micro_batch = self.micro_batch_size * self.world_size
        # each source serves single windows: a one-sample "micro-batch" on a single rank
        self.sources = [TrainBatches(s, 1, seed=seed + k, shuffle=shuffle) for k, s in enumerate(sources)]
        self.windows = ConcatWindows(sources, "train")
        self.samples = 0
        self.served = [0] * len(self.sources)

    def next_indices(self) -> list[tuple[int, int]]:
        """(source, window) of every sample of the next global micro-batch; advances the position."""
        picks = blend_choices(self.weights, self.samples, self.global_micro_batch, self.served)
        self.samples += self.global_micro_batch
        return [(int(k), int(self.sources[k].next_indices()[0])) for k in picks]

    def next_batch(self) -> Batch:
        mine = self.next_indices()[self.rank * self.micro_batch_size : (self.rank + 1) * self.micro_batch_size]
        rows = [self.sources[k].windows.window_array([i])[0] for k, i in mine]
        return build_batch(np.stack(rows), **self.windows._opts)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "served": list(self.served),
            "weights": self.weights,
            "sources": [s.state_dict() for s in self.sources],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (
            "sources" not in state
            or len(state["sources"]) != len(self.sources)
            or not np.allclose(state.get("weights", []), self.weights)
        ):
            raise UserError(
                "cannot resume the data position: the checkpoint was written with another "
                "--data-path blend (sources or weights differ)"
            )
        for source, saved in zip(self.sources, state["sources"]):
            source.load_state_dict(saved)
        self.samples, self.served = int(state["samples"]), [int(x) for x in state["served"]]
