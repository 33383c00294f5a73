"""The variable-length mode's steps over one source or a blend of several: which source each step trains.

:class:`VariableSteps` holds one :class:`~seqwarm.curriculum.variable.VariableLengthSampler` per source
(source ``k`` draws with seed ``seed + k``) and picks each optimizer step's source by the blend's weights
(:func:`blend_choices`: the source whose share of steps lags its weight the most, as Megatron's blend picks
samples); the step's sampler then draws its length and rows with the run's step number, so a cap
(``linear``, ``schedule``) follows the run's steps, not the source's. Every step holds the same tokens, so
the shares of steps are the shares of tokens. ``seqwarm train --curriculum-mode variable``
(:mod:`seqwarm.data.variable`) trains with it and :func:`~seqwarm.curriculum.plan_variable.plan_variable`
replays it without indices, so the plan's lengths are the run's. Plain numpy: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqwarm.curriculum.decompose import Decomposition
from seqwarm.curriculum.variable import VariableLengthSampler, VariableStep
from seqwarm.util.errors import UserError

__all__ = ["blend_choices", "VariableSteps"]


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


class VariableSteps:
    """The optimizer steps of one or more sources (see the module). ``sampler`` holds the keywords of
    every source's :class:`~seqwarm.curriculum.variable.VariableLengthSampler` (curriculum, schedule, ...);
    ``names`` prefix a source's errors."""

    def __init__(
        self,
        decompositions: Sequence[Decomposition],
        weights: Sequence[float],
        tokens_per_step: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        names: Sequence[str] | None = None,
        **sampler: Any,
    ):
        if len(decompositions) != len(weights) or not decompositions:
            raise ValueError(f"{len(decompositions)} decompositions and {len(weights)} weights: one weight a source")
        self.decompositions = list(decompositions)
        self.weights = [float(w) for w in weights]
        self.samplers: list[VariableLengthSampler] = []
        for k, d in enumerate(self.decompositions):
            try:
                self.samplers.append(
                    VariableLengthSampler(
                        d, tokens_per_step, seed=seed + k, rank=rank, world_size=world_size, **sampler
                    )
                )
            except UserError as err:  # which source of a blend
                raise UserError(f"{names[k]}: {err}" if names else str(err)) from None
        self.steps = 0
        """Optimizer steps drawn."""
        self.served = [0] * len(self.decompositions)
        """Steps drawn from each source."""

    def next_step(self, *, indices: bool = True) -> tuple[int, VariableStep]:
        """The next optimizer step: its source and that source's draw (``indices=False``: the length
        alone, as a plan replays the run; the state moves on the same)."""
        if len(self.samplers) == 1:
            k = 0
            self.served[0] += 1
        else:
            k = int(blend_choices(self.weights, self.steps, 1, self.served)[0])
        self.steps += 1
        return k, self.samplers[k].next_step(at=self.steps, indices=indices)

    def cap(self, k: int, step: int) -> int | None:
        """The longest length source ``k`` may draw at ``step`` (None: no cap, every length)."""
        sampler = self.samplers[k]
        if sampler.schedule is None:
            return None
        lengths = np.asarray(sampler.decomposition.bucket_lengths)
        return int(lengths[sampler._cap_mask(step)].max())

    def state_dict(self) -> dict[str, Any]:
        """The position after the steps drawn: the step count, each source's steps and sampler state."""
        return {"steps": self.steps, "served": list(self.served), "samplers": [s.state_dict() for s in self.samplers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (each sampler refuses a changed setting or corpus, naming it)."""
        saved = state.get("samplers") or []
        if len(saved) != len(self.samplers):
            raise UserError(f"the state holds {len(saved)} source(s), these steps have {len(self.samplers)}")
        for sampler, s in zip(self.samplers, saved):
            sampler.load_state_dict(s)
        self.steps, self.served = int(state["steps"]), [int(n) for n in state["served"]]
