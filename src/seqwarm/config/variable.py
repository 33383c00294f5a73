"""The variable-length mode's part of a run config (``curriculum_mode: variable``, docs/VARIABLE.md).

In that mode the curriculum block's ``min_difficulty`` and ``max_difficulty`` are the shortest and longest
chunk documents are cut into (:func:`seqwarm.curriculum.decompose.decompose`), and ``variable_curriculum``
picks how the steps draw their length (:class:`seqwarm.curriculum.variable.VariableLengthSampler`):
``schedule`` (the default: the block's schedule is the cap), ``natural``, ``grow_p2`` (``variable_cycles``)
or ``linear``. :func:`read_variable` checks them with the rest of the config, so ``seqwarm check-config``
lists their problems too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqwarm.util.problems import Checker

__all__ = ["VARIABLE_CURRICULA", "DEFAULT_CYCLES", "VARIABLE_TORCH_ONLY", "read_variable"]

VARIABLE_TORCH_ONLY = (
    "curriculum mode variable trains seqwarm's GPT on the torch backends only (one device, DDP under torchrun, "
    "--fsdp), not on DeepSpeed, a pipeline or an hf: model yet"
)
"""Why ``seqwarm train`` / ``compare`` refuse the mode with ``--deepspeed`` or an ``hf:`` model (exit 2)."""

VARIABLE_CURRICULA = ("schedule", "natural", "grow_p2", "linear")
"""The ``variable_curriculum`` choices (the sampler's curricula; the default first)."""

DEFAULT_CYCLES = 8
"""Grow-P2's cycles per epoch unless ``variable_cycles`` says otherwise (Dataset Decomposition's 8)."""


def _power_of_two(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


def read_variable(chk: Checker, s: Mapping[str, Any], curriculum: Any, *, document_masking: bool) -> tuple[str, int]:
    """``(variable_curriculum, variable_cycles)`` of the settings ``s`` (key -> (value, path)); the problems
    of curriculum mode variable added to ``chk``: no curriculum block to take the lengths from, lengths that
    are not powers of 2, a custom schedule as the cap, document masking or stages next to it."""
    name = "schedule"
    if "variable_curriculum" in s:
        value, path = s["variable_curriculum"]
        name = chk.choice(value, path, VARIABLE_CURRICULA, "variable curriculum") or name
    cycles = s["variable_cycles"].value if "variable_cycles" in s else DEFAULT_CYCLES  # a whole number >= 1
    asked = "curriculum_mode" in s and s["curriculum_mode"][0] == "variable"
    if curriculum is None or curriculum.mode != "variable":
        if asked:  # the mode was given but there is no curriculum to carry it
            chk.add(
                s["curriculum_mode"][1],
                "variable",
                "needs a curriculum block: its min_difficulty and max_difficulty are the shortest and the "
                "longest chunk documents are cut into",
                "add a curriculum_learning block (the built-in recipe has one), or drop --no-curriculum",
            )
        for key in ("variable_curriculum", "variable_cycles"):
            if key in s and not asked:
                chk.warn(f"{key} has no effect outside curriculum mode variable")
        return name, cycles
    block = curriculum.source if curriculum.source == "curriculum_learning" else "curriculum"
    lo, hi = curriculum.min_difficulty, curriculum.max_difficulty
    if not (_power_of_two(lo) and _power_of_two(hi)):
        chk.add(
            f"{block}.min_difficulty / max_difficulty",
            f"{lo} / {hi}",
            "must be powers of 2 in curriculum mode variable: documents are cut into power-of-2 chunks, and "
            "every length then divides micro_batch_size x max_difficulty tokens into whole rows",
            "e.g. 64 and 1024",
        )
    if name == "schedule" and curriculum.schedule_type == "custom":
        chk.add(
            f"{block}.schedule_type",
            "custom",
            "a custom schedule has no lengths the variable mode's cap can follow",
            "use fixed_linear / fixed_root / fixed_discrete, or variable_curriculum natural, grow_p2 or linear",
        )
    if document_masking:
        chk.add(
            "document_masking",
            True,
            "is not needed in curriculum mode variable: every row is a piece of one document, so attention "
            "never crosses a document",
            "drop --document-masking",
        )
    if "stages" in s:
        chk.add(
            s["stages"][1], "[...]", "cannot follow curriculum mode variable yet", "drop the stages, or use truncate"
        )
    for key in ("train_samples", "lr_warmup_samples", "lr_decay_samples"):
        if key in s:
            chk.warn(
                f"{key} in curriculum mode variable: a sample is a row of the step's length (a chunk), so it "
                "passes faster while steps are short; give the length in tokens or iters"
            )
    if "variable_cycles" in s and name != "grow_p2":
        chk.warn(f"variable_cycles has no effect with variable_curriculum {name} (only grow_p2 has cycles)")
    return name, cycles
