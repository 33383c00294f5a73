"""A training run described: a frozen :class:`RunSpec`, checked and resolved into its RunConfig (what
``seqwarm train``, ``compare`` and ``tune`` build; :func:`seqwarm.run.training.run_training` runs one).

::

    from seqwarm.run.spec import RunSpec
    from seqwarm.run.training import run_training

    result = run_training(RunSpec(config="examples/tiny_cpu.json", settings={"train_tokens": 20_000},
                                  out="runs/demo", device="cpu"))  # paths may be str or Path
    print(result.final_val_loss, result.run_dir)

A spec holds everything ``seqwarm train`` takes: the config file (or None for the built-in recipe,
:func:`seqwarm.config.defaults.default_train_config`), ``settings`` (``load_config`` overrides, keyed as the
settings table :mod:`seqwarm.config.settings`), and the run's options. The ``seqwarm train`` flags are
generated from these fields (name from the field name, help from the field docstring: see
:mod:`seqwarm.run.command` for the rule); change the spec with :func:`dataclasses.replace` or
:func:`with_changes`. Bad input raises :class:`~seqwarm.util.errors.UserError` (config and run-policy problems
together as one :class:`~seqwarm.util.problems.ConfigError`), which the CLI turns into exit code 2.
"""

from __future__ import annotations

import logging
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from seqwarm.config import RunConfig, load_config
from seqwarm.config.defaults import PRESETS, default_train_config
from seqwarm.config.settings import SETTING_KEYS, flag_for, negative_flag
from seqwarm.config.variable import VARIABLE_TORCH_ONLY
from seqwarm.util.errors import UserError
from seqwarm.util.problems import ConfigError, Problem

SPLIT_ROUNDINGS = ("megatron-deepspeed", "megatron-core")
"""``--split-rounding``'s rules: seqwarm.data.blend.SPLIT_ROUNDINGS, named here without importing torch."""

