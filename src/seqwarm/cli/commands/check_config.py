"""``seqwarm check-config FILE``: say what a config does, or list every problem in it (exit 2)."""

from __future__ import annotations

import argparse
import json
import sys

from seqwarm.cli.commands.common import positive_int
from seqwarm.config import load_config
from seqwarm.config.describe import describe
from seqwarm.run.spec import policy_problems, schedule_problems
from seqwarm.util.problems import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-config",
        help="check a DeepSpeed/seqwarm config and summarise it",
        description="Check a DeepSpeed JSON config (legacy curriculum_learning or "
        "data_efficiency form). Exit 0 with a summary, or 2 listing every problem.",
    )
    p.add_argument("config", metavar="FILE")
    p.add_argument("--world-size", type=positive_int, default=1, help="data-parallel ranks, for the batch-size rule")
    p.add_argument("--json", action="store_true", help="print the resolved config as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, world_size=args.world_size)
    wrong = schedule_problems(cfg)  # with a budget: a stage that begins before the warmup ends
    if wrong:
        raise ConfigError(wrong, args.config)
    if args.json:
        print(json.dumps(cfg.to_dict(), indent=2, default=str))
        return 0
    print(f"{args.config}: OK")
    for line in describe(cfg):
        print(f"  {line}")
    for message in cfg.warnings:
        print(f"  warning: {message}", file=sys.stderr)
    for problem in policy_problems(cfg):  # a valid config that `seqwarm train`'s loop still cannot run
        if problem.path != "train_tokens":  # no budget is fine here: plan and train take --train-tokens
            print(f"  warning: `seqwarm train` refuses it: {problem}", file=sys.stderr)
    return 0
