"""What a ``TrainingArguments`` means under the curriculum: batch sizes, optimizer values and the LR schedule.

The curriculum config (a DeepSpeed JSON path or dict) and the Trainer's arguments describe one run, so
each value comes from one of them and the two never silently disagree:

- Batch sizes, clipping, precision and optimizer values the JSON leaves out or sets to ``"auto"`` are the
  Trainer's (as transformers fills a DeepSpeed config). A value set in both must be equal
  (:class:`~seqwarm.util.errors.UserError` listing every difference and its fix), except the peak LR:
  a JSON ``lr`` wins over ``learning_rate`` left at its default (5e-5).
- The LR schedule runs on seqwarm's token clock. When the JSON sets none (no ``seqwarm`` LR key, no
  ``scheduler`` block), it is the Trainer's, mapped where the mapping is exact: peak ``learning_rate``,
  warmup ``warmup_steps`` (or the ratio of the run's steps), and ``lr_scheduler_type`` ``linear`` /
  ``cosine`` / ``cosine_with_min_lr`` (decay over the run's optimizer steps to 0, or to the min LR),
  ``constant`` (no warmup, as in transformers) or ``constant_with_warmup``. Other types have no such
  mapping and are refused. When the JSON sets a schedule, ``lr_scheduler_type`` and ``warmup_steps``
  must be left at their defaults.
- One deliberate difference, said at the start of the run: seqwarm sets the LR of a step before its
  optimizer step, from the clock including that step, so step k trains at the LR transformers' scheduler
  gives step k + 1 (warmup's first step is not at LR 0, and the decay ends one step sooner).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from seqwarm.config import RunConfig, load_config
from seqwarm.config.reader import read_config_dict, without_seqwarm_blocks
from seqwarm.config.settings import keys_in_group
from seqwarm.util.errors import UserError

__all__ = ["curriculum_config_for", "lr_settings_for", "raw_config", "trainer_deepspeed_config"]

LR_KEYS = keys_in_group("lr")
"""The ``seqwarm`` block's LR keys (``lr``, ``min_lr``, ``lr_decay_style``, ``lr_warmup_iters`` ...)."""
DEFAULT_LR = 5e-5
"""``TrainingArguments.learning_rate``'s default."""
SCHEDULE_TYPES = ("linear", "cosine", "cosine_with_min_lr", "constant", "constant_with_warmup")
"""The ``lr_scheduler_type`` values with an exact token-clock mapping."""
SCHEDULE_DEFAULTS = {"lr_scheduler_type": "linear", "warmup_steps": 0, "warmup_ratio": 0.0}
"""The TrainingArguments of the schedule, at their defaults (``warmup_ratio``: transformers 4 only)."""
OPTIMIZER_ARGS = {"betas": ("adam_beta1", "adam_beta2"), "eps": ("adam_epsilon",), "weight_decay": ("weight_decay",)}


def raw_config(source: Any) -> dict[str, Any]:
    """A config dict from a dict or JSON path (a new dict)."""
    if not isinstance(source, (Mapping, str, os.PathLike)):
        raise TypeError(f"config must be a RunConfig, a dict or a JSON path, got {type(source).__name__}")
    return read_config_dict(source)[0]


def trainer_deepspeed_config(source: Any) -> dict[str, Any]:
    """The DeepSpeed config for ``TrainingArguments(deepspeed=...)``: the user's (dict or JSON path)
    without the keys seqwarm handles (``curriculum_learning``, the ``seqwarm`` block, the curriculum
    of ``data_efficiency``, the ``scheduler``) and with the optimizer's ``lr`` left to the Trainer
    (``"auto"``: seqwarm's clock sets every step's LR); other ``"auto"`` values stay, for the Trainer."""
    ds = without_seqwarm_blocks(raw_config(source))
    ds.pop("scheduler", None)  # seqwarm's clock sets the LR; a DeepSpeed scheduler would fight it
    params = ds.get("optimizer", {}).get("params") if isinstance(ds.get("optimizer"), dict) else None
    if isinstance(params, dict) and "lr" in params:
        params["lr"] = "auto"
    return ds


