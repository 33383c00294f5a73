"""The checks of a DeepSpeed config's blocks, one function per block, for :mod:`seqwarm.config.reader`.

Each function takes the :class:`~seqwarm.util.problems.Checker` that collects every problem, the raw config
and/or the merged seqwarm settings (:data:`Settings`), and returns the block's checked value:

- where the curriculum is: the legacy ``curriculum_learning`` block or ``data_efficiency``'s
  ``seqlen_truncate`` / ``seqlen_reshape`` metric (the fields of either are checked by
  :func:`seqwarm.curriculum.checks.check_curriculum_block`);
- DeepSpeed's own rules: the batch sizes (``train_batch_size`` = micro batch x accumulation x world size),
  ``optimizer`` (and the ``--adam-*`` overrides), ``fp16`` / ``bf16``, and the ``scheduler`` block mapped
  onto seqwarm's LR settings;
- the LR settings, handed to :func:`seqwarm.curriculum.lr.lr_config_from`.

:func:`~seqwarm.config.reader.load_config` reads the file, merges the settings, calls these in turn,
applies the rules that span blocks and builds the RunConfig. Like the reader, this module imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from seqwarm.config.run import PRECISIONS, FP16Config, OptimizerConfig
from seqwarm.config.settings import flag_for, keys_in_group
from seqwarm.curriculum.checks import LEGACY_KEYS, check_curriculum_block
from seqwarm.curriculum.lr import LRConfig, lr_config_from
from seqwarm.curriculum.schedule import CurriculumConfig
from seqwarm.util.problems import Checker, suggest

OPTIMIZERS_BUILT_HERE = ("Adam", "AdamW", "SGD")

METRIC_KEYS = (
    "index_to_sample_path",
    "index_to_metric_path",
    "difficulty_type",
    "clustering_type",
    "min_difficulty",
    "max_difficulty",
    "schedule_type",
    "schedule_config",
)
SEQLEN_METRICS = {"seqlen_truncate": "truncate", "seqlen_reshape": "reshape"}

# The LR settings, as LRConfig's field names (lr_warmup_iters -> warmup_iters): lr_schedule checks them.
_LR_FIELDS = {key: key.removeprefix("lr_") for key in keys_in_group("lr") if key != "megatron"}
_LR_KEYS = {name: key for key, name in _LR_FIELDS.items()}


class Given(NamedTuple):
    """A setting as given: its value and where it came from (``seqwarm.KEY`` or the ``--flag``)."""

    value: Any
    path: str


Settings = dict[str, Given]
"""The merged settings: key -> :class:`Given` (a key absent: not given)."""


# --------------------------------------------------------------------------------------------------
# the curriculum blocks (their fields are checked by seqwarm.curriculum.checks)


def read_legacy_curriculum(chk: Checker, raw: Mapping[str, Any]) -> CurriculumConfig | None:
    """The legacy top-level ``curriculum_learning`` block, checked (None: absent or not enabled)."""
    block = chk.section(raw, "curriculum_learning", "curriculum_learning")
    if block is None:
        return None
    out = check_curriculum_block(chk, block, "curriculum_learning", LEGACY_KEYS, need_enabled=True)
    return None if out is None else CurriculumConfig(**out, mode=None, source="curriculum_learning")


def read_data_efficiency_curriculum(chk: Checker, raw: Mapping[str, Any]) -> CurriculumConfig | None:
    """``data_efficiency.data_sampling.curriculum_learning``'s one sequence-length metric, checked (None: absent,
    off, or in error)."""
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
        chk.warn(
            f"{cl_path}.enabled is true but {', '.join(off)}.enabled is not: the curriculum is off "
            "(DeepSpeed needs all three enabled)"
        )
        return None
    m_path = f"{cl_path}.curriculum_metrics"
    if not metrics:
        chk.add(m_path, metrics, "must name one metric", 'add "seqlen_truncate": {...} or "seqlen_reshape": {...}')
        return None
    found = []
    for name, block in metrics.items():
        if name not in SEQLEN_METRICS:
            guess = suggest(name, SEQLEN_METRICS)
            chk.add(
                f"{m_path}.{name}",
                "{...}",
                "seqwarm runs sequence-length curricula only (other metrics need DeepSpeed's "
                "offline-indexed data sampler)",
                f'did you mean "{guess}"?' if guess else "use seqlen_truncate or seqlen_reshape",
            )
            continue
        if not isinstance(block, Mapping):
            chk.add(f"{m_path}.{name}", block, "must be an object", "write the metric's settings as an object")
            continue
        dtype = block.get("difficulty_type", "value")
        if dtype != "value":
            chk.add(f"{m_path}.{name}.difficulty_type", dtype, "a length curriculum is value-based", 'use "value"')
        out = check_curriculum_block(chk, block, f"{m_path}.{name}", METRIC_KEYS, need_enabled=False)
        if out is not None:
            found.append(CurriculumConfig(**out, mode=SEQLEN_METRICS[name], source="data_efficiency"))
    if len(found) > 1:
        chk.add(
            m_path,
            sorted(metrics),
            "only one sequence-length metric can be active",
            "keep either seqlen_truncate or seqlen_reshape",
        )
        return None
    return found[0] if found else None


# --------------------------------------------------------------------------------------------------
# the training blocks: DeepSpeed's own rules, and the LR settings


def check_batch_sizes(chk: Checker, raw: Mapping[str, Any], s: Settings, world: int):
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
        chk.add(
            "train_batch_size",
            None,
            "is required (or train_micro_batch_size_per_gpu)",
            'add "train_batch_size": the global batch in sequences',
        )
        return None
    if tbs is not None and mb is not None and gas is not None:
        if tbs != mb * gas * world:
            chk.add(
                paths["train_batch_size"],
                tbs,
                f"{rule}: {mb} x {gas} x {world} = {mb * gas * world}",
                f"set train_batch_size to {mb * gas * world}, or change the micro batch / accumulation",
            )
            return None
    elif tbs is not None and mb is not None:
        if tbs % (mb * world):
            chk.add(
                paths["train_batch_size"],
                tbs,
                f"{rule}: it is not divisible by {mb} x {world}",
                "use a multiple of micro batch x world size",
            )
            return None
        gas = tbs // (mb * world)
    elif tbs is not None:
        gas = gas or 1
        if tbs % (gas * world):
            chk.add(
                paths["train_batch_size"],
                tbs,
                f"{rule}: it is not divisible by {gas} x {world}",
                "use a multiple of gradient_accumulation_steps x world size",
            )
            return None
        mb = tbs // (gas * world)
    else:
        gas = gas or 1
        tbs = mb * gas * world
    return tbs, mb, gas


def check_optimizer(chk: Checker, raw: Mapping[str, Any]) -> OptimizerConfig:
    """The ``optimizer`` block (DeepSpeed's defaults where it is silent: no weight decay once it is named)."""
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
            chk.warn(
                f"optimizer.type {kind!r}: seqwarm's own engine builds {', '.join(OPTIMIZERS_BUILT_HERE)}; "
                "other types run only under DeepSpeed"
            )
    params = chk.section(block, "params", "optimizer.params") or {}
    defaults = OptimizerConfig()
    lr = defaults.lr
    if "lr" in params:
        lr = chk.number(params["lr"], "optimizer.params.lr", fix="use a positive learning rate, e.g. 1.5e-4")
    betas = defaults.betas
    if "betas" in params:
        b = params["betas"]
        ok = (
            isinstance(b, (list, tuple))
            and len(b) == 2
            and all(not isinstance(x, bool) and isinstance(x, (int, float)) and 0 <= x < 1 for x in b)
        )
        if ok:
            betas = (float(b[0]), float(b[1]))
        else:
            chk.add("optimizer.params.betas", b, "must be two numbers in [0, 1)", "write e.g. [0.9, 0.95]")
    eps = chk.number(params.get("eps", defaults.eps), "optimizer.params.eps", strict=True) or defaults.eps
    # DeepSpeed's optimizers default to no weight decay; keep that when the config names an optimizer.
    wd = chk.number(params.get("weight_decay", 0.0), "optimizer.params.weight_decay")
    return OptimizerConfig(
        type=kind,
        lr=lr if lr is not None else defaults.lr,
        betas=betas,
        eps=eps,
        weight_decay=wd if wd is not None else 0.0,
        params=dict(params),
    )


def apply_adam_overrides(chk: Checker, s: Settings, opt: OptimizerConfig) -> OptimizerConfig:
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


def check_precision(chk: Checker, raw: Mapping[str, Any], s: Settings) -> tuple[str, FP16Config, bool]:
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
        initial_scale_power=chk.integer(
            fp16_block.get("initial_scale_power", d.initial_scale_power), "fp16.initial_scale_power", minimum=0
        )
        or 0,
        loss_scale_window=chk.integer(
            fp16_block.get("loss_scale_window", d.loss_scale_window), "fp16.loss_scale_window"
        )
        or d.loss_scale_window,
        hysteresis=chk.integer(fp16_block.get("hysteresis", d.hysteresis), "fp16.hysteresis") or d.hysteresis,
        consecutive_hysteresis=bool(
            chk.boolean(fp16_block.get("consecutive_hysteresis", False), "fp16.consecutive_hysteresis")
        ),
        min_loss_scale=chk.number(
            fp16_block.get("min_loss_scale", d.min_loss_scale), "fp16.min_loss_scale", strict=True
        )
        or d.min_loss_scale,
    )
    # a block that says enabled (true or false) names the precision: only silence lets the device choose
    named = "enabled" in fp16_block or "enabled" in bf16_block or "precision" in s
    return precision, fp16, named


