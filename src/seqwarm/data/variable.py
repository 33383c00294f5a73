"""Curriculum mode variable's training batches: every row a piece of one document, one length per step.

In curriculum mode variable (docs/VARIABLE.md) the documents of the training split are cut into chunks of
power-of-2 lengths between the curriculum's ``min_difficulty`` and ``max_difficulty``
(:func:`~seqwarm.curriculum.decompose.decompose`; the remainder shorter than the minimum is dropped and
counted) and a :class:`~seqwarm.curriculum.variable.VariableLengthSampler` picks each optimizer step's
length ``L`` and its chunks. :class:`VariableBatches` is the batch source the loop's feed draws from
(``next_batch``, ``state_dict``, ``load_state_dict``: :mod:`seqwarm.trainer.feed`): each ``next_batch()``
is the next micro-batch of the step in flight, a batch as :func:`~seqwarm.data.dataset.build_batch` makes
them (``label_style`` respected) whose rows are chunks of length ``L`` (+1 for the shifted labels).

The tokens per step are those of the full-length global batch, ``micro_batch_size x
gradient_accumulation_steps x world_size x max_difficulty``, so each micro-batch holds ``micro_batch_size
x max_difficulty`` tokens, ``micro_batch_size x max_difficulty / L`` rows: the same memory for the
activations at every length, and the same tokens in every step. Every rank draws the same length each step
and its own rows (the sampler's rank split). The position is the samplers' state before the step in
flight plus the micro-batches of it already drawn, so a read-ahead batch and a checkpoint taken between
steps or inside one continue exactly.

**Blends** (``--data-path 0.3 A 0.7 B``): one decomposition and one sampler per source (seed + k), and
each optimizer step trains rows of one source, chosen by weight
(:class:`~seqwarm.curriculum.variable_blend.VariableSteps`: the source whose share of steps lags its weight
the most). Every step holds the same tokens, so the shares of steps are the shares of tokens: source ``k``
trains ``w_k`` of the tokens, give or take one step. A source's sampler draws with the run's step number,
so a schedule's cap follows the run's steps. The settings and the documents' offsets are read by
:mod:`seqwarm.data.variable_sources`, which ``seqwarm plan`` uses too (:meth:`VariableBatches.plan`: the
run's plan from these very decompositions and samplers' settings).

:class:`VariableData` is the run's :class:`~seqwarm.data.megatron.TokenData` (a prepared folder, the
embedded corpus, a Megatron blend) whose ``train_batches`` are these; validation reads the data's own
full-length windows, as in every other mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqwarm.config import RunConfig
from seqwarm.curriculum.plan_variable import VariablePlan
from seqwarm.curriculum.variable_blend import VariableSteps
from seqwarm.data.dataset import Batch, build_batch, check_label_style
from seqwarm.data.variable_sources import (
    DocumentSource,
    VariableSettings,
    decompose_sources,
    in_run_terms,
    sources_of,
    variable_plan,
)
from seqwarm.util.errors import UserError
from seqwarm.util.units import human_count

__all__ = ["VariableBatches", "VariableData", "VariableSettings", "variable_data"]

_STATE_VERSION = 1


class VariableBatches:
    """Curriculum mode variable's training micro-batches (see the module): ``parts`` are the sources'
    training documents (:class:`~seqwarm.data.variable_sources.DocumentSource`, with their token files)."""

    def __init__(
        self,
        parts: list[DocumentSource],
        streams: list[np.ndarray],
        settings: VariableSettings,
        *,
        seed: int = 1234,
        rank: int = 0,
        world_size: int = 1,
        eod_id: int | None = None,
        label_style: str = "megatron",
    ):
        self.settings, self.parts, self._streams = settings, parts, streams
        self.weights = [float(p.weight) for p in parts]
        self.label_style = check_label_style(label_style)
        self.eod_id = eod_id
        self.seed, self.world_size = seed, world_size
        self.tokens_per_step = settings.tokens_per_step(world_size)
        self.micro_batch_tokens = settings.micro_batch_size * settings.max_length
        options = settings.sampler_options(world_size)
        self.decompositions = decompose_sources(parts, settings)
        names = [p.name for p in parts]
        try:
            self.draw = VariableSteps(
                self.decompositions,
                self.weights,
                self.tokens_per_step,
                seed=seed,
                rank=rank,
                world_size=world_size,
                names=names if len(parts) > 1 else None,
                **options,
            )
        except UserError as err:  # what to change, in a run's terms
            raise in_run_terms(err, names[0] if len(parts) == 1 else None) from None
        self.samplers = self.draw.samplers
        self._step: tuple[int, Any] | None = None  # (source, VariableStep) in flight
        self._micro = 0  # its micro-batches drawn
        self._rows: list[list[int]] = []
        self._before: dict[str, Any] | None = None  # the position before the step in flight

    # -- the micro-batches ------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Optimizer steps drawn."""
        return self.draw.steps

    @property
    def served(self) -> list[int]:
        """Optimizer steps drawn from each source."""
        return self.draw.served

    def _position(self) -> dict[str, Any]:
        return self.draw.state_dict()

    def _begin(self) -> None:
        """Draw the next optimizer step: its source, length and this rank's rows."""
        self._before = self._position()
        self._step, self._micro = self.draw.next_step(), 0
        step = self._step[1]
        self._rows = step.micro_batches(self.micro_batch_tokens)

    @property
    def current_length(self) -> int | None:
        """The length of the step in flight (None before the first)."""
        return None if self._step is None else self._step[1].length

    def next_batch(self) -> Batch:
        """The next micro-batch of the step in flight (a new step after its last)."""
        if self._step is None or self._micro == len(self._rows):
            self._begin()
        k, _ = self._step
        rows = self._rows[self._micro]
        self._micro += 1
        part = self.parts[k]
        if part.file is not None:  # a file truncated or rewritten under the run is an error naming it
            part.file.check_unchanged()
        windows = self.decompositions[k].rows(self._streams[k], rows)  # (rows, L + 1), one document each
        return build_batch(windows, eod_id=self.eod_id, label_style=self.label_style)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    # -- the position -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position before the first micro-batch not drawn yet: the samplers' state before the step in
        flight and its micro-batches drawn (between steps: the state after the last, 0)."""
        inside = self._step is not None and 0 < self._micro < len(self._rows)
        where = self._before if inside else self._position()
        return {"variable": _STATE_VERSION, "weights": self.weights, **where, "micro": self._micro if inside else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; a UserError (exit 2) naming what changed when it cannot."""
        if not isinstance(state, dict) or state.get("variable") != _STATE_VERSION:
            raise UserError(
                "cannot resume the data position: the checkpoint was not trained in curriculum mode variable "
                "(its data position is another mode's); resume it in its own mode, or start a new run (--out)"
            )
        saved = state.get("samplers") or []
        if len(saved) != len(self.samplers) or not np.allclose(state.get("weights", []), self.weights):
            raise UserError(
                f"cannot resume the data position: the checkpoint was written with {len(saved)} data source(s) "
                f"(weights {state.get('weights')}), this run has {len(self.samplers)} ({self.weights})"
            )
        self.draw.load_state_dict(state)  # a changed length range, tokens per step, curriculum or corpus: refused
        self._step, self._micro, self._rows = None, 0, []
        micro = int(state.get("micro", 0))
        if micro:  # inside a step: draw it again (the same step), past its micro-batches drawn
            self._begin()
            self._micro = micro

    # -- what it does -----------------------------------------------------------------------------
    def plan(self, cfg: RunConfig) -> VariablePlan:
        """The run ahead of time from these decompositions, weights, seed and settings, to ``cfg``'s budget:
        what ``seqwarm plan`` shows (:func:`~seqwarm.data.variable_sources.variable_plan`)."""
        names = [p.name for p in self.parts]
        return variable_plan(
            cfg, self.decompositions, self.weights, names=names, seed=self.seed, world_size=self.world_size
        )

    def describe(self) -> str:
        """One console line: the buckets and their shares, the dropped remainder, the curriculum."""
        tokens: dict[int, int] = {}
        dropped = empty = 0
        for d in self.decompositions:
            for length, t in zip(d.bucket_lengths, d.tokens_per_bucket()):
                tokens[length] = tokens.get(length, 0) + t
            dropped, empty = dropped + d.dropped_tokens, empty + d.empty_documents
        total = sum(tokens.values()) or 1
        shares = ", ".join(f"{length} {t / total:.1%}" for length, t in sorted(tokens.items()))
        s = self.settings
        name = s.curriculum + (f" ({s.num_cycles} cycles)" if s.curriculum == "grow_p2" else "")
        if s.curriculum == "schedule":
            name += f" (the curriculum block's {s.schedule.schedule_type} schedule caps the length)"
        return (
            f"variable:    every row one document; buckets (share of tokens) {shares}; "
            f"{human_count(dropped)} tokens dropped (remainders shorter than {s.min_length}; {empty:,} documents "
            f"shorter); curriculum {name}; {human_count(self.tokens_per_step)} tokens per step "
            f"({self.tokens_per_step // s.max_length:,} rows of {s.max_length} .. "
            f"{self.tokens_per_step // s.min_length:,} rows of {s.min_length})"
        )


