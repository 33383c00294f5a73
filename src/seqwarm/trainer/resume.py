"""Resuming a run: which of its recorded settings must not change, and the check against the new ones.

A checkpoint's ``config.json`` records what the run was resolved to. :func:`check_resume_config` compares
it with the run being started: a different recipe (:data:`RESUME_KEYS`) is refused unless
``--allow-config-change``; a different model never is allowed (its weights would not fit).
:func:`saved_section` reads one section of a run folder's ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqwarm.util.errors import UserError

__all__ = ["RESUME_KEYS", "check_resume_config", "saved_section"]

RESUME_KEYS = (
    "train_batch_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "seq_length",
    "lr",
    "curriculum",
    "train_tokens",
    "train_iters",
    "train_samples",
    "count_tokens_by",
    "precision",
)


def check_resume_config(path: Any, saved: dict, resolved: dict, *, allow_config_change: bool = False) -> None:
    """UserError when the checkpoint at ``path`` (its recorded ``saved`` config) was written with another
    recipe or model than ``resolved`` (the run's), naming what differs."""
    old, new = saved["run"], resolved["run"]
    if (old.get("curriculum") or {}).get("mode", "") is None and new.get("curriculum"):
        # written before the resolved mode was recorded: the same config resolves to the same mode
        old = {**old, "curriculum": {**old["curriculum"], "mode": new["curriculum"]["mode"]}}
    changed = [k for k in RESUME_KEYS if old.get(k) != new.get(k)]
    old_model = saved["model"]
    if "vocab_multiple" in resolved["model"] and "vocab_multiple" not in old_model:  # before padding
        old_model = {**old_model, "vocab_multiple": 1}
    if old_model != resolved["model"]:
        shape = [f"{k} {old_model.get(k)!r} -> {v!r}" for k, v in resolved["model"].items() if old_model.get(k) != v]
        if allow_config_change:  # the weights would not fit: no flag can make that work
            raise UserError(
                f"{path} holds a different model ({', '.join(shape)}); --allow-config-change "
                "covers the recipe, not the model or its sequence length: resume with the "
                "same --model, --seq-length and data, or start a new run"
            )
        changed.append("model")
    if changed and not allow_config_change:
        raise UserError(
            f"{path} was written with a different {', '.join(changed)}; resume with the same "
            "settings, or pass --allow-config-change to continue anyway"
        )


def saved_section(run_dir: Path, section: str) -> dict[str, Any]:
    """One section (``run``, ``model``) of a run folder's config.json ({} when there is none to read)."""
    try:
        out = json.loads((run_dir / "config.json").read_text())[section]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return out if isinstance(out, dict) else {}
