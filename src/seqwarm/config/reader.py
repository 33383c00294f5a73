"""The DeepSpeed JSON dialect reader: ``load_config`` (legacy and data_efficiency curriculum forms) plus
seqwarm settings.

``load_config(path_or_dict, overrides=..., world_size=...)`` reads a DeepSpeed config verbatim, checks
everything, and returns a frozen :class:`~seqwarm.config.run.RunConfig`. Every problem is collected and
raised at once as one :class:`~seqwarm.util.problems.ConfigError` whose ``.problems`` name the key path, the
value, the rule and the fix. Tutorial advice (multiples of 8/16, ...) becomes ``RunConfig.warnings``,
never an error. The curriculum block's checks belong to :mod:`seqwarm.curriculum.schedule`, the LR settings'
to :mod:`seqwarm.curriculum.lr`; this module finds the values, says where each came from, and applies
DeepSpeed's own rules (batch sizes, optimizer, precision, scheduler mapping).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from seqwarm.config.run import COUNT_TOKENS_BY, PRECISIONS, FP16Config, OptimizerConfig, RunConfig
from seqwarm.config.settings import SETTING_KEYS, flag_for, keys_in_group, keys_of_kind
from seqwarm.curriculum.lr import LRConfig, lr_config_from
from seqwarm.curriculum.schedule import CURRICULUM_MODES, LEGACY_KEYS, CurriculumConfig, check_curriculum_block
from seqwarm.util.problems import Checker, ConfigError, Problem, raise_if_problems, suggest

OPTIMIZERS_BUILT_HERE = ("Adam", "AdamW", "SGD")

METRIC_KEYS = ("index_to_sample_path", "index_to_metric_path", "difficulty_type", "clustering_type",
               "min_difficulty", "max_difficulty", "schedule_type", "schedule_config")
SEQLEN_METRICS = {"seqlen_truncate": "truncate", "seqlen_reshape": "reshape"}

# The optional top-level "seqwarm" block and the CLI overrides share the keys of the settings table.
SEQWARM_KEYS = SETTING_KEYS
# The LR settings, as LRConfig's field names (lr_warmup_iters -> warmup_iters): lr_schedule checks them.
_LR_FIELDS = {key: key.removeprefix("lr_") for key in keys_in_group("lr")}
_LR_KEYS = {name: key for key, name in _LR_FIELDS.items()}
_INT_KEYS = tuple(k for k in keys_of_kind("count") if k not in _LR_FIELDS)
_BUDGET_KEYS = keys_in_group("budget")

APPLIED_DS_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                   "optimizer", "gradient_clipping", "fp16", "bf16")
"""DeepSpeed top-level keys whose values seqwarm's own engine applies (the rest pass through to DeepSpeed)."""
TRACKER_DS_KEYS = ("tensorboard", "wandb", "csv_monitor")
"""DeepSpeed's monitor blocks: seqwarm's trackers log them in every engine (:mod:`seqwarm.trainer.trackers`)."""
# The top-level keys seqwarm itself reads: a near miss of one of them is an error, not a warning.
_READ_TOP_KEYS = (*APPLIED_DS_KEYS, "scheduler", "curriculum_learning", "data_efficiency", "seqwarm")
# Top-level keys of DeepSpeed configs, for "did you mean" on likely typos (other keys pass through).
_DS_TOP_KEYS = (
    *_READ_TOP_KEYS, "steps_per_print", "amp", "zero_optimization", "wall_clock_breakdown",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "activation_checkpointing",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger", "zero_allow_untested_optimizer",
    "communication_data_type", "pipeline", "checkpoint", "dump_state", "elasticity",
    "compression_training", "aio", "memory_breakdown", "torch_autocast",
)


# --------------------------------------------------------------------------------------------------
# curriculum blocks (their fields are checked by seqwarm.curriculum.schedule)


