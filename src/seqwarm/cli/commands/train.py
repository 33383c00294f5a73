"""``seqwarm train``: GPT pretraining with a sequence-length curriculum (the main job).

With no arguments it pretrains the ``tiny`` GPT on the embedded public-domain corpus on CPU in a few
minutes (see :mod:`seqwarm.config.defaults`) and leaves a run folder with metrics, checkpoints and plots. The
flags are generated from :class:`seqwarm.run.spec.RunSpec` (:mod:`seqwarm.cli.commands.spec_flags`); the run is
:func:`seqwarm.run.training.run_training`.
"""

from __future__ import annotations

import argparse
import signal
from typing import Any

from seqwarm.cli.commands.common import training_console
from seqwarm.cli.commands.spec_flags import add_spec_flags, spec_from_args
from seqwarm.run.training import run_training

GROUP_TITLES = {"deepspeed": "DeepSpeed (pip install 'seqwarm[deepspeed]'; see docs/DISTRIBUTED.md)", "run": "run"}
"""``--help`` group titles of the RunSpec fields' ``metadata["group"]``."""

HELP = "pretrain a GPT with a sequence-length curriculum (default: tiny GPT, embedded corpus, CPU)"
DESCRIPTION = (
    "Pretrain a GPT with sequence-length warmup. With no arguments: the tiny GPT on the embedded "
    'public-domain corpus, on CPU (how long: the README\'s "What `make demo` does"). Flags '
    "override the config."
)

EPILOG = (
    "Exit codes: 0 the run reached its budget; 2 a mistake in the flags, config, data or run folder (one line "
    "names it); 3 the training diverged (the newest finite checkpoint is named); 75 stopped early with a "
    "checkpoint: run the same command with --resume to continue. "
    "Signals: the first SIGTERM, SIGINT (Ctrl-C), SIGUSR1 (sbatch --signal=USR1@120) or SIGHUP, like "
    "--exit-duration-in-mins, finishes the step, saves a checkpoint and exits 75 -- every one of "
    "them, Ctrl-C included, so that a requeue script needs one test: 75 means a checkpoint was written and "
    "--resume continues (130 or 143 would read as killed without one). A second signal stops at once, "
    "without a checkpoint of that step, with 128+N as a shell reports it: "
    + ", ".join(
        f"{128 + getattr(signal, n)} {n}" for n in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP") if hasattr(signal, n)
    )
    + " (the newest checkpoint is named)."
)


def add_train_flags(p: argparse.ArgumentParser) -> None:
    add_spec_flags(p, groups=GROUP_TITLES)  # --model: a preset or hf:PATH, checked by the runner


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_train_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with training_console():  # a closed stdout stops the console lines, not the run
        run_training(spec_from_args(args))
    return 0


def add_parser_with_train_flags(sub: argparse._SubParsersAction, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command parser that accepts every ``seqwarm train`` flag (its own flags may replace some).

    Train's ``--out RUN`` (alias ``--save``) is left out: the experiment adds its own ``--out DIR``. Flags
    the experiment sets itself (``--resume``, ``--no-curriculum``, ``--allow-config-change``) are
    hidden from --help (the experiment refuses them when given); ``--eval-interval``, ``--eval-iters`` and
    ``--log-interval`` default to None so the experiment can tell "not given" from the train default.
    """
    # The flags are added to the sub-parser itself, not copied from a parent parser: argparse copies a
    # parent's mutually exclusive groups (--lr-decay-*, --lr-warmup-*) out of their --help groups.
    p = sub.add_parser(name, conflict_handler="resolve", **kwargs)
    add_train_flags(p)
    # the experiment's --out DIR (its own flag, added next) is its one folder flag: train's --out RUN and
    # its alias --save go, so that `--save` is not silently taken as --out
    run_folder = next(a for a in p._actions if a.dest == "out")
    p._handle_conflict_resolve(run_folder, [(flag, run_folder) for flag in list(run_folder.option_strings)])
    for flag in ("--resume", "--no-curriculum", "--allow-config-change"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(eval_interval=None, eval_iters=None, log_interval=None)
    return p