def _optimizer_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    opt = raw.get("optimizer")
    params = opt.get("params") if isinstance(opt, dict) else None
    return params if isinstance(params, dict) else {}


def _schedule_keys(raw: Mapping[str, Any]) -> list[str]:
    """The JSON keys that set the LR schedule (the peak aside)."""
    block = raw.get("seqwarm") if isinstance(raw.get("seqwarm"), dict) else {}
    keys = [f"seqwarm.{k}" for k in LR_KEYS if k in block and k != "lr"]
    return keys + (["scheduler"] if raw.get("scheduler") is not None else [])


def _json_peak(raw: Mapping[str, Any]) -> tuple[float, str] | None:
    block = raw.get("seqwarm") if isinstance(raw.get("seqwarm"), dict) else {}
    for value, where in ((block.get("lr"), "seqwarm.lr"), (_optimizer_params(raw).get("lr"), "optimizer.params.lr")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), where
    return None


def _check_against_args(raw: Mapping[str, Any], args: Any) -> None:
    """Every value set in both the JSON and ``args`` agrees (one UserError lists every difference)."""
    problems = []
    params = _optimizer_params(raw)
    for key, names in OPTIMIZER_ARGS.items():
        value = params.get(key)
        if value is None or value == "auto":
            continue
        ours = [getattr(args, n) for n in names]
        theirs = list(value) if isinstance(value, (list, tuple)) else [value]
        if [float(v) for v in theirs] != [float(v) for v in ours]:
            problems.append(
                f"optimizer.params.{key} = {value} but TrainingArguments {', '.join(names)} = "
                f"{', '.join(map(str, ours))} (the Trainer's optimizer uses the TrainingArguments)"
            )
    peak = _json_peak(raw)
    if peak is not None and args.learning_rate not in (peak[0], DEFAULT_LR):
        problems.append(f"{peak[1]} = {peak[0]:g} but TrainingArguments learning_rate = {args.learning_rate:g}")
    schedule = _schedule_keys(raw)
    if schedule:
        given = {name: _plain(getattr(args, name, default)) for name, default in SCHEDULE_DEFAULTS.items()}
        set_args = [f"{name} = {value!r}" for name, value in given.items() if value != SCHEDULE_DEFAULTS[name]]
        if set_args:
            problems.append(
                f"the curriculum config sets the LR schedule ({', '.join(schedule)}) and TrainingArguments sets "
                f"{', '.join(set_args)}"
            )
    else:
        kind = _scheduler_type(args)
        if kind not in SCHEDULE_TYPES:
            problems.append(
                f"TrainingArguments lr_scheduler_type = {kind!r} has no exact equivalent on seqwarm's token "
                f"clock (mapped: {', '.join(SCHEDULE_TYPES)})"
            )
    if problems:
        raise UserError(
            "the curriculum config and the TrainingArguments disagree: "
            + "; ".join(problems)
            + '. Set each value in one place ("auto" or left out of the JSON takes the TrainingArguments\'), or '
            "make them equal"
        )


def _plain(value: Any) -> Any:
    """An enum's value (``SchedulerType.COSINE`` -> ``"cosine"``), anything else as it is."""
    return getattr(value, "value", value)


def _scheduler_type(args: Any) -> str:
    return str(_plain(getattr(args, "lr_scheduler_type", "linear")))


def _warmup_steps(args: Any, num_training_steps: int) -> int:
    if hasattr(args, "get_warmup_steps"):
        return int(args.get_warmup_steps(num_training_steps))
    steps = getattr(args, "warmup_steps", 0) or 0
    return int(steps) if steps >= 1 else math.ceil(num_training_steps * steps)