def _read_legacy(chk: Checker, raw: Mapping[str, Any]) -> CurriculumConfig | None:
    block = chk.section(raw, "curriculum_learning", "curriculum_learning")
    if block is None:
        return None
    out = check_curriculum_block(chk, block, "curriculum_learning", LEGACY_KEYS, need_enabled=True)
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
        out = check_curriculum_block(chk, block, f"{m_path}.{name}", METRIC_KEYS, need_enabled=False)
        if out is not None:
            found.append(CurriculumConfig(**out, mode=SEQLEN_METRICS[name], source="data_efficiency"))
    if len(found) > 1:
        chk.add(m_path, sorted(metrics), "only one sequence-length metric can be active",
                "keep either seqlen_truncate or seqlen_reshape")
        return None
    return found[0] if found else None


# --------------------------------------------------------------------------------------------------
# the whole config


MAX_DEPTH = 32
"""Deepest nesting of objects/lists a config may have (DeepSpeed's own use 4 levels)."""
MAX_INT = 10**18
"""Largest integer a config may hold: larger ones are typos, and would overflow float arithmetic."""


def _absurd(raw: Any, where: str = "", depth: int = 0) -> Problem | None:
    """The first value nested deeper than MAX_DEPTH or an integer beyond MAX_INT, as a Problem."""
    if depth > MAX_DEPTH:
        return Problem(where or "(top level)", "...", f"nested more than {MAX_DEPTH} levels deep",
                       "a seqwarm/DeepSpeed config is a few levels of objects; check the file")
    if isinstance(raw, Mapping):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in raw.items())
    elif isinstance(raw, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(raw))
    else:
        if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) > MAX_INT:
            return Problem(where, f"an integer of {len(str(abs(raw)))} digits", f"is larger than {MAX_INT:.0e}",
                           "give a realistic value (budgets and sizes fit in 18 digits)")
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
    except (RecursionError, ValueError) as err:  # absurd nesting, or an integer of thousands of digits
        raise ConfigError([Problem(name, "...", f"cannot be read as a config ({str(err).split(':')[0]})",
                                   "a config is a few levels of objects with realistic numbers")]) from None
    if not isinstance(raw, dict):
        raise ConfigError([Problem(name, raw, "the top level must be a JSON object",
                                   'wrap the settings in { ... }')])
    found = _absurd(raw)
    if found:
        raise ConfigError([found], name)
    return raw, name


class Given(NamedTuple):
    """A setting as given: its value and where it came from (``seqwarm.KEY`` or the ``--flag``)."""

    value: Any
    path: str


Settings = dict[str, Given]
"""The merged settings: key -> :class:`Given` (a key absent: not given)."""


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


def _batch_sizes(chk: Checker, raw: Mapping[str, Any], s: Settings, world: int):
    """DeepSpeed's rule: train_batch_size = micro batch x gradient accumulation x world size."""
    got: dict[str, int | None] = {}
    paths = {}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value, path = s.get(key, Given(raw.get(key), key))
        paths[key] = path
        got[key] = None if value is None else chk.integer(value, path)
    if any(got[k] is None and s.get(k, Given(raw.get(k), k)).value is not None for k in got):
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


def _adam_overrides(chk: Checker, s: Settings, opt: OptimizerConfig) -> OptimizerConfig:
    """--adam-beta1 / --adam-beta2 / --adam-eps over the optimizer block's betas and eps."""
    betas = list(opt.betas)
    for i, key in enumerate(("adam_beta1", "adam_beta2")):
        if key in s:
            value = chk.number(s[key].value, s[key].path)
            if value is not None and not 0 <= value < 1:
                chk.add(s[key].path, value, "must be in [0, 1)", "use e.g. 0.9 and 0.95")
            elif value is not None:
                betas[i] = float(value)
    eps = opt.eps
    if "adam_eps" in s:
        value = chk.number(s["adam_eps"].value, s["adam_eps"].path)
        eps = float(value) if value is not None else eps
    return dataclasses.replace(opt, betas=(betas[0], betas[1]), eps=eps)


