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
each optimizer step trains rows of one source, chosen by :func:`~seqwarm.data.blend.blend_choices` over
steps (the source whose share of steps lags its weight the most). Every step holds the same tokens, so
the shares of steps are the shares of tokens: source ``k`` trains ``w_k`` of the tokens, give or take one
step. A source's sampler draws with the run's step number, so a schedule's cap follows the run's steps.

:class:`VariableData` is the run's :class:`~seqwarm.data.megatron.TokenData` (a prepared folder, the
embedded corpus, a Megatron blend) whose ``train_batches`` are these; validation reads the data's own
full-length windows, as in every other mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqwarm.config import RunConfig
from seqwarm.curriculum.decompose import decompose
from seqwarm.curriculum.schedule import CurriculumConfig
from seqwarm.curriculum.variable import VariableLengthSampler
from seqwarm.data.blend import blend_choices
from seqwarm.data.dataset import Batch, build_batch, check_label_style
from seqwarm.util.errors import UserError
from seqwarm.util.units import human_count

__all__ = ["VariableBatches", "VariableData", "VariableSettings", "variable_data"]

_STATE_VERSION = 1


@dataclass(frozen=True)
class VariableSettings:
    """What curriculum mode variable reads of a run config (:meth:`of`)."""

    min_length: int
    """The shortest chunk: the curriculum's ``min_difficulty`` (a power of 2)."""
    max_length: int
    """The longest chunk: its ``max_difficulty`` (a power of 2)."""
    micro_batch_size: int
    """Full-length rows per micro-batch: a micro-batch holds ``micro_batch_size x max_length`` tokens."""
    accumulation: int
    """Micro-batches per optimizer step on each rank."""
    curriculum: str = "schedule"
    """The sampler's curriculum (``variable_curriculum``)."""
    num_cycles: int = 8
    """Grow-P2's cycles per epoch."""
    schedule: CurriculumConfig | None = None
    """The cap of the ``schedule`` curriculum: the config's curriculum block."""
    train_tokens: int | None = None
    """The budget, from which ``linear`` counts its steps."""
    train_iters: int | None = None

    @classmethod
    def of(cls, cfg: RunConfig) -> VariableSettings:
        cur = cfg.curriculum
        if cur is None or cur.mode != "variable":
            raise ValueError("VariableSettings.of needs a config in curriculum mode variable")
        return cls(
            cur.min_difficulty,
            cur.max_difficulty,
            cfg.micro_batch_size,
            cfg.gradient_accumulation_steps,
            cfg.variable_curriculum,
            cfg.variable_cycles,
            cur,
            cfg.train_tokens,
            cfg.train_iters,
        )

    def tokens_per_step(self, world_size: int) -> int:
        """The tokens of every optimizer step, all ranks: the full-length global batch's."""
        return self.micro_batch_size * self.accumulation * world_size * self.max_length

    def sampler_options(self, world_size: int) -> dict[str, Any]:
        """The curriculum keywords of :class:`~seqwarm.curriculum.variable.VariableLengthSampler`."""
        if self.curriculum == "grow_p2":
            return {"curriculum": "grow_p2", "num_cycles": self.num_cycles}
        if self.curriculum == "schedule":
            return {"curriculum": "schedule", "schedule": self.schedule}
        if self.curriculum == "linear":  # the cap grows over the budget's steps
            per_step = self.tokens_per_step(world_size)
            steps = math.ceil(self.train_tokens / per_step) if self.train_tokens else self.train_iters
            if not steps:
                raise UserError(
                    "variable_curriculum linear grows the length over the budget's steps: give --train-tokens "
                    "(or --train-iters)"
                )
            return {"curriculum": "linear", "total_steps": int(steps)}
        return {"curriculum": self.curriculum}


@dataclass(frozen=True)
class _Part:
    """One source's training split: its token stream, the documents' offsets into it, its file and name."""

    stream: np.ndarray
    offsets: np.ndarray
    file: Any
    name: str


class VariableBatches:
    """Curriculum mode variable's training micro-batches (see the module): ``parts`` are the sources'
    training splits, ``weights`` their blend weights."""

    def __init__(
        self,
        parts: list[_Part],
        weights: list[float],
        settings: VariableSettings,
        *,
        seed: int = 1234,
        rank: int = 0,
        world_size: int = 1,
        eod_id: int | None = None,
        label_style: str = "megatron",
    ):
        self.settings, self.parts = settings, parts
        self.weights = [float(w) for w in weights]
        self.label_style = check_label_style(label_style)
        self.eod_id = eod_id
        self.tokens_per_step = settings.tokens_per_step(world_size)
        self.micro_batch_tokens = settings.micro_batch_size * settings.max_length
        options = settings.sampler_options(world_size)
        self.decompositions, self.samplers = [], []
        for k, part in enumerate(parts):
            d = decompose(part.offsets, settings.min_length, settings.max_length)
            try:
                sampler = VariableLengthSampler(
                    d, self.tokens_per_step, seed=seed + k, rank=rank, world_size=world_size, **options
                )
            except UserError as err:  # which source of a blend, and what to change in a run's terms
                message = f"curriculum mode variable, {part.name}: {err}"
                raise UserError(message.replace("min_length", "min_difficulty")) from None
            self.decompositions.append(d)
            self.samplers.append(sampler)
        self.steps = 0  # optimizer steps drawn
        self.served = [0] * len(parts)  # steps drawn from each source
        self._step: tuple[int, Any] | None = None  # (source, VariableStep) in flight
        self._micro = 0  # its micro-batches drawn
        self._rows: list[list[int]] = []
        self._before: dict[str, Any] | None = None  # the position before the step in flight

    # -- the micro-batches ------------------------------------------------------------------------
    def _position(self) -> dict[str, Any]:
        return {"steps": self.steps, "served": list(self.served), "samplers": [s.state_dict() for s in self.samplers]}

    def _begin(self) -> None:
        """Draw the next optimizer step: its source, length and this rank's rows."""
        self._before = self._position()
        k = 0 if len(self.parts) == 1 else int(blend_choices(self.weights, self.steps, 1, self.served)[0])
        if len(self.parts) == 1:
            self.served[0] += 1
        self.steps += 1
        step = self.samplers[k].next_step(at=self.steps)
        self._step, self._micro = (k, step), 0
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
        windows = self.decompositions[k].rows(part.stream, rows)  # (rows, L + 1), one document each
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
        for sampler, s in zip(self.samplers, saved):
            sampler.load_state_dict(s)  # a changed length range, tokens per step, curriculum or corpus: refused
        self.steps, self.served = int(state["steps"]), [int(n) for n in state["served"]]
        self._step, self._micro, self._rows = None, 0, []
        micro = int(state.get("micro", 0))
        if micro:  # inside a step: draw it again (the same step), past its micro-batches drawn
            self._begin()
            self._micro = micro

    # -- what it does -----------------------------------------------------------------------------
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
        parts = []
        for source in self.data.sources:
            file, (start, stop) = source.files[0], source.ranges[0]
            offsets = np.asarray(file.doc_offsets[start : stop + 1], dtype=np.int64)
            parts.append(_Part(source.stream(0), offsets - offsets[0], file, source.names[0]))
        weights = [source.weight for source in self.data.sources]
        return VariableBatches(
            parts,
            weights,
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