__all__ = ["RunSpec", "resolve_config", "recipe_config", "policy_problems", "spec_problems", "with_changes"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """One ``seqwarm train`` run. Field metadata (``flag``, ``metavar``, ``group``, ``parse``) shapes its
    command-line flag; the docstring under a field is that flag's ``--help``."""

    config: Path | None = field(
        default=None, metadata={"metavar": "FILE", "aliases": ("--deepspeed_config", "--deepspeed-config")}
    )
    """DeepSpeed JSON config (curriculum_learning or data_efficiency block, batch sizes, optimizer,
    clipping, precision; optional 'seqwarm' block). Default: the built-in CPU demo recipe
    (examples/tiny_cpu.json)"""
    data: Path | None = field(default=None, metadata={"metavar": "DIR"})
    """a folder written by `seqwarm prepare` (default: the embedded corpus, prepared once into the cache)"""
    data_path: tuple[str, ...] = field(default=(), metadata={"metavar": "PREFIX"})
    """Megatron indexed data read in place instead of --data: PREFIX for PREFIX.bin + PREFIX.idx, or a blend
    W1 PREFIX1 W2 PREFIX2 ... (see docs/MIGRATING.md)"""
    split: str = field(default="969,30,1", metadata={"metavar": "T,V,E"})
    """with --data-path: Megatron's train,valid,test split of the documents (default 969,30,1; the test part
    is not used)"""
    split_rounding: str = field(default="megatron-deepspeed", metadata={"metavar": "RULE"})
    """with --data-path: how --split rounds its document boundaries: megatron-deepspeed (default; each part
    rounded, Megatron-DeepSpeed's get_train_valid_test_split_) or megatron-core (each cumulative boundary
    rounded); they can put a boundary one document apart"""
    tokenizer: str | None = field(default=None, metadata={"metavar": "NAME"})
    """with --data-path: the tokenizer the data was made with (gpt2, hf:PATH), for its vocabulary and EOD id"""
    vocab_size: int | None = field(default=None, metadata={"parse": "int", "metavar": "N"})
    """with --data-path: the vocabulary size (default: the tokenizer's; e.g. Megatron's padded size)"""
    eod_id: int | None = field(default=None, metadata={"parse": "int", "metavar": "ID"})
    """with --data-path: the end-of-document token id (default: the tokenizer's)"""
    model: str = "tiny"
    """model size preset: tiny (default), nano (for sweeps on CPU), gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b;
    or hf:PATH, a Hugging Face causal LM built from a local config.json (AutoModelForCausalLM.from_config, nothing is
    downloaded)"""
    n_layer: int | None = field(default=None, metadata={"metavar": "N", "parse": "int"})
    """transformer layers (default: the --model preset's); with --n-head and --n-embd, a GPT of any size
    for cheap experiments"""
    n_head: int | None = field(default=None, metadata={"metavar": "N", "parse": "int"})
    """attention heads (default: the --model preset's; must divide --n-embd)"""
    n_embd: int | None = field(default=None, metadata={"metavar": "N", "parse": "int"})
    """model width (default: the --model preset's)"""
    rotary: bool = field(default=False, metadata={"aliases": ("--use-rotary-position-embeddings",)})
    """rotary position embeddings instead of learned ones"""
    rotary_percent: float = field(default=1.0, metadata={"metavar": "P"})
    """with --rotary: the share of each attention head's channels rotated, the rest unrotated (Megatron's
    --rotary-percent; default 1.0)"""
    init_method_std: float | None = field(default=None, metadata={"metavar": "STD"})
    """standard deviation of the normal weight initialisation; residual output projections get
    STD / sqrt(2 x layers) (Megatron's --init-method-std; default 0.02)"""
    fsdp: bool = False
    """under torchrun: shard the model with FSDP2 (fully_shard per block) instead of DDP"""
    deepspeed: bool = field(default=False, metadata={"group": "deepspeed"})
    """train on a DeepSpeed engine (under torchrun or the deepspeed launcher); ZeRO stage, offload,
    precision and batch sizes come from --config"""
    pipeline_stages: int = field(
        default=0, metadata={"group": "deepspeed", "metavar": "K", "aliases": ("--pipeline-model-parallel-size",)}
    )
    """with --deepspeed: a K-stage (K >= 2) DeepSpeed pipeline of the GPT (ZeRO stage 0 or 1; K must divide
    the number of processes)"""
    local_rank: int | None = field(
        default=None,
        metadata={"group": "deepspeed", "parse": "int", "metavar": "N", "aliases": ("--local_rank",), "launcher": True},
    )
    """set by the deepspeed launcher (--local_rank=N); checked against its LOCAL_RANK, which seqwarm uses"""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """``load_config`` overrides, keyed as the settings table (``{"train_tokens": 2_000_000, "lr": 3e-4,
    "curriculum": False}``); each key is a flag of its own (``--train-tokens``, ``--lr``, ``--no-curriculum``)"""
    out: Path | None = field(default=None, metadata={"group": "run", "metavar": "RUN", "aliases": ("--save",)})
    """run folder (default: runs/<model>-<date>-<time>)"""
    resume: bool | str = field(default=False, metadata={"group": "run", "values": ("auto",)})
    """continue the run in --out from its latest valid checkpoint; `--resume auto`: continue it, or start it
    when --out holds no run yet (one command for a job's first launch and its requeues)"""
    start_over: bool = field(default=False, metadata={"group": "run"})
    """train the run in --out again from step 0, after moving everything the folder holds into
    RUN/previous-N/ (nothing is deleted); the one way to restart a run that wrote checkpoints"""
    allow_config_change: bool = field(default=False, metadata={"group": "run"})
    """resume even if the curriculum/budget/batch settings differ from the checkpoint's"""
    seed: int = field(default=1234, metadata={"group": "run", "parse": "int"})
    """seed of the initial weights and of the data order (default 1234)"""
    device: str = field(default="auto", metadata={"group": "run"})
    """auto (cuda if available), cpu, cuda, cuda:N"""
    eval_interval: int = field(default=50, metadata={"group": "run", "metavar": "N"})
    """validate every N steps (0: only at the end)"""
    eval_iters: int = field(default=8, metadata={"group": "run", "metavar": "N"})
    """validation micro-batches per evaluation"""
    save_interval: int = field(default=100, metadata={"group": "run", "metavar": "N"})
    """checkpoint every N steps (and at the end)"""
    keep_checkpoints: int = field(default=3, metadata={"group": "run", "metavar": "N"})
    """checkpoints kept in the run folder, the newest ones (0: all; default 3)"""
    exit_duration_in_mins: float | None = field(default=None, metadata={"group": "run", "metavar": "MIN"})
    """after MIN minutes of wall-clock (Megatron's flag), finish the step, save a checkpoint and exit with
    code 75, as on SIGTERM / SIGUSR1: continue with --resume"""
    dist_timeout_s: float | None = field(default=None, metadata={"group": "run", "metavar": "S"})
    """under torchrun: a collective that waits S seconds for another rank fails, and every rank exits naming
    the one that died, raised or stalled (default 600)"""
    log_interval: int = field(default=10, metadata={"group": "run", "metavar": "N"})
    """a metrics row and a console line every N steps (default 10)"""
    progress_bar: bool = field(default=True, metadata={"group": "run", "flag": "--no-progress"})
    """no progress bar"""
    eval_wikitext: Path | None = field(default=None, metadata={"group": "run", "metavar": "FILE"})
    """after training, WikiText-103 perplexity on this local wiki.test.raw (see docs/EVALUATION.md)"""
    eval_lambada: Path | None = field(default=None, metadata={"group": "run", "metavar": "FILE"})
    """after training, LAMBADA zero-shot accuracy on this local lambada_test.jsonl"""
    tensorboard: bool = field(default=True, metadata={"group": "run", "flag": "--no-tensorboard"})
    """no TensorBoard event files"""
    tensorboard_dir: Path | None = field(default=None, metadata={"group": "run", "metavar": "DIR"})
    """TensorBoard event files here instead of RUN/tensorboard (also the config's "tensorboard" block)"""
    tensorboard_log_interval: int = field(default=1, metadata={"group": "run", "metavar": "N"})
    """the trackers (TensorBoard, W&B, CSV) get a point every N steps, each step's own numbers, as
    Megatron-DeepSpeed's --tensorboard-log-interval (default 1: every step; 0: only the --log-interval rows,
    averaged over their steps)"""
    log_optimizer_states_to_tensorboard: bool = field(default=False, metadata={"group": "run"})
    """with each point, the l2 / l1 norms and largest values of Adam's variance, its square root, the
    momentum and the weights (Megatron-DeepSpeed's optimizer/* tags; reads every state: slower steps)"""
    wandb_project: str | None = field(default=None, metadata={"group": "run", "metavar": "NAME"})
    """log to Weights & Biases, this project (pip install 'seqwarm[wandb]'; also the config's "wandb"
    block; WANDB_MODE=offline keeps it local)"""
    wandb_run_name: str | None = field(
        default=None, metadata={"group": "run", "metavar": "NAME", "aliases": ("--wandb-exp-name",)}
    )
    """the W&B run's name (default: the run folder's name)"""

    def __post_init__(self) -> None:
        # paths given as strings become Paths and settings a private dict, so that equal runs compare equal
        for name in _PATH_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "settings", dict(self.settings))
        object.__setattr__(self, "data_path", tuple(str(p) for p in self.data_path))


