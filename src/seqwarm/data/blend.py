"""Blends of ``--data-path`` sources: the argument's weights and prefixes, Megatron's ``--split``, batches.

``--data-path PREFIX``, a blend ``W1 P1 W2 P2 ...`` (``--data-path 0.3 A 0.7 B``) or a list of prefixes
without weights (``--data-path A B``, as megatron-core accepts it) is parsed by :func:`parse_data_path`
(weights normalised to sum 1; ``None`` for a list: the sources weigh what they hold);
:func:`split_documents` cuts a source's documents in file order into train / valid / test parts in
proportion to Megatron's ``--split 969,30,1`` weights, rounded as Megatron-DeepSpeed or megatron-core does.

:class:`BlendedBatches` draws each training sample from source ``k`` so that after ``n`` samples source
``k`` has served ``round(w_k * n)`` of them give or take one (the source whose share lags its weight the
most goes next, as in Megatron's blended dataset, see :func:`blend_choices`); validation reads every
source's val split (one :class:`ConcatWindows`) in the same proportions (:func:`blend_eval_indices`).
Nothing here reads files: the sources are :class:`~seqwarm.data.dataset.TokenWindows`, whichever format
they come from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

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
# --data-path and --split


SPLIT_ROUNDINGS = ("megatron-deepspeed", "megatron-core")
"""How ``--split`` rounds its document boundaries (see :func:`split_documents`)."""


def _is_weight(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_data_path(items: Sequence[str]) -> list[tuple[float | None, str]]:
    """``["A"]`` -> ``[(1.0, "A")]``; ``["0.3", "A", "0.7", "B"]`` -> weights normalised to sum 1;
    ``["A", "B"]`` (no weight at all, as megatron-core's ``get_blend_from_list`` accepts) ->
    ``[(None, "A"), (None, "B")]``: the caller weighs each source by its size."""
    items = [str(i) for i in items]
    if not items:
        raise UserError("--data-path needs PREFIX, or a blend W1 PREFIX1 W2 PREFIX2 ..., or PREFIX1 PREFIX2 ...")
    if len(items) == 1:
        return [(1.0, items[0])]
    if not any(_is_weight(i) for i in items):  # a plain list of prefixes
        return [(None, i) for i in items]
    if len(items) % 2:
        raise UserError(
            f"--data-path {' '.join(items)}: a blend is pairs of weight and prefix "
            "(W1 PREFIX1 W2 PREFIX2 ...), got an odd number of values; give weights to all sources or to none"
        )
    pairs = []
    for w, prefix in zip(items[::2], items[1::2]):
        try:
            weight = float(w)
        except ValueError:
            raise UserError(
                f"--data-path: {w!r} (before {prefix!r}) is not a weight; a blend is W1 PREFIX1 W2 PREFIX2 ..."
            ) from None
        if not weight > 0:
            raise UserError(f"--data-path: the weight of {prefix!r} is {w}; weights must be positive")
        pairs.append((weight, prefix))
    total = sum(w for w, _ in pairs)
    return [(w / total, p) for w, p in pairs]


def split_documents(num_docs: int, split: str, rounding: str = "megatron-deepspeed") -> list[tuple[int, int]]:
    """Megatron's ``--split``: document ranges ``[(start, stop)]`` of train, valid, test in proportion to
    the weights (``"969,30,1"``; ``/`` also separates), each boundary a whole document.

    ``rounding="megatron-deepspeed"`` (Megatron-DeepSpeed's ``get_train_valid_test_split_``,
    megatron/data/dataset_utils.py): each part's size is rounded on its own (Python's ``round``,
    half to even), the boundaries are their running sums, and the surplus of the sum over ``num_docs``
    is taken off every boundary after the first 0. ``"megatron-core"`` (megatron-core's
    ``BlendedMegatronDatasetBuilder``): each boundary is the rounded cumulative fraction times
    ``num_docs``. They differ by a document for some counts: 49 documents at 969,30,1 train on 48
    (Megatron-DeepSpeed: 47.48 -> 47, 1.47 -> 1, 0.05 -> 0, one short, so every boundary moves up one)
    or 47 (megatron-core: round(47.48))."""
    if rounding not in SPLIT_ROUNDINGS:
        raise UserError(f"--split-rounding {rounding!r}: choose {' or '.join(SPLIT_ROUNDINGS)}")
    try:
        weights = [float(x) for x in split.replace("/", ",").split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--split {split!r}: give weights like 969,30,1") from None
    weights = (weights + [0.0, 0.0, 0.0])[:3]
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UserError(f"--split {split!r}: weights must be non-negative with a positive sum")
    total = sum(weights)
    if rounding == "megatron-core":
        bounds = [0] + [int(round(sum(weights[: i + 1]) / total * num_docs)) for i in range(3)]
    else:
        bounds = [0]
        for w in weights:
            bounds.append(bounds[-1] + int(round(w / total * float(num_docs))))
        surplus = bounds[-1] - num_docs
        bounds = [0] + [b - surplus for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


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


def blend_choices(weights: Sequence[float], start: int, count: int, served: Sequence[int]) -> np.ndarray:
    """Sources of global samples ``start .. start+count-1``: each goes to the source whose count lags
    ``weight x samples`` the most (ties: the lower index); ``served`` is updated in place. The weights
    are relative (normalised here, as Megatron does): ``[1, 2]`` means one third and two thirds."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"blend weights must be finite, >= 0 and not all 0, got {list(weights)}")
    w = w / w.sum()
    out = np.empty(count, dtype=np.int64)
    for j in range(count):
        k = int(np.argmax(w * (start + j + 1) - np.asarray(served)))
        out[j] = k
        served[k] += 1
    return out


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
