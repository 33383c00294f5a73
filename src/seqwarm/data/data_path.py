"""``--data-path`` and ``--split`` read without torch: the blend's weights and prefixes, the train / valid /
test document ranges, and the weight of a source given without one. :mod:`seqwarm.data.blend` (the blend's
batches) and ``seqwarm plan`` (:mod:`seqwarm.data.variable_sources`) use the same rules."""

from __future__ import annotations

from collections.abc import Sequence

from seqwarm.util.errors import UserError

__all__ = ["SPLIT_ROUNDINGS", "parse_data_path", "split_documents", "source_weights"]


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


def source_weights(parsed: Sequence[float | None], train_tokens: Sequence[int], what: str) -> list[float]:
    """The blend's weights: those given (:func:`parse_data_path`), or for a list without weights each
    source's share of the training tokens (``what``: the ``--data-path`` argument, for the error)."""
    if parsed[0] is not None:
        return [float(w) for w in parsed]
    if not sum(train_tokens):
        raise UserError(f"--data-path {what}: no source has training tokens")
    return [n / sum(train_tokens) for n in train_tokens]
