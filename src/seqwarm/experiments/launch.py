"""Launching training runs for experiments: run specs in, run folders out.

``compare``, ``tune`` and ``sweep`` start runs exactly as the CLI does, with
:func:`seqwarm.run.training.run_training` on :class:`~seqwarm.run.spec.RunSpec` s (changed with
:func:`seqwarm.run.spec.with_changes`), through :mod:`seqwarm.experiments.runner`. This module holds what
they need besides: the config files and flags a run needs (e.g. a different ``total_curriculum_step``, a
scaled batch) and whether a run folder can be reused, resumed or started. The ``seqwarm train ...`` command line that
reproduces a spec is :func:`seqwarm.run.command.command_line`.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqwarm.config.defaults import PRESETS
from seqwarm.config.reader import read_config_dict
from seqwarm.run.checks import model_size
from seqwarm.run.spec import RunSpec, recipe_config, resolve_config
from seqwarm.run.training import run_training
from seqwarm.trainer.resume import RECORDED_SINCE, RESUME_KEYS
from seqwarm.trainer.run_folder import LOCK_FILE, run_lock
from seqwarm.util.errors import UserError

# Files `seqwarm train` writes into a run folder (a folder holding only these, with no checkpoint and
# no summary, is a run that died before its first checkpoint and can be started again).
RUN_FILES = ("config.json", "metrics.jsonl", "tensorboard", "checkpoints", "curves.png", "summary.json", LOCK_FILE)


# --------------------------------------------------------------------------------------------------
# configs


def read_raw_config(spec: RunSpec) -> dict[str, Any]:
    """The DeepSpeed JSON of the spec's ``--config``, as a dict; without one, the built-in recipe as
    ``seqwarm train`` builds it for this spec (following --seq-length, the budget and the batch)."""

    if not spec.config:
        return recipe_config(spec)
    return read_config_dict(spec.config)[0]


def _schedule_blocks(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The enabled curriculum blocks (legacy block, or data_efficiency seqlen metrics) of a raw config."""
    blocks = []
    legacy = raw.get("curriculum_learning")
    if isinstance(legacy, dict) and legacy.get("enabled"):
        blocks.append(legacy)
    de = raw.get("data_efficiency")
    try:
        metrics = de["data_sampling"]["curriculum_learning"]["curriculum_metrics"]
    except (KeyError, TypeError):
        metrics = None
    if isinstance(metrics, dict):
        blocks += [m for name, m in metrics.items() if name.startswith("seqlen") and isinstance(m, dict)]
    return blocks


def total_curriculum_step_of(raw: Mapping[str, Any]) -> int:
    """The config's ``total_curriculum_step`` (fixed_linear / fixed_root schedules only)."""
    blocks = _schedule_blocks(raw)
    if not blocks:
        raise UserError(
            "the config has no enabled sequence-length curriculum (curriculum_learning or data_efficiency block)"
        )
    sc = blocks[0].get("schedule_config") or {}
    if blocks[0].get("schedule_type") not in ("fixed_linear", "fixed_root") or "total_curriculum_step" not in sc:
        raise UserError(
            f"schedule_type {blocks[0].get('schedule_type')!r} has no total_curriculum_step: "
            "only fixed_linear and fixed_root schedules can be tuned or rescaled"
        )
    return int(sc["total_curriculum_step"])


def with_total_curriculum_step(raw: Mapping[str, Any], value: int) -> dict[str, Any]:
    """A copy of ``raw`` whose curriculum rises over ``value`` steps (every seqlen block is changed)."""
    total_curriculum_step_of(raw)  # checks there is one
    out = copy.deepcopy(dict(raw))
    for block in _schedule_blocks(out):
        block.setdefault("schedule_config", {})["total_curriculum_step"] = int(value)
    return out