def lr_settings_for(raw: Mapping[str, Any], args: Any, num_training_steps: int) -> tuple[dict[str, Any], str | None]:
    """The ``seqwarm`` LR settings that make the Trainer's schedule (for a run of ``num_training_steps``
    optimizer steps) the token clock's, and the line to say at the start (what was mapped, and the one
    step it runs ahead). When the JSON sets the schedule itself: at most the peak (from
    ``learning_rate`` when the JSON has none), and no line."""
    peak = _json_peak(raw)
    lr = peak[0] if peak is not None else float(args.learning_rate)
    source = peak[1] if peak is not None else "TrainingArguments learning_rate"
    if _schedule_keys(raw):
        return ({} if peak is not None else {"lr": lr}), None  # the config's schedule, as written: nothing to say
    kind = _scheduler_type(args)
    warmup = 0 if kind == "constant" else _warmup_steps(args, num_training_steps)  # transformers: no warmup
    out: dict[str, Any] = {"lr": lr, "min_lr": 0.0}
    shape = "constant"
    if kind in ("linear", "cosine", "cosine_with_min_lr") and num_training_steps > warmup:
        out.update(lr_decay_style="linear" if kind == "linear" else "cosine", lr_decay_iters=num_training_steps)
        if kind == "cosine_with_min_lr":
            extra = dict(getattr(args, "lr_scheduler_kwargs", None) or {})
            out["min_lr"] = float(extra["min_lr"]) if "min_lr" in extra else lr * float(extra.get("min_lr_rate", 0))
        shape = f"{out['lr_decay_style']} decay to {out['min_lr']:g} at step {num_training_steps}"
    else:
        out["lr_decay_style"] = "constant"
    if warmup:
        out["lr_warmup_iters"] = warmup
    return out, (
        f"the LR from the TrainingArguments: peak {lr:g} ({source}), warmup {warmup} steps, {shape} "
        f"(lr_scheduler_type {kind!r}) on seqwarm's clock: step k trains at the LR transformers would give "
        "step k + 1 (the LR is set before each optimizer step)"
    )


def curriculum_config_for(source: Any, args: Any, num_training_steps: int | None = None) -> RunConfig:
    """The checked :class:`RunConfig` of ``source`` (dict / JSON path / RunConfig) for the Trainer's
    ``args``: batch keys, clipping and optimizer values missing or ``"auto"`` are the Trainer's; values
    set in both must agree (a :class:`UserError` says which differ). With ``num_training_steps``, the LR
    schedule is the Trainer's where the JSON sets none (:func:`lr_settings_for`). A RunConfig is used as
    it is."""
    if isinstance(source, RunConfig):
        cfg = source
    else:
        raw = raw_config(source)
        _check_against_args(raw, args)
        fill = {
            "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "train_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
        }
        for key, value in fill.items():  # a missing train_batch_size follows from the other two
            if raw.get(key, "auto" if key != "train_batch_size" else None) == "auto":
                raw[key] = value
        if raw.get("gradient_clipping") == "auto":
            raw["gradient_clipping"] = args.max_grad_norm
        params = _optimizer_params(raw)
        hf = {
            "lr": args.learning_rate,
            "betas": [args.adam_beta1, args.adam_beta2],
            "eps": args.adam_epsilon,
            "weight_decay": args.weight_decay,
        }
        for key, value in hf.items():
            if params.get(key) == "auto":
                params[key] = value
        for name in ("fp16", "bf16"):
            if isinstance(raw.get(name), dict) and raw[name].get("enabled") == "auto":
                raw[name]["enabled"] = bool(getattr(args, name, False))
        if num_training_steps is not None:
            block = raw.setdefault("seqwarm", {})
            block.update(lr_settings_for(raw, args, num_training_steps)[0])
        cfg = load_config(raw, world_size=args.world_size)
    ours = {
        "per_device_train_batch_size": (cfg.micro_batch_size, args.per_device_train_batch_size),
        "gradient_accumulation_steps": (cfg.gradient_accumulation_steps, args.gradient_accumulation_steps),
        "world_size": (cfg.world_size, args.world_size),
    }
    diff = [f"{k}: curriculum config {a}, TrainingArguments {b}" for k, (a, b) in ours.items() if a != b]
    if diff:
        raise UserError(
            "the curriculum config's batch sizes differ from the Trainer's ("
            + "; ".join(diff)
            + "): set them to 'auto' or leave them out of the config, or make them equal"
        )
    return cfg
