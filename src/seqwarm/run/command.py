"""The ``seqwarm train`` command line of a :class:`~seqwarm.run.spec.RunSpec`: the one field -> flag rule.

The CLI (:mod:`seqwarm.cli.commands.spec_flags`) builds its flags with :func:`flag_of`, and experiments render
the command that reproduces a run with :func:`train_argv` / :func:`command_line`, so the two cannot drift:

- a field's flag is ``--`` + its name with ``-`` for ``_`` (``eval_interval`` -> ``--eval-interval``),
  unless its metadata names another (``progress_bar`` -> ``--no-progress``);
- a ``bool`` field is a switch that flips its default (``--rotary`` sets True, ``--no-progress`` False);
  one that may also hold a word (``resume``: True or ``"auto"``) writes the word after the switch;
- ``settings`` become their own flags, named by the settings table (:func:`seqwarm.config.settings.flag_for`);
- only values that differ from the defaults are written (never a launcher's ``--local-rank``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import Field, fields
from typing import Any

from seqwarm.config.settings import GROUPS, SETTINGS, negative_flag

__all__ = ["flag_of", "settings_argv", "train_argv", "command_line"]


def flag_of(f: Field) -> str:
    """The command-line flag of a RunSpec field."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def settings_argv(settings: Mapping[str, Any]) -> list[str]:
    """The flags of ``load_config`` overrides, in ``--help`` order (an ``off`` setting is written when False)."""
    argv: list[str] = []
    for group in GROUPS:
        for s in SETTINGS:
            if s.group != group or settings.get(s.key) is None:
                continue
            value = settings[s.key]
            if s.kind == "off":
                if value is False:
                    argv.append(s.flag)
            elif s.kind == "on":
                argv.append(s.flag if value else negative_flag(s.key))
            elif isinstance(value, (list, tuple)):
                argv += [s.flag, *map(str, value)]
            else:
                argv += [s.flag, str(value)]
    return argv


def train_argv(spec) -> list[str]:
    """The ``seqwarm train`` arguments that rebuild ``spec`` (only what differs from the defaults)."""
    argv: list[str] = []
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.name == "settings":
            argv += settings_argv(value)
        elif value is None or value == f.default or f.metadata.get("launcher"):
            continue
        elif isinstance(f.default, bool):
            argv += [flag_of(f)] if isinstance(value, bool) else [flag_of(f), str(value)]  # --resume auto
        elif isinstance(value, tuple):
            argv += [flag_of(f), *map(str, value)]
        else:
            argv += [flag_of(f), str(value)]
    return argv


def command_line(spec) -> str:
    """``seqwarm train ...`` reproducing ``spec``, quoted for a POSIX shell."""
    return shlex.join(["seqwarm", "train", *train_argv(spec)])
