"""The one table of seqwarm settings: the ``"seqwarm"`` block's keys, ``load_config`` overrides, CLI flags.

Every Megatron-side setting (and the few DeepSpeed keys a flag may override) is one :class:`Setting`
row in :data:`SETTINGS`. From this table come: the keys the config's top-level ``"seqwarm"`` block
accepts, the keys of ``load_config(overrides=...)``, the command-line flags of ``train`` / ``plan`` /
``compare`` / ``tune`` (name, type, choices, group, mutual exclusion) and their ``--help`` text, the
flag named in a config error about a flag, and the flag rendered when an experiment writes out the
``seqwarm train`` command that reproduces a run. Add a setting here and everything else follows.

This module imports nothing of seqwarm but the choice lists' owners' constants, and no ``argparse``:
the CLI layer (:mod:`seqwarm.cli.commands.common`) turns rows into flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqwarm.config.run import COUNT_TOKENS_BY, PRECISIONS
from seqwarm.config.variable import VARIABLE_CURRICULA
from seqwarm.curriculum.lr import DECAY_STYLES
from seqwarm.curriculum.schedule import CURRICULUM_MODES

__all__ = [
    "Setting",
    "SETTINGS",
    "SETTING_KEYS",
    "GROUPS",
    "setting",
    "flag_for",
    "negative_flag",
    "keys_of_kind",
    "keys_in_group",
]

GROUPS = {
    "budget": "budget (tokens are counted as trained, after truncation)",
    "lr": "learning rate (warmup in iters/samples, decay in tokens)",
    "batch": "batch and length",
    "optimizer": "optimizer, clipping and precision",
    "performance": "performance (the numbers stay those of eager PyTorch, up to kernel rounding)",
}
"""Flag group name -> the title ``--help`` shows above its flags (in this order)."""


@dataclass(frozen=True)
class Setting:
    """One setting: where it lives in a config, its flag, its type and its help text."""

    key: str
    """Key in the config's ``"seqwarm"`` block and in ``load_config(overrides=...)``."""
    flag: str
    """Its command-line flag, e.g. ``--train-tokens``."""
    kind: str
    """``count`` (a whole number: 1000000, 1e6, 1M), ``float`` (>= 0), ``choice``, ``list`` (one or more
    values), ``json`` (a JSON value, or the path of a file holding one),
    ``off`` (a switch that sets the key to False, like ``--no-curriculum``) or ``on`` (a boolean
    key: its flag sets it to True and ``--no-`` + the flag to False, both over the config's value)."""
    help: str
    """The ``--help`` text."""
    group: str
    """The flag group (a key of :data:`GROUPS`)."""
    choices: tuple[str, ...] = ()
    """The allowed values of a ``choice`` setting."""
    exclusive: str | None = None
    """Settings sharing this name are mutually exclusive (one LR warmup unit, one decay unit)."""
    metavar: str | None = None
    """The value's name in ``--help`` (``N``, ``L``, ``B``, ...)."""
    aliases: tuple[str, ...] = ()
    """More spellings of the flag (another tool's name for the same setting)."""
    switches: tuple[tuple[str, str], ...] = ()
    """``(flag, value)``: switch flags that set a ``choice`` setting to one value (Megatron's ``--fp16``)."""


