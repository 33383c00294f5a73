"""Atomic checkpoints of everything a resume needs, named by step, the last few kept.

A checkpoint is written to a temporary name in the same folder, flushed to disk, then renamed into
place (:func:`seqwarm.atomic.atomic_path`), so a crash (even SIGKILL) mid-write never leaves a file
under a checkpoint name that does not load. :func:`latest_checkpoint` skips files that fail to load
and falls back to the previous one.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqwarm.atomic import TMP_MARK, atomic_path

logger = logging.getLogger(__name__)

FORMAT = "seqwarm.checkpoint/1"
_NAME = re.compile(r"^step_(\d{8})\.pt$")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of the files named like checkpoints, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(folder: Path, step: int, payload: dict[str, Any], keep: int = 3) -> Path:
    """Write ``payload`` as the checkpoint of ``step`` atomically; delete all but the newest ``keep``."""
    final = checkpoint_path(folder, step)
    with atomic_path(final) as tmp:  # fsync the file, rename, fsync the folder
        torch.save({"format": FORMAT, "step": step, **payload}, tmp)
    if keep > 0:
        for _, old in list_checkpoints(folder)[:-keep]:
            old.unlink(missing_ok=True)
    for stale in folder.glob(f".step_*.pt{TMP_MARK}*"):  # left by a run killed mid-write
        stale.unlink(missing_ok=True)
    return final


def load_checkpoint(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a seqwarm checkpoint")
    return state


def latest_checkpoint(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads (a damaged newer one is skipped with a warning)."""
    for _, path in reversed(list_checkpoints(folder)):
        try:
            return path, load_checkpoint(path)
        except Exception as err:  # noqa: BLE001 - any unreadable file: fall back to an older one
            logger.warning("skipping checkpoint %s: it does not load (%s)", path, err)
    return None
