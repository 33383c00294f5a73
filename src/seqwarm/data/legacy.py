"""seqwarm's old token-file format (``SEQWIDX``, ``meta.json`` format version 1), read only to convert it.

Before 0.2.0 ``seqwarm prepare`` wrote its own index beside the same ``.bin`` token stream
(``SPLIT.idx``, little-endian)::

    offset  size  field
    0       8     magic b"SEQWIDX\\0"
    8       4     format version (uint32) = 1
    12      4     token item size in bytes (uint32): 2 = uint16, 4 = uint32
    16      8     number of documents D (uint64)
    24      8     number of tokens N (uint64)
    32      8*(D+1) document offsets (int64), in tokens: offsets[0] = 0, offsets[D] = N

:func:`convert_folder` (``seqwarm prepare --convert DIR``) rewrites such a folder in place as Megatron's
``MMIDIDX`` (:mod:`seqwarm.data.indexed`): the ``.bin`` files are kept byte for byte (``uint16`` stays
``uint16``; ``uint32`` ids, all below 2**31, read the same as ``int32``), each ``.idx`` is written anew from
the same document offsets, and ``meta.json`` keeps the folder's data fingerprint (``converted_from``), so
a run started on the old folder resumes on the converted one. The new folder is assembled beside the old
one (its files hard-linked where the file system allows) and swapped in whole under the folder's lock:
an interrupted conversion leaves the old folder as it was.
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.data.indexed import MAX_VOCAB, MegatronIndexed, dtype_name, sha256_file, write_index
from seqwarm.data.meta import (
    LEGACY_FORMAT_VERSION,
    META_FILE,
    META_FORMAT_VERSION,
    SPLITS,
    data_fingerprint,
    read_meta,
    verify_files,
)
from seqwarm.data.outdir import check_name_length, clear_leftovers, out_lock, replace_dir, resolve_out
from seqwarm.util.atomic import WriteError, write_json
from seqwarm.util.errors import UserError
from seqwarm.util.version import __version__

LEGACY_MAGIC = b"SEQWIDX\x00"
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, itemsize, documents, tokens


def read_legacy_offsets(idx_path: Path, bin_size: int) -> tuple[np.dtype, np.ndarray]:
    """The token dtype of an old ``SPLIT.idx`` and its document offsets (D+1), checked against the
    ``.bin`` size."""
    raw = idx_path.read_bytes()
    if len(raw) < _HEADER.size:
        raise UserError(f"{str(idx_path)!r} is truncated (shorter than its header); re-run seqwarm prepare")
    magic, version, itemsize, docs, tokens = _HEADER.unpack_from(raw)
    if magic != LEGACY_MAGIC or version != 1 or itemsize not in (2, 4):
        raise UserError(f"{str(idx_path)!r} is not a seqwarm SEQWIDX version 1 index; re-run seqwarm prepare")
    if len(raw) != _HEADER.size + 8 * (docs + 1) or bin_size != tokens * itemsize:
        raise UserError(f"{str(idx_path)!r} does not match its sizes or its .bin; re-run seqwarm prepare")
    offsets = np.frombuffer(raw, dtype="<i8", offset=_HEADER.size).astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != tokens or (np.diff(offsets) < 0).any():
        raise UserError(
            f"{str(idx_path)!r}: its document offsets do not rise from 0 to {tokens}; re-run seqwarm prepare"
        )
    return np.dtype("<u2" if itemsize == 2 else "<i4"), offsets


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def convert_folder(folder: str | Path) -> dict[str, Any]:
    """Convert a prepared folder in the old ``SEQWIDX`` format to ``MMIDIDX`` in place; return its new
    ``meta.json``. UserError when it is not an intact old-format folder (checked with its checksums)."""
    shown = Path(folder).expanduser()
    real = resolve_out(shown)
    check_name_length(shown, real)
    with out_lock(shown, real):
        clear_leftovers(real)
        meta = read_meta(real, version=LEGACY_FORMAT_VERSION)
        if meta["vocab_size"] > MAX_VOCAB:
            raise UserError(f"{str(shown)!r}: vocab_size {meta['vocab_size']:,} does not fit int32 token files")
        verify_files(real, meta)  # convert intact data only
        rewritten = {f"{name}.idx" for name in SPLITS} | {META_FILE}
        tmp = real.parent / f".{real.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            shutil.copytree(real, tmp, copy_function=_link_or_copy, ignore=lambda d, names: rewritten & set(names))
            files = dict(meta["files"])
            for name in SPLITS:
                dtype, offsets = read_legacy_offsets(real / f"{name}.idx", (real / f"{name}.bin").stat().st_size)
                write_index(tmp / f"{name}.idx", np.diff(offsets), dtype)
                if not np.array_equal(MegatronIndexed(tmp / name).doc_offsets, offsets):
                    raise AssertionError(f"the converted {name}.idx reads back other documents")
                idx = tmp / f"{name}.idx"
                files[idx.name] = {"bytes": idx.stat().st_size, "sha256": sha256_file(idx)}
            new = {
                **meta,
                "format_version": META_FORMAT_VERSION,
                "dtype": dtype_name(dtype),
                "files": files,
                "converted_from": {
                    "format": "SEQWIDX",
                    "format_version": LEGACY_FORMAT_VERSION,
                    "fingerprint": data_fingerprint(meta),
                    "seqwarm_version": __version__,
                },
            }
            write_json(tmp / META_FILE, new)
            replace_dir(tmp, real)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, OSError):  # disk full, read-only, permissions: the old folder is kept
                raise WriteError(
                    f"cannot convert {str(shown)!r} ({err.filename or tmp}: {err.strerror or err}); it is untouched"
                ) from None
            raise
    return new
