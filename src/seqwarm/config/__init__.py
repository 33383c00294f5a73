"""Run configuration: DeepSpeed JSON (legacy and data_efficiency curriculum forms) plus seqwarm settings.

``load_config(path_or_dict, overrides=..., world_size=...)`` reads a DeepSpeed config verbatim, checks
everything, and returns a frozen :class:`RunConfig`. Every problem is collected and raised at once as
one :class:`ConfigError` whose ``.problems`` name the key path, the value, the rule and the fix.
Tutorial advice (multiples of 8/16, ...) becomes ``RunConfig.warnings``, never an error.

Where settings come from, weakest first: defaults; the config's DeepSpeed keys; its optional top-level
``"seqwarm"`` block (Megatron-side settings DeepSpeed never had: ``seq_length``, ``train_tokens``,
``lr_decay_tokens``, ...); ``overrides`` (the CLI flags). Keys DeepSpeed owns (``zero_optimization``,
``bf16``, ``scheduler``, ...) are kept in ``RunConfig.deepspeed`` — the config with the curriculum and
seqwarm blocks removed — ready to hand to ``deepspeed.initialize``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqwarm.curriculum import CUSTOM, FIXED_DISCRETE, FIXED_LINEAR, FIXED_ROOT, SCHEDULE_TYPES, aligned_min
from seqwarm.config.settings import (
    COUNT_TOKENS_BY,
    CURRICULUM_MODES,
    DECAY_STYLES,
    PRECISIONS,
    SETTING_KEYS,
    exclusive_groups,
    flag_for,
    keys_of_kind,
)
from seqwarm.problems import Checker, ConfigError, Problem, raise_if_problems, suggest

__all__ = [
    "ConfigError", "Problem", "CurriculumConfig", "FP16Config", "OptimizerConfig", "LRConfig",
    "RunConfig", "load_config", "validate_curriculum_block", "SEQWARM_KEYS", "CURRICULUM_MODES",
    "DECAY_STYLES", "PRECISIONS",
]

OPTIMIZERS_BUILT_HERE = ("Adam", "AdamW", "SGD")

LEGACY_KEYS = ("enabled", "curriculum_type", "min_difficulty", "max_difficulty", "schedule_type",
               "schedule_config")
SCHEDULE_KEYS = {
    FIXED_LINEAR: ("total_curriculum_step", "difficulty_step"),
    FIXED_ROOT: ("total_curriculum_step", "difficulty_step", "root_degree"),
    FIXED_DISCRETE: ("difficulty", "max_step"),
    CUSTOM: (),
}
ALL_SCHEDULE_KEYS = ("total_curriculum_step", "difficulty_step", "root_degree", "difficulty", "max_step")
METRIC_KEYS = ("index_to_sample_path", "index_to_metric_path", "difficulty_type", "clustering_type",
               "min_difficulty", "max_difficulty", "schedule_type", "schedule_config")
SEQLEN_METRICS = {"seqlen_truncate": "truncate", "seqlen_reshape": "reshape"}

# The optional top-level "seqwarm" block and the CLI overrides share the keys of the settings table.
SEQWARM_KEYS = SETTING_KEYS
_INT_KEYS = tuple(k for k in keys_of_kind("count") if not k.startswith("lr_"))  # LR lengths: checked in _lr
_WARMUP_KEYS = exclusive_groups()["warmup"]
_DECAY_KEYS = exclusive_groups()["decay"]

# Top-level keys of DeepSpeed configs, for "did you mean" on likely typos (other keys pass through).
_DS_TOP_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "steps_per_print", "optimizer", "scheduler", "gradient_clipping", "fp16", "bf16", "amp",
    "zero_optimization", "curriculum_learning", "data_efficiency", "wall_clock_breakdown",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "activation_checkpointing",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger", "zero_allow_untested_optimizer",
    "communication_data_type", "pipeline", "checkpoint", "dump_state", "seqwarm", "elasticity",
    "compression_training", "aio", "memory_breakdown", "torch_autocast",
)


# The top-level keys seqwarm itself reads: a near miss of one of them is an error, not a warning.
_READ_TOP_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "optimizer", "scheduler", "gradient_clipping", "fp16", "bf16", "curriculum_learning",
                  "data_efficiency", "seqwarm")


@dataclass(frozen=True)
class CurriculumConfig:
    """The sequence-length curriculum, in DeepSpeed's terms."""

    enabled: bool
    curriculum_type: str
    min_difficulty: int
    """Starting length (tokens)."""
    max_difficulty: int
    """Final length: the model's full sequence length."""
    schedule_type: str
    schedule_config: Mapping[str, Any]
    mode: str | None = None
    """How the length reaches the model: truncate | reshape | inject | None (inject when the model's
    forward takes ``curriculum_seqlen``, else truncate)."""
    source: str = "curriculum_learning"
    """Where it came from: curriculum_learning (legacy block), data_efficiency, or flags."""

    def block(self) -> dict[str, Any]:
        """The DeepSpeed-style dict :class:`~seqwarm.curriculum.CurriculumScheduler` takes."""
        return {
            "enabled": self.enabled,
            "curriculum_type": self.curriculum_type,
            "min_difficulty": self.min_difficulty,
            "max_difficulty": self.max_difficulty,
            "schedule_type": self.schedule_type,
            "schedule_config": dict(self.schedule_config),
        }

    @property
    def total_curriculum_step(self) -> int | None:
        """Step from which the length is max (None for custom schedules)."""
        if self.schedule_type == FIXED_DISCRETE:
            return int(self.schedule_config["max_step"][-1]) + 1 if self.schedule_config["max_step"] else 0
        value = self.schedule_config.get("total_curriculum_step")
        return int(value) if value is not None else None


