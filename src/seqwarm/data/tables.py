"""Documents from tables: Parquet files and the Arrow files of ``datasets`` folders, one per row.

A ``datasets`` folder (``Dataset.save_to_disk``: ``data-0000x-of-0000n.arrow`` + ``state.json``; a
``DatasetDict`` has one such folder per split) is read as its ``.arrow`` files: Arrow IPC streams, read
here with pyarrow, so ``datasets`` itself is not needed. Both readers stream record batches (a batch of
rows at a time), so a table is never held in memory whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqwarm.util.errors import UserError

BATCH_ROWS = 1024
EXTRA = "pip install 'seqwarm[hf]' (or pip install pyarrow)"


def _pyarrow(path: Path, what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401 - the submodules used below
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UserError(f"reading {str(path)!r} ({what}) needs pyarrow: {EXTRA}") from None
    return pyarrow


def _text_column(pa: Any, schema: Any, path: Path, field: str) -> None:
    """The ``field`` column must exist and hold strings; UserError naming the file otherwise."""
    names = list(schema.names)
    if field not in names:
        shown = ", ".join(repr(n) for n in names[:8]) or "none"
        raise UserError(f"{path}: no {field!r} column (columns: {shown}); choose the text column with --text-field")
    kind = schema.field(field).type
    if not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
    ):
        raise UserError(
            f"{path}: column {field!r} must hold strings, got {kind}; choose the text column with --text-field"
        )


def _rows(batches: Iterator[Any], path: Path, field: str) -> Iterator[tuple[str, str]]:
    row = 0
    for batch in batches:
        for text in batch.column(batch.schema.get_field_index(field)).to_pylist():
            row += 1
            if text is not None:  # a null is an empty document: skipped like one
                yield f"{path}:row {row}", text


def iter_parquet(path: Path, field: str) -> Iterator[tuple[str, str]]:
    """``(path:row N, text)`` for every row of a Parquet file's ``field`` column."""
    pa = _pyarrow(path, "parquet")
    try:
        table = pa.parquet.ParquetFile(str(path))
        _text_column(pa, table.schema_arrow, path, field)
        yield from _rows(table.iter_batches(batch_size=BATCH_ROWS, columns=[field]), path, field)
    except (pa.ArrowException, OSError) as err:
        raise UserError(f"cannot read parquet file {str(path)!r}: {err}") from None


def iter_arrow(path: Path, field: str) -> Iterator[tuple[str, str]]:
    """``(path:row N, text)`` for every row of an Arrow IPC stream (``datasets``) or IPC file."""
    pa = _pyarrow(path, "Arrow")
    try:
        source = pa.memory_map(str(path), "r")
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:  # not a stream: the random-access IPC file format (Feather v2)
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            reader = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
            _text_column(pa, file_reader.schema, path, field)
        else:
            _text_column(pa, reader.schema, path, field)
        yield from _rows(iter(reader), path, field)
    except (pa.ArrowException, OSError) as err:
        raise UserError(f"cannot read Arrow file {str(path)!r}: {err}") from None