def _precision(chk: Checker, raw: Mapping[str, Any],
               s: Settings) -> tuple[str, FP16Config, bool]:
    """The precision, the fp16 block, and whether the config named a precision (else the device decides)."""
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
    # a block that says enabled (true or false) names the precision: only silence lets the device choose
    named = "enabled" in fp16_block or "enabled" in bf16_block or "precision" in s
    return precision, fp16, named


def _ds_scheduler(chk: Checker, raw: Mapping[str, Any]) -> Settings:
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
    return {k: Given(v, f"scheduler.params ({kind})") for k, v in out.items() if v is not None}


def _lr(chk: Checker, s: Settings, opt: OptimizerConfig, budget: dict[str, int | None]) -> LRConfig:
    """The LR settings, handed to :func:`seqwarm.curriculum.lr.lr_config_from` by LRConfig field name."""
    given = {_LR_FIELDS[key]: where for key, where in s.items() if key in _LR_FIELDS}
    return lr_config_from(chk, given, default_lr=opt.lr, budget=budget, label=lambda name: flag_for(_LR_KEYS[name]))


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
        count_by = chk.choice(s["count_tokens_by"].value, s["count_tokens_by"].path, COUNT_TOKENS_BY,
                              "token counting") or "shape"

    compiled = chk.boolean(*s["compile"]) if "compile" in s else False
    bucket = s["length_bucket"].value if "length_bucket" in s else None  # a whole number >= 1 (checked above)
    if bucket is not None and not curriculum:
        chk.warn(f"length_bucket {bucket} has no effect without a curriculum (every batch is at full length)")
    if bucket is not None and curriculum and curriculum.mode not in (None, "truncate"):
        chk.add(s["length_bucket"].path, bucket, f"works only in curriculum mode truncate, not {curriculum.mode}",
                "drop the length bucket, or use curriculum mode truncate")
    batch = _batch_sizes(chk, raw, s, world_size)
    seq_length = s["seq_length"].value if "seq_length" in s else None
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
        clip = chk.number(s["gradient_clipping"].value, s["gradient_clipping"].path)
    else:
        clip = chk.number(raw.get("gradient_clipping", 0.0), "gradient_clipping", fix="use 1.0, or 0 to turn off")
    opt = _optimizer(chk, raw)
    if "weight_decay" in s:
        wd = chk.number(s["weight_decay"].value, s["weight_decay"].path)
        if wd is not None:
            opt = dataclasses.replace(opt, weight_decay=wd)
    opt = _adam_overrides(chk, s, opt)
    if clip is None or clip == 0:
        mgn = opt.params.get("max_grad_norm")
        if isinstance(mgn, (int, float)) and not isinstance(mgn, bool) and mgn > 0 \
                and "gradient_clipping" not in raw and "gradient_clipping" not in s:
            clip = float(mgn)
    precision, fp16, named = _precision(chk, raw, s)
    budget = {k: s[k].value if k in s else None for k in _BUDGET_KEYS}
    s = {**_ds_scheduler(chk, raw), **s}
    lr = _lr(chk, s, opt, budget)
    if curriculum and budget["train_iters"] and not budget["train_tokens"]:
        chk.warn("with a curriculum, steps carry different token counts: budget the run with train_tokens "
                 "and keep train_iters only as a safety cap")
    raise_if_problems(chk, name)
    tbs, mb, gas = batch
    ds = without_seqwarm_blocks(raw)
    return RunConfig(
        train_batch_size=tbs, micro_batch_size=mb, gradient_accumulation_steps=gas, world_size=world_size,
        seq_length=seq_length, gradient_clipping=clip or 0.0, precision=precision, precision_named=named, fp16=fp16,
        optimizer=opt,
        lr=lr, curriculum=curriculum, train_tokens=budget["train_tokens"], train_iters=budget["train_iters"],
        train_samples=budget["train_samples"], count_tokens_by=count_by, compile=bool(compiled), deepspeed=ds,
        length_bucket=bucket,
        rampup_batch_size=s["rampup_batch_size"].value if "rampup_batch_size" in s else None,
        warnings=tuple(chk.warnings), source=name,
    )
