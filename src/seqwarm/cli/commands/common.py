"""Flags shared by the commands that describe a run (plan, train, compare, tune), generated from the
settings table (:mod:`seqwarm.config.settings`), and their mapping onto ``load_config`` overrides; and
:func:`training_console`, the stdout of the commands that train."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from seqwarm.config.settings import GROUPS, SETTINGS, Setting, negative_flag
from seqwarm.util.units import parse_count

logger = logging.getLogger(__name__)


def count(text: str) -> int:
    """argparse type for token/step/sample counts: 1000000, 1e6, 1M, 2B."""
    try:
        return parse_count(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_int(text: str) -> int:
    """argparse type for a count that must be at least 1 (--world-size)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _dest(s: Setting) -> str:
    return s.flag.lstrip("-").replace("-", "_")


def add_setting_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """One flag per row of the settings table (but the keys in ``exclude``), in its groups, with its help."""
    types = {"count": count, "float": positive_float, "json": str}
    for group_name, title in GROUPS.items():
        rows = [s for s in SETTINGS if s.group == group_name and s.key not in exclude]
        if not rows:
            continue
        group = parser.add_argument_group(title)
        exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for s in rows:
            target = group
            if s.exclusive:
                if s.exclusive not in exclusive:
                    exclusive[s.exclusive] = group.add_mutually_exclusive_group()
                target = exclusive[s.exclusive]
            kwargs: dict[str, Any] = {"dest": _dest(s), "help": s.help}
            if s.kind == "on":  # None when neither flag is given: the config decides
                target.add_argument(s.flag, *s.aliases, action="store_const", const=True, **kwargs)
                target.add_argument(
                    negative_flag(s.key),
                    dest=_dest(s),
                    action="store_const",
                    const=False,
                    help=f"not {s.flag}, whatever the config says",
                )
                continue
            if s.kind == "off":
                kwargs["action"] = "store_true"
            elif s.kind == "choice":
                kwargs["choices"] = s.choices
            elif s.kind == "list":
                kwargs.update(nargs="+", metavar=s.metavar)
            else:
                kwargs.update(type=types[s.kind], metavar=s.metavar)
            target.add_argument(s.flag, *s.aliases, **kwargs)
            for flag, value in s.switches:
                target.add_argument(
                    flag, dest=_dest(s), action="store_const", const=value, help=f"the same as {s.flag} {value}"
                )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The load_config overrides the parsed flags ask for (flags not given are left out)."""
    out: dict[str, Any] = {}
    for s in SETTINGS:
        value = getattr(args, _dest(s), None)
        if s.kind == "off":
            if value:
                out[s.key] = False
        elif s.kind == "on":
            if value is not None:
                out[s.key] = bool(value)
        elif value is not None:
            out[s.key] = value
    return out


class _TrainingStdout:
    """``sys.stdout`` while a command trains: when its reader goes away (``seqwarm train | head``, a closed
    terminal), the console lines stop and the run goes on — its record is the run folder, and a run cut
    short by a pipe would lose everything since its last checkpoint."""

    def __init__(self, stream):
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self._gone = True
        try:  # the stream's unwritten buffer then goes to /dev/null at exit, not to a failing pipe
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (e.g. captured by a test)
            pass
        logger.warning(
            "stdout was closed (its reader went away): training goes on without console lines; "
            "metrics.jsonl in the run folder has every logged step"
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def training_console() -> Iterator[None]:
    """Run a training command with a stdout that survives its reader going away (see _TrainingStdout)."""
    real = sys.stdout
    sys.stdout = _TrainingStdout(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = real
