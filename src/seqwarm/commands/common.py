"""Flags shared by the commands that describe a run (plan, train, compare, tune), generated from the
settings table (:mod:`seqwarm.config.settings`), and their mapping onto ``load_config`` overrides."""

from __future__ import annotations

import argparse
from typing import Any

from seqwarm.config.settings import GROUPS, SETTINGS, Setting
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


def _dest(s: Setting) -> str:
    return s.flag.lstrip("-").replace("-", "_")


def add_setting_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """One flag per row of the settings table (but the keys in ``exclude``), in its groups, with its help."""
    types = {"count": count, "float": positive_float}
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
                target.add_argument(flag, dest=_dest(s), action="store_const", const=value,
                                    help=f"the same as {s.flag} {value}")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The load_config overrides the parsed flags ask for (flags not given are left out)."""
    out: dict[str, Any] = {}
    for s in SETTINGS:
        value = getattr(args, _dest(s), None)
        if s.kind == "off":
            if value:
                out[s.key] = False
        elif value is not None:
            out[s.key] = value
    return out
