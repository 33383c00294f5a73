"""``seqwarm train``'s flags, generated from :class:`seqwarm.run.spec.RunSpec`, and the parse back into a spec.

Flag name and switch rule: :func:`seqwarm.run.command.flag_of` (the rule the experiments render command
lines with). Type from the annotation (``bool``: a switch flipping the default; ``int``: a count such as
1000, 1e6, 1M, or a plain int with ``metadata["parse"] == "int"``; ``Path``/``str``: as given;
``tuple[str, ...]``: one or more values; ``metadata["values"]``: a switch that may also take one of these
words, ``--resume`` or ``--resume auto``). ``metadata["aliases"]``: more spellings of the flag (Megatron's
and the deepspeed launcher's, e.g. ``--deepspeed_config``, ``--local_rank``). Help from
the docstring under the field, read with :mod:`ast` from the class source. The ``settings`` field stands
for the settings-table flags (:func:`seqwarm.cli.commands.common.add_setting_flags`), added in its place.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from seqwarm.cli.commands.common import add_setting_flags, count, overrides_from_args
from seqwarm.run.command import flag_of
from seqwarm.run.spec import RunSpec

__all__ = ["field_docs", "add_spec_flags", "spec_from_args"]


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a class's attribute docstrings (a string right under an annotated name)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, after in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def _base_type(annotation: Any) -> Any:
    """``Path | None`` -> ``Path``; ``int`` -> ``int``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def add_spec_flags(
    parser: argparse.ArgumentParser, *, groups: dict[str, str], choices: dict[str, list[str]] | None = None
) -> None:
    """One flag per RunSpec field, in field order; ``groups`` maps a field's ``metadata["group"]`` to the
    title of its ``--help`` group (fields without one go in the parser's own options)."""
    hints = typing.get_type_hints(RunSpec)
    docs = field_docs(RunSpec)
    made: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(RunSpec):
        if f.name == "settings":
            add_setting_flags(parser)
            continue
        group_name = f.metadata.get("group")
        if group_name is None:
            target: Any = parser
        else:
            if group_name not in made:
                made[group_name] = parser.add_argument_group(groups[group_name])
            target = made[group_name]
        kind = _base_type(hints[f.name])
        kwargs: dict[str, Any] = {"dest": f.name, "help": docs[f.name].replace("%", "%%")}
        if typing.get_origin(hints[f.name]) is tuple:  # one or more values
            kwargs.update(nargs="+", default=f.default, metavar=f.metadata.get("metavar"))
        elif "values" in f.metadata:  # a switch that may take one of a few words (--resume, --resume auto)
            values = f.metadata["values"]
            kwargs.update(nargs="?", const=True, default=f.default, choices=values, metavar="|".join(values))
        elif kind is bool:
            kwargs.update(action="store_false" if f.default else "store_true")
        else:
            kwargs["default"] = f.default
            if kind is int:
                kwargs["type"] = int if f.metadata.get("parse") == "int" else count
            elif kind is float:
                kwargs["type"] = float
            elif kind is Path:
                kwargs["type"] = Path
            if "metavar" in f.metadata:
                kwargs["metavar"] = f.metadata["metavar"]
            if choices and f.name in choices:
                kwargs["choices"] = choices[f.name]
        target.add_argument(flag_of(f), *f.metadata.get("aliases", ()), **kwargs)


def spec_from_args(args: argparse.Namespace, **changes: Any) -> RunSpec:
    """The RunSpec of parsed train flags (a value None, or absent, takes the field's default), with changes."""
    values: dict[str, Any] = {}
    for f in fields(RunSpec):
        if f.name == "settings":
            values["settings"] = overrides_from_args(args)
            continue
        value = getattr(args, f.name, None)
        if value is None:
            value = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        values[f.name] = value
    values.update(changes)
    return RunSpec(**values)