def scaled_stages(stages, factor: float) -> str:
    """``--stages`` JSON text of ``stages`` (:class:`~seqwarm.curriculum.stages.StageConfig`) with each
    ``start_tokens`` multiplied by ``factor`` (at least 1), their lengths and position settings kept."""
    out = []
    for s in stages:
        stage = {"start_tokens": max(1, round(s.start_tokens * factor)), "length": s.length}
        stage |= {"rope_theta": s.rope_theta} if s.rope_theta is not None else {}
        stage |= {"rope_scaling": s.rope_scaling.to_dict()} if s.rope_scaling is not None else {}
        stage |= {"micro_batch_size": s.micro_batch_size} if s.micro_batch_size is not None else {}
        out.append(stage)
    return json.dumps(out)


def scale_schedule_steps(raw: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """A copy of ``raw`` with the curriculum's step counts multiplied by ``factor`` (at least 1).

    fixed_linear / fixed_root: ``total_curriculum_step``; fixed_discrete: every ``max_step``.
    """
    out = copy.deepcopy(dict(raw))
    for block in _schedule_blocks(out):
        sc = block.get("schedule_config")
        if not isinstance(sc, dict):
            continue
        if isinstance(sc.get("total_curriculum_step"), (int, float)):
            sc["total_curriculum_step"] = max(1, round(sc["total_curriculum_step"] * factor))
        if isinstance(sc.get("max_step"), list):
            steps, last = [], 0
            for s in sc["max_step"]:
                last = max(last + 1, round(s * factor))  # keep them strictly increasing
                steps.append(last)
            sc["max_step"] = steps
    return out


def scaled_lr_units(lr, step_factor: float, amount_factor: float) -> dict[str, Any]:
    """Warmup/decay flags: lengths in iterations x step_factor, in samples/tokens x amount_factor."""
    out: dict[str, Any] = {}
    for kind in ("warmup", "decay"):
        for unit in ("iters", "samples", "tokens"):
            out[f"lr_{kind}_{unit}"] = None
        unit = lr.warmup_unit if kind == "warmup" else lr.decay_unit
        if unit is None:
            continue
        value = getattr(lr, f"{kind}_{unit}")
        factor = step_factor if unit == "iters" else amount_factor
        out[f"lr_{kind}_{unit}"] = max(1, round(value * factor))
    out["lr_decay_style"] = lr.decay_style
    return out


def scaled_batch(base_cfg, k: int, m: float) -> dict[str, Any]:
    """The flags that run ``base_cfg`` at ``k`` x its global batch (more accumulation steps) and ``m`` x its
    learning rate, its schedules counted in steps divided by ``k`` so that they cover the same samples."""
    out: dict[str, Any] = {
        "train_batch_size": base_cfg.train_batch_size * k,
        "gradient_accumulation_steps": base_cfg.gradient_accumulation_steps * k,
        "train_micro_batch_size_per_gpu": base_cfg.micro_batch_size,
        "lr": base_cfg.lr.lr * m,
        "min_lr": base_cfg.lr.min_lr * m if base_cfg.lr.min_lr else None,
    }
    out.update(scaled_lr_units(base_cfg.lr, 1.0 / k, 1.0))
    if base_cfg.train_iters:
        out["train_iters"] = max(1, math.ceil(base_cfg.train_iters / k))
    return out


# --------------------------------------------------------------------------------------------------
# run folders


def run_state(run_dir: Path) -> str:
    """``new`` (absent/empty), ``finished`` (summary.json), ``resumable`` (checkpoints), ``stale``
    (only files a run writes, killed before its first checkpoint) or ``foreign`` (anything else)."""
    run_dir = Path(run_dir)
    if not run_dir.exists() or not any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        return "new"
    if (run_dir / "summary.json").is_file():
        return "finished"
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and any(p.suffix == ".pt" for p in ckpts.iterdir()):
        return "resumable"
    if all(p.name in RUN_FILES for p in run_dir.iterdir()):
        return "stale"
    return "foreign"


def clear_stale(run_dir: Path) -> None:
    """Remove what a run killed before its first checkpoint left (only seqwarm's own file names)."""
    for name in RUN_FILES:
        if name == LOCK_FILE:  # the caller holds it (or nobody does): it stays until released
            continue
        p = Path(run_dir) / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def check_same_run(run_dir: Path, spec: RunSpec) -> None:
    """Refuse to reuse a run folder whose recorded settings differ from what this experiment asks for."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    new_run = json.loads(json.dumps(resolve_config(spec).to_dict(), default=lambda o: str(o)))
    old_cl, new_cl = old.get("run", {}).get("curriculum"), new_run.get("curriculum")
    if isinstance(old_cl, dict) and isinstance(new_cl, dict) and new_cl.get("mode") is None:
        # the run records the mode "auto" resolved to (inject/truncate); the same config resolves the same
        new_run["curriculum"] = {**new_cl, "mode": old_cl.get("mode")}
    changed = [k for k in RESUME_KEYS if old.get("run", {}).get(k, RECORDED_SINCE.get(k)) != new_run.get(k)]
    opts = old.get("options", {})
    if opts.get("model") not in (None, spec.model):
        changed.append("model")
    if opts.get("seed") not in (None, spec.seed):
        changed.append("seed")
    old_model = old.get("model") or {}
    if spec.model in PRESETS and any(old_model.get(k) not in (None, v) for k, v in model_size(spec).items()):
        changed.append("model size")
    held = (old.get("data") or {}).get("fingerprint")
    if held is not None and held != spec_data_fingerprint(spec):
        changed.append("data (its token files' fingerprint)")
    if changed:
        raise UserError(
            f"{run_dir} holds a run with a different {', '.join(changed)} than this experiment asks "
            "for; choose another --out, or delete that folder to run it again"
        )


def spec_data_fingerprint(spec: RunSpec) -> str | None:
    """Fingerprint of the data ``spec`` trains on (``--data``, else the embedded corpus, prepared if need
    be); None when ``--data`` names no prepared folder (training will say why)."""
    from seqwarm.data import data_fingerprint, embedded_data_dir, read_meta

    folder = Path(spec.data) if spec.data else embedded_data_dir()
    try:
        return data_fingerprint(read_meta(folder))
    except UserError:
        return None


def run_data_fingerprint(run_dir: Path) -> str | None:
    """The data fingerprint a run folder's ``config.json`` records (None: no config, or a run from
    before fingerprints were recorded)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    return (json.loads(path.read_text()).get("data") or {}).get("fingerprint")