def scheduler_settings(chk: Checker, raw: Mapping[str, Any]) -> Settings:
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
        chk.warn(
            f"scheduler {kind!r} is mapped onto seqwarm's LR schedule by iterations; with a curriculum, "
            "decay by tokens instead (lr_decay_tokens): early curriculum steps carry few tokens"
        )
        if params.get("warmup_min_lr"):
            chk.warn(
                f"scheduler.params.warmup_min_lr = {params['warmup_min_lr']}: seqwarm's warmup starts "
                "from 0, not from warmup_min_lr"
            )
        if params.get("warmup_type", "log") != "linear" and "warmup_num_steps" in params:
            chk.warn(
                f"scheduler.params.warmup_type = {params.get('warmup_type', 'log')!r} (DeepSpeed's default "
                "is 'log'): seqwarm's warmup is linear"
            )
    else:
        chk.warn(
            f"scheduler {kind!r} is left to DeepSpeed; seqwarm's own engine keeps a constant LR unless "
            "lr_decay_style is set"
        )
    return {k: Given(v, f"scheduler.params ({kind})") for k, v in out.items() if v is not None}


def check_lr(
    chk: Checker, s: Settings, opt: OptimizerConfig, budget: dict[str, int | None], *, megatron: bool = False
) -> LRConfig:
    """The LR settings, handed to :func:`seqwarm.curriculum.lr.lr_config_from` by LRConfig field name
    (``megatron``: under Megatron-DeepSpeed's rule)."""
    given = {_LR_FIELDS[key]: where for key, where in s.items() if key in _LR_FIELDS}
    return lr_config_from(
        chk,
        given,
        default_lr=opt.lr,
        budget=budget,
        label=lambda name: flag_for(_LR_KEYS[name]),
        rule="megatron" if megatron else "seqwarm",
    )


