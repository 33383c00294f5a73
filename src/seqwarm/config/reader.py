"""The DeepSpeed JSON dialect reader: ``load_config`` (legacy and data_efficiency curriculum forms) plus
seqwarm settings.

``load_config(path_or_dict, overrides=..., world_size=...)`` reads a DeepSpeed config verbatim, checks
everything, and returns a frozen :class:`~seqwarm.config.run.RunConfig`. Every problem is collected and
raised at once as one :class:`~seqwarm.util.problems.ConfigError` whose ``.problems`` name the key path, the
value, the rule and the fix. Tutorial advice (multiples of 8/16, ...) becomes ``RunConfig.warnings``,
never an error.

This module reads the file (:func:`read_config_dict`), checks the top-level keys, merges the ``"seqwarm"``
block with the overrides (saying where each setting came from), hands each block to its check in
:mod:`seqwarm.config.blocks` (curriculum, batch sizes, optimizer, precision, scheduler mapping, LR), applies
the rules that span blocks (one curriculum, its length against ``seq_length``, the length bucket, clipping
from ``max_grad_norm``) and builds the RunConfig. The curriculum block's field checks belong to
:mod:`seqwarm.curriculum.checks`, the LR settings' to :mod:`seqwarm.curriculum.lr`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seqwarm.config.blocks import (
    Given,
    Settings,
    apply_adam_overrides,
    check_batch_sizes,
    check_lr,
    check_optimizer,
    check_precision,
    is_megatron_run,
    megatron_optimizer,
    read_data_efficiency_curriculum,
    read_legacy_curriculum,
    scheduler_settings,
)
from seqwarm.config.run import COUNT_TOKENS_BY, RunConfig
from seqwarm.config.settings import SETTING_KEYS, flag_for, keys_in_group, keys_of_kind
from seqwarm.config.variable import read_variable
from seqwarm.curriculum.schedule import CURRICULUM_MODES
from seqwarm.curriculum.stages import StageConfig, check_stages
from seqwarm.util.problems import Checker, ConfigError, Problem, raise_if_problems, suggest

# The optional top-level "seqwarm" block and the CLI overrides share the keys of the settings table.
SEQWARM_KEYS = SETTING_KEYS
# The whole-number settings checked up front (the LR ones are checked with the LR, in blocks.check_lr).
_INT_KEYS = tuple(k for k in keys_of_kind("count") if k not in keys_in_group("lr"))
_BUDGET_KEYS = keys_in_group("budget")

APPLIED_DS_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "optimizer",
    "gradient_clipping",
    "fp16",
    "bf16",
)
"""DeepSpeed top-level keys whose values seqwarm's own engine applies (the rest pass through to DeepSpeed)."""
TRACKER_DS_KEYS = ("tensorboard", "wandb", "csv_monitor")
"""DeepSpeed's monitor blocks: seqwarm's trackers log them in every engine (:mod:`seqwarm.trainer.trackers`)."""
# The top-level keys seqwarm itself reads: a near miss of one of them is an error, not a warning.
_READ_TOP_KEYS = (*APPLIED_DS_KEYS, "scheduler", "curriculum_learning", "data_efficiency", "seqwarm")
# Top-level keys of DeepSpeed configs, for "did you mean" on likely typos (other keys pass through).
_DS_TOP_KEYS = (
    *_READ_TOP_KEYS,
    "steps_per_print",
    "amp",
    "zero_optimization",
    "wall_clock_breakdown",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
    "zero_allow_untested_optimizer",
    "communication_data_type",
    "pipeline",
    "checkpoint",
    "dump_state",
    "elasticity",
    "compression_training",
    "aio",
    "memory_breakdown",
    "torch_autocast",
)


# --------------------------------------------------------------------------------------------------
# the whole config


MAX_DEPTH = 32
"""Deepest nesting of objects/lists a config may have (DeepSpeed's own use 4 levels)."""
MAX_INT = 10**18
"""Largest integer a config may hold: larger ones are typos, and would overflow float arithmetic."""


