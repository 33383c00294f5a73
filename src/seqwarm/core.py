"""CurriculumCore: the curriculum wiring every engine shares, over the pure ops and schedules.

Composer's ``SeqLengthWarmup`` is a thin class over a functional op; this is the same split. The
ops (:func:`~seqwarm.batch.truncate_batch`, :func:`~seqwarm.batch.reshape_batch`), the schedule
(:func:`~seqwarm.curriculum.difficulty_at`), the clock (:func:`~seqwarm.budget.advance`) and the LR
(:func:`~seqwarm.lr_schedule.lr_at`) stay pure; the core adds only what needs state:

- which mode delivers the length (truncate | reshape | inject; auto = inject when the model's
  forward has a parameter named ``curriculum_seqlen``, else truncate; ``**kwargs`` does not count
  without ``inject_via_kwargs=True``; a pipeline cannot inject), and, in inject mode, that the
  model's output is at the length it was given (:meth:`CurriculumCore.check_output`);
- the length, decided once per optimizer step: the first micro-batch of step ``n + 1`` calls
  ``scheduler.update_difficulty(n + 1)``, the later micro-batches of that step reuse the value;
- the samples and tokens of the step being accumulated (tokens by the shaped shape, via
  :func:`~seqwarm.budget.micro_batch_shape`, or by loss-mask sums, summed over the process group
  it is given), and the clock they advance.

:class:`~seqwarm.engine.CurriculumEngine` and :class:`~seqwarm.integrations.deepspeed.DeepSpeedCurriculum`
are built on it; anyone's loop can be too::

    core = CurriculumCore(cfg, model.forward)
    for i, batch in enumerate(loader):           # full-length micro-batches
        model(**core.shape(batch)).backward()
        if (i + 1) % cfg.gradient_accumulation_steps == 0:
            progress, lr = core.end_step()       # this step's counts, summed over ranks
            set_lr(optimizer, lr)
            optimizer.step()
            optimizer.zero_grad()
            core.commit(progress, lr)            # or core.skip() when the update was not applied
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from seqwarm.batch import batch_shape, bucket_batch, bucket_length, reshape_batch, truncate_batch
from seqwarm.budget import Progress, advance, micro_batch_shape
from seqwarm.config import RunConfig, load_config
from seqwarm.curriculum import CurriculumScheduler
from seqwarm.lr_schedule import lr_at

__all__ = ["MODES", "CurriculumCore", "as_run_config", "check_state_format", "output_length", "resolve_mode",
           "set_lr"]

logger = logging.getLogger(__name__)

MODES = ("truncate", "reshape", "inject")
COUNT_TOKENS_BY = ("shape", "loss_mask")


def as_run_config(config: Any, world_size: int) -> RunConfig:
    """``config`` itself when a :class:`RunConfig`, else a DeepSpeed-style dict / JSON path checked with
    :func:`~seqwarm.config.load_config` for ``world_size`` data-parallel ranks."""
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, (Mapping, str, os.PathLike)):
        return load_config(config, world_size=world_size)
    raise TypeError(f"config must be a RunConfig, a dict or a path, got {type(config).__name__}")


def _forward_name(forward: Callable) -> str:
    owner = getattr(forward, "__self__", None)
    return f"{type(owner).__name__}.forward" if owner is not None else getattr(forward, "__qualname__", "forward")


def _describe_forward(forward: Callable, signature: inspect.Signature) -> str:
    text = f"{_forward_name(forward)}{signature}"
    return text if len(text) <= 160 else f"{_forward_name(forward)}(...)"


def resolve_mode(mode: str | None, forward: Callable | None, *, pipeline: bool = False,
                 inject_via_kwargs: bool = False) -> str:
    """The mode that delivers the length: ``mode`` checked against the model, or chosen (None / "auto").

    auto: inject when ``forward`` has a parameter named ``curriculum_seqlen``, else truncate. An
    explicit inject needs that named parameter: a ``**kwargs`` forward (every Hugging Face model)
    would swallow the keyword and train at full length while the clock counts the short length.
    ``inject_via_kwargs=True`` is the opt-in for a forward that does read ``curriculum_seqlen`` from
    its ``**kwargs`` (DeepSpeed's legacy test models): such a forward then counts as taking it. A
    pipeline engine (``pipeline=True``; ``forward`` is not read) cannot pass keyword arguments
    through its stages: truncate by default.
    """
    if mode == "auto":
        mode = None
    if mode is not None and mode not in MODES:
        raise ValueError(f"curriculum mode must be one of {MODES} or None (auto), got {mode!r}")
    if pipeline:
        if mode == "inject":
            raise ValueError("a pipeline engine cannot pass curriculum_seqlen through its stages: use mode "
                             "'truncate' (the same cut, made on the data) or 'reshape'")
        return mode or "truncate"
    if forward is None:
        raise ValueError("resolving the curriculum mode needs the model's forward")
    signature = inspect.signature(forward)
    params = signature.parameters
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    takes = "curriculum_seqlen" in params or (inject_via_kwargs and open_kwargs)
    if mode is None:
        return "inject" if takes else "truncate"
    if mode == "inject" and not takes:
        why = (" (its **kwargs would swallow the keyword: the model would train at full length while the "
               "clock counts the short one)" if open_kwargs else "")
        optin = ("; if that forward does read curriculum_seqlen from **kwargs, pass inject_via_kwargs=True"
                 if open_kwargs and not inject_via_kwargs else "")
        raise ValueError(
            f"curriculum mode 'inject' needs a model whose forward takes curriculum_seqlen; "
            f"{_describe_forward(forward, signature)} has no such parameter{why}. "
            f"Use mode 'truncate' or 'reshape' (the batch is then cut before the model sees it){optin}."
        )
    return mode


def output_length(output: Any, rows: int) -> int | None:
    """The sequence length of a model output: logits ``(B, T, V)`` (a tensor, an object with
    ``.logits`` or a dict with "logits"), per-token values ``(B, T)``, or the first such tensor of a
    tuple; None when the output is only a loss (nothing to read a length from)."""
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    candidates = [logits] if logits is not None else list(output) if isinstance(output, (tuple, list)) else [output]
    for t in candidates:
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] == rows:
            return int(t.shape[1])
    return None


def _no_seam_inside(rows: int, full: int, seqlen: int) -> bool:
    """Whether reshaping ``rows x full`` into rows of ``seqlen`` puts no sample boundary inside a kept row
    (then reshape's restarted ``arange`` positions are ``arange`` per new row)."""
    if seqlen >= full:
        return True
    kept = rows * full // seqlen * seqlen
    return all((k * full) % seqlen == 0 for k in range(1, rows) if k * full < kept)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every param group gets ``lr * group.get("lr_scale", 1.0)`` (seqwarm owns the learning rate)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def check_state_format(state: Mapping[str, Any], expected: str, owner: str) -> None:
    """Raise ValueError unless ``state["format"]`` is ``expected`` (a state dict of ``owner``)."""
    if state.get("format") != expected:
        raise ValueError(f"not a {owner} state dict (format {state.get('format')!r}, expected {expected!r})")


class CurriculumCore:
    """The curriculum length, shaping, token counting and clock of one training run.

    ``config``: the checked :class:`RunConfig` (its ``curriculum``, ``count_tokens_by``,
    ``world_size`` = data-parallel ranks, ``lr``). ``forward``: the model's forward (its signature
    picks the mode); not read for a ``pipeline``. ``mode``: overrides the config's curriculum mode.
    ``process_group``: where loss-mask token counts are summed (None: the default group); give the
    data-parallel group when the default group also spans pipeline or tensor-parallel ranks.
    ``inject_via_kwargs``: let inject mode pass the length to a forward that reads it from
    ``**kwargs`` (see :func:`resolve_mode`). With the config's ``length_bucket`` the mode is truncate
    (auto picks it; another mode is a ValueError) and batches are cut into buckets.
    """

    def __init__(self, config: RunConfig, forward: Callable | None = None, *, mode: str | None = None,
                 pipeline: bool = False, process_group: Any = None, inject_via_kwargs: bool = False):
        if config.count_tokens_by not in COUNT_TOKENS_BY:
            raise ValueError(f"count_tokens_by must be 'shape' or 'loss_mask', got {config.count_tokens_by!r}")
        self.config = config
        cur = config.curriculum
        self.scheduler = CurriculumScheduler(cur) if cur is not None and cur.enabled else None
        chosen = mode if mode is not None else (cur.mode if cur is not None else None)
        self.bucket: int | None = config.length_bucket if self.scheduler else None
        if self.bucket is not None and chosen in (None, "auto"):
            chosen = "truncate"  # the cut is made on the data, into buckets; never injected
        self.mode = (resolve_mode(chosen, forward, pipeline=pipeline, inject_via_kwargs=inject_via_kwargs)
                     if self.scheduler else None)
        if self.bucket is not None and self.mode != "truncate":
            raise ValueError(f"length_bucket works only in curriculum mode truncate, not {self.mode}")
        self.model_name = _forward_name(forward).removesuffix(".forward") if forward is not None else "the model"
        # a forward that names curriculum_seqlen declares it reads it; one reached via **kwargs does not
        self._declares_seqlen = forward is not None and "curriculum_seqlen" in inspect.signature(forward).parameters
        self.process_group = process_group
        self.progress = Progress()
        self.lr = lr_at(self.progress, config.lr)
        self.skipped_steps = 0
        self.current_seqlen: int | None = None
        self.micro_shape: tuple[int, int] | None = None  # (rows, length) of the last training micro-batch
        self._step_seqlen: int | None = None
        self._pending_samples = 0
        self._pending_tokens: int | torch.Tensor = 0
        self._checked_length = False
        self._warned_unchecked = False
        self._injected: tuple[int, int] | None = None  # (rows, length) of the last injected micro-batch
        self._full: int | None = None  # the data's full length, when batches come cut ahead (feed_plan)

    # -- per micro-batch --------------------------------------------------------------------------
    def seqlen(self, full: int) -> int | None:
        """This optimizer step's length (None without a curriculum), latched at its first micro-batch;
        ``full`` is the batch's sequence length (checked once against ``max_difficulty``, unless
        :meth:`expect_full_length` named the data's)."""
        if self.scheduler is None:
            return None
        if self._step_seqlen is None:  # first micro-batch of optimizer step progress.step + 1
            self._step_seqlen = self.scheduler.update_difficulty(self.progress.step + 1)
        if not self._checked_length:
            self._check_top(full, stacklevel=6)
        if self._full is not None and full < min(self._step_seqlen, self._full):
            raise RuntimeError(f"a micro-batch of step {self.progress.step + 1} came cut to {full} columns, "
                               f"fewer than the step's length {self._step_seqlen}: it was cut ahead for "
                               "another step (each optimizer step must take gradient_accumulation_steps batches)")
        return self._step_seqlen

    def _check_top(self, full: int, stacklevel: int) -> None:
        self._checked_length = True
        top = self.scheduler.block["max_difficulty"] if self.scheduler else full
        if top != full:
            warnings.warn(
                f"curriculum max_difficulty {top} != the batch's sequence length {full}: the "
                f"curriculum {'never reaches' if top < full else 'stops growing at'} the full "
                "length; set max_difficulty to the model's sequence length", stacklevel=stacklevel)

    # -- ahead of the micro-batches: what the device needs of them --------------------------------
    def expect_full_length(self, full: int) -> None:
        """The data's full length, for a loop that hands the core micro-batches already cut to
        :meth:`feed_plan`'s columns: checked against ``max_difficulty`` now (not against the cut
        batches), and a batch cut shorter than its step's length is an error from now on."""
        self._full = int(full)
        if self.scheduler is not None and not self._checked_length:
            self._check_top(self._full, stacklevel=3)

    def lengths_at(self, steps: Sequence[int]) -> list[int] | None:
        """The lengths optimizer steps ``steps`` (ascending, from the next one on) would train at, from
        the scheduler's current value; nothing changes. None without a curriculum, or for a custom
        schedule (its function is not called ahead of its step)."""
        if self.scheduler is None or self.scheduler.config.schedule_type == "custom":
            return None
        top, current, out = self.scheduler.block["max_difficulty"], self.scheduler.get_current_difficulty(), []
        for step in steps:  # update_difficulty's rule: the value moves only while below max_difficulty
            if current < top:
                current = self.scheduler.get_difficulty(step)
            out.append(current)
        return out

    def feed_plan(self, rows: int, full: int, steps: Sequence[int]) -> tuple[int, frozenset[str]]:
        """What :meth:`shape` needs of a full-length ``rows x full`` micro-batch of one of ``steps``
        (candidates: the loop may not know yet whether a step is retried after an fp16 skip).

        Returns its first ``columns`` columns (truncate and inject cut a prefix: the longest of the
        steps' lengths suffices, rounded up to the ``length_bucket``, and the result is the same;
        reshape re-chunks the whole row, and without a curriculum every column trains), and the keys
        that may be left out of it when trivial:
        ``loss_mask`` (all ones) unless tokens are counted by it, and ``position_ids`` (``arange``
        rows) unless reshape would rewrite them into something else — it restarts them at the seam
        between two samples, which the model's default ``arange`` per row does not when that seam
        falls inside a row.
        """
        droppable = set() if self.config.count_tokens_by == "loss_mask" else {"loss_mask"}
        lengths = self.lengths_at(steps) if self.mode is not None else None
        columns = full
        if lengths and self.mode in ("truncate", "inject"):
            columns = bucket_length(max(lengths), self.bucket or 1, full)
        if self.mode != "reshape" or (lengths and all(_no_seam_inside(rows, full, n) for n in lengths)):
            droppable.add("position_ids")
        return columns, frozenset(droppable)

    def observe(self, rows: int, seq: int, loss_mask: torch.Tensor | None = None) -> int | None:
        """A training micro-batch of ``rows x seq`` that is not cut here (inject mode, or no
        curriculum): latch the length and count it (``loss_mask`` cut to the length). Returns the
        ``curriculum_seqlen`` to pass to the model (None: pass nothing)."""
        seqlen = self.seqlen(seq)
        length = seq if seqlen is None else min(seqlen, seq)
        self._count(rows, rows, length, None if loss_mask is None else loss_mask[:, :length])
        self.current_seqlen = length if seqlen is None else seqlen
        self._injected = None if seqlen is None else (rows, length)
        return seqlen

    def check_output(self, output: Any, shape: tuple[int, int] | None = None) -> None:
        """After an injected training forward: raise ValueError when the model's output is not at the
        length it was given (it ignored ``curriculum_seqlen``: it trained at another length than the
        clock counts). ``shape``: the (rows, length) the model was given (default: those of the last
        :meth:`observe`). An output without a sequence dimension (a loss only) cannot be checked: a
        warning says so, once. No-op outside inject mode."""
        if shape is None:
            if self._injected is None:
                return
            shape, self._injected = self._injected, None
        rows, length = shape
        got = output_length(output, rows)
        if got is None:
            if not self._warned_unchecked:
                self._warned_unchecked = True
                msg = (f"{self.model_name} returned only a loss: seqwarm cannot check that it trains at the "
                       f"curriculum_seqlen it is given ({length}); make sure its forward cuts its inputs to "
                       "it, or use curriculum mode 'truncate'")
                if self._declares_seqlen:  # its signature names the keyword: say it, quietly
                    logger.info(msg)
                else:  # reached through **kwargs (inject_via_kwargs): nothing vouches for it
                    warnings.warn(msg, stacklevel=3)
        elif got != length:
            raise ValueError(
                f"{self.model_name} was given curriculum_seqlen={length} but returned outputs of length "
                f"{got}: it ignores the keyword, so it trained at {got} while the clock counts {length}. "
                "Use curriculum mode 'truncate' or 'reshape' (seqwarm cuts the batch itself)")

    def shape(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A dict micro-batch at this step's length: cut (truncate / reshape; with a ``length_bucket``, cut
        to the bucket and the loss masked past the length: :func:`~seqwarm.batch.bucket_batch`) or with
        ``curriculum_seqlen`` added (inject); unchanged without a curriculum. Counts it at the length."""
        batch = dict(batch)
        _, b, s = batch_shape(batch)
        mask = batch.get("loss_mask")
        mask = mask if isinstance(mask, torch.Tensor) else None
        if self.mode not in ("truncate", "reshape"):
            seqlen = self.observe(b, s, mask)
            return batch if seqlen is None else {**batch, "curriculum_seqlen": seqlen}
        seqlen = self.seqlen(s)
        if self.bucket is not None:
            out = bucket_batch(batch, seqlen, self.bucket)
        else:
            out = (truncate_batch if self.mode == "truncate" else reshape_batch)(batch, seqlen)
        rows, length = micro_batch_shape(b, s, seqlen, self.mode)
        self._count(b, rows, length, out.get("loss_mask") if mask is not None else None)
        if self.bucket is not None:  # counted at the length; the batch the model sees is the bucket's
            self.micro_shape = (rows, bucket_length(seqlen, self.bucket, s))
        self.current_seqlen = seqlen
        return out

    def _count(self, samples: int, rows: int, length: int, loss_mask: torch.Tensor | None) -> None:
        if self.config.count_tokens_by == "loss_mask":
            if loss_mask is None:
                raise ValueError("count_tokens_by 'loss_mask' needs a loss_mask tensor in every training batch")
            self._pending_tokens = self._pending_tokens + loss_mask.detach().sum(dtype=torch.int64)
        else:
            self._pending_tokens += rows * length
        self._pending_samples += samples
        self.micro_shape = (rows, length)

    # -- per optimizer step -----------------------------------------------------------------------
    def end_step(self) -> tuple[Progress, float]:
        """At an optimizer-step boundary: the clock after this step and its learning rate.

        The step's samples and tokens are global: shape counts x ``world_size`` (every rank has the
        same shapes), loss-mask counts summed over the process group (x ``world_size`` when
        torch.distributed is not initialised). The next micro-batch starts a new step (a new length).
        Nothing is committed: :meth:`commit` once the update is applied, or :meth:`skip`.
        """
        samples, tokens = self._take_pending()
        self._step_seqlen = None
        new = advance(self.progress, samples, tokens, self.config.lr)
        return new, lr_at(new, self.config.lr)

    def commit(self, progress: Progress, lr: float) -> None:
        """The step from :meth:`end_step` was applied: the clock and LR move on."""
        self.progress, self.lr = progress, lr

    def skip(self) -> None:
        """The step from :meth:`end_step` was not applied (fp16 overflow): nothing moves; it is retried."""
        self.skipped_steps += 1

    def _take_pending(self) -> tuple[int, int]:
        samples, tokens = self._pending_samples, self._pending_tokens
        self._pending_samples, self._pending_tokens = 0, 0
        world = self.config.world_size
        if isinstance(tokens, torch.Tensor):  # loss masks differ between ranks: sum them exactly
            dist = torch.distributed
            if world > 1 and dist.is_available() and dist.is_initialized():
                dist.all_reduce(tokens, group=self.process_group)
                return samples * world, int(tokens.item())
            tokens = int(tokens.item())
        return samples * world, tokens * world

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Clock, LR, skipped steps, scheduler value, this step's length and pending counts (small)."""
        pending = self._pending_tokens
        return {
            "progress": self.progress.to_dict(),
            "lr": self.lr,
            "skipped_steps": self.skipped_steps,
            "current_seqlen": self.current_seqlen,
            "step_seqlen": self._step_seqlen,
            "pending_samples": self._pending_samples,
            "pending_tokens": int(pending.item()) if isinstance(pending, torch.Tensor) else pending,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s keys (other keys of a caller's larger state dict are ignored)."""
        self.progress = Progress.from_dict(state["progress"])
        self.lr = float(state["lr"])
        self.skipped_steps = int(state["skipped_steps"])
        self.current_seqlen = state["current_seqlen"]
        self._step_seqlen = state["step_seqlen"]
        self._pending_samples = int(state["pending_samples"])
        self._pending_tokens = int(state["pending_tokens"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    def __repr__(self) -> str:
        return (f"CurriculumCore(mode={self.mode}, step={self.progress.step}, tokens={self.progress.tokens}, "
                f"seqlen={self.current_seqlen}, lr={self.lr:.3g})")
