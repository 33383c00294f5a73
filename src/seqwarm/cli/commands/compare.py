"""``seqwarm compare``: the baseline and the curriculum run side by side, with speedups and stability
(``--modes``: the baseline and one curriculum run per mode).

Every ``seqwarm train`` flag is accepted and applies to every run. See
:mod:`seqwarm.experiments.compare` for what is run and :mod:`seqwarm.experiments.report` for the report.
"""

from __future__ import annotations

import argparse

from seqwarm.cli.commands.common import training_console
from seqwarm.cli.commands.experiment_flags import (
    add_experiment_parser,
    add_seeds_flag,
    add_stability_flags,
    arm_options,
)
from seqwarm.cli.commands.spec_flags import spec_from_args
from seqwarm.experiments.compare import MODES, QUICK_FRACTION, CompareOptions, run_compare
from seqwarm.experiments.report import TIME_NOTE, mode_rows, spread_text
from seqwarm.run.spec import RunSpec
from seqwarm.util.units import human_count


def register(sub: argparse._SubParsersAction) -> None:
    p, g = add_experiment_parser(
        sub,
        "compare",
        out="the runs and the report",
        help="run the baseline and the curriculum on the same budget and report the speedup",
        description="Train the baseline (--no-curriculum) and the curriculum run on the same data, seed, model "
        "and token budget, one after the other, in DIR/baseline and DIR/curriculum (a finished run is reused, "
        "one with checkpoints resumed), then write DIR/report.json, DIR/report.md and figures: full-length "
        "validation loss against tokens and wall-clock, tokens-to-target and time-to-target speedups (target: "
        "the baseline's final validation loss), loss-ratio spikes, gradient and Adam second-moment norms. "
        "With --modes truncate,reshape,window,variable: the baseline and one curriculum run per mode "
        "(DIR/baseline, DIR/truncate, ...), the report one row per mode against the baseline: final loss, tokens "
        "to the baseline's final loss, speedups, time per token of the training steps. "
        "All `seqwarm train` flags apply to every run.",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help=f"a short comparison (minutes on CPU for the default recipe; measured in docs/RESULTS.md): "
        f"{QUICK_FRACTION:g}x the token budget with the curriculum and LR schedule shrunk alike, "
        "fewer validation batches",
    )
    g.add_argument(
        "--scale-batch",
        type=int,
        default=1,
        metavar="K",
        help="run the curriculum at K x the global batch (more accumulation steps; the paper: 8)",
    )
    g.add_argument(
        "--scale-lr",
        type=float,
        default=1.0,
        metavar="M",
        help="run the curriculum at M x the learning rate (the paper: 4)",
    )
    add_seeds_flag(
        g,
        "N seeds per arm (--seed S, then S+1, ...; the first pair in DIR/baseline and "
        "DIR/curriculum (or DIR/<mode>), the others in DIR/seed-S/): the report gives every seed, the median and "
        "min-max, and whether the difference exceeds the seed spread (default 1: no spread measured)",
    )
    g.add_argument(
        "--modes",
        type=_modes,
        default=(),
        metavar="M,...",
        help=f"compare curriculum modes side by side: the baseline and one curriculum run per mode, each in "
        f"DIR/<mode> (seeds: DIR/seed-S/<mode>) and with that --curriculum-mode, against the one baseline "
        f"(trained once per seed); the report has one row per mode. Modes: {', '.join(MODES)}, "
        "comma-separated; not with --curriculum-mode",
    )
    add_stability_flags(g)
    p.set_defaults(func=run)


def _modes(text: str) -> tuple[str, ...]:
    """``--modes truncate,reshape``: the names, checked against MODES later (one clear error, exit 2)."""
    modes = tuple(part.strip() for part in text.split(",") if part.strip())
    if not modes:  # else an empty list would silently mean the one-mode comparison
        raise argparse.ArgumentTypeError(f"{text!r} names no mode: give e.g. truncate,reshape,window")
    return modes


def compare_inputs(args: argparse.Namespace) -> tuple[RunSpec, CompareOptions]:
    """The runs' shared spec and the comparison's options from the parsed ``seqwarm compare`` flags."""
    options = CompareOptions(
        **arm_options(args), quick=args.quick, scale_batch=args.scale_batch, scale_lr=args.scale_lr, modes=args.modes
    )
    return spec_from_args(args, out=None), options


def run(args: argparse.Namespace) -> int:
    with training_console():  # a closed stdout stops the console lines, not the runs
        report = run_compare(*compare_inputs(args))
    if report.get("modes"):
        return _print_modes(report)
    base, cur = report["baseline"], report["curriculum"]
    print()
    for name, r in (("baseline", base), ("curriculum", cur)):
        loss = "diverged" if r["diverged"] else f"final val loss {r['final_val_loss']:.4f}"
        per_token = r.get("step_us_per_token")
        time = f", {per_token:.3g} us/token (steps)" if per_token is not None else ""
        print(f"{name:<11} {loss}, {human_count(r['tokens'])} tokens, {r['steps']} steps{time}")
    if report.get("target") is None:
        print(report.get("target_note", ""))
    elif report["reached"]:
        print(
            f"speedup to the baseline's final val loss {report['target']:.4f}: "
            f"{report['speedup_tokens']:.2f}x in tokens (wall-clock {report['speedup_time']:.2f}x: {TIME_NOTE})"
        )
    else:
        print(f"the curriculum never reached the baseline's final val loss {report['target']:.4f} (speedup: null)")
    s = report["stability"]
    print(
        f"loss-ratio spikes > {s['threshold']:g}: baseline {s['baseline']['spikes']}, "
        f"curriculum {s['curriculum']['spikes']}"
    )
    agg = report.get("aggregate")
    if agg and agg["n_seeds"] > 1:
        print(
            f"over {agg['n_seeds']} seeds {report['settings']['seeds']} (the lines above: seed "
            f"{report['settings']['seeds'][0]}):"
        )
    for line in (agg or {}).get("verdict", {}).get("text", []):
        print(line)
    print(f"report: {report['out']}/report.md (report.json, compare_val.png, compare_stability.png)")
    return 0


def _print_modes(report: dict) -> int:
    """The console summary of ``compare --modes``: one line per arm, over the seeds."""
    seeds = report["settings"]["seeds"]
    print()
    print(f"over {len(seeds)} seed(s) {seeds}: median (min-max); target = each seed's baseline final val loss")
    for r in mode_rows(report):
        loss = _spread(r["final_val_loss"], ".4f")
        steps = _spread(r["steps"], ".0f")
        line = f"{r['arm']:<9} final val loss {loss}, {steps} steps, spikes {_spread(r['spikes'], 'g')}"
        line += f", tokens to target {_spread(r['tokens_to_target'], ',.0f')}"
        line += f", {_spread(r['step_us_per_token'], '.3g')} us/token (steps)"
        if r["diverged"]:
            line += f", diverged on {r['diverged']}/{r['n_seeds']}"
        if r["arm"] != "baseline":
            line += (
                f"; speedup_tokens {_spread(r['speedup_tokens'], '.2f', 'x')} "
                f"(reached on {r['reached']}/{r['n_seeds']}), wall-clock {_spread(r['speedup_time'], '.2f', 'x')}"
                f"; exceeds seed spread: {r['exceeds']}"
            )
        print(line)
    print(f"(wall-clock: {TIME_NOTE})")
    print(f"report: {report['out']}/report.md (report.json, compare_val.png, compare_stability.png)")
    return 0


def _spread(s: dict | None, fmt: str, unit: str = "") -> str:
    return spread_text(s, fmt, unit, dash="-")  # the console's dash is ASCII
