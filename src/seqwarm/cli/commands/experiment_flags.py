"""What the experiment commands (``compare``, ``tune``, ``sweep``) share on the command line, in one place.

Each takes every ``seqwarm train`` flag (:func:`seqwarm.cli.commands.train.add_parser_with_train_flags`,
which hides the train flags an experiment decides itself; :func:`seqwarm.experiments.runner.refuse_run_flags`
refuses them when given) and its own group of flags, opened by :func:`add_experiment_parser` with the
one folder flag ``--out DIR``. The commands that train arms over seeds (compare, sweep) add ``--seeds``
and the stability flags here, and read them back into their options with :func:`arm_options`.
"""

from __future__ import annotations

import argparse
from typing import Any

from seqwarm.cli.commands.train import add_parser_with_train_flags
from seqwarm.experiments.runner import DEFAULT_SMOOTH_STEPS, DEFAULT_SPIKE_THRESHOLD


def add_experiment_parser(
    sub: argparse._SubParsersAction, name: str, *, out: str, group: str | None = None, **kwargs: Any
) -> tuple[argparse.ArgumentParser, argparse._ArgumentGroup]:
    """The command's parser (every train flag) and its own ``--help`` group (titled ``group``, default the
    command's name), which starts with ``--out DIR``, "folder for ``out`` (required)"."""
    parser = add_parser_with_train_flags(sub, name, **kwargs)
    own = parser.add_argument_group(group or name)
    own.add_argument("--out", metavar="DIR", help=f"folder for {out} (required)")
    return parser, own


def add_seeds_flag(group: argparse._ArgumentGroup, help: str) -> None:
    """``--seeds N``: seeds per arm, from ``--seed`` on."""
    group.add_argument("--seeds", type=int, default=1, metavar="N", help=help)


def add_stability_flags(group: argparse._ArgumentGroup) -> None:
    """``--spike-threshold R`` and ``--smooth-steps N``: what counts as a loss spike."""
    group.add_argument(
        "--spike-threshold",
        type=float,
        default=DEFAULT_SPIKE_THRESHOLD,
        metavar="R",
        help="a spike is an excursion of the smoothed loss ratio (loss / minimum so far) above R "
        f"(default {DEFAULT_SPIKE_THRESHOLD})",
    )
    group.add_argument(
        "--smooth-steps",
        type=int,
        default=DEFAULT_SMOOTH_STEPS,
        metavar="N",
        help=f"trailing-mean window of the loss ratio, in logged steps (default {DEFAULT_SMOOTH_STEPS}; 1 = raw)",
    )


def arm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~seqwarm.experiments.runner.ArmOptions` fields from the parsed flags (the evaluation and
    log intervals are train's flags, None when not given: the experiment chooses)."""
    return {
        "out": args.out,
        "seeds": args.seeds,
        "spike_threshold": args.spike_threshold,
        "smooth_steps": args.smooth_steps,
        "eval_interval": args.eval_interval,
        "eval_iters": args.eval_iters,
        "log_interval": args.log_interval,
    }
