"""Stages: the length schedule after the warmup (context extension), each with its rotary position settings.

The warmup (:mod:`~seqwarm.curriculum.schedule`) runs first, up to the pretraining length. A stage
(:class:`StageConfig`) says: from the first optimizer step whose clock — the tokens trained before the
step — has reached ``start_tokens``, train at ``length`` with these position settings (``rope_theta``: the
rotary base, raised as in ABF; ``rope_scaling``: linear interpolation or YaRN, in Transformers' keys,
:class:`RopeScaling`). A key a stage leaves out keeps the previous stage's value (the model's own before
the first stage), so each checked stage holds its whole settings. :func:`stage_at` is the pure rule;
:func:`check_stages` collects every problem of a ``stages`` list (JSON or :class:`StageConfig`);
:class:`StageTracker` is the little state a loop needs: which stage the step in flight is in, and whether
it changed at this step. Imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seqwarm.util.errors import UserError
from seqwarm.util.problems import Checker, raise_if_problems

__all__ = [
    "RopeScaling",
    "StageConfig",
    "StageTracker",
    "stage_at",
    "check_stages",
    "refuse_positions",
    "sets_positions",
    "stage_rows",
    "STAGE_KEYS",
    "ROPE_TYPES",
]

STAGE_KEYS = ("start_tokens", "length", "rope_theta", "rope_scaling", "micro_batch_size")
ROPE_TYPES = ("linear", "yarn")
SCALING_KEYS = {  # each rope_scaling type's keys, in Transformers' names
    "linear": ("type", "factor"),
    "yarn": (
        "type",
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
}


@dataclass(frozen=True)
class RopeScaling:
    """A stage's ``rope_scaling``, in the keys of Transformers' ``rope_scaling`` / ``rope_parameters``."""

    type: str
    """``linear`` (positions divided by ``factor``) or ``yarn``."""
    factor: float
    """How many times longer the context is than the one the frequencies were trained for (>= 1)."""
    original_max_position_embeddings: int | None = None
    """YaRN: the length trained before (default: the length before the stage that sets the scaling)."""
    beta_fast: float = 32.0
    """YaRN: channels turning more than this many times over the original length keep their frequency."""
    beta_slow: float = 1.0
    """YaRN: channels turning fewer times are fully interpolated; a linear ramp between the two."""
    attention_factor: float | None = None
    """YaRN: the factor on cos/sin (attention temperature); None: ``0.1 * ln(factor) + 1``."""
    mscale: float | None = None
    """YaRN: with ``mscale_all_dim``, the attention factor is ``mscale(factor, mscale) / mscale(factor,
    mscale_all_dim)`` (DeepSeek's spelling)."""
    mscale_all_dim: float | None = None
    """YaRN: see ``mscale``."""
    truncate: bool = True
    """YaRN: round the ramp's ends to whole channels (Transformers' default)."""

    def to_dict(self) -> dict[str, Any]:
        """A Transformers ``rope_scaling`` dict: ``type`` and the keys of that type that are set (a linear
        scaling: ``factor`` only; YaRN: its defaults too)."""
        keys = SCALING_KEYS.get(self.type, ())
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and k in keys}


@dataclass(frozen=True)
class StageConfig:
    """One stage: from ``start_tokens`` on, train at ``length`` with these position settings."""

    start_tokens: int
    """The stage begins at the first optimizer step whose clock (tokens trained before it) reaches this."""
    length: int
    """The sequence length of its steps."""
    rope_theta: float | None = None
    """The rotary base from this stage on (None: the previous stage's, or the model's own)."""
    rope_scaling: RopeScaling | None = None
    """Linear interpolation or YaRN from this stage on (None: the previous stage's, or none)."""
    micro_batch_size: int | None = None
    """Rows of ``length`` per micro-batch in this stage (None: as many as keep the tokens of the micro-batch
    before the stages, :func:`stage_rows`). Not carried over to the next stage."""

    def positions(self) -> dict[str, Any]:
        """``{"rope_theta": ..., "rope_scaling": {...} | None}``: what a rotary model applies."""
        scaling = self.rope_scaling.to_dict() if self.rope_scaling is not None else None
        return {"rope_theta": self.rope_theta, "rope_scaling": scaling}

    def describe(self) -> str:
        """``length 1024, rope_theta 500000, yarn x2`` (the console's and the plan's words)."""
        parts = [f"length {self.length}"]
        if self.rope_theta is not None:
            parts.append(f"rope_theta {self.rope_theta:g}")
        if self.rope_scaling is not None:
            parts.append(f"{self.rope_scaling.type} x{self.rope_scaling.factor:g}")
        if self.micro_batch_size is not None:
            parts.append(f"micro_batch_size {self.micro_batch_size}")
        return ", ".join(parts)


