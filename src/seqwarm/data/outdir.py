"""The output folder of ``seqwarm prepare``: checked, locked, written beside it and swapped in.

- :func:`resolve_out`: an ``--out`` that is a symbolic link stands for the folder it points to (data kept
  on a scratch disk): that folder is checked and replaced, the link is kept as it is.
- :func:`check_name_length`: prepare writes hidden siblings named after ``--out``
  (``.NAME.tmp-PID-XXXXXXXX``, ``.NAME.old-XXXXXXXX``, ``.NAME.lock``); a name too long for them (or for
  the file system at all) is refused up front, naming that cause.
- :func:`out_lock`: one ``prepare`` per output folder. ``flock(LOCK_EX | LOCK_NB)`` on the sibling
  ``.NAME.lock``, which holds the holder's pid; a second ``prepare`` into the same folder exits 2 naming it.
  The kernel drops the lock when its process dies (SIGKILL included), so a killed ``prepare`` never blocks
  the next one; the file is removed on release, and a process that locked a file already removed by its
  holder locks again (the same scheme as the run folder's lock, :mod:`seqwarm.trainer.run_folder`).
  Re-entrant within a process. Advisory: it keeps seqwarm processes apart, not other programs.
- :func:`check_out`, :func:`clear_leftovers`, :func:`replace_dir`: ``--force`` replaces prepared data
  only, leftovers of killed runs are cleared, and the old folder is removed only once the new one is in.
- :func:`cache_dir`, :func:`writable_cache_dir`: where the embedded corpus is prepared once.
- Never from under a run: a training run holds ``.NAME.readers`` beside the data folder it reads, shared
  (:func:`seqwarm.util.lock.share_lock`, one ``PID NOTE`` line each); ``--force`` refuses (exit 2, naming
  the runs) when it cannot take that file exclusively, once before it starts and again for the swap itself,
  which it makes holding the file, so a run starting meanwhile waits for the swap and reads the new data. A
  run refused at the swap keeps the finished data in a visible ``NAME.new`` beside it. The kernel drops a
  killed run's lock, so a crashed run never blocks ``--force``.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from seqwarm.data.meta import META_FILE, META_FORMAT
from seqwarm.util.errors import UserError
from seqwarm.util.lock import live_readers, pid_alive, readers_path, take_lock

logger = logging.getLogger(__name__)

RUN_SIGNS = ("checkpoints", "metrics.jsonl", "summary.json", "config.json")
"""Entries of a training run folder: ``--force`` never replaces a folder holding one of them."""

SIBLING_EXTRA = len(".") + len(".tmp-") + 7 + len("-") + 8
"""Bytes the longest hidden sibling adds to the folder's name (``.NAME.tmp-PID-XXXXXXXX``, a pid of up
to 7 digits)."""


def resolve_out(out: Path) -> Path:
    """The folder prepare writes: ``out`` itself, or, when ``out`` is a symbolic link, where it points
    (the link is kept; its target is replaced)."""
    try:
        if not out.is_symlink():
            return out
    except OSError:  # a name too long to look up: check_name_length says so
        return out
    try:
        return out.resolve(strict=False)
    except (OSError, RuntimeError) as err:  # a loop of links
        raise UserError(f"--out {str(out)!r} is a symbolic link that cannot be followed ({err})") from None


def _name_max(folder: Path) -> int:
    for p in (folder, *folder.parents):
        with contextlib.suppress(OSError, ValueError):
            return int(os.pathconf(p, "PC_NAME_MAX"))  # the nearest folder that exists
    return 255


def check_name_length(out: Path, real: Path) -> None:
    """UserError when ``real``'s name, or the hidden siblings prepare names after it, exceed the file
    system's longest name (usually 255 bytes)."""
    limit = _name_max(real.parent)
    size = len(os.fsencode(real.name))
    shown = str(out) if len(str(out)) <= 60 else str(out)[:40] + "..." + str(out)[-12:]
    where = f" (where the link {shown!r} points)" if real != out else ""
    for part in real.parent.parts:
        if len(os.fsencode(part)) > limit:
            raise UserError(
                f"--out {shown!r}{where}: the folder name {part[:20]}... in its path is too long "
                f"({len(os.fsencode(part))} bytes; this file system allows {limit}); choose a shorter path"
            )
    if size > limit:
        raise UserError(
            f"--out {shown!r}{where}: the name is too long ({size} bytes; this file system allows {limit}); "
            "choose a shorter name"
        )
    if size + SIBLING_EXTRA > limit:
        raise UserError(
            f"--out {shown!r}{where}: the name is too long ({size} bytes): prepare writes the data beside it "
            f"under a temporary name ('.NAME.tmp-PID-XXXXXXXX', {size + SIBLING_EXTRA} bytes), longer than "
            f"the {limit} bytes this file system allows; choose a name of at most {limit - SIBLING_EXTRA} bytes"
        )