def check_same_data(run_dirs: list[Path]) -> None:
    """Refuse to put runs trained on different data side by side (UserError, exit 2)."""
    seen = {Path(d): run_data_fingerprint(d) for d in run_dirs}
    known = {fp for fp in seen.values() if fp is not None}
    if len(known) > 1:
        listing = "; ".join(f"{d}: {fp[:12] if fp else 'unrecorded'}" for d, fp in seen.items())
        raise UserError(
            "these runs were trained on different data (fingerprints of their token files: "
            f"{listing}), so they cannot be compared; rerun them on one prepared folder "
            "(the same --data), or delete the runs made on other data"
        )


def run_or_reuse(spec: RunSpec, *, check: bool = True) -> tuple[str, Any]:
    """Start, resume or reuse the run in ``spec.out``. Returns (what happened, TrainResult or None)."""
    run_dir = Path(spec.out)
    if not run_dir.is_dir():
        return _run_or_reuse(run_dir, spec, check)
    with run_lock(run_dir):  # nobody else's run may be in this folder while it is looked at or cleared
        return _run_or_reuse(run_dir, spec, check)


def _run_or_reuse(run_dir: Path, spec: RunSpec, check: bool) -> tuple[str, Any]:
    state = run_state(run_dir)
    if state == "foreign":
        raise UserError(f"{run_dir} holds files that are not a seqwarm run; choose another --out")
    if state in ("finished", "resumable") and check:
        check_same_run(run_dir, spec)
    if state == "finished":
        return "reused", None
    if state == "stale":
        clear_stale(run_dir)
    result = run_training(replace(spec, resume=state == "resumable"))
    return ("resumed" if state == "resumable" else "trained"), result