SETTINGS: tuple[Setting, ...] = (
    # budget
    Setting(
        "train_tokens",
        "--train-tokens",
        "count",
        "token budget: stop after the first optimizer step at "
        "which the tokens trained (after truncation, summed over ranks) reach N",
        "budget",
        metavar="N",
    ),
    Setting(
        "train_iters",
        "--train-iters",
        "count",
        "cap on optimizer steps (with a curriculum, keep it only as a generous safety cap next to --train-tokens)",
        "budget",
        metavar="N",
    ),
    Setting(
        "train_samples",
        "--train-samples",
        "count",
        "cap on samples (full-length sequences drawn)",
        "budget",
        metavar="N",
    ),
    # learning rate
    Setting(
        "megatron",
        "--megatron",
        "on",
        "Megatron-DeepSpeed's rules: the LR schedule of its OptimizerParamScheduler step for step (a step "
        "trains at the LR set after the step before; decay over --train-iters/--train-samples unless "
        "--lr-decay-tokens), its optimizer from the flags and their Megatron defaults (AdamW, --adam-beta1 0.9, "
        "--adam-beta2 0.999, --adam-eps 1e-8, --weight-decay 0.01) over the config's optimizer block (default: "
        "on when the command line gives --lr, --micro-batch-size and --train-iters or --train-samples, the "
        "flags every Megatron-DeepSpeed run needs; see docs/MIGRATING.md)",
        "lr",
    ),
    Setting("lr", "--lr", "float", "peak learning rate (default: the config's optimizer lr)", "lr", metavar="LR"),
    Setting("min_lr", "--min-lr", "float", "learning rate at the end of the decay (default 0)", "lr", metavar="LR"),
    Setting(
        "lr_decay_style",
        "--lr-decay-style",
        "choice",
        "shape of the decay after warmup: linear and "
        "cosine reach exactly --min-lr at the decay end (default: linear when a decay length is given, "
        "else constant)",
        "lr",
        choices=DECAY_STYLES,
    ),
    Setting(
        "lr_decay_tokens",
        "--lr-decay-tokens",
        "count",
        "the LR decays from the end of warmup until N "
        "tokens are trained (the recipe's unit; default: the --train-tokens budget). From "
        "--lr-decay-samples multiply by the full length; from --lr-decay-iters by full length x global "
        "batch",
        "lr",
        exclusive="decay",
        metavar="N",
    ),
    Setting(
        "lr_decay_iters",
        "--lr-decay-iters",
        "count",
        "decay until optimizer step N instead (decays too fast with a curriculum: early steps carry few tokens)",
        "lr",
        exclusive="decay",
        metavar="N",
    ),
    Setting(
        "lr_decay_samples",
        "--lr-decay-samples",
        "count",
        "decay until N samples instead",
        "lr",
        exclusive="decay",
        metavar="N",
    ),
    Setting(
        "lr_warmup_iters",
        "--lr-warmup-iters",
        "count",
        "linear LR warmup over N optimizer steps (for a warmup of X tokens: X / (min_difficulty x global batch))",
        "lr",
        exclusive="warmup",
        metavar="N",
    ),
    Setting(
        "lr_warmup_samples",
        "--lr-warmup-samples",
        "count",
        "linear LR warmup over N samples (for a warmup of X tokens: X / min_difficulty)",
        "lr",
        exclusive="warmup",
        metavar="N",
    ),
    Setting(
        "lr_warmup_tokens",
        "--lr-warmup-tokens",
        "count",
        "linear LR warmup over N tokens (not the recipe: token warmup rises slowly while sequences are short)",
        "lr",
        exclusive="warmup",
        metavar="N",
    ),
    # batch and length
    Setting(
        "seq_length",
        "--seq-length",
        "count",
        "the model's full sequence length (default: the curriculum's max_difficulty, else the model preset's)",
        "batch",
        metavar="L",
    ),
    Setting(
        "train_micro_batch_size_per_gpu",
        "--micro-batch-size",
        "count",
        "sequences per micro-batch on each process (DeepSpeed's train_micro_batch_size_per_gpu)",
        "batch",
        metavar="B",
    ),
    Setting(
        "train_batch_size",
        "--global-batch-size",
        "count",
        "sequences per optimizer step (= micro batch x accumulation x world size; DeepSpeed's train_batch_size)",
        "batch",
        metavar="B",
    ),
    Setting(
        "gradient_accumulation_steps",
        "--gradient-accumulation-steps",
        "count",
        "micro-batches per optimizer step on each process",
        "batch",
        metavar="K",
    ),
    Setting(
        "rampup_batch_size",
        "--rampup-batch-size",
        "list",
        "Megatron's batch-size ramp: refused next to a "
        "curriculum (both cut the tokens per batch; never combine the two)",
        "batch",
        metavar="V",
    ),
    Setting(
        "curriculum_mode",
        "--curriculum-mode",
        "choice",
        "how the length reaches the model: truncate (cut "
        "every sequence), reshape (re-chunk the batch, keep all tokens), window (rows stay at full length, "
        "attention inside fragments of L tokens: one shape for the whole run), inject (pass "
        "curriculum_seqlen=L to a forward that takes it) or variable (documents cut into power-of-2 chunks "
        "between min_difficulty and max_difficulty, every row one document, each step one length with the "
        "same tokens; seqwarm's GPT on the torch backends, see docs/VARIABLE.md); default: inject when the "
        "model's forward names curriculum_seqlen, else truncate",
        "batch",
        choices=CURRICULUM_MODES,
    ),
    Setting(
        "variable_curriculum",
        "--variable-curriculum",
        "choice",
        "with --curriculum-mode variable, which length each step draws: schedule (default: the curriculum "
        "block's schedule caps the length, natural odds below the cap), natural (each length in proportion to "
        "the tokens its bucket holds), grow_p2 (cycles from short to long, --variable-cycles of them per pass "
        "over the data) or linear (the cap grows linearly from min_difficulty to max_difficulty over the "
        "budget's steps)",
        "batch",
        choices=VARIABLE_CURRICULA,
    ),
    Setting(
        "variable_cycles",
        "--variable-cycles",
        "count",
        "the grow_p2 variable curriculum's cycles per pass over the data (default 8)",
        "batch",
        metavar="N",
    ),
    Setting(
        "count_tokens_by",
        "--count-tokens-by",
        "choice",
        "count trained tokens by the shaped batch's shape (default) or by the sum of its loss_mask",
        "batch",
        choices=COUNT_TOKENS_BY,
    ),
    Setting(
        "stages",
        "--stages",
        "json",
        "the length schedule after the warmup, as a JSON list (or a file holding one): "
        '[{"start_tokens": N, "length": L, "rope_theta": T}, {"start_tokens": N2, "length": L2, "rope_scaling": '
        '{"type": "yarn", "factor": 2.0}}]; from the first step whose clock reaches start_tokens the run trains '
        "at that length with those rotary settings (linear or yarn rope_scaling in Transformers' keys; a key "
        "left out keeps the previous stage's). A stage's windows are read at its length, above --seq-length too, "
        "with the micro-batch's tokens kept (or its own micro_batch_size); seqwarm's rotary GPT on the torch "
        "backends only (see docs/STAGES.md)",
        "batch",
        metavar="JSON",
    ),
    Setting("curriculum", "--no-curriculum", "off", "turn the curriculum off: the full-length baseline", "batch"),
    Setting(
        "document_masking",
        "--document-masking",
        "on",
        "attention stays inside each document of a packed window (block-diagonal causal, documents end at "
        "EOD) and positions restart at each document, in training and validation; seqwarm's GPT, or an hf: "
        "model through restarting position_ids (default: the config's seqwarm.document_masking, else off)",
        "batch",
    ),
    # optimizer, clipping, precision
    Setting(
        "weight_decay",
        "--weight-decay",
        "float",
        "AdamW weight decay on matrices (biases and norms get none); default: the config's optimizer weight_decay",
        "optimizer",
        metavar="WD",
    ),
    Setting(
        "gradient_clipping",
        "--clip-grad",
        "float",
        "clip the global gradient norm to this value (0: off); DeepSpeed's gradient_clipping",
        "optimizer",
        metavar="NORM",
    ),
    Setting(
        "adam_beta1",
        "--adam-beta1",
        "float",
        "Adam's beta1, in [0, 1) (default: the config's optimizer betas)",
        "optimizer",
        metavar="B1",
    ),
    Setting(
        "adam_beta2",
        "--adam-beta2",
        "float",
        "Adam's beta2, in [0, 1) (default: the config's optimizer betas)",
        "optimizer",
        metavar="B2",
    ),
    Setting(
        "adam_eps",
        "--adam-eps",
        "float",
        "Adam's epsilon (default: the config's optimizer eps)",
        "optimizer",
        metavar="EPS",
    ),
    Setting(
        "precision",
        "--precision",
        "choice",
        "fp32, bf16 (autocast) or fp16 (autocast with dynamic loss "
        "scaling); default: the config's fp16/bf16 blocks, else bf16 on CUDA and fp32 elsewhere",
        "optimizer",
        choices=PRECISIONS,
        switches=(("--fp16", "fp16"), ("--bf16", "bf16")),
    ),
    # performance
    Setting(
        "compile",
        "--compile",
        "on",
        "torch.compile seqwarm's GPT (in place, before DDP; per block under "
        "--fsdp) with the sequence dimension dynamic, so a whole curriculum runs on a few graphs (default: "
        "the config's seqwarm.compile, else off)",
        "performance",
    ),
    Setting(
        "length_bucket",
        "--length-bucket",
        "count",
        "cut batches to the curriculum length rounded up to a "
        "multiple of N, the loss masked past the length: the same loss and gradients, at most "
        "ceil(seq_length / N) shapes (static shapes for CUDA graphs or compile without dynamic shapes), at "
        "the cost of computing "
        "the masked columns; truncate mode only (default: cut to the length itself)",
        "performance",
        metavar="N",
    ),
    Setting(
        "peak_tflops",
        "--peak-tflops",
        "float",
        "the device's peak TFLOP/s (dense, in the run's precision): metrics.jsonl and the console then show the "
        "model FLOPs utilisation (MFU) of the span each step trained (its length, window and documents; see "
        "docs/PERFORMANCE.md). Default: known only for a bf16/fp16 run on an A100, H100 or H200 by its exact "
        "CUDA name; any other device shows no MFU",
        "performance",
        metavar="TFLOPS",
    ),
)

_BY_KEY = {s.key: s for s in SETTINGS}
SETTING_KEYS: tuple[str, ...] = tuple(_BY_KEY)
"""The keys the ``"seqwarm"`` block and ``load_config(overrides=...)`` accept."""


def setting(key: str) -> Setting:
    """The row for ``key`` (KeyError naming the known keys otherwise)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown seqwarm setting {key!r}; known: {', '.join(SETTING_KEYS)}") from None


def flag_for(key: str) -> str:
    """The command-line flag of setting ``key`` (``train_micro_batch_size_per_gpu`` -> ``--micro-batch-size``)."""
    return setting(key).flag


def negative_flag(key: str) -> str:
    """The flag that sets an ``on`` setting to False (``compile`` -> ``--no-compile``)."""
    return "--no-" + setting(key).flag.removeprefix("--")


def keys_of_kind(kind: str) -> tuple[str, ...]:
    """The keys of every setting of one ``kind`` (e.g. all ``count`` settings)."""
    return tuple(s.key for s in SETTINGS if s.kind == kind)


def keys_in_group(group: str) -> tuple[str, ...]:
    """The keys of every setting in one flag ``group`` (e.g. ``budget``), in table order."""
    return tuple(s.key for s in SETTINGS if s.group == group)