def name_too_long(err: OSError) -> bool:
    return err.errno == errno.ENAMETOOLONG


# -- the lock ---------------------------------------------------------------------------------------

_HELD: dict[str, tuple[int, int]] = {}
"""Locks this process holds: lock file path -> (file descriptor, number of holders)."""


def lock_path(real: Path) -> Path:
    return real.parent / f".{real.name}.lock"


def _acquire(path: Path, out: Path, wait: bool) -> int:
    return take_lock(
        path,
        lambda pid: UserError(
            f"--out {str(out)!r} is being written by another seqwarm prepare (pid {pid}); "
            "wait for it to finish, stop it, or choose another --out"
        ),
        wait=wait,
    )


@contextlib.contextmanager
def out_lock(out: Path, real: Path | None = None, *, wait: bool = False) -> Iterator[None]:
    """Hold the lock on the output folder ``real`` (default ``out``) for the block; ``wait``: block until
    it is free instead of raising UserError naming the holder. The folder's parent is created if needed."""
    real = real or out
    path = lock_path(real)
    key = str(path.absolute())
    if key in _HELD:
        fd, count = _HELD[key]
        _HELD[key] = (fd, count + 1)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _HELD[key] = (_acquire(path, out, wait), 1)
    try:
        yield
    finally:
        fd, count = _HELD.pop(key)
        if count > 1:
            _HELD[key] = (fd, count - 1)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # while still held, so nobody locks a file that is going away unnoticed
            os.close(fd)


# -- checks, leftovers, the swap ------------------------------------------------------------------


