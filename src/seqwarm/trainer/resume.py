"""Resuming a run: which of its recorded settings must not change, and the check against the new ones.

A checkpoint records the config its run was resolved to (what ``config.json`` holds).
:func:`check_resume_config` compares it with the run being started: a different recipe
(:data:`RESUME_KEYS`, the optimizer and clipping included) or other training data (its fingerprint) is
refused unless ``--allow-config-change``, naming each setting with its old and new value (the split of
an unchanged global batch into micro-batches, accumulation and processes may change); a different
model never is allowed (its weights would not fit). :func:`config_changes` lists every setting that
differs, as the run folder's ``history.jsonl`` records it and the resume prints it
(:func:`format_changes`). :func:`saved_section` reads one section of a run folder's ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqwarm.util.errors import UserError

__all__ = ["RECORDED_SINCE", "RESUME_KEYS", "check_resume_config", "config_changes", "format_changes", "saved_section"]

RESUME_KEYS = (
    "train_batch_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "seq_length",
    "lr",
    "optimizer",
    "gradient_clipping",
    "curriculum",
    "train_tokens",
    "train_iters",
    "train_samples",
    "count_tokens_by",
    "precision",
    "document_masking",
    "stages",
)

RECORDED_SINCE = {"document_masking": False, "stages": []}
"""Settings a run's record gained later, with the value every run recorded before had: a record without
one is read as that value, not as a change."""


LAYOUT_KEYS = ("micro_batch_size", "gradient_accumulation_steps")
"""How the global batch is split (with the number of processes): free to change on resume when
``train_batch_size`` is the same, since the data position and the clock count global samples."""


def check_resume_config(path: Any, saved: dict, resolved: dict, *, allow_config_change: bool = False) -> None:
    """UserError when the checkpoint at ``path`` (its recorded ``saved`` config) was written with another
    recipe or model than ``resolved`` (the run's), naming what differs."""
    old, new = {**RECORDED_SINCE, **saved["run"]}, {**RECORDED_SINCE, **resolved["run"]}
    if (old.get("curriculum") or {}).get("mode", "") is None and new.get("curriculum"):
        # written before the resolved mode was recorded: the same config resolves to the same mode
        old = {**old, "curriculum": {**old["curriculum"], "mode": new["curriculum"]["mode"]}}
    same_batch = old.get("train_batch_size") == new.get("train_batch_size")
    diff = config_changes(
        {"run": old, "data": saved.get("data") or {}}, {"run": new, "data": resolved.get("data") or {}}
    )
    changed = [
        format_changes({k: v for k, v in diff.items() if k == f"run.{key}" or k.startswith(f"run.{key}.")})
        for key in RESUME_KEYS
        if old.get(key) != new.get(key) and not (key in LAYOUT_KEYS and same_batch)
    ]
    if "data.fingerprint" in diff and diff["data.fingerprint"][0] is not None:  # older checkpoints hold none
        changed.append("training data (" + format_changes({"fingerprint": diff["data.fingerprint"]}) + ")")
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
        changed.append("model (" + ", ".join(shape) + ")")
    if changed and not allow_config_change:
        raise UserError(
            f"{path} was written with different settings: {'; '.join(changed)}; resume with the same "
            "settings, or pass --allow-config-change to continue anyway (the run folder's history.jsonl "
            "then records the change)"
        )


IGNORED_CHANGES = (
    "run.warnings",
    "run.source",
    "options.allow_config_change",
    "options.memory_probe",
    "precision.source",
)
"""Entries of the resolved config whose difference is no change of the run."""


def config_changes(old: Any, new: Any, prefix: str = "") -> dict[str, list[Any]]:
    """Every entry of two resolved configs that differs, as ``{"run.lr.lr": [old, new], ...}`` (dotted
    paths into the nested dicts; an entry one of them lacks is None there)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, list[Any]] = {}
        for key in sorted(set(old) | set(new), key=str):
            out.update(config_changes(old.get(key), new.get(key), f"{prefix}{key}."))
        return out
    name = prefix.rstrip(".")
    if old is None and name.startswith("run.") and RECORDED_SINCE.get(name[4:], old) == new:
        return {}  # recorded before the setting was: it had its one value then
    return {} if old == new or name in IGNORED_CHANGES else {name: [old, new]}


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    if isinstance(value, str) and len(value) > 24 and all(c in "0123456789abcdef" for c in value):
        return value[:10]  # a fingerprint
    return text if len(text) <= 60 else text[:57] + "..."


def format_changes(changes: dict[str, list[Any]]) -> str:
    """``lr.lr 0.002 -> 0.001, data.fingerprint 1b80a26c42 -> 18d324fd37``."""
    return ", ".join(f"{key} {_short(a)} -> {_short(b)}" for key, (a, b) in changes.items())


def saved_section(run_dir: Path, section: str) -> dict[str, Any]:
    """One section (``run``, ``model``) of a run folder's config.json ({} when there is none to read)."""
    try:
        out = json.loads((run_dir / "config.json").read_text())[section]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return out if isinstance(out, dict) else {}