_MINUTES_FIX = "give the minutes a session may train, e.g. 230 for a 4-hour job (or leave it out: no limit)"
_FIELDS = tuple(f.name for f in fields(RunSpec) if f.name != "settings")
_PATH_FIELDS = tuple(name for name, hint in typing.get_type_hints(RunSpec).items() if Path in typing.get_args(hint))


def with_changes(spec: RunSpec, **changes: Any) -> RunSpec:
    """``spec`` with fields and settings changed by name; a setting given as None is removed (its
    value then comes from the config again)."""
    direct: dict[str, Any] = {}
    settings = dict(spec.settings)
    for key, value in changes.items():
        if key in _FIELDS:
            direct[key] = value
        elif key in SETTING_KEYS:
            if value is None:
                settings.pop(key, None)
            else:
                settings[key] = value
        else:
            raise KeyError(f"{key!r} is neither a RunSpec field nor a setting ({', '.join(SETTING_KEYS)})")
    return replace(spec, settings=settings, **direct)


# --------------------------------------------------------------------------------------------------
# the run's config and the run-level policy


def policy_problems(cfg: RunConfig) -> list[Problem]:
    """What ``seqwarm train``'s loop cannot run although the config itself is valid (all of it at once)."""
    problems = []
    if cfg.rampup_batch_size:
        ramp = f"rampup_batch_size ({flag_for('rampup_batch_size')})"
        if cfg.curriculum is not None:
            problems.append(
                Problem(
                    ramp,
                    " ".join(map(str, cfg.rampup_batch_size)),
                    "cannot be combined with a sequence-length curriculum: both cut the tokens per "
                    "batch and SLW is the more stable of the two (Li et al. 2022, §5.4)",
                    "keep the global batch fixed (consider a larger micro-batch) and drop the ramp",
                )
            )
        else:
            problems.append(
                Problem(
                    ramp,
                    " ".join(map(str, cfg.rampup_batch_size)),
                    "Megatron's batch-size warmup is not implemented by seqwarm's loop",
                    "drop the ramp",
                )
            )
    if cfg.curriculum is not None and cfg.curriculum.schedule_type == "custom":
        problems.append(
            Problem(
                "curriculum_learning.schedule_type",
                "custom",
                "a 'custom' schedule is a Python function: `seqwarm train` cannot run it from a config file",
                "use the library (CurriculumScheduler.set_custom_get_difficulty "
                "with CurriculumEngine), or a fixed_linear / fixed_root / fixed_discrete schedule",
            )
        )
    if cfg.train_tokens is None and cfg.train_iters is None and cfg.train_samples is None:
        problems.append(
            Problem(
                "train_tokens",
                None,
                "no budget: the run needs train_tokens, train_iters or train_samples",
                "give --train-tokens (or --train-iters / --train-samples), or "
                "a 'seqwarm' block with train_tokens in the config",
            )
        )
    return problems


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def spec_problems(spec: RunSpec) -> list[Problem]:
    """The run options no loop can use, found before anything is trained (all of them at once)."""
    problems = []
    for name, least in (
        ("eval_iters", 1),
        ("eval_interval", 0),
        ("save_interval", 0),
        ("keep_checkpoints", 0),
        ("log_interval", 0),
        ("tensorboard_log_interval", 0),
        ("pipeline_stages", 0),
    ):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            flag = "--" + name.replace("_", "-")
            problems.append(
                Problem(
                    flag,
                    value,
                    f"must be a whole number >= {least}",
                    f"give {flag} {max(least, 1)} or more" if least else f"give {flag} 0 or more",
                )
            )
    for flag, value, what, fix in (
        ("--exit-duration-in-mins", spec.exit_duration_in_mins, "minutes", _MINUTES_FIX),
        ("--dist-timeout-s", spec.dist_timeout_s, "seconds", "give e.g. 600 (or leave it out: 600)"),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            problems.append(Problem(flag, value, f"must be a number of {what} > 0", fix))
    if not (isinstance(spec.resume, bool) or spec.resume == "auto"):
        problems.append(Problem("--resume", spec.resume, "takes no value or auto", "give --resume, or --resume auto"))
    if spec.start_over and spec.resume:
        problems.append(Problem("--start-over", True, "restarts --out from step 0; --resume continues it", "give one"))
    if not isinstance(spec.device, str) or not _DEVICE.match(spec.device):
        problems.append(
            Problem(
                "--device",
                spec.device,
                "seqwarm trains on auto, cpu, cuda or cuda:N",
                "give --device auto (cuda when available, else cpu)",
            )
        )
    if spec.split_rounding not in SPLIT_ROUNDINGS:
        problems.append(
            Problem(
                "--split-rounding",
                spec.split_rounding,
                f"is one of {', '.join(SPLIT_ROUNDINGS)}",
                "give --split-rounding megatron-deepspeed (Megatron-DeepSpeed's) or megatron-core",
            )
        )
    if spec.data and spec.data_path:
        problems.append(
            Problem(
                "--data-path",
                " ".join(map(str, spec.data_path)),
                "--data (a seqwarm prepared "
                "folder) and --data-path (Megatron indexed files) both name the training data",
                "give one of them",
            )
        )
    if not spec.data_path:  # these describe Megatron indexed files; a prepared folder carries its own
        for name in ("split", "split_rounding", "tokenizer", "vocab_size", "eod_id"):
            value = getattr(spec, name)
            if value != getattr(RunSpec, name):
                flag = "--" + name.replace("_", "-")
                problems.append(
                    Problem(
                        flag,
                        value,
                        "only applies with --data-path (Megatron indexed files); a "
                        "prepared folder (--data) carries its own tokenizer and split",
                        f"drop {flag}, or give --data-path PREFIX",
                    )
                )
    return problems


def resolve_config(spec: RunSpec, world_size: int = 1) -> RunConfig:
    """The run's RunConfig: the config file (or the default recipe) with the settings applied; raises one
    ConfigError listing every run-policy problem."""

    overrides = dict(spec.settings)
    source: Any = str(spec.config) if spec.config else recipe_config(spec)
    cfg = load_config(source, overrides=overrides, world_size=world_size)
    if cfg.seq_length is None:
        seq = cfg.full_length or _model_seq_length(spec.model)
        cfg = load_config(source, overrides={**overrides, "seq_length": seq}, world_size=world_size)
    problems = spec_problems(spec) + policy_problems(cfg)
    if spec.model.startswith("hf:") and cfg.count_tokens_by == "loss_mask":
        problems.append(
            Problem(
                "count_tokens_by",
                "loss_mask",
                "an hf: model takes HF-style batches, which carry no loss_mask to count",
                "count by shape (drop --count-tokens-by loss_mask)",
            )
        )
    if cfg.compile and (spec.deepspeed or spec.model.startswith("hf:")):
        problems.append(
            Problem(
                f"compile ({flag_for('compile')})",
                True,
                "compiles seqwarm's own GPT on its own engine, not a DeepSpeed engine or an hf: model",
                f"drop it ({negative_flag('compile')} over a config's seqwarm.compile), or use "
                "DeepSpeed's config key \"compile\" (or Hugging Face's torch_compile) for those",
            )
        )
    if cfg.curriculum is not None and cfg.curriculum.mode == "variable" and (spec.deepspeed or spec.model[:3] == "hf:"):
        problems.append(  # what the engine builder refuses too, but here before any run (a compare's arms) trains
            Problem(
                "curriculum_mode", "variable", VARIABLE_TORCH_ONLY, "drop --deepspeed / the hf: model, or use truncate"
            )
        )
    problems += _stage_problems(spec, cfg) + schedule_problems(cfg)
    if problems:
        raise ConfigError(problems, str(spec.config) if spec.config else "the built-in recipe")
    for message in cfg.warnings:
        logger.warning("warning: %s", message)
    return cfg


def schedule_problems(cfg: RunConfig) -> list[Problem]:
    """What only the plan sees wrong in the stages (a stage that begins before the warmup ends), when a
    budget is given: :func:`~seqwarm.curriculum.plan.make_plan`'s problems."""
    if not cfg.stages or (cfg.train_tokens is None and cfg.train_iters is None and cfg.train_samples is None):
        return []
    from seqwarm.curriculum.plan import make_plan

    try:
        return make_plan(cfg, check=False).problems
    except UserError:  # what cannot be planned (no length, a custom schedule) is said elsewhere
        return []


def _stage_problems(spec: RunSpec, cfg: RunConfig) -> list[Problem]:
    """What this release's stages do not train yet: each refused rather than trained otherwise."""
    if not cfg.stages:
        return []
    seq, longest = cfg.full_length or 0, max(s.length for s in cfg.stages)
    refused = [
        (
            not spec.rotary
            and not spec.model.startswith("hf:")  # an hf: model's own config decides (checked when it is built)
            and any(s.rope_theta is not None or s.rope_scaling is not None for s in cfg.stages),
            "rope_theta / rope_scaling on a model with learned positions",
            "add --rotary, or drop the stages' rope settings",
        ),
        (
            not spec.rotary and not spec.model.startswith("hf:") and longest > seq,
            f"a length above seq_length {seq} on a model with learned positions (it has {seq} of them)",
            f"add --rotary (rotary positions hold any length), or raise --seq-length to {longest}",
        ),
    ]
    return [
        Problem(f"stages ({flag_for('stages')})", "[...]", f"are not supported with {what} yet", fix)
        for bad, what, fix in refused
        if bad
    ]


def recipe_config(spec: RunSpec) -> dict[str, Any]:
    """The built-in recipe a run without ``--config`` trains (a fresh dict): it follows the user's length
    (``--seq-length``, else the model's), budget and global batch (an explicit config is checked strictly)."""
    return default_train_config(
        spec.settings.get("seq_length") or _recipe_length(spec.model),
        train_tokens=spec.settings.get("train_tokens"),
        train_batch_size=spec.settings.get("train_batch_size"),
    )


def _recipe_length(model: str) -> int | None:
    """The length the built-in recipe follows without --seq-length: the preset's, or an hf: config's
    context (None, the recipe's own length, when it names none or the model is unknown)."""
    if model.startswith("hf:"):
        from seqwarm.integrations.hf.run import hf_model_path, hf_seq_length

        return hf_seq_length(hf_model_path(model))
    return PRESETS[model]["seq_length"] if model in PRESETS else None


def _model_seq_length(model: str) -> int:
    """The full length of a model without a configured one: the preset's, or an hf: config's context."""
    if model.startswith("hf:"):
        from seqwarm.integrations.hf.run import hf_model_path, hf_seq_length

        seq = hf_seq_length(hf_model_path(model))
        if seq is None:
            raise UserError(f"--model {model}: its config.json has no max_position_embeddings; give --seq-length")
        return seq
    return PRESETS[model]["seq_length"]


# --------------------------------------------------------------------------------------------------
# running