def check_out(out: Path, force: bool, shown: Path | None = None) -> None:
    """``out`` is empty or missing, or (with ``force``) holds prepared data; else UserError. ``shown``: the
    path the user gave (a link to ``out``)."""
    name = str(shown or out) + (f" (-> {out})" if shown is not None and shown != out else "")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {name!r} exists and is not a folder")
    try:
        entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except OSError as err:
        raise UserError(f"--out {name!r}: cannot list it ({err.strerror or err})") from None
    if not entries:
        return
    if not force:
        raise UserError(
            f"--out {name!r} already exists and is not empty; "
            "pass --force to replace it (only once the new data is complete)"
        )
    run = [e for e in entries if e in RUN_SIGNS]
    if run:
        raise UserError(
            f"--force replaces prepared data only, and {name!r} holds a training run "
            f"({', '.join(run)}); choose another --out, or move the run away first"
        )
    try:
        meta = json.loads((out / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise UserError(
            f"--force replaces prepared data only, and {name!r} is not a seqwarm data folder "
            f"(no valid {META_FILE}; it holds {', '.join(entries[:5])}"
            f"{', ...' if len(entries) > 5 else ''}); choose another --out, or empty it yourself"
        )
    _release_readers_lock(*_take_readers_lock(out, name))  # before hours of tokenizing: refused now


class _BeingRead(Exception):
    pass


def _being_read(out: Path, name: str, kept: Path | None = None) -> UserError:
    path = readers_path(out)
    readers = live_readers(path)
    who = (
        "; ".join(f"pid {line.replace(' ', ', ', 1)}" for line in readers)
        if readers
        else f"a process on another machine or in another container holds {path.name}"
    )
    if kept is None:
        then = "wait for it to finish (or stop it: it resumes from its checkpoint), then prepare again"
    else:
        then = (
            f"it was left as it is, and the new data is in {str(kept)!r}: move that into place once the "
            "run has finished, or train on it as it is"
        )
    return UserError(
        f"--force would replace {name!r} under a running seqwarm run that reads it ({who}); {then}. "
        "--force never replaces data a live run has open"
    )


def _take_readers_lock(out: Path, name: str) -> tuple[Path, int]:
    """The data folder's readers lock, held exclusively: no run reads ``out`` while it is held (UserError
    naming the runs when one does)."""
    path = readers_path(out)
    try:
        return path, take_lock(path, lambda _: _BeingRead())
    except _BeingRead:
        raise _being_read(out, name) from None


def _release_readers_lock(path: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # while still held, so a reader waiting on it locks the next one
    os.close(fd)


def clear_leftovers(out: Path) -> None:
    """Remove the temporary folders of earlier ``prepare`` runs on ``out`` that were killed (their
    process is gone); a previous ``out`` parked during a replace that was cut short is put back. A parked
    symbolic link (left by seqwarm versions that replaced the link itself) is removed, never its target."""
    if not out.parent.is_dir():
        return
    for p in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        pid = p.name[len(out.name) + 6 :].split("-")[0]
        if p.is_dir() and not p.is_symlink() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
    for p in out.parent.glob(f".{glob.escape(out.name)}.old-*"):
        if p.is_symlink():
            if out.exists() or out.is_symlink():
                p.unlink()
            else:
                os.replace(p, out)
        elif p.is_dir():
            if out.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:  # killed between parking the old data and moving the new in: the old data is still good
                os.replace(p, out)


def check_inputs_outside(out: Path, inputs: Sequence[str | Path]) -> None:
    """``--out`` is replaced wholesale: refuse when it would swallow an input (``--input d --out d``)."""
    target = out.resolve()
    for raw in inputs:
        path = Path(raw).expanduser().resolve()
        if path == target or target in path.parents:
            raise UserError(
                f"--out {str(out)!r} contains the input {str(raw)!r}; it would be replaced. "
                "Choose another output folder"
            )


def replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` to ``out`` (a real folder, not a link); an existing ``out`` is removed
    only after that succeeded, and never while a run reads it: then ``tmp`` is kept as ``NAME.new`` beside
    ``out`` and UserError names the run."""
    if not out.exists():
        os.replace(tmp, out)
        return
    try:
        lock = _take_readers_lock(out, str(out))
    except UserError:
        kept = out.parent / f"{out.name}.new"
        if kept.exists() or kept.is_symlink():
            kept = out.parent / f"{out.name}.new-{uuid.uuid4().hex[:8]}"
        os.replace(tmp, kept)
        raise _being_read(out, str(out), kept) from None
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    try:
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
    finally:
        _release_readers_lock(*lock)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# the cache of the embedded corpus


CACHE_VARIABLE = "SEQWARM_CACHE"
"""The environment variable naming the folder the embedded corpus is prepared into."""

_FELL_BACK: set[str] = set()
"""Cache folders this process already said it could not write (said once, not once per call)."""


def cache_dir() -> Path:
    """Where the embedded corpus is prepared once: $SEQWARM_CACHE, else $XDG_CACHE_HOME/seqwarm."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seqwarm"


def writable_cache_dir() -> Path:
    """:func:`cache_dir`, created if needed; when it cannot be written and $SEQWARM_CACHE does not name
    it, ``seqwarm-cache-UID`` under the system's temporary folder (with a warning, once). UserError when
    neither can be written, or $SEQWARM_CACHE names a folder that cannot be."""
    configured = cache_dir()
    err = _write_problem(configured)
    if err is None:
        return configured
    fix = f"set {CACHE_VARIABLE}=DIR to a writable folder, or pass --data DIR (a folder written by seqwarm prepare)"
    if os.environ.get(CACHE_VARIABLE):  # asked for by name: never written elsewhere behind the user's back
        raise UserError(f"{CACHE_VARIABLE}={str(configured)!r}: cannot write there ({err}); {fix}")
    try:
        tmp = Path(tempfile.gettempdir())
        if tmp.resolve() == Path.cwd().resolve():  # Python's last resort: never the user's working folder
            raise OSError("only the current folder is writable")
        fallback = tmp / f"seqwarm-cache-{os.getuid()}"
    except OSError as no_tmp:  # no usable temporary folder at all (TMPDIR, /tmp, /var/tmp)
        raise UserError(
            f"cannot write the cache folder {str(configured)!r} ({err}) nor any temporary folder ({no_tmp}); {fix}"
        ) from None
    err_fallback = _write_problem(fallback, private=True)
    if err_fallback is not None:
        raise UserError(
            f"cannot write the cache folder {str(configured)!r} ({err}) nor {str(fallback)!r} ({err_fallback}); {fix}"
        )
    if str(configured) not in _FELL_BACK:
        _FELL_BACK.add(str(configured))
        logger.warning(
            "warning: the cache folder %s cannot be written (%s); the embedded corpus is kept in %s instead "
            "(prepared again if that folder is cleared). Set %s=DIR to keep it elsewhere",
            configured,
            err,
            fallback,
            CACHE_VARIABLE,
        )
    return fallback


def _write_problem(folder: Path, *, private: bool = False) -> str | None:
    """Why ``folder`` cannot be created or written (None when it can). ``private``: a folder in a shared
    temporary folder, created for this user alone and refused when someone else owns it."""
    try:
        folder.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
        if private and (folder.is_symlink() or folder.stat().st_uid != os.getuid()):
            return "it belongs to another user"
        # Creating a file is the only sure test: os.access says yes to root on a read-only mount's folder
        # with write bits, and to anyone on a folder whose file system is full.
        probe = folder / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as err:
        return err.strerror or str(err)
    return None