class VariableData:
    """``data`` (a :class:`~seqwarm.data.megatron.TokenData`) whose training batches are curriculum mode
    variable's (:class:`VariableBatches`, from ``settings``); everything else is the data's own."""

    def __init__(self, data: Any, settings: VariableSettings):
        self.data, self.settings = data, settings

    def __getattr__(self, name: str) -> Any:  # the data's own windows, val batches, meta, tokenizer, ...
        return getattr(self.data, name)

    def train_batches(
        self,
        seq_length: int,
        micro_batch_size: int,
        *,
        seed: int = 1234,
        rank: int = 0,
        world_size: int = 1,
        label_style: str = "megatron",
        document_masking: bool = False,
        **_full_length: Any,
    ) -> VariableBatches:
        """The variable mode's micro-batches of the train split (``seq_length``: the model's, which must
        hold ``max_length``; ``micro_batch_size``: the settings' full-length rows)."""
        s = self.settings
        if document_masking:
            raise UserError("curriculum mode variable needs no document masking: every row is one document")
        if seq_length < s.max_length:
            raise UserError(
                f"curriculum mode variable: the model's {seq_length} positions cannot hold max_difficulty "
                f"{s.max_length}; give --seq-length {s.max_length}"
            )
        if micro_batch_size != s.micro_batch_size:
            raise ValueError(f"micro_batch_size {micro_batch_size} != the settings' {s.micro_batch_size}")
        return VariableBatches(
            sources_of(self.data),
            [source.stream(0) for source in self.data.sources],
            s,
            seed=seed,
            rank=rank,
            world_size=world_size,
            eod_id=self.data.eod_id,
            label_style=label_style,
        )


def variable_data(data: Any, cfg: RunConfig) -> VariableData:
    """``data`` read in curriculum mode variable as ``cfg`` sets it (:class:`VariableData`)."""
    return VariableData(data, VariableSettings.of(cfg))