# --------------------------------------------------------------------------------------------------
# Megatron-DeepSpeed's command line

MEGATRON_REQUIRED = ("lr", "train_micro_batch_size_per_gpu")
"""Settings every Megatron-DeepSpeed command line gives (with ``train_iters`` or ``train_samples``): its
``arguments.py`` asserts ``--micro-batch-size``, its scheduler needs ``--lr`` and one training length."""
MEGATRON_OPTIMIZER = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8, "weight_decay": 0.01}
"""Megatron-DeepSpeed's defaults of its optimizer flags (``arguments.py``)."""


def is_megatron_run(chk: Checker, s: Settings) -> bool:
    """Whether the run follows Megatron-DeepSpeed's rules: ``megatron`` when set, else whether the command
    line (the overrides) gives ``--lr``, ``--micro-batch-size`` and ``--train-iters`` or ``--train-samples``."""
    if "megatron" in s:
        return bool(chk.boolean(s["megatron"].value, s["megatron"].path))
    flags = {key for key, got in s.items() if got.path.startswith("--")}
    return all(k in flags for k in MEGATRON_REQUIRED) and bool(flags & {"train_iters", "train_samples"})


def megatron_optimizer(chk: Checker, s: Settings, block: OptimizerConfig, raw: Mapping[str, Any]) -> OptimizerConfig:
    """The optimizer Megatron-DeepSpeed builds from its flags (``get_megatron_optimizer``: Adam over param
    groups without weight decay on biases and norms; apex's FusedAdam, decoupled weight decay by default).
    It hands that optimizer to ``deepspeed.initialize``, and DeepSpeed then uses it as it is and ignores the
    config's ``optimizer`` block: where the block says otherwise, a warning names what wins."""
    values: dict[str, float] = {}
    for key, default in MEGATRON_OPTIMIZER.items():
        value = chk.number(s[key].value, s[key].path) if key in s else None
        if value is not None and key.startswith("adam_beta") and not 0 <= value < 1:
            chk.add(s[key].path, value, "must be in [0, 1)", "use e.g. 0.9 and 0.999 (Megatron's defaults)")
            value = None
        values[key] = float(default if value is None else value)
    opt = dataclasses.replace(
        block,
        type="AdamW",
        betas=(values["adam_beta1"], values["adam_beta2"]),
        eps=values["adam_eps"],
        weight_decay=values["weight_decay"],
    )
    if isinstance(raw.get("optimizer"), Mapping):
        differs = [
            f"{name} {mine} (the block: {theirs})"
            for name, mine, theirs in (
                ("type", opt.type, block.type),
                ("betas", list(opt.betas), list(block.betas)),
                ("eps", f"{opt.eps:g}", f"{block.eps:g}"),
                ("weight decay", f"{opt.weight_decay:g}", f"{block.weight_decay:g}"),
            )
            if mine != theirs and not (name == "type" and theirs in ("Adam", "AdamW"))
        ]
        if differs:
            chk.warn(
                "a Megatron-DeepSpeed command line: the optimizer is built from its flags and their Megatron "
                f"defaults, not from the config's optimizer block: {', '.join(differs)}. Megatron-DeepSpeed "
                "hands its own optimizer to deepspeed.initialize, which then ignores the block; set "
                "--adam-beta1/--adam-beta2/--adam-eps/--weight-decay to change it, or --no-megatron to use the block"
            )
    return opt
