"""``seqwarm sweep``: baseline and curriculum over a grid of peak LR, batch scale, clipping, warmup,
position embeddings, curriculum mode and document masking, several seeds each. See :mod:`seqwarm.experiments.sweep`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from seqwarm.cli.commands.common import training_console
from seqwarm.cli.commands.experiment_flags import (
    add_experiment_parser,
    add_seeds_flag,
    add_stability_flags,
    arm_options,
)
from seqwarm.cli.commands.spec_flags import spec_from_args
from seqwarm.experiments.sweep import SweepOptions, run_sweep
from seqwarm.run.spec import RunSpec


def _list(kind: Callable[[str], Any], *, allow_cfg: bool = False) -> Callable[[str], tuple]:
    """A comma-separated list of ``kind`` values (``cfg``: the config's value, where allowed)."""

    def parse(text: str) -> tuple:
        out = []
        for part in text.split(","):
            part = part.strip()
            if allow_cfg and part == "cfg":
                out.append(None)
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{part!r} is not a {kind.__name__}") from None
        return tuple(out)

    return parse


def _on_off(text: str) -> tuple[bool, ...]:
    """``--document-masking off,on``: the values as booleans."""
    words = {"on": True, "off": False}
    out = []
    for part in text.split(","):
        if part.strip() not in words:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not on or off (e.g. --document-masking off,on)")
        out.append(words[part.strip()])
    return tuple(out)


def register(sub: argparse._SubParsersAction) -> None:
    p, g = add_experiment_parser(
        sub,
        "sweep",
        out="the runs and the report",
        group="sweep grid (comma-separated lists)",
        help="baseline and curriculum over a grid of LR, batch scale, clipping, warmup, positions, modes",
        description="Train the baseline and the curriculum in every cell of a grid (each cell a `seqwarm compare "
        "--seeds N` of its own in DIR/CELL; at --scale-batch K both arms train at K x the global batch), then "
        "write DIR/sweep.json, DIR/sweep.md (final full-length val loss, diverged, max loss ratio, tokens-to-target "
        "per cell and arm; the largest LR each arm survives; every cell against the best baseline) and "
        "DIR/sweep.png (final loss against LR). With several --curriculum-mode values the cells of each mode "
        "share their baseline (DIR/CELL/baseline, DIR/CELL/<mode>, as `seqwarm compare --modes`). Finished runs "
        "are reused, so a killed sweep continues. The grid flags take comma-separated lists; every other "
        "`seqwarm train` flag applies to all runs.",
    )
    g.add_argument(
        "--lr",
        dest="sweep_lr",
        type=_list(float),
        default=(),
        metavar="LR,...",
        help="peak learning rates, e.g. 1e-3,4e-3 (default: the config's)",
    )
    g.add_argument(
        "--scale-batch",
        type=_list(int),
        default=(1,),
        metavar="K,...",
        help="global batch multiples for both arms, e.g. 1,8 (default 1)",
    )
    g.add_argument(
        "--clip-grad",
        dest="sweep_clip",
        type=_list(float, allow_cfg=True),
        default=(None,),
        metavar="C,...",
        help="gradient clipping norms, 0 = off, cfg = the config's (e.g. 1,0)",
    )
    g.add_argument(
        "--lr-warmup-iters",
        dest="sweep_warmup",
        type=_list(int, allow_cfg=True),
        default=(None,),
        metavar="N,...",
        help="LR warmup lengths in steps at batch scale 1 (cfg = the config's)",
    )
    g.add_argument(
        "--pos",
        type=_list(str),
        default=None,
        metavar="P,...",
        help="position embeddings: learned, rotary or learned,rotary (default: rotary with --rotary, else learned)",
    )
    g.add_argument(
        "--curriculum-mode",
        dest="sweep_mode",
        type=_list(str),
        default=(None,),
        metavar="M,...",
        help="curriculum modes: one (truncate, reshape, window, inject) applies to every run as in "
        "`seqwarm train`; several (from truncate, reshape, window) are an axis whose cells share their "
        "baseline, e.g. truncate,reshape,window (default: the config's)",
    )
    g.add_argument(
        "--document-masking",
        dest="sweep_masking",
        type=_on_off,
        nargs="?",
        const=(True,),
        default=(None,),
        metavar="off,on",
        help="document masking in both arms: alone or 'on', every run as in `seqwarm train`; 'off,on' "
        "is an axis (default: the config's)",
    )
    add_seeds_flag(g, "seeds per cell and arm (default 1)")
    add_stability_flags(g)
    p.set_defaults(func=run)


def sweep_inputs(args: argparse.Namespace) -> tuple[RunSpec, SweepOptions]:
    """The runs' shared spec and the grid from the parsed ``seqwarm sweep`` flags."""
    options = SweepOptions(
        **arm_options(args),
        lr=args.sweep_lr,
        scale_batch=args.scale_batch,
        clip_grad=args.sweep_clip,
        lr_warmup_iters=args.sweep_warmup,
        pos=args.pos or (("rotary",) if args.rotary else ("learned",)),
        curriculum_mode=args.sweep_mode,
        document_masking=args.sweep_masking,
    )
    return spec_from_args(args, out=None), options


def run(args: argparse.Namespace) -> int:
    with training_console():
        report = run_sweep(*sweep_inputs(args))
    print()
    for cell in report["cells"]:
        for arm in ("baseline", "curriculum"):
            a = cell[arm]
            med = a["final_val_loss"]["median"]
            loss = "–" if med is None else f"{med:.4f}"
            print(
                f"{cell['name']:<48} {arm:<11} final val loss {loss}, diverged {a['diverged']}/"
                f"{report['grid']['seeds']}"
            )
    print(f"report: {report['out']}/sweep.md (sweep.json, sweep.png)")
    return 0