def stage_rows(stage: StageConfig, micro_tokens: int) -> int:
    """Rows of ``stage.length`` in one micro-batch of ``stage``: its own ``micro_batch_size``, else as many as
    keep ``micro_tokens`` (the tokens of a micro-batch before the stages: rows x the pretraining length), rounded
    down, at least 1 — a stage twice as long trains half the rows, the same tokens per step."""
    if stage.micro_batch_size is not None:
        return stage.micro_batch_size
    return max(1, micro_tokens // stage.length)


def stage_at(tokens: int, stages: Sequence[StageConfig]) -> tuple[int, StageConfig] | None:
    """The stage (its index and config) a step trains in when ``tokens`` were trained before it; None
    before the first (the warmup, or the pretraining length). ``stages`` in order of ``start_tokens``."""
    found = None
    for i, stage in enumerate(stages):
        if tokens >= stage.start_tokens:
            found = (i, stage)
    return found


def _scaling(chk: Checker, raw: Any, path: str, before: int | None) -> RopeScaling | None:
    if isinstance(raw, RopeScaling):
        raw = raw.to_dict()
    if not isinstance(raw, Mapping):
        chk.add(path, raw, "must be an object", 'write {"type": "yarn", "factor": 2.0}')
        return None
    kind = chk.choice(raw.get("type"), f"{path}.type", ROPE_TYPES, "rope scaling type")
    if kind is None:
        return None
    chk.unknown_keys(raw, SCALING_KEYS[kind], path)
    ok = len(chk.problems)
    vals: dict[str, Any] = {"type": kind}
    if "factor" not in raw:
        chk.add(f"{path}.factor", None, "is required", "give the context's growth, e.g. 2.0")
    else:
        vals["factor"] = chk.number(raw["factor"], f"{path}.factor", minimum=1.0, fix="use a factor >= 1")
    for key in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        if raw.get(key) is not None:
            vals[key] = chk.number(raw[key], f"{path}.{key}", minimum=0.0, strict=True)
    if "truncate" in raw:
        vals["truncate"] = chk.boolean(raw["truncate"], f"{path}.truncate")
    if kind == "yarn":
        original = raw.get("original_max_position_embeddings", before)
        if original is None:
            chk.add(
                f"{path}.original_max_position_embeddings",
                None,
                "is required here (the length before the stage is not known)",
                "give the length the model was trained at before",
            )
        else:
            vals["original_max_position_embeddings"] = chk.integer(original, f"{path}.original_max_position_embeddings")
        fast, slow = vals.get("beta_fast", 32.0), vals.get("beta_slow", 1.0)
        if fast is not None and slow is not None and fast <= slow:
            chk.add(f"{path}.beta_fast", fast, f"must be above beta_slow ({slow})", "use e.g. 32 and 1")
    return RopeScaling(**vals) if len(chk.problems) == ok else None


def check_stages(
    chk: Checker, raw: Any, path: str = "seqwarm.stages", *, pretrain_length: int | None = None, warmup: bool = False
) -> tuple[StageConfig, ...]:
    """The checked stages of a ``stages`` list (JSON objects or :class:`StageConfig`), each with its whole
    position settings (a key left out keeps the previous stage's); every problem goes to ``chk``.
    ``pretrain_length``: the length trained before the first stage (the warmup's top), when known.
    ``warmup``: a warmup runs first (a stage cannot start at token 0). A length above the run's seq_length is
    for the trainer to judge (a rotary model holds it, learned positions do not)."""
    if not isinstance(raw, (list, tuple)) or not raw:
        chk.add(path, raw, "must be a non-empty list of stages", 'write [{"start_tokens": N, "length": L}, ...]')
        return ()
    out: list[StageConfig] = []
    before, start_before = pretrain_length, -1
    theta: float | None = None
    scaling: RopeScaling | None = None
    for i, stage in enumerate(raw):
        where = f"{path}[{i}]"
        if isinstance(stage, StageConfig):
            stage = {f.name: getattr(stage, f.name) for f in dataclasses.fields(stage)}  # its RopeScaling kept
            stage = {k: v for k, v in stage.items() if v is not None}
        if not isinstance(stage, Mapping):
            chk.add(where, stage, "must be an object", 'write {"start_tokens": N, "length": L}')
            continue
        chk.unknown_keys(stage, STAGE_KEYS, where)
        start = chk.integer(stage.get("start_tokens"), f"{where}.start_tokens", minimum=0)
        length = chk.integer(stage.get("length"), f"{where}.length")
        if start is not None:
            if start <= start_before:
                chk.add(f"{where}.start_tokens", start, "stages must be in order of start_tokens", "sort them")
            elif start == 0 and warmup:
                chk.add(f"{where}.start_tokens", 0, "starts before the warmup ends", "start it after the warmup")
            start_before = start
        if length is not None:
            if before is not None and length < before:
                chk.add(
                    f"{where}.length",
                    length,
                    f"is below the length before it ({before})",
                    f"give a length of at least {before}",
                )
        if stage.get("rope_theta") is not None:
            theta = chk.number(stage["rope_theta"], f"{where}.rope_theta", minimum=1.0, strict=True)
        if stage.get("rope_scaling") is not None:
            scaling = _scaling(chk, stage["rope_scaling"], f"{where}.rope_scaling", before)
        micro = None
        if stage.get("micro_batch_size") is not None:
            micro = chk.integer(stage["micro_batch_size"], f"{where}.micro_batch_size")
        if start is not None and length is not None:
            out.append(StageConfig(start, length, theta, scaling, micro))
        before = length if length is not None else before
    return tuple(out)


def as_stages(stages: Any, *, pretrain_length: int | None = None, warmup: bool = False) -> tuple[StageConfig, ...]:
    """Checked stages from keywords (dicts or :class:`StageConfig`); one ConfigError lists every problem."""
    if not stages:
        return ()
    chk = Checker()
    out = check_stages(chk, list(stages), "stages", pretrain_length=pretrain_length, warmup=warmup)
    raise_if_problems(chk)
    return out


class StageTracker:
    """Which stage the step in flight trains in, and whether it differs from the last step's."""

    def __init__(self, stages: Sequence[StageConfig] = ()):
        self.stages = tuple(stages)
        self.index: int | None = None
        """The stage of the step in flight (None: before the first, or not known yet)."""
        self.changed = False
        self._known = False

    changed_doc = (
        "True at the step whose stage differs from the last step's — also at the first step after the object was "
        "built or loaded when that step is inside a stage: set the model's positions before its forward."
    )

    @property
    def stage(self) -> StageConfig | None:
        return None if self.index is None else self.stages[self.index]

    def positions(self) -> dict[str, Any] | None:
        """The rotary settings of the step in flight, ``{"rope_theta": ..., "rope_scaling": {...} | None}``
        (None before the first stage: the model's own); a key None keeps the model's own (base θ, no
        scaling). :func:`~seqwarm.curriculum.rope.rope_frequencies` turns them into inverse frequencies."""
        return None if self.stage is None else self.stage.positions()

    def begin(self, tokens: int) -> StageConfig | None:
        """The stage of a step begun with ``tokens`` trained before it; sets :attr:`changed`."""
        found = stage_at(tokens, self.stages)
        index = None if found is None else found[0]
        self.changed = index != self.index or (not self._known and index is not None)
        self.index, self._known = index, True
        return self.stage

    @property
    def known(self) -> bool:
        """Whether a step has begun since this tracker was built or :meth:`forget` (after a load): then
        :attr:`index` is that step's stage (None: before any), else not known yet."""
        return self._known

    def forget(self) -> None:
        """After a state load: the next :meth:`begin` reports its stage as changed."""
        self.index, self._known = None, False

    def check_width(self, seq: int, layout: str) -> None:
        """ValueError for a dense batch of ``seq`` tokens per row, shorter than the stage in flight: a cut
        cannot lengthen rows, so the stage's positions would train at the old length (padded batches are
        as long as their longest sequence, and may be shorter)."""
        stage = self.stage
        if stage is not None and layout == "dense" and seq < stage.length:
            raise ValueError(
                f"stage {self.index + 1} trains at length {stage.length}, but this batch has {seq} tokens per row: "
                f"give windows at least {stage.length} long from the stage on (a cut cannot lengthen them, and the "
                "stage's positions would train at the old length)"
            )


def sets_positions(stages: Sequence[StageConfig]) -> bool:
    """Whether any stage changes the rotary positions (a ``rope_theta`` or a ``rope_scaling``)."""
    return any(s.rope_theta is not None or s.rope_scaling is not None for s in stages)


def refuse_positions(stages: Sequence[StageConfig], who: str) -> None:
    """UserError when ``stages`` change the rotary positions and ``who`` cannot apply them to its model:
    a stage that changed the length but not the positions would train another model than the one asked for."""
    if sets_positions(stages):
        raise UserError(
            f"{who}: the stages set rope_theta / rope_scaling, which {who} cannot apply to its model (it would "
            "train the stage lengths at the old positions); give stages with lengths only, or use "
            "SequenceLengthWarmup in your own loop and set slw.positions on the model when slw.stage_changed "
            "(docs/STAGES.md)"
        )
