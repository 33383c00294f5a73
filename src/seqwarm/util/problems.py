"""Collecting config problems: every problem found at once, each with key path, value, rule and fix.

A :class:`Checker` walks a mapping and records :class:`Problem` objects instead of raising at the
first one; :class:`ConfigError` carries them all. The typed getters return ``None`` for a bad value so
validation can go on and report the next problem too.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from seqwarm.util.errors import UserError

_MISSING = object()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, what was found, which rule it breaks, how to fix it."""

    path: str
    value: Any
    rule: str
    fix: str

    def __str__(self) -> str:
        shown = "(missing)" if self.value is _MISSING else _show(self.value)
        return f"{self.path} = {shown}: {self.rule}. Fix: {self.fix}"


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else _json_like(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_like(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return repr(value)


class ConfigError(UserError):
    """A config (file, dict or flags) has one or more problems; ``.problems`` lists them all."""

    def __init__(self, problems: Iterable[Problem], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''}{where}:"
        super().__init__("\n".join([head] + [f"  - {p}" for p in self.problems]))


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    if value is None:
        return "null"
    return type(value).__name__


def suggest(name: str, choices: Iterable[str]) -> str | None:
    """The closest known name to ``name``, if any is close enough to be a likely typo."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


class Checker:
    """Accumulates problems and warnings while reading config values."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def add(self, path: str, value: Any, rule: str, fix: str) -> None:
        self.problems.append(Problem(path, value, rule, fix))

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    # -- structure -----------------------------------------------------------------------------
    def section(self, parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
        """``parent[key]`` when it is an object; None when absent; a problem when it is not."""
        if key not in parent or parent[key] is None:
            return None
        value = parent[key]
        if not isinstance(value, Mapping):
            self.add(path, value, f"must be an object, got a {type_name(value)}", f'write "{key}": {{...}}')
            return None
        return value

    def unknown_keys(self, block: Mapping[str, Any], known: Iterable[str], path: str) -> None:
        known = list(known)
        for key in block:
            if key in known:
                continue
            guess = suggest(str(key), known)
            hint = f'did you mean "{guess}"?' if guess else "known keys: " + ", ".join(known)
            self.add(
                f"{path}.{key}" if path else str(key), block[key], "unknown key", f"remove it or rename it ({hint})"
            )

    # -- scalars -------------------------------------------------------------------------------
    def require(self, block: Mapping[str, Any], key: str, path: str, why: str, fix: str) -> Any:
        if key not in block or block[key] is None:
            self.add(path, _MISSING, f"is required {why}", fix)
            return None
        return block[key]

    def integer(self, value: Any, path: str, *, minimum: int | None = 1, fix: str = "") -> int | None:
        """An int (not a bool, not a float — even 8.0) >= ``minimum``; None after recording a problem."""
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                self.add(path, value, "must be an integer, not a decimal number", f"write {int(value)}")
            elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
                self.add(path, value, "must be a number, not a string", f"write {value.strip()} without quotes")
            else:
                self.add(path, value, f"must be an integer, got a {type_name(value)}", fix or "write a whole number")
            return None
        if minimum is not None and value < minimum:
            rule = "must be positive" if minimum == 1 else f"must be >= {minimum}"
            self.add(path, value, rule, fix or f"use a value >= {minimum}")
            return None
        return value

    def number(
        self, value: Any, path: str, *, minimum: float | None = 0.0, strict: bool = False, fix: str = ""
    ) -> float | None:
        """A finite int/float (not a bool) >= ``minimum`` (> when ``strict``)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            if isinstance(value, str):
                try:
                    float(value)
                    self.add(path, value, "must be a number, not a string", f"write {value.strip()} without quotes")
                    return None
                except ValueError:
                    pass
            self.add(path, value, f"must be a finite number, got a {type_name(value)}", fix or "write a number")
            return None
        if minimum is not None and (value < minimum or (strict and value == minimum)):
            rel = ">" if strict else ">="
            self.add(path, value, f"must be {rel} {minimum:g}", fix or f"use a value {rel} {minimum:g}")
            return None
        return float(value)

    def boolean(self, value: Any, path: str) -> bool | None:
        if not isinstance(value, bool):
            fix = (
                f"write {str(value).lower()} (a JSON boolean)"
                if str(value).lower() in ("true", "false")
                else "write true or false"
            )
            self.add(path, value, f"must be true or false, got a {type_name(value)}", fix)
            return None
        return value

    def choice(self, value: Any, path: str, choices: Iterable[str], what: str = "value") -> str | None:
        choices = list(choices)
        if not isinstance(value, str) or value not in choices:
            guess = suggest(str(value), choices) if isinstance(value, str) else None
            fix = f'did you mean "{guess}"?' if guess else "use one of: " + ", ".join(choices)
            self.add(path, value, f"unknown {what}", fix if guess is None else f"{fix} (choices: {', '.join(choices)})")
            return None
        return value

    def int_list(self, value: Any, path: str, *, minimum: int = 1) -> list[int] | None:
        if not isinstance(value, (list, tuple)):
            self.add(path, value, f"must be a list of integers, got a {type_name(value)}", "write [a, b, ...]")
            return None
        if not value:
            self.add(path, value, "must not be empty", "list at least one value")
            return None
        out = []
        for i, item in enumerate(value):
            checked = self.integer(item, f"{path}[{i}]", minimum=minimum)
            if checked is None:
                return None
            out.append(checked)
        return out


def raise_if_problems(checker: Checker, source: str | None = None) -> None:
    if checker.problems:
        raise ConfigError(checker.problems, source)
