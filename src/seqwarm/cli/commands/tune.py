"""``seqwarm tune``: search the largest ``total_curriculum_step`` whose short probes stay stable.

Every ``seqwarm train`` flag is accepted and applies to every probe. See :mod:`seqwarm.experiments.tune`.
"""

from __future__ import annotations

import argparse

from seqwarm.cli.commands.common import count, training_console
from seqwarm.cli.commands.experiment_flags import add_experiment_parser
from seqwarm.cli.commands.spec_flags import spec_from_args
from seqwarm.experiments.tune import (
    DEFAULT_FLUCTUATION_PCT,
    DEFAULT_PROBE_EVALS,
    DEFAULT_PROBE_MULTIPLE,
    TuneOptions,
    run_tune,
)
from seqwarm.run.spec import RunSpec


def register(sub: argparse._SubParsersAction) -> None:
    p, g = add_experiment_parser(
        sub,
        "tune",
        out="the probes, state and results",
        help="binary-search total_curriculum_step with short probe runs (paper appendix A.1)",
        description="Find the largest total_curriculum_step whose probe run (the first few multiples of the "
        "LR warmup) shows no significant fluctuation of the full-length validation perplexity. Prints each "
        "probe, writes DIR/tune.json and DIR/tuned_config.json (the input config with the chosen value). "
        "Rerunning with the same --out skips finished probes. All `seqwarm train` flags apply to the probes.",
    )
    g.add_argument(
        "--probe-multiple",
        type=float,
        default=DEFAULT_PROBE_MULTIPLE,
        metavar="X",
        help=f"probes train X x the LR warmup steps (default {DEFAULT_PROBE_MULTIPLE:g})",
    )
    g.add_argument("--probe-steps", type=count, metavar="N", help="probes train N steps (instead of X x warmup)")
    g.add_argument(
        "--probe-evals",
        type=int,
        default=DEFAULT_PROBE_EVALS,
        metavar="N",
        help=f"evaluations per probe when --eval-interval is not given (default {DEFAULT_PROBE_EVALS})",
    )
    g.add_argument(
        "--fluctuation",
        type=float,
        default=DEFAULT_FLUCTUATION_PCT,
        metavar="F",
        help="a probe fails when a full-length validation perplexity is more than F percent above the "
        f"lowest earlier one, or when it diverges (default {DEFAULT_FLUCTUATION_PCT:g})",
    )
    g.add_argument("--lo", type=count, metavar="A", help="smallest value to consider (default: the LR warmup steps)")
    g.add_argument("--hi", type=count, metavar="B", help="largest value to consider (default: the run's planned steps)")
    g.add_argument(
        "--resolution",
        type=count,
        default=0,
        metavar="N",
        help="stop when the passing and failing values are at most N apart (default: 5%% of --hi)",
    )
    g.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="probes at a time, each in its own process (default 1; on 2 cores more does not help)",
    )
    p.set_defaults(func=run)


def tune_inputs(args: argparse.Namespace) -> tuple[RunSpec, TuneOptions]:
    """The probes' shared spec and the search's options from the parsed ``seqwarm tune`` flags."""
    options = TuneOptions(
        out=args.out,
        probe_multiple=args.probe_multiple,
        probe_steps=args.probe_steps,
        probe_evals=args.probe_evals,
        fluctuation=args.fluctuation,
        lo=args.lo,
        hi=args.hi,
        resolution=args.resolution,
        jobs=args.jobs,
        eval_interval=args.eval_interval,
    )
    return spec_from_args(args, out=None), options


def run(args: argparse.Namespace) -> int:
    with training_console():  # a closed stdout stops the console lines, not the probes
        report = run_tune(*tune_inputs(args))
    return 0 if report["chosen"] is not None else 1
