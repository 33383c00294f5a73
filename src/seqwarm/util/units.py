"""Reading and writing large counts: ``157.3B`` tokens, ``--train-tokens 1.5e11`` or ``300M``."""

from __future__ import annotations

import math

_SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """An integer count from ``"157286400000"``, ``"1.5e11"``, ``"300M"``, ``"2B"`` or ``"10_000"``.

    Raises ValueError (with the reason) for anything that is not a whole, non-negative count.
    """
    s = str(text).strip().replace("_", "").replace(",", "")
    mult = 1
    if s and s[-1].lower() in _SUFFIXES:
        mult, s = _SUFFIXES[s[-1].lower()], s[:-1]
    try:
        value = int(s) * mult
    except ValueError:
        try:
            f = float(s) * mult
        except ValueError:
            raise ValueError(f"{text!r} is not a count (write e.g. 1000000, 1e6 or 1M)") from None
        if not math.isfinite(f) or not f.is_integer():
            raise ValueError(f"{text!r} is not a whole number") from None
        value = int(f)
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


def human_count(n: float | int | None, digits: int = 3) -> str:
    """``1234567`` -> ``1.23M``; small numbers stay as they are."""
    if n is None:
        return "-"
    for value, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(n) >= value:
            return f"{n / value:.{digits}g}{suffix}"
    return f"{n:g}" if isinstance(n, float) else str(n)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 document``, ``2,115 documents``: a count with thousands separators and its noun, singular for 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
