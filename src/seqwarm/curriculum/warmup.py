"""SequenceLengthWarmup: the sequence-length curriculum of one training run, as one small object.

Composer's ``SeqLengthWarmup`` is a thin class over a functional op; this is the same split. The ops
(:mod:`~seqwarm.curriculum.batch`, :mod:`~seqwarm.curriculum.layouts`), the schedule, the clock and the LR stay
pure; the object adds only what needs state — the length of the optimizer step in flight, decided once by
:meth:`~SequenceLengthWarmup.begin_step`, the tokens its micro-batches held once cut, and the clock::

    slw = SequenceLengthWarmup(min_length=8, max_length=1024, steps=15000, multiple_of=8)
    while not slw.done:
        length = slw.begin_step()                    # the length of this step, decided once
        for micro_step in range(accumulation):
            X, Y = slw.cut(get_batch("train"))       # the same kind back (a tuple here), contiguous
            logits, loss = model(X, Y)
            (loss / accumulation).backward()
        optimizer.step(); optimizer.zero_grad()
        slw.end_step()                               # the clock moves by the tokens cut (over ranks)

``end_step(applied=False)`` (an fp16 skip) keeps the clock: the step is retried at the same length. ``mode``:
``truncate`` / ``reshape`` cut the batch; ``inject`` adds ``curriculum_seqlen=L`` for a forward that cuts its
inputs itself (auto: when the forward names it), and :meth:`~SequenceLengthWarmup.check_output` checks the
model ran at it. :class:`~seqwarm.curriculum.engine.CurriculumEngine`, ``DeepSpeedCurriculum``, the Hugging
Face ``CurriculumTrainer`` and seqwarm's own loop are thin users of this object."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from seqwarm.curriculum.batch import (
    batch_shape,
    bucket_batch,
    bucket_length,
    reshape_batch,
    tokens_trained,
    truncate_batch,
    window_batch,
)
from seqwarm.curriculum.clock import COUNT_TOKENS_BY, Limits, Progress, advance, micro_batch_shape, stop_reason
from seqwarm.curriculum.inputs import as_batch, check_keys, check_saved_state, keyword_curriculum
from seqwarm.curriculum.layouts import LAYOUTS, check_cut, cut_to_layout, longest_sequence, read_layout
from seqwarm.curriculum.lr import LRConfig, lr_at
from seqwarm.curriculum.lr_checks import with_budget
from seqwarm.curriculum.modes import OutputCheck, resolve_mode
from seqwarm.curriculum.plan import LoopSettings, Plan, make_plan
from seqwarm.curriculum.ranks import global_counts
from seqwarm.curriculum.run import WarmupSettings, as_run_config
from seqwarm.curriculum.schedule import CurriculumConfig, CurriculumScheduler
from seqwarm.curriculum.stages import StageConfig, StageTracker, as_stages
from seqwarm.curriculum.variable_mode import variable_lengths

__all__ = ["SequenceLengthWarmup", "Limits"]


class SequenceLengthWarmup:
    """The curriculum length per optimizer step, the one cut per micro-batch, the token clock and its state.

    Keyword schedule: the length rises from ``min_length`` to ``max_length`` over ``steps`` optimizer steps,
    every length a multiple of ``multiple_of`` (``schedule="linear"``; ``"root"`` with ``root_degree``;
    ``"discrete"`` with ``lengths=[...]`` used up to ``until_steps=[...]``), with the rounding and checks of
    DeepSpeed's blocks (every problem listed in one :class:`~seqwarm.util.problems.ConfigError`). ``mode``:
    truncate (default) | reshape | inject | None (auto, from ``forward``'s signature). ``length_bucket``: cut to
    the length rounded up to a multiple of it, the loss masked past the length (truncate only).
    ``count_tokens_by``: ``shape`` (the tokens the model is given: rows x length, padding left out) or
    ``loss_mask`` (its sum, or the labels that are not -100). ``layout``: how batches hold their sequences
    (:mod:`~seqwarm.curriculum.layouts`: ``auto`` reads each batch; ``dense``, ``padded``, ``padding_free``).
    ``lr``: an :class:`~seqwarm.curriculum.lr.LRConfig` for the token-clock LR (None: the LR is not this
    object's). ``train_tokens`` / ``train_iters`` / ``train_samples``: when :attr:`done` turns true.
    ``world_size``: data-parallel ranks the counts are summed over (None: the size of ``process_group``, the
    default group, or 1 without torch.distributed). ``process_group``: where loss-mask counts are summed.
    ``keys``: seqwarm's names mapped to a dict batch's, e.g. ``{"input_ids": "idx", "labels": "targets"}``.
    A linear or cosine ``lr`` decay without a decay length spans the budget.

    ``curriculum``: instead of the schedule keywords, a checked
    :class:`~seqwarm.curriculum.schedule.CurriculumConfig` (None: no curriculum — every batch passes at full
    length and is counted). :meth:`from_deepspeed` and :meth:`from_config` build one from DeepSpeed's JSON.

    ``mode="variable"`` (:mod:`~seqwarm.curriculum.variable_mode`): rows of one document, ``tokens_per_step``
    every step; ``documents`` (offsets or a ``Decomposition``), ``schedule`` natural | grow_p2 (``num_cycles``) |
    linear (``steps``) | root | discrete, ``seed``, ``rank``; ``slw.sampler``: a DataLoader's ``batch_sampler``.
    """

    def __init__(
        self,
        min_length: int | None = None,
        max_length: int | None = None,
        steps: int | None = None,
        *,
        multiple_of: int = 8,
        schedule: str | None = None,
        root_degree: float | None = None,
        lengths: list[int] | None = None,
        until_steps: list[int] | None = None,
        curriculum: CurriculumConfig | None = None,
        mode: str | None = "truncate",
        forward: Callable | None = None,
        inject_via_kwargs: bool = False,
        pipeline: bool = False,
        length_bucket: int | None = None,
        count_tokens_by: str = "shape",
        layout: str = "auto",
        lr: LRConfig | None = None,
        train_tokens: int | None = None,
        train_iters: int | None = None,
        train_samples: int | None = None,
        world_size: int | None = None,
        process_group: Any = None,
        keys: Mapping[str, str] | None = None,
        stages: Sequence[StageConfig | Mapping[str, Any]] | None = None,
        documents: Any = None,
        tokens_per_step: int | None = None,
        num_cycles: int | None = None,
        seed: int | None = None,
        rank: int | None = None,
    ):
        self.sampler = variable_lengths(dict(locals()))  # mode "variable" (variable_mode.py), else None
        """Mode ``variable``: the steps' lengths and rows, a ``DataLoader``'s ``batch_sampler``; else None."""
        if self.sampler is not None:  # the sampler decides the lengths: no schedule here, rows pass as they are
            min_length = max_length = steps = lengths = until_steps = curriculum = None
        keywords = (min_length, max_length, steps, lengths, until_steps)
        self.keys = check_keys(keys)
        self._max_name = "max_difficulty" if curriculum is not None else "max_length"  # the caller's word
        if curriculum is not None and any(v is not None for v in keywords):
            raise TypeError("pass either the schedule keywords or curriculum=, not both")
        if curriculum is None and any(v is not None for v in keywords):
            curriculum = keyword_curriculum(
                min_length, max_length, steps, multiple_of, schedule or "linear", root_degree, lengths, until_steps
            )
        if count_tokens_by not in COUNT_TOKENS_BY:
            raise ValueError(f"count_tokens_by must be 'shape' or 'loss_mask', got {count_tokens_by!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.layout = layout
        self.curriculum = curriculum if curriculum is not None and curriculum.enabled else None
        self.scheduler = CurriculumScheduler(self.curriculum) if self.curriculum is not None else None
        top = self.curriculum.max_difficulty if self.curriculum is not None else None
        self.stages = StageTracker(as_stages(stages, pretrain_length=top, warmup=self.scheduler is not None))
        """The stages after the warmup (:mod:`~seqwarm.curriculum.stages`): ``stages.stage``, ``.changed``."""
        self.bucket: int | None = length_bucket if self.scheduler else None
        self.mode = (
            resolve_mode(
                mode, forward, pipeline=pipeline, inject_via_kwargs=inject_via_kwargs, length_bucket=self.bucket
            )
            if self.scheduler or self.stages.stages
            else ("variable" if self.sampler else None)
        )
        if self.bucket is not None and self.mode != "truncate":
            raise ValueError(f"length_bucket works only in curriculum mode truncate, not {self.mode}")
        self.count_tokens_by = count_tokens_by
        budget = {"train_tokens": train_tokens, "train_iters": train_iters, "train_samples": train_samples}
        self.lr_config = lr = with_budget(lr, budget) if lr is not None else None
        self.limits = Limits(train_tokens, train_iters, train_samples)
        self.world_size = world_size
        self.process_group = process_group
        self._output_check = OutputCheck(forward)
        self.model_name = self._output_check.model_name
        self.progress = Progress()
        """Optimizer steps applied, samples and tokens trained (all ranks)."""
        self.lr: float | None = lr_at(self.progress, lr) if lr is not None else None
        """The learning rate of the last applied step (None without an LR config)."""
        self.skipped_steps = 0
        """Steps ended with ``applied=False`` (fp16 overflow): the clock did not move."""
        self.current_seqlen: int | None = None
        """The length of the step in flight (or the last one); the batch's own without a curriculum."""
        self.micro_shape: tuple[int, int] | None = None
        """(rows, length) of the last micro-batch as the model sees it (a pipeline resets on a change)."""
        self.trained_length: int | None = None
        """The longest sequence the model was given in the step in flight (or the last one): the length, or
        less when the batches held shorter sequences (padded to their longest)."""
        self._open = False
        self._step_length: int | None = None
        self._samples = 0
        self._tokens: int | torch.Tensor = 0
        self._totals: tuple[int, int] | None = None  # the open step's global counts, once summed
        self._checked_top = False
        self._injected: tuple[int, int] | None = None  # (rows, length) of the last injected micro-batch

    # -- other constructors -----------------------------------------------------------------------
    @classmethod
    def from_config(
        cls, config: WarmupSettings, forward: Callable | None = None, *, mode: str | None = None, **kwargs: Any
    ) -> SequenceLengthWarmup:
        """From a checked :class:`~seqwarm.config.RunConfig` (or anything with the attributes of
        :class:`~seqwarm.curriculum.run.WarmupSettings`): its curriculum (and mode, unless ``mode`` is given),
        length bucket, token counting, LR, budget and data-parallel size."""
        cur = config.curriculum
        return cls(
            curriculum=cur,
            mode=mode if mode is not None else (cur.mode if cur is not None else None),
            forward=forward,
            length_bucket=config.length_bucket,
            count_tokens_by=config.count_tokens_by,
            lr=config.lr,
            train_tokens=config.train_tokens,
            train_iters=config.train_iters,
            train_samples=config.train_samples,
            world_size=config.world_size,
            stages=getattr(config, "stages", ()),
            **kwargs,
        )

    @classmethod
    def from_deepspeed(
        cls, source: Any, forward: Callable | None = None, *, world_size: int = 1, **kwargs: Any
    ) -> SequenceLengthWarmup:
        """From a DeepSpeed JSON path or dict (either curriculum block, plus the ``seqwarm`` block), checked
        for ``world_size`` data-parallel ranks; one error lists every problem."""
        return cls.from_config(as_run_config(source, world_size), forward, **kwargs)

    # -- the step ---------------------------------------------------------------------------------
    @property
    def step_open(self) -> bool:
        """Whether a step was begun and not ended yet."""
        return self._open

    def begin_step(self) -> int | None:
        """The length of the optimizer step about to run (step ``progress.step + 1``), decided here, once;
        None without a curriculum. Every :meth:`cut` until :meth:`end_step` uses it."""
        if self._open:
            raise RuntimeError(
                "begin_step() called twice: end the step in flight with end_step() first "
                "(applied=False when its update was skipped)"
            )
        self._open = True
        self._totals = None
        self.trained_length = None
        if self.scheduler is not None:  # DeepSpeed's engine called update_difficulty(global_steps + 1)
            self._step_length = self.scheduler.update_difficulty(self.progress.step + 1)
        if (stage := self.stages.begin(self.progress.tokens)) is not None:  # a stage after the warmup
            self._step_length = stage.length
        if self.sampler is not None:  # the sampler's next step: its rows pass through at its length
            self.current_seqlen = self.sampler.begin()
            return self.current_seqlen
        self.current_seqlen = self._step_length if self._step_length is not None else self.current_seqlen
        return self._step_length

    stage = property(lambda self: self.stages.stage, doc="The stage of the step in flight (None: before one).")
    stage_changed = property(lambda self: self.stages.changed, doc=StageTracker.changed_doc)
    positions = property(lambda self: self.stages.positions(), doc=StageTracker.positions.__doc__)

    def _need_open(self, what: str) -> None:
        if not self._open:
            raise RuntimeError(f"{what} outside a step: call begin_step() first (once per optimizer step)")

    def cut(self, batch: Any, *, trim: bool = False) -> Any:
        """One micro-batch of the step in flight, cut to its length, in the form it came in
        (:func:`~seqwarm.curriculum.inputs.as_batch`): a dict (a new one, under the names of ``keys``), a
        tuple or list ``(inputs, targets, ...)`` in the same order, or a tensor; every tensor contiguous (the
        model may ``.view()`` it); the input is not changed. Truncate / reshape (into buckets with a
        ``length_bucket``: :func:`~seqwarm.curriculum.batch.bucket_batch`), or with ``curriculum_seqlen``
        added (inject, dicts only); as it is without a curriculum. Its tokens are counted. Padded and
        padding-free batches (:mod:`~seqwarm.curriculum.layouts`) keep each sequence's first L real tokens,
        and only real tokens are counted.

        ``trim``: in inject mode, also leave out the columns past the length, which the model drops
        itself — what a loop does that copies batches to a device after the cut (only trained columns
        travel); the model still gets ``curriculum_seqlen``."""
        self._need_open("cut()")
        named, back = as_batch(batch, self.keys, inject=self.mode == "inject" and not trim and self.scheduler)
        return back(self._cut(named, trim))

    def _cut(self, batch: Mapping[str, Any], trim: bool) -> dict[str, Any]:
        _, rows, seq = batch_shape(batch)
        length = self._step_length
        layout = read_layout(batch, self.layout, strict=length is not None)
        if length is None:  # no curriculum (or mode variable: the step's rows): the batch as it is, counted
            if self.sampler is not None:
                self.sampler.check_cut(seq)
            self._add(rows, batch, layout)
            self.current_seqlen = seq
            return dict(batch)
        self._check_top(seq, layout)
        check_cut(layout, self.mode, self.bucket is not None, self.model_name)
        if self.mode not in ("truncate", "reshape", "window"):
            out = truncate_batch(batch, length)  # what the model trains on: its first L columns
            self._add(rows, out, layout)
            self._injected = (rows, min(length, seq))
            if not trim:
                return {**batch, "curriculum_seqlen": length}
            self._injected = None  # cut to the length here: the model cannot train at another one
            return {**out, "curriculum_seqlen": length}
        if layout != "dense":
            out = cut_to_layout(batch, length, layout)
            self._add(rows, out, layout)
            return out
        if self.bucket is not None:
            out = bucket_batch(batch, length, self.bucket)
        elif self.mode == "window":
            out = window_batch(batch, length)
        else:
            out = (truncate_batch if self.mode == "truncate" else reshape_batch)(batch, length)
        new_rows, new_len = micro_batch_shape(rows, seq, length, self.mode)
        self._add(rows, out, layout, (new_rows, new_len))
        if self.bucket is not None:  # counted at the length; the model sees the bucket's columns
            self.micro_shape = (new_rows, bucket_length(length, self.bucket, seq))
        return out

    def record(
        self, rows: int, seq: int, loss_mask: torch.Tensor | None = None, *, labels: torch.Tensor | None = None
    ) -> int | None:
        """Count a dense micro-batch of ``rows x seq`` that is not cut here (inject mode with positional
        arguments, or no curriculum), by the same rule as :meth:`cut`: ``loss_mask`` and ``labels`` are its
        full-length tensors (cut to the length here), read by ``count_tokens_by="loss_mask"`` (the mask's
        sum, else the labels that are not -100). Returns the ``curriculum_seqlen`` to pass to the model
        (None: pass nothing)."""
        self._need_open("record()")
        seqlen = self._step_length
        if seqlen is not None:
            self._check_top(seq, "dense")
        length = seq if seqlen is None else min(seqlen, seq)
        given = {"loss_mask": loss_mask, "labels": labels}
        trained = {k: v[:, :length] for k, v in given.items() if isinstance(v, torch.Tensor)}
        self._add(rows, trained, "dense", (rows, length))
        if seqlen is None:
            self.current_seqlen = length
        self._injected = None if seqlen is None else (rows, length)
        return seqlen

    def _check_top(self, full: int, layout: str) -> None:
        self.stages.check_width(full, layout)  # a batch shorter than the stage in flight: ValueError
        top = self.curriculum.max_difficulty if self.curriculum is not None else full
        if self._checked_top or self.stages.stages or layout == "padding_free" or layout != "dense" and full <= top:
            return  # padded batches are as long as their longest sequence: shorter than the top is fine
        self._checked_top, name, grows = True, self._max_name, "never reaches" if top < full else "stops growing at"
        if top != full:
            message = f"curriculum {name} {top} != the batch's sequence length {full}: the curriculum {grows} the "
            warnings.warn(message + f"full length; set {name} to the model's sequence length", stacklevel=5)

    def _add(self, samples: int, out: Mapping[str, Any], layout: str, shape: tuple[int, int] | None = None) -> None:
        """Count a cut micro-batch ``out`` (``samples`` rows drawn) by the one rule,
        :func:`~seqwarm.curriculum.batch.tokens_trained`. ``shape``: (rows, length) to count dense rows at,
        when not the shape of ``out``."""
        rows, width = shape if shape is not None else batch_shape(out)[1:]
        self._tokens = self._tokens + tokens_trained(out, layout, self.count_tokens_by, (rows, width))
        self._samples += samples
        self._totals = None
        self.micro_shape = (rows, width)
        longest = longest_sequence(out, layout) if layout == "padding_free" else width
        self.trained_length = max(self.trained_length or 0, longest)

    def check_output(self, output: Any, shape: tuple[int, int] | None = None) -> None:
        """After an injected training forward: raise ValueError when the model's output is not at the
        length it was given (it ignored ``curriculum_seqlen``: it trained at another length than the
        clock counts). ``shape``: the (rows, length) the model was given (default: those of the last
        injected micro-batch). An output without a sequence dimension (a loss only) cannot be checked:
        said once (a warning unless the forward names ``curriculum_seqlen``). No-op outside inject mode."""
        if shape is None:
            if self._injected is None:
                return
            shape, self._injected = self._injected, None
        self._output_check(output, *shape)

    def _step_totals(self) -> tuple[int, int]:
        """The open step's samples and tokens over all ranks (summed once per step)."""
        if self._totals is None:
            self._totals = global_counts(self._samples, self._tokens, self.world_size, self.process_group)
        return self._totals

    def step_progress(self, *, _caller: str = "step_progress()") -> Progress:
        """The clock once the step in flight is applied (its micro-batches so far counted, over all ranks)."""
        self._need_open(_caller)
        samples, tokens = self._step_totals()
        return advance(self.progress, samples, tokens, self.lr_config or LRConfig())

    def step_lr(self) -> float | None:
        """The learning rate of the step in flight — ``lr_at`` of the clock including it: set it on the
        optimizer after the step's last :meth:`cut`, before ``optimizer.step()`` (None without an LR config)."""
        progress = self.step_progress(_caller="step_lr()")
        return lr_at(progress, self.lr_config) if self.lr_config is not None else None

    def end_step(self, applied: bool = True) -> Progress:
        """Close the step in flight. ``applied``: its update was made, so the clock advances by what was cut
        (summed over ranks) and :attr:`lr` follows; False (an fp16 overflow skip): nothing moves, and the
        next :meth:`begin_step` retries the same step at the same length. Returns the clock."""
        self._need_open("end_step()")
        if applied:
            self.progress = self.step_progress()
            if self.lr_config is not None:
                self.lr = lr_at(self.progress, self.lr_config)
        else:
            self.skipped_steps += 1
        if self.sampler is not None:
            self.sampler.end()
        self._open, self._step_length, self._totals = False, None, None
        self._samples, self._tokens = 0, 0
        return self.progress

    # -- the budget -------------------------------------------------------------------------------
    def stop_reason(self) -> str | None:
        """Why training is over at the current clock (a budget reached), else None."""
        return stop_reason(self.progress, self.limits)

    @property
    def done(self) -> bool:
        """Whether a budget (``train_tokens`` / ``train_iters`` / ``train_samples``) is reached."""
        return self.stop_reason() is not None

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Clock, LR, skipped steps, the schedule's value and a step in flight's length and counts (small,
        plain values)."""
        pending = self._tokens
        return {
            "progress": self.progress.to_dict(),
            "lr": self.lr,
            "skipped_steps": self.skipped_steps,
            "current_seqlen": self.current_seqlen,
            "step_seqlen": self._step_length,
            "pending_samples": self._samples,
            "pending_tokens": int(pending.item()) if isinstance(pending, torch.Tensor) else pending,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            **({"variable": self.sampler.state_dict()} if self.sampler else {}),  # mode variable only
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s keys (other keys of a caller's larger state dict are ignored). A step
        was in flight when the state holds its length or counts (the same keys as before the two-call
        protocol, so older checkpoints load). A state without them (a checkpoint saved without
        ``slw.state_dict()``) is a ValueError naming what is missing."""
        check_saved_state(state)
        self.progress = Progress.from_dict(state["progress"])
        self.lr = None if state.get("lr") is None else float(state["lr"])
        self.skipped_steps = int(state["skipped_steps"])
        self.current_seqlen = state["current_seqlen"]
        self._step_length = state["step_seqlen"]
        self._samples = int(state["pending_samples"])
        self._tokens = int(state["pending_tokens"])
        self._open = self._step_length is not None or self._samples > 0
        self._totals = None
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state.get("variable"))
        self.stages.forget()  # derived from the clock: the next begin_step reports its stage as changed

    def plan(self, batch_size: int, *, micro_batch_size: int | None = None, seq_length: int | None = None) -> Plan:
        """The run ahead of time from these settings, as ``seqwarm plan`` replays a config file
        (:meth:`LoopSettings.of <seqwarm.curriculum.plan.LoopSettings.of>` reads the arguments: sequences per
        optimizer step, per cut, the full length) until the budget is reached (none: until the ramp ends); a
        ConfigError lists every problem of the stages' schedule."""
        if self.sampler is not None:
            raise ValueError("mode 'variable' is planned by seqwarm.curriculum.plan_variable.plan_variable")
        settings = (self.curriculum, self.lr_config, self.limits, batch_size, micro_batch_size, seq_length)
        return make_plan(LoopSettings.of(*settings, self.bucket, self.mode, self.stages.stages))

    def __repr__(self) -> str:
        p, lr, seq = self.progress, "None" if self.lr is None else f"{self.lr:.3g}", self.current_seqlen
        return f"SequenceLengthWarmup(mode={self.mode}, step={p.step}, tokens={p.tokens}, seqlen={seq}, lr={lr})"
