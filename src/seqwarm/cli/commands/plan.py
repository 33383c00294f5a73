"""``seqwarm plan CONFIG``: the run ahead of time — lengths, tokens and LR at every length change."""

from __future__ import annotations

import argparse
import json
import sys

from seqwarm.cli.commands.common import add_setting_flags, overrides_from_args, positive_int
from seqwarm.config import load_config
from seqwarm.config.describe import describe
from seqwarm.curriculum.plan import Plan, make_plan
from seqwarm.trainer.plots import plot_plan
from seqwarm.util.units import human_count

MAX_TABLE_ROWS = 24


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="print the run ahead of time (lengths, tokens, LR, steps to the budget)",
        description="Replay the curriculum, token budget and LR schedule of CONFIG without "
        "training: where the length changes, how many steps reach --train-tokens, the tokens "
        "used by the end of the curriculum and the end of LR warmup.",
    )
    p.add_argument("config", metavar="CONFIG", help="DeepSpeed JSON config (seqwarm/DeepSpeed format)")
    add_setting_flags(p, exclude=("precision", "weight_decay", "gradient_clipping", "compile"))
    p.add_argument("--world-size", type=positive_int, default=1, help="data-parallel ranks")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="draw length and LR against steps and tokens")
    p.set_defaults(func=run)


def _table_rows(plan: Plan) -> tuple[list, bool]:
    points = plan.points
    if len(points) <= MAX_TABLE_ROWS:
        return points, False
    stride = -(-(len(points) - 2) // (MAX_TABLE_ROWS - 2))
    picked = [points[0]] + points[1:-1:stride] + [points[-1]]
    return picked, True


def print_plan(plan: Plan, out=None) -> None:
    out = out or sys.stdout
    rows, thinned = _table_rows(plan)
    print(f"{'step':>10} {'seqlen':>7} {'tokens/step':>12} {'tokens':>10} {'lr':>10}", file=out)
    for p in rows:
        print(
            f"{p.step:>10,} {p.seqlen:>7} {human_count(p.tokens_per_step):>12} {human_count(p.tokens):>10} "
            f"{p.lr:>10.3g}",
            file=out,
        )
    if thinned:
        print(f"({len(rows)} of {len(plan.points)} length changes shown; --json lists all)", file=out)
    print(file=out)
    print(f"total steps:               {plan.total_steps:,}  ({plan.stop_reason})", file=out)
    print(f"total tokens:              {plan.total_tokens:,} ({human_count(plan.total_tokens)})", file=out)
    if plan.curriculum_end_step is not None:
        print(
            f"curriculum ends:           step {plan.curriculum_end_step:,}, after "
            f"{human_count(plan.tokens_at_curriculum_end)} tokens",
            file=out,
        )
    if plan.warmup_end_step is not None:
        print(
            f"LR warmup ends:            step {plan.warmup_end_step:,}, at "
            f"{human_count(plan.warmup_end_tokens)} tokens (token decay starts there)",
            file=out,
        )
    elif plan.warmup_reached is not None:
        print(
            f"LR warmup ends:            never: the run stops first, at {plan.warmup_reached:.0%} of the peak LR",
            file=out,
        )
    notes = {
        "lr_decay_tokens": "decay by tokens instead: --lr-decay-tokens",
        "lr_warmup_samples": "the token warmup as samples at min_difficulty: --lr-warmup-samples",
        "lr_warmup_iters": "or as iterations: --lr-warmup-iters",
    }
    for key, value in plan.conversions.items():
        print(f"{notes[key]} {value}", file=out)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, overrides=overrides_from_args(args), world_size=args.world_size)
    plan = make_plan(cfg, keep_series=bool(args.plot))
    if args.plot:
        plot_plan(plan, args.plot)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1))
    else:
        for line in describe(cfg):
            print(line)
        print()
        print_plan(plan)
        if args.plot:
            print(f"plot written to {args.plot}")
    for message in plan.warnings:
        print(f"warning: {message}", file=sys.stderr)
    return 0