@dataclass(frozen=True)
class FP16Config:
    """DeepSpeed's fp16 block (dynamic loss scaling when ``loss_scale`` is 0)."""

    enabled: bool = False
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0


@dataclass(frozen=True)
class OptimizerConfig:
    """DeepSpeed's optimizer block; seqwarm's own engine builds Adam, AdamW and SGD."""

    type: str = "AdamW"
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    params: Mapping[str, Any] = field(default_factory=dict)
    """All of the block's params, as given (for DeepSpeed)."""


@dataclass(frozen=True)
class LRConfig:
    """Learning-rate schedule: warmup in iters/samples/tokens, decay in tokens (or iters/samples)."""

    lr: float = 6e-4
    """Peak learning rate."""
    min_lr: float = 0.0
    decay_style: str = "constant"
    warmup_iters: int = 0
    warmup_samples: int = 0
    warmup_tokens: int = 0
    decay_tokens: int | None = None
    decay_iters: int | None = None
    decay_samples: int | None = None

    @property
    def warmup_unit(self) -> str | None:
        for unit in ("iters", "samples", "tokens"):
            if getattr(self, f"warmup_{unit}"):
                return unit
        return None

    @property
    def decay_unit(self) -> str | None:
        for unit in ("tokens", "iters", "samples"):
            if getattr(self, f"decay_{unit}") is not None:
                return unit
        return None


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs to know, checked. Build it with :func:`load_config`."""

    train_batch_size: int
    """Global batch in sequences (micro batch x gradient accumulation x world size)."""
    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int = 1
    seq_length: int | None = None
    """The model's full sequence length (defaults to the curriculum's max_difficulty)."""
    gradient_clipping: float = 0.0
    precision: str = "fp32"
    fp16: FP16Config = field(default_factory=FP16Config)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr: LRConfig = field(default_factory=LRConfig)
    curriculum: CurriculumConfig | None = None
    train_tokens: int | None = None
    """Token budget: stop after the first step at which the trained tokens reach it."""
    train_iters: int | None = None
    train_samples: int | None = None
    count_tokens_by: str = "shape"
    rampup_batch_size: Any = None
    """Megatron's batch-size ramp, kept only to refuse it next to a curriculum (SPEC §4)."""
    deepspeed: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The config for DeepSpeed: the input without the curriculum and seqwarm blocks."""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    source: str | None = field(default=None, compare=False)

    @property
    def full_length(self) -> int | None:
        if self.seq_length is not None:
            return self.seq_length
        return self.curriculum.max_difficulty if self.curriculum else None

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["warnings"] = list(self.warnings)
        return out


# --------------------------------------------------------------------------------------------------
# curriculum blocks


_SCHEDULE_FIXES = {
    "total_curriculum_step": "the number of steps over which the length rises from min to max, e.g. 15000",
    "difficulty_step": "every length is a multiple of it: 8 for fp16, 16 for int8, 1 otherwise",
    "root_degree": "2 for a square root, 3 for a cube root",
    "difficulty": "the lengths to use in order, e.g. [128, 512, 1024]",
    "max_step": "the last step of each length but the final one, e.g. [5000, 10000]",
}


def _check_schedule_value(chk: Checker, key: str, value: Any, path: str) -> Any:
    if key in ("total_curriculum_step", "difficulty_step"):
        return chk.integer(value, path, fix=f"use a positive integer: {_SCHEDULE_FIXES[key]}")
    if key == "root_degree":
        return chk.number(value, path, minimum=0.0, strict=True, fix=_SCHEDULE_FIXES[key])
    return chk.int_list(value, path)


def _check_schedule(chk: Checker, block: Mapping[str, Any], path: str, lo: int | None, hi: int | None,
                    kind: str | None) -> dict[str, Any]:
    """Check ``schedule_config`` for ``kind``; return the cleaned dict (possibly partial)."""
    sc_path = f"{path}.schedule_config"
    if kind == CUSTOM:
        sc = chk.section(block, "schedule_config", sc_path) or {}
        return dict(sc)
    sc = chk.section(block, "schedule_config", sc_path)
    if sc is None:
        if block.get("schedule_config") is None and kind is not None:
            keys = ", ".join(SCHEDULE_KEYS[kind])
            chk.require(block, "schedule_config", sc_path, f"for schedule_type {kind!r}",
                        f'add "schedule_config": {{...}} with {keys}')
        return {}
    out: dict[str, Any] = {}
    needed = SCHEDULE_KEYS[kind] if kind is not None else ()
    for key in sc:
        if key in needed:
            continue
        if key in ALL_SCHEDULE_KEYS:
            if kind is not None:
                chk.warn(f"{sc_path}.{key} is ignored by schedule_type {kind!r}")
            else:  # unknown schedule type: still check the values that are there
                _check_schedule_value(chk, key, sc[key], f"{sc_path}.{key}")
        else:
            choices = needed or ALL_SCHEDULE_KEYS
            guess = suggest(key, choices)
            chk.add(f"{sc_path}.{key}", sc[key],
                    f"unknown key for schedule_type {kind!r}" if kind else "unknown key",
                    f'did you mean "{guess}"?' if guess else f"remove it (known: {', '.join(choices)})")
    for key in needed:
        value = chk.require(sc, key, f"{sc_path}.{key}", f"for schedule_type {kind!r}",
                            f"add it: {_SCHEDULE_FIXES[key]}")
        if value is not None:
            out[key] = _check_schedule_value(chk, key, value, f"{sc_path}.{key}")
    if kind in (FIXED_LINEAR, FIXED_ROOT):
        step = out.get("difficulty_step")
        if step is not None and lo is not None and hi is not None and lo <= hi:
            if aligned_min(lo, step) > hi:
                chk.add(f"{sc_path}.difficulty_step", step,
                        f"no multiple of it lies in [min_difficulty, max_difficulty] = [{lo}, {hi}]",
                        "use a smaller difficulty_step or a larger max_difficulty")
            else:
                if step % 8:
                    chk.warn(f"{sc_path}.difficulty_step = {step}: a multiple of 8 (fp16) or 16 (int8) "
                             "lets GPU Tensor Cores run at full speed")
                if lo % step:
                    chk.warn(f"{path}.min_difficulty = {lo} is not a multiple of difficulty_step {step}: "
                             f"the schedule starts at {aligned_min(lo, step)}")
                if hi % step:
                    chk.warn(f"{path}.max_difficulty = {hi} is not a multiple of difficulty_step {step}: "
                             "seqwarm uses exactly max_difficulty from total_curriculum_step on "
                             "(DeepSpeed reached it some steps later)")
    if kind == FIXED_DISCRETE:
        levels, steps = out.get("difficulty"), out.get("max_step")
        if levels is not None and steps is not None and len(steps) != len(levels) - 1:
            chk.add(f"{sc_path}.max_step", steps,
                    f"must have exactly one element fewer than difficulty ({len(levels)} levels)",
                    f"give {len(levels) - 1} step thresholds, one per level but the last")
        if levels is not None:
            if any(b < a for a, b in zip(levels, levels[1:])):
                chk.add(f"{sc_path}.difficulty", levels, "must be sorted from short to long",
                        f"sort it: {sorted(levels)}")
            if lo is not None and hi is not None:
                outside = [v for v in levels if v < lo or v > hi]
                if outside:
                    chk.add(f"{sc_path}.difficulty", levels,
                            f"values {outside} lie outside [min_difficulty, max_difficulty] = [{lo}, {hi}]",
                            "keep every level between min_difficulty and max_difficulty")
        if steps is not None and any(b <= a for a, b in zip(steps, steps[1:])):
            chk.add(f"{sc_path}.max_step", steps, "must be strictly increasing",
                    "list the switch steps in increasing order")
    return out


def _check_metric_block(chk: Checker, block: Mapping[str, Any], path: str, known: tuple[str, ...],
                        need_enabled: bool) -> dict[str, Any] | None:
    """Check the common fields of a legacy block or a data_efficiency metric block.

    Returns the normalised block (DeepSpeed shape), or None when it is disabled or broken.
    """
    chk.unknown_keys(block, known, path)
    enabled = True
    if need_enabled:
        enabled = chk.boolean(block.get("enabled", False), f"{path}.enabled")
        if enabled is False:
            return None  # a disabled block is not checked further: DeepSpeed ignores it too
    ctype = block.get("curriculum_type", "seqlen")
    if "curriculum_type" in known:
        ctype = chk.choice(ctype, f"{path}.curriculum_type", ("seqlen",), "curriculum_type")
    bounds = {}
    for key, fix in (("min_difficulty", "the starting length, e.g. 8 (64 for billion-parameter models)"),
                     ("max_difficulty", "the model's full sequence length, e.g. 1024")):
        value = chk.require(block, key, f"{path}.{key}", "when the curriculum is enabled", f"add it: {fix}")
        bounds[key] = None if value is None else chk.integer(value, f"{path}.{key}", fix=f"use {fix}")
    lo, hi = bounds["min_difficulty"], bounds["max_difficulty"]
    if lo is not None and hi is not None and lo > hi:
        chk.add(f"{path}.min_difficulty", lo, f"must not exceed max_difficulty ({hi})",
                "swap them, or lower min_difficulty")
    if lo is not None and lo % 8:
        chk.warn(f"{path}.min_difficulty = {lo}: a multiple of 8 (fp16) or 16 (int8) suits GPU Tensor Cores")
    kind = chk.require(block, "schedule_type", f"{path}.schedule_type", "when the curriculum is enabled",
                       'add "schedule_type": "fixed_linear" (recommended)')
    if kind is not None:
        kind = chk.choice(kind, f"{path}.schedule_type", SCHEDULE_TYPES, "schedule_type")
    if kind == FIXED_ROOT:
        chk.warn(f"{path}.schedule_type fixed_root showed no clear advantage over fixed_linear "
                 "and has one more knob")
    schedule = _check_schedule(chk, block, path, lo, hi, kind)
    if None in (lo, hi, kind, ctype) or not enabled:
        return None
    return {"enabled": True, "curriculum_type": ctype, "min_difficulty": lo, "max_difficulty": hi,
            "schedule_type": kind, "schedule_config": schedule}


def validate_curriculum_block(block: Mapping[str, Any], path: str = "curriculum_learning") -> dict[str, Any]:
    """Check one DeepSpeed curriculum block (the scheduler's input); raise ConfigError listing all problems."""
    chk = Checker()
    if not isinstance(block, Mapping):
        chk.add(path, block, "must be an object", "pass the curriculum block dict")
        raise_if_problems(chk)
    if "enabled" not in block:
        block = {**block, "enabled": True}
    out = _check_metric_block(chk, block, path, LEGACY_KEYS, need_enabled=True)
    raise_if_problems(chk)
    if out is None:
        raise ConfigError([Problem(f"{path}.enabled", False, "a scheduler needs an enabled curriculum",
                                   "set enabled to true")])
    return out


def _read_legacy(chk: Checker, raw: Mapping[str, Any]) -> CurriculumConfig | None:
    block = chk.section(raw, "curriculum_learning", "curriculum_learning")
    if block is None:
        return None
    out = _check_metric_block(chk, block, "curriculum_learning", LEGACY_KEYS, need_enabled=True)
    return None if out is None else CurriculumConfig(**out, mode=None, source="curriculum_learning")


def _read_data_efficiency(chk: Checker, raw: Mapping[str, Any]) -> CurriculumConfig | None:
    de = chk.section(raw, "data_efficiency", "data_efficiency")
    if de is None:
        return None
    ds_path = "data_efficiency.data_sampling"
    sampling = chk.section(de, "data_sampling", ds_path)
    if sampling is None:
        return None
    cl_path = f"{ds_path}.curriculum_learning"
    cl = chk.section(sampling, "curriculum_learning", cl_path)
    if cl is None:
        return None
    flags = {}
    for where, block in (("data_efficiency", de), (ds_path, sampling), (cl_path, cl)):
        flags[where] = chk.boolean(block.get("enabled", False), f"{where}.enabled")
    chk.unknown_keys(cl, ("enabled", "data_cluster_path", "curriculum_metrics"), cl_path)
    metrics = chk.section(cl, "curriculum_metrics", f"{cl_path}.curriculum_metrics")
    if not flags[cl_path]:
        return None
    if not all(flags.values()):
        off = [where for where, on in flags.items() if on is False]
        chk.warn(f"{cl_path}.enabled is true but {', '.join(off)}.enabled is not: the curriculum is off "
                 "(DeepSpeed needs all three enabled)")
        return None
    m_path = f"{cl_path}.curriculum_metrics"
    if not metrics:
        chk.add(m_path, metrics, "must name one metric", 'add "seqlen_truncate": {...} or "seqlen_reshape": {...}')
        return None
    found = []
    for name, block in metrics.items():
        if name not in SEQLEN_METRICS:
            guess = suggest(name, SEQLEN_METRICS)
            chk.add(f"{m_path}.{name}", "{...}",
                    "seqwarm runs sequence-length curricula only (other metrics need DeepSpeed's "
                    "offline-indexed data sampler)",
                    f'did you mean "{guess}"?' if guess else "use seqlen_truncate or seqlen_reshape")
            continue
        if not isinstance(block, Mapping):
            chk.add(f"{m_path}.{name}", block, "must be an object", "write the metric's settings as an object")
            continue
        dtype = block.get("difficulty_type", "value")
        if dtype != "value":
            chk.add(f"{m_path}.{name}.difficulty_type", dtype, "a length curriculum is value-based",
                    'use "value"')
        out = _check_metric_block(chk, block, f"{m_path}.{name}", METRIC_KEYS, need_enabled=False)
        if out is not None:
            found.append(CurriculumConfig(**out, mode=SEQLEN_METRICS[name], source="data_efficiency"))
    if len(found) > 1:
        chk.add(m_path, sorted(metrics), "only one sequence-length metric can be active",
                "keep either seqlen_truncate or seqlen_reshape")
        return None
    return found[0] if found else None


# --------------------------------------------------------------------------------------------------
# the whole config


def _read_source(source: Any) -> tuple[dict[str, Any], str | None]:
    """A dict from a path or mapping; JSON problems become ConfigErrors that say where."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), None
    if isinstance(source, RunConfig):
        raise TypeError("load_config() got a RunConfig; it is already loaded")
    path = Path(os.fspath(source))
    name = str(path)
    if not path.exists():
        raise ConfigError([Problem(name, str(path), "config file not found",
                                   "check the path (relative paths start from the current directory)")])
    if path.is_dir():
        raise ConfigError([Problem(name, str(path), "is a folder, not a config file",
                                   "pass the JSON file inside it")])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([Problem(name, str(path), f"cannot be read ({err})",
                                   "check its permissions and that it is UTF-8 JSON")]) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        line = text.splitlines()[err.lineno - 1] if 0 < err.lineno <= len(text.splitlines()) else ""
        raise ConfigError([Problem(f"{name}:{err.lineno}:{err.colno}", line.strip(),
                                   f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}",
                                   "fix the JSON syntax there (trailing commas, comments and single "
                                   "quotes are not JSON)")]) from None
    if not isinstance(raw, dict):
        raise ConfigError([Problem(name, raw, "the top level must be a JSON object",
                                   'wrap the settings in { ... }')])
    return raw, name


def _settings(chk: Checker, raw: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, tuple[Any, str]]:
    """Merged seqwarm settings: key -> (value, path it came from). Overrides win; None = not given."""
    merged: dict[str, tuple[Any, str]] = {}
    block = chk.section(raw, "seqwarm", "seqwarm")
    if block is not None:
        chk.unknown_keys(block, SEQWARM_KEYS, "seqwarm")
        for key, value in block.items():
            if key in SEQWARM_KEYS and value is not None:
                merged[key] = (value, f"seqwarm.{key}")
    for key, value in (overrides or {}).items():
        if key not in SEQWARM_KEYS:
            raise TypeError(f"unknown override {key!r}; known: {', '.join(SEQWARM_KEYS)}")
        if value is not None:
            merged[key] = (value, flag_for(key))
    return merged


def _batch_sizes(chk: Checker, raw: Mapping[str, Any], s: dict[str, tuple[Any, str]], world: int):
    """DeepSpeed's rule: train_batch_size = micro batch x gradient accumulation x world size."""
    got: dict[str, int | None] = {}
    paths = {}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value, path = s.get(key, (raw.get(key), key))
        paths[key] = path
        got[key] = None if value is None else chk.integer(value, path)
    if any(got[k] is None and (s.get(k, (raw.get(k),))[0] is not None) for k in got):
        return None  # each bad value is reported above
    tbs, mb, gas = got["train_batch_size"], got["train_micro_batch_size_per_gpu"], got["gradient_accumulation_steps"]
    rule = f"train_batch_size must equal micro batch x gradient_accumulation_steps x world size ({world})"
    if tbs is None and mb is None:
        chk.add("train_batch_size", None, "is required (or train_micro_batch_size_per_gpu)",
                'add "train_batch_size": the global batch in sequences')
        return None
    if tbs is not None and mb is not None and gas is not None:
        if tbs != mb * gas * world:
            chk.add(paths["train_batch_size"], tbs, f"{rule}: {mb} x {gas} x {world} = {mb * gas * world}",
                    f"set train_batch_size to {mb * gas * world}, or change the micro batch / accumulation")
            return None
    elif tbs is not None and mb is not None:
        if tbs % (mb * world):
            chk.add(paths["train_batch_size"], tbs, f"{rule}: it is not divisible by {mb} x {world}",
                    "use a multiple of micro batch x world size")
            return None
        gas = tbs // (mb * world)
    elif tbs is not None:
        gas = gas or 1
        if tbs % (gas * world):
            chk.add(paths["train_batch_size"], tbs, f"{rule}: it is not divisible by {gas} x {world}",
                    "use a multiple of gradient_accumulation_steps x world size")
            return None
        mb = tbs // (gas * world)
    else:
        gas = gas or 1
        tbs = mb * gas * world
    return tbs, mb, gas


def _optimizer(chk: Checker, raw: Mapping[str, Any]) -> OptimizerConfig:
    block = chk.section(raw, "optimizer", "optimizer")
    if block is None:
        return OptimizerConfig()
    kind = block.get("type", "AdamW")
    if not isinstance(kind, str):
        chk.add("optimizer.type", kind, "must be a string", 'write e.g. "AdamW"')
        kind = "AdamW"
    elif kind not in OPTIMIZERS_BUILT_HERE:
        canonical = {k.lower(): k for k in OPTIMIZERS_BUILT_HERE}.get(kind.lower())
        if canonical:
            kind = canonical
        else:
            chk.warn(f"optimizer.type {kind!r}: seqwarm's own engine builds {', '.join(OPTIMIZERS_BUILT_HERE)}; "
                     "other types run only under DeepSpeed")
    params = chk.section(block, "params", "optimizer.params") or {}
    defaults = OptimizerConfig()
    lr = defaults.lr
    if "lr" in params:
        lr = chk.number(params["lr"], "optimizer.params.lr", fix="use a positive learning rate, e.g. 1.5e-4")
    betas = defaults.betas
    if "betas" in params:
        b = params["betas"]
        ok = isinstance(b, (list, tuple)) and len(b) == 2 and all(
            not isinstance(x, bool) and isinstance(x, (int, float)) and 0 <= x < 1 for x in b)
        if ok:
            betas = (float(b[0]), float(b[1]))
        else:
            chk.add("optimizer.params.betas", b, "must be two numbers in [0, 1)", "write e.g. [0.9, 0.95]")
    eps = chk.number(params.get("eps", defaults.eps), "optimizer.params.eps", strict=True) or defaults.eps
    # DeepSpeed's optimizers default to no weight decay; keep that when the config names an optimizer.
    wd = chk.number(params.get("weight_decay", 0.0), "optimizer.params.weight_decay")
    return OptimizerConfig(type=kind, lr=lr if lr is not None else defaults.lr, betas=betas, eps=eps,
                           weight_decay=wd if wd is not None else 0.0, params=dict(params))


def _precision(chk: Checker, raw: Mapping[str, Any], s: dict[str, tuple[Any, str]]) -> tuple[str, FP16Config]:
    fp16_block = chk.section(raw, "fp16", "fp16") or {}
    bf16_block = chk.section(raw, "bf16", "bf16") or {}
    fp16_on = chk.boolean(fp16_block.get("enabled", False), "fp16.enabled")
    bf16_on = chk.boolean(bf16_block.get("enabled", False), "bf16.enabled")
    if fp16_on and bf16_on:
        chk.add("bf16.enabled", True, "fp16 and bf16 cannot both be enabled", "disable one of them")
    if raw.get("amp", {}) and isinstance(raw.get("amp"), Mapping) and raw["amp"].get("enabled"):
        chk.warn("amp (NVIDIA Apex) is not used by seqwarm's engine; use bf16 or fp16 instead")
    precision = "fp16" if fp16_on else "bf16" if bf16_on else "fp32"
    if "precision" in s:
        value, path = s["precision"]
        precision = chk.choice(value, path, PRECISIONS, "precision") or precision
    d = FP16Config()
    fp16 = FP16Config(
        enabled=precision == "fp16",
        loss_scale=chk.number(fp16_block.get("loss_scale", d.loss_scale), "fp16.loss_scale") or 0.0,
        initial_scale_power=chk.integer(fp16_block.get("initial_scale_power", d.initial_scale_power),
                                        "fp16.initial_scale_power", minimum=0) or 0,
        loss_scale_window=chk.integer(fp16_block.get("loss_scale_window", d.loss_scale_window),
                                      "fp16.loss_scale_window") or d.loss_scale_window,
        hysteresis=chk.integer(fp16_block.get("hysteresis", d.hysteresis), "fp16.hysteresis") or d.hysteresis,
        consecutive_hysteresis=bool(chk.boolean(fp16_block.get("consecutive_hysteresis", False),
                                                "fp16.consecutive_hysteresis")),
        min_loss_scale=chk.number(fp16_block.get("min_loss_scale", d.min_loss_scale), "fp16.min_loss_scale",
                                  strict=True) or d.min_loss_scale,
    )
    return precision, fp16


def _ds_scheduler(chk: Checker, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Map a DeepSpeed LR ``scheduler`` block onto seqwarm's LR settings (iteration based)."""
    block = chk.section(raw, "scheduler", "scheduler")
    if not block:
        return {}
    kind = block.get("type")
    params = block.get("params") if isinstance(block.get("params"), Mapping) else {}
    out: dict[str, Any] = {}
    if "warmup_num_steps" in params:
        out["lr_warmup_iters"] = params["warmup_num_steps"]
    if kind in ("WarmupLR", "WarmupDecayLR") and "warmup_max_lr" in params:
        out["lr"] = params["warmup_max_lr"]
    if kind == "WarmupDecayLR":
        out.update(lr_decay_style="linear", lr_decay_iters=params.get("total_num_steps"))
    elif kind == "WarmupCosineLR":
        out.update(lr_decay_style="cosine", lr_decay_iters=params.get("total_num_steps"))
    if out:
        chk.warn(f"scheduler {kind!r} is mapped onto seqwarm's LR schedule by iterations; with a curriculum, "
                 "decay by tokens instead (lr_decay_tokens): early curriculum steps carry few tokens")
        if params.get("warmup_min_lr"):
            chk.warn(f"scheduler.params.warmup_min_lr = {params['warmup_min_lr']}: seqwarm's warmup starts "
                     "from 0, not from warmup_min_lr")
        if params.get("warmup_type", "log") != "linear" and "warmup_num_steps" in params:
            chk.warn(f"scheduler.params.warmup_type = {params.get('warmup_type', 'log')!r} (DeepSpeed's default "
                     "is 'log'): seqwarm's warmup is linear")
    else:
        chk.warn(f"scheduler {kind!r} is left to DeepSpeed; seqwarm's own engine keeps a constant LR unless "
                 "lr_decay_style is set")
    return {k: (v, f"scheduler.params ({kind})") for k, v in out.items() if v is not None}


def _lr(chk: Checker, s: dict[str, tuple[Any, str]], opt: OptimizerConfig, budget: dict[str, int | None]) -> LRConfig:
    vals: dict[str, Any] = {}
    for key in ("lr", "min_lr"):
        if key in s:
            vals[key] = chk.number(s[key][0], s[key][1], fix="use a learning rate >= 0, e.g. 3e-4")
    peak = vals.get("lr")
    peak = opt.lr if peak is None else peak
    min_lr = vals.get("min_lr") or 0.0
    if peak is not None and min_lr > peak:
        path = s["min_lr"][1] if "min_lr" in s else "min_lr"
        chk.add(path, min_lr, f"must not exceed the peak learning rate ({peak:g})", "lower min_lr")
    if peak == 0:
        chk.warn("the peak learning rate is 0: the model will not learn")
    style = None
    if "lr_decay_style" in s:
        style = chk.choice(s["lr_decay_style"][0], s["lr_decay_style"][1], DECAY_STYLES, "decay style")
    units: dict[str, int] = {}
    for group, minimum in ((_WARMUP_KEYS, 0), (_DECAY_KEYS, 1)):
        given = [k for k in group if k in s]
        if len(given) > 1:
            chk.add(s[given[1]][1], s[given[1]][0], f"only one of {', '.join(flag_for(k) for k in group)} may be set",
                    f"keep just one (also set: {s[given[0]][1]})")
        for key in given[:1]:
            value = chk.integer(s[key][0], s[key][1], minimum=minimum)
            if value is not None:
                units[key] = value
    if "lr_warmup_tokens" in units and units["lr_warmup_tokens"]:
        chk.warn("LR warmup is in tokens: the recipe keeps it in samples or iterations (token warmup slows the "
                 "rise while sequences are short); convert with warmup_samples = tokens / min_difficulty")
    decay_given = any(k in units for k in _DECAY_KEYS)
    if style is None:
        style = "linear" if decay_given else "constant"
    if style in ("linear", "cosine") and not decay_given:
        for unit in ("tokens", "iters", "samples"):
            if budget.get(f"train_{unit}"):
                units[f"lr_decay_{unit}"] = budget[f"train_{unit}"]
                break
        else:
            chk.add(s["lr_decay_style"][1] if "lr_decay_style" in s else "lr_decay_style", style,
                    f"{style} decay needs a length to decay over",
                    "set lr_decay_tokens (or a train_tokens budget, which it then defaults to)")
    for unit in ("iters", "samples", "tokens"):
        warm, decay = units.get(f"lr_warmup_{unit}"), units.get(f"lr_decay_{unit}")
        if warm and decay and warm >= decay:
            path = s[f"lr_warmup_{unit}"][1] if f"lr_warmup_{unit}" in s else f"lr_warmup_{unit}"
            chk.add(path, warm, f"warmup must end before the decay does ({decay:,} {unit})",
                    "shorten the warmup or lengthen the decay")
    return LRConfig(
        lr=peak if peak is not None else opt.lr, min_lr=min_lr, decay_style=style or "constant",
        warmup_iters=units.get("lr_warmup_iters", 0), warmup_samples=units.get("lr_warmup_samples", 0),
        warmup_tokens=units.get("lr_warmup_tokens", 0), decay_tokens=units.get("lr_decay_tokens"),
        decay_iters=units.get("lr_decay_iters"), decay_samples=units.get("lr_decay_samples"),
    )


def load_config(source: Any, *, overrides: Mapping[str, Any] | None = None, world_size: int = 1) -> RunConfig:
    """Read and check a DeepSpeed JSON config (path or dict) plus seqwarm settings.

    ``overrides`` (keys of :data:`SEQWARM_KEYS`, ``None`` = not given) win over the file; use
    ``{"curriculum": False}`` to turn the curriculum off and ``{"curriculum_mode": "reshape"}`` to
    choose the shaping mode. Raises :class:`ConfigError` listing every problem.
    """
    raw, name = _read_source(source)
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

    legacy = _read_legacy(chk, raw)
    newer = _read_data_efficiency(chk, raw)
    if legacy and newer:
        chk.add("curriculum_learning", "{...}", "both the legacy block and data_efficiency curriculum are enabled",
                "keep one of them")
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
        count_by = chk.choice(s["count_tokens_by"][0], s["count_tokens_by"][1], COUNT_TOKENS_BY,
                              "token counting") or "shape"

    batch = _batch_sizes(chk, raw, s, world_size)
    seq_length = s["seq_length"][0] if "seq_length" in s else None
    if curriculum and seq_length is not None:
        if curriculum.max_difficulty > seq_length:
            where = ("curriculum_learning" if curriculum.source == "curriculum_learning" else
                     "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen_"
                     f"{curriculum.mode}")
            chk.add(f"{where}.max_difficulty", curriculum.max_difficulty,
                    f"exceeds the model's sequence length ({seq_length})",
                    f"set max_difficulty to {seq_length}, the full length")
        elif curriculum.max_difficulty < seq_length:
            chk.warn(f"max_difficulty {curriculum.max_difficulty} < seq_length {seq_length}: training never "
                     "reaches full length (evaluation still runs at full length)")
    if "gradient_clipping" in s:
        clip = chk.number(s["gradient_clipping"][0], s["gradient_clipping"][1])
    else:
        clip = chk.number(raw.get("gradient_clipping", 0.0), "gradient_clipping", fix="use 1.0, or 0 to turn off")
    opt = _optimizer(chk, raw)
    if "weight_decay" in s:
        wd = chk.number(s["weight_decay"][0], s["weight_decay"][1])
        if wd is not None:
            opt = dataclasses.replace(opt, weight_decay=wd)
    if clip is None or clip == 0:
        mgn = opt.params.get("max_grad_norm")
        if isinstance(mgn, (int, float)) and not isinstance(mgn, bool) and mgn > 0 \
                and "gradient_clipping" not in raw and "gradient_clipping" not in s:
            clip = float(mgn)
    precision, fp16 = _precision(chk, raw, s)
    budget = {k: s[k][0] if k in s else None for k in ("train_tokens", "train_iters", "train_samples")}
    s = {**_ds_scheduler(chk, raw), **s}
    lr = _lr(chk, s, opt, budget)
    if curriculum and budget["train_iters"] and not budget["train_tokens"]:
        chk.warn("with a curriculum, steps carry different token counts: budget the run with train_tokens "
                 "and keep train_iters only as a safety cap")
    raise_if_problems(chk, name)
    tbs, mb, gas = batch
    ds = {k: v for k, v in raw.items() if k not in ("curriculum_learning", "seqwarm")}
    if "data_efficiency" in ds and isinstance(ds["data_efficiency"], dict):
        ds["data_efficiency"] = copy.deepcopy(ds["data_efficiency"])
        ds["data_efficiency"].get("data_sampling", {}).pop("curriculum_learning", None)
    return RunConfig(
        train_batch_size=tbs, micro_batch_size=mb, gradient_accumulation_steps=gas, world_size=world_size,
        seq_length=seq_length, gradient_clipping=clip or 0.0, precision=precision, fp16=fp16, optimizer=opt,
        lr=lr, curriculum=curriculum, train_tokens=budget["train_tokens"], train_iters=budget["train_iters"],
        train_samples=budget["train_samples"], count_tokens_by=count_by, deepspeed=ds,
        rampup_batch_size=s["rampup_batch_size"][0] if "rampup_batch_size" in s else None,
        warnings=tuple(chk.warnings), source=name,
    )
