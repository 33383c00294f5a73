"""File names in any locale. Python decodes the bytes of a file name with the file-system encoding and
surrogate escapes, and encodes them back to the same bytes (UTF-8, latin-1, ASCII with surrogate escapes
alike), so seqwarm works under any of them. Two things need care:

- Libraries written in Rust or C++ (tokenizers, TensorBoard's writer) encode a name as UTF-8, which
  reaches another file when its bytes are not that str's UTF-8: :func:`utf8_reachable` says when a name
  is safe to hand them (else seqwarm reads and writes the file itself, or says what it leaves out).
- A run's JSON files record paths as :func:`path_record` writes them, the same text whatever the locale of
  the process that wrote it: the name's bytes read as UTF-8, with surrogate escapes (``\\udcXX`` in JSON)
  for bytes that are not UTF-8 -- what Python shows in a UTF-8 locale. :func:`recorded_path` turns it
  back into the same bytes in any locale.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["path_record", "recorded_path", "utf8_reachable"]


def utf8_reachable(path: str | os.PathLike) -> bool:
    """Whether a library that encodes ``path`` as UTF-8 reaches the file Python reaches."""
    name = os.fspath(path)
    try:
        return name.encode("utf-8") == os.fsencode(name)
    except UnicodeError:  # surrogate escapes: bytes that are not UTF-8
        return False


def path_record(path: str | os.PathLike) -> str:
    """``path`` as a run's JSON records it: its bytes as UTF-8 with surrogate escapes (in a UTF-8 locale,
    ``str(path)`` itself)."""
    return os.fsencode(path).decode("utf-8", "surrogateescape")


def recorded_path(text: str) -> Path:
    """The path :func:`path_record` recorded as ``text``, in this process's encoding (the same bytes)."""
    try:
        return Path(os.fsdecode(text.encode("utf-8", "surrogateescape")))
    except UnicodeError:  # not a record of bytes (a hand-edited file): as it reads
        return Path(text)
