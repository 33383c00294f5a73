"""Flags shared by the commands that describe a run (plan, train, compare, tune), and their mapping
onto :func:`seqwarm.config.load_config` overrides."""

from __future__ import annotations

import argparse
from typing import Any

from seqwarm.config import CURRICULUM_MODES, DECAY_STYLES, PRECISIONS
from seqwarm.units import parse_count


def count(text: str) -> int:
    """argparse type for token/step/sample counts: 1000000, 1e6, 1M, 2B."""
    try:
        return parse_count(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


# flag dest -> load_config override key
_OVERRIDES = {
    "seq_length": "seq_length", "train_tokens": "train_tokens", "train_iters": "train_iters",
    "train_samples": "train_samples", "lr": "lr", "min_lr": "min_lr", "lr_decay_style": "lr_decay_style",
    "lr_decay_tokens": "lr_decay_tokens", "lr_decay_iters": "lr_decay_iters",
    "lr_decay_samples": "lr_decay_samples", "lr_warmup_iters": "lr_warmup_iters",
    "lr_warmup_samples": "lr_warmup_samples", "lr_warmup_tokens": "lr_warmup_tokens",
    "micro_batch_size": "train_micro_batch_size_per_gpu", "global_batch_size": "train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps", "curriculum_mode": "curriculum_mode",
    "precision": "precision", "rampup_batch_size": "rampup_batch_size", "weight_decay": "weight_decay",
    "clip_grad": "gradient_clipping",
}


def add_budget_and_lr_flags(parser: argparse.ArgumentParser) -> None:
    """Budget, LR schedule and batch flags (they override the config file)."""
    g = parser.add_argument_group("budget (tokens are counted as trained, after truncation)")
    g.add_argument("--train-tokens", type=count, metavar="N", help="stop after the step that reaches N tokens")
    g.add_argument("--train-iters", type=count, metavar="N", help="cap on optimizer steps")
    g.add_argument("--train-samples", type=count, metavar="N", help="cap on samples (sequences)")
    g = parser.add_argument_group("learning rate (warmup in iters/samples, decay in tokens)")
    g.add_argument("--lr", type=positive_float, help="peak learning rate (default: the config's optimizer lr)")
    g.add_argument("--min-lr", type=positive_float, help="learning rate at the end of decay")
    g.add_argument("--lr-decay-style", choices=DECAY_STYLES)
    d = g.add_mutually_exclusive_group()
    d.add_argument("--lr-decay-tokens", type=count, metavar="N")
    d.add_argument("--lr-decay-iters", type=count, metavar="N")
    d.add_argument("--lr-decay-samples", type=count, metavar="N")
    w = g.add_mutually_exclusive_group()
    w.add_argument("--lr-warmup-iters", type=count, metavar="N")
    w.add_argument("--lr-warmup-samples", type=count, metavar="N")
    w.add_argument("--lr-warmup-tokens", type=count, metavar="N")
    g = parser.add_argument_group("batch and length")
    g.add_argument("--seq-length", type=count, metavar="L", help="the model's full sequence length")
    g.add_argument("--micro-batch-size", type=count, metavar="B")
    g.add_argument("--global-batch-size", type=count, metavar="B",
                   help="sequences per optimizer step (= micro batch x accumulation x world size)")
    g.add_argument("--gradient-accumulation-steps", type=count, metavar="K")
    g.add_argument("--rampup-batch-size", nargs="+", metavar="V",
                   help="Megatron's batch-size ramp: refused next to a curriculum (never combine the two)")
    g.add_argument("--curriculum-mode", choices=CURRICULUM_MODES,
                   help="truncate (cut sequences), reshape (keep all tokens) or inject (curriculum_seqlen=L)")
    g.add_argument("--no-curriculum", action="store_true", help="turn the curriculum off (the baseline)")


def add_precision_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precision", choices=PRECISIONS)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The load_config overrides the parsed flags ask for (flags not given are left out)."""
    out = {key: getattr(args, dest) for dest, key in _OVERRIDES.items()
           if getattr(args, dest, None) is not None}
    if getattr(args, "no_curriculum", False):
        out["curriculum"] = False
    return out