def _absurd(raw: Any, where: str = "", depth: int = 0) -> Problem | None:
    """The first value nested deeper than MAX_DEPTH or an integer beyond MAX_INT, as a Problem."""
    if depth > MAX_DEPTH:
        return Problem(
            where or "(top level)",
            "...",
            f"nested more than {MAX_DEPTH} levels deep",
            "a seqwarm/DeepSpeed config is a few levels of objects; check the file",
        )
    if isinstance(raw, Mapping):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in raw.items())
    elif isinstance(raw, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(raw))
    else:
        if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) > MAX_INT:
            return Problem(
                where,
                f"an integer of {len(str(abs(raw)))} digits",
                f"is larger than {MAX_INT:.0e}",
                "give a realistic value (budgets and sizes fit in 18 digits)",
            )
        return None
    for key, value in items:
        found = _absurd(value, key, depth + 1)
        if found:
            return found
    return None


def read_config_dict(source: Any) -> tuple[dict[str, Any], str | None]:
    """A config as a new dict, and the file it came from (None for a mapping): the one reader of seqwarm's
    JSON configs. A missing, unreadable or invalid file is a :class:`ConfigError` that says where."""
    if isinstance(source, Mapping):
        found = _absurd(source)
        if found:
            raise ConfigError([found])
        return copy.deepcopy(dict(source)), None
    if isinstance(source, RunConfig):
        raise TypeError("load_config() got a RunConfig; it is already loaded")
    path = Path(os.fspath(source))
    name = str(path)
    if not path.exists():
        raise ConfigError(
            [
                Problem(
                    name,
                    str(path),
                    "config file not found",
                    "check the path (relative paths start from the current directory)",
                )
            ]
        )
    if path.is_dir():
        raise ConfigError([Problem(name, str(path), "is a folder, not a config file", "pass the JSON file inside it")])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(
            [Problem(name, str(path), f"cannot be read ({err})", "check its permissions and that it is UTF-8 JSON")]
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        line = text.splitlines()[err.lineno - 1] if 0 < err.lineno <= len(text.splitlines()) else ""
        raise ConfigError(
            [
                Problem(
                    f"{name}:{err.lineno}:{err.colno}",
                    line.strip(),
                    f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}",
                    "fix the JSON syntax there (trailing commas, comments and single quotes are not JSON)",
                )
            ]
        ) from None
    except (RecursionError, ValueError) as err:  # absurd nesting, or an integer of thousands of digits
        raise ConfigError(
            [
                Problem(
                    name,
                    "...",
                    f"cannot be read as a config ({str(err).split(':')[0]})",
                    "a config is a few levels of objects with realistic numbers",
                )
            ]
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError([Problem(name, raw, "the top level must be a JSON object", "wrap the settings in { ... }")])
    found = _absurd(raw)
    if found:
        raise ConfigError([found], name)
    return raw, name


def _settings(chk: Checker, raw: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> Settings:
    """Merged seqwarm settings. Overrides win; None = not given."""
    merged: Settings = {}
    block = chk.section(raw, "seqwarm", "seqwarm")
    if block is not None:
        chk.unknown_keys(block, SEQWARM_KEYS, "seqwarm")
        for key, value in block.items():
            if key in SEQWARM_KEYS and value is not None:
                merged[key] = Given(value, f"seqwarm.{key}")
    for key, value in (overrides or {}).items():
        if key not in SEQWARM_KEYS:
            raise TypeError(f"unknown override {key!r}; known: {', '.join(SEQWARM_KEYS)}")
        if value is not None:
            merged[key] = Given(value, flag_for(key))
    return merged


def without_seqwarm_blocks(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a DeepSpeed config (``raw`` is not changed) without the blocks seqwarm reads itself: the
    legacy ``curriculum_learning`` block (DeepSpeed 0.19 refuses it), the ``seqwarm`` block and the
    curriculum of ``data_efficiency``. Each backend drops what else it owns on top of this."""
    ds = {k: copy.deepcopy(v) for k, v in raw.items() if k not in ("curriculum_learning", "seqwarm")}
    efficiency = ds.get("data_efficiency")
    sampling = efficiency.get("data_sampling") if isinstance(efficiency, dict) else None
    if isinstance(sampling, dict):
        sampling.pop("curriculum_learning", None)
    return ds


def _megatron_accumulation(chk: Checker, raw: dict[str, Any], s: Settings, world: int) -> dict[str, Any]:
    """``raw`` with ``gradient_accumulation_steps`` left to the batch-size rule when ``--micro-batch-size`` and
    ``--global-batch-size`` are both flags and the config's value is DeepSpeed's default 1, as Megatron-DeepSpeed
    does (its micro-batches per step are global / (micro x data-parallel ranks); the example templates
    write 1). Any other config value is kept, and checked against the flags as before."""
    flags = {key for key, got in s.items() if got.path.startswith("--")}
    batch_flags = {"train_batch_size", "train_micro_batch_size_per_gpu"}
    if not batch_flags <= flags or "gradient_accumulation_steps" in s or raw.get("gradient_accumulation_steps") != 1:
        return raw
    tbs, mb = s["train_batch_size"].value, s["train_micro_batch_size_per_gpu"].value
    if isinstance(tbs, int) and isinstance(mb, int) and mb > 0 and tbs != mb * world and tbs % (mb * world) == 0:
        chk.warn(
            f"gradient_accumulation_steps 1 (the config) becomes {tbs // (mb * world)} = --global-batch-size {tbs} / "
            f"(--micro-batch-size {mb} x {world} rank{'s' if world != 1 else ''}), as Megatron-DeepSpeed derives it"
        )
    return {k: v for k, v in raw.items() if k != "gradient_accumulation_steps"}


def _stages(chk: Checker, s: Settings, curriculum: Any, seq_length: int | None) -> tuple[StageConfig, ...]:
    """The checked ``stages`` setting: a list, or from the command line its JSON text or a file holding it."""
    if "stages" not in s:
        return ()
    value, path = s["stages"]
    if isinstance(value, str):
        text = value
        if not value.lstrip().startswith("["):
            try:
                text = Path(value).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                chk.add(path, value, f"is neither a JSON list nor a readable file ({err})", "give [{...}, ...]")
                return ()
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            chk.add(path, value, f"is not valid JSON ({err.msg}, column {err.colno})", "check the JSON")
            return ()
    top = curriculum.max_difficulty if curriculum else seq_length
    return check_stages(chk, value, path, pretrain_length=top, warmup=bool(curriculum))


def load_config(source: Any, *, overrides: Mapping[str, Any] | None = None, world_size: int = 1) -> RunConfig:
    """Read and check a DeepSpeed JSON config (path or dict) plus seqwarm settings.

    ``overrides`` (keys of :data:`SEQWARM_KEYS`, ``None`` = not given) win over the file; use
    ``{"curriculum": False}`` to turn the curriculum off and ``{"curriculum_mode": "reshape"}`` to
    choose the shaping mode. Raises :class:`ConfigError` listing every problem.
    """
    raw, name = read_config_dict(source)
    chk = Checker()
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    for key in raw:
        if key not in _DS_TOP_KEYS:
            guess = suggest(key, _DS_TOP_KEYS)
            if guess in _READ_TOP_KEYS:  # a typo here would silently change the run (e.g. no curriculum)
                chk.add(key, raw[key], "unknown top-level key", f'did you mean "{guess}"?')
            elif guess:
                chk.warn(f'top-level key "{key}" is not a DeepSpeed key seqwarm knows: did you mean "{guess}"?')
    s = _settings(chk, raw, overrides)
    for key, (value, path) in list(s.items()):
        if key in _INT_KEYS:
            if chk.integer(value, path) is None:
                del s[key]

    legacy = read_legacy_curriculum(chk, raw)
    newer = read_data_efficiency_curriculum(chk, raw)
    if legacy and newer:
        chk.add(
            "curriculum_learning",
            "{...}",
            "both the legacy block and data_efficiency curriculum are enabled",
            "keep one of them",
        )
    curriculum = legacy or newer
    if "curriculum" in s:
        value, path = s["curriculum"]
        if chk.boolean(value, path) is False:
            curriculum = None
    if "curriculum_mode" in s:
        value, path = s["curriculum_mode"]
        mode = chk.choice(value, path, CURRICULUM_MODES, "curriculum mode")
        if mode and curriculum:
            curriculum = dataclasses.replace(curriculum, mode=mode)
    count_by = "shape"
    if "count_tokens_by" in s:
        count_by = (
            chk.choice(s["count_tokens_by"].value, s["count_tokens_by"].path, COUNT_TOKENS_BY, "token counting")
            or "shape"
        )

    compiled = chk.boolean(*s["compile"]) if "compile" in s else False
    documents = chk.boolean(*s["document_masking"]) if "document_masking" in s else False
    variable, cycles = read_variable(chk, s, curriculum, document_masking=bool(documents))
    bucket = s["length_bucket"].value if "length_bucket" in s else None  # a whole number >= 1 (checked above)
    if bucket is not None and not curriculum:
        chk.warn(f"length_bucket {bucket} has no effect without a curriculum (every batch is at full length)")
    if bucket is not None and curriculum and curriculum.mode not in (None, "truncate"):
        chk.add(
            s["length_bucket"].path,
            bucket,
            f"works only in curriculum mode truncate, not {curriculum.mode}",
            "drop the length bucket, or use curriculum mode truncate",
        )
    peak = chk.number(*s["peak_tflops"], strict=True) if "peak_tflops" in s else None
    megatron = is_megatron_run(chk, s)
    batch = check_batch_sizes(chk, _megatron_accumulation(chk, raw, s, world_size), s, world_size)
    seq_length = s["seq_length"].value if "seq_length" in s else None
    if curriculum and seq_length is not None:
        if curriculum.max_difficulty > seq_length:
            where = (
                "curriculum_learning"
                if curriculum.source == "curriculum_learning"
                else f"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen_{curriculum.mode}"
            )
            chk.add(
                f"{where}.max_difficulty",
                curriculum.max_difficulty,
                f"exceeds the model's sequence length ({seq_length})",
                f"set max_difficulty to {seq_length}, the full length",
            )
        elif curriculum.max_difficulty < seq_length and "stages" not in s:
            chk.warn(
                f"max_difficulty {curriculum.max_difficulty} < seq_length {seq_length}: training never "
                "reaches full length (evaluation still runs at full length)"
            )
    stages = _stages(chk, s, curriculum, seq_length)
    if "gradient_clipping" in s:
        clip = chk.number(s["gradient_clipping"].value, s["gradient_clipping"].path)
    else:
        clip = chk.number(raw.get("gradient_clipping", 0.0), "gradient_clipping", fix="use 1.0, or 0 to turn off")
    opt = check_optimizer(chk, raw)
    if megatron:
        opt = megatron_optimizer(chk, s, opt, raw)
    else:
        if "weight_decay" in s:
            wd = chk.number(s["weight_decay"].value, s["weight_decay"].path)
            if wd is not None:
                opt = dataclasses.replace(opt, weight_decay=wd)
        opt = apply_adam_overrides(chk, s, opt)
    if clip is None or clip == 0:
        mgn = opt.params.get("max_grad_norm")
        if (
            isinstance(mgn, (int, float))
            and not isinstance(mgn, bool)
            and mgn > 0
            and "gradient_clipping" not in raw
            and "gradient_clipping" not in s
        ):
            clip = float(mgn)
    precision, fp16, named = check_precision(chk, raw, s)
    budget = {k: s[k].value if k in s else None for k in _BUDGET_KEYS}
    s = {**scheduler_settings(chk, raw), **s}
    lr = check_lr(chk, s, opt, budget, megatron=megatron)
    if curriculum and budget["train_iters"] and not budget["train_tokens"]:
        chk.warn(
            "with a curriculum, steps carry different token counts: budget the run with train_tokens "
            "and keep train_iters only as a safety cap"
        )
    raise_if_problems(chk, name)
    tbs, mb, gas = batch
    ds = without_seqwarm_blocks(raw)
    return RunConfig(
        train_batch_size=tbs,
        micro_batch_size=mb,
        gradient_accumulation_steps=gas,
        world_size=world_size,
        seq_length=seq_length,
        gradient_clipping=clip or 0.0,
        precision=precision,
        precision_named=named,
        fp16=fp16,
        optimizer=opt,
        lr=lr,
        curriculum=curriculum,
        train_tokens=budget["train_tokens"],
        train_iters=budget["train_iters"],
        train_samples=budget["train_samples"],
        count_tokens_by=count_by,
        compile=bool(compiled),
        document_masking=bool(documents),
        deepspeed=ds,
        length_bucket=bucket,
        peak_tflops=peak,
        stages=stages,
        variable_curriculum=variable,
        variable_cycles=cycles,
        rampup_batch_size=s["rampup_batch_size"].value if "rampup_batch_size" in s else None,
        warnings=tuple(chk.warnings),
        source=name,
    )
