"""``seqwarm sweep``: the baseline and the curriculum over a grid of peak LR, batch scale, clipping,
LR warmup, position embeddings, curriculum mode and document masking, several seeds each.

A *cell* is one point of the grid; each cell is laid out as a ``seqwarm compare --seeds N`` of its own
(``DIR/CELL/baseline``, ``DIR/CELL/curriculum``, ``DIR/CELL/seed-S/...``), planned by
:func:`seqwarm.experiments.compare.plan_compare`, except that at batch scale K *both* arms train at K x
the global batch (the curriculum's and the LR schedule's step counts divided by K, so they cover the
same samples). Every cell's seed is handed to the experiments' one runner
(:class:`~seqwarm.experiments.runner.ArmRunner`): finished runs are reused and runs with checkpoints
resumed, so a killed sweep continues. The report's markdown is :mod:`seqwarm.experiments.sweep_report`.

The curriculum mode and document masking are axes only when given more than one value (one value is
a setting of every run, as in ``seqwarm train``, and leaves the cell names as they were). Cells that
differ only in mode share their baseline, as ``compare --modes`` does: ``DIR/CELL/baseline`` and
``DIR/CELL/<mode>``, the cell of each mode named ``CELL_mode-<mode>`` in the report.

Every run reports its final full-length validation loss, whether it diverged (non-finite loss, a
smoothed loss-ratio spike — see :data:`seqwarm.experiments.compare.STABILITY_DEFINITION` — or a
blow-up: :data:`DIVERGED_DEFINITION`) and, for the curriculum, the tokens to reach the same cell's and
seed's baseline final loss.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqwarm.curriculum.schedule import CURRICULUM_MODES
from seqwarm.experiments import curves, spread
from seqwarm.experiments.compare import MODES, RUNS, CompareOptions, plan_compare
from seqwarm.experiments.launch import check_same_data
from seqwarm.experiments.runner import Arm, ArmOptions, ArmRunner, arm_options, read_arm, refuse_run_flags, require_out
from seqwarm.experiments.sweep_report import BEST_DEFINITION, DIVERGED_DEFINITION, LIMITS_DEFINITION, render_sweep
from seqwarm.run.spec import RunSpec, with_changes
from seqwarm.trainer.plots import plot_sweep
from seqwarm.util.atomic import write_json, write_text
from seqwarm.util.errors import UserError

POSITIONS = ("learned", "rotary")


@dataclass(frozen=True)
class SweepOptions(ArmOptions):
    """The grid of ``seqwarm sweep`` (each axis a list; None on an axis: the config's value), and
    :class:`ArmOptions`: ``out`` (the folder for the cells, sweep.json, sweep.md and sweep.png), the seeds
    per cell and arm, the spike threshold and smoothing, and the evaluation and log intervals (None: as
    compare chooses)."""

    lr: tuple[float, ...] = ()
    """Peak learning rates (empty: the config's)."""
    scale_batch: tuple[int, ...] = (1,)
    """Global batch multiples, applied to both arms."""
    clip_grad: tuple[float | None, ...] = (None,)
    """Gradient clipping norms (0: off; None: the config's)."""
    lr_warmup_iters: tuple[int | None, ...] = (None,)
    """LR warmup lengths in iterations at batch scale 1 (None: the config's)."""
    pos: tuple[str, ...] = ("learned",)
    """Position embeddings: learned and/or rotary."""
    curriculum_mode: tuple[str | None, ...] = (None,)
    """Curriculum modes (None: the config's); several make an axis whose cells share their baseline."""
    document_masking: tuple[bool | None, ...] = (None,)
    """Document masking off and/or on, in both arms (None: the config's)."""


def _num(value: float | None) -> str:
    return "cfg" if value is None else f"{value:g}"


def cell_name(lr: float | None, k: int, clip: float | None, warmup: int | None, pos: str) -> str:
    """The cell's folder name, e.g. ``lr-0.004_bs-8_clip-1_wu-cfg_pos-learned``."""
    return f"lr-{_num(lr)}_bs-{k}_clip-{_num(clip)}_wu-{_num(warmup)}_pos-{pos}"


def plan_sweep(base: RunSpec, options: SweepOptions) -> list[dict[str, Any]]:
    """Every cell: its grid values and, per seed, the two runs' specs (writes each cell's configs)."""
    require_out(options.out, "the sweep's runs and its report")
    bad = [f"--pos {p}: choose learned or rotary" for p in options.pos if p not in POSITIONS]
    bad += [f"--scale-batch {k}: must be >= 1" for k in options.scale_batch if k < 1]
    bad += [f"--lr {v:g}: must be positive" for v in options.lr if not v > 0]
    modes = options.curriculum_mode
    if len(modes) > 1:  # an axis: each mode's arm is a folder named after it, as in `compare --modes`
        bad += [
            f"--curriculum-mode {_mode_text(m)}: as a grid axis choose from {', '.join(MODES)}"
            for m in modes
            if m not in MODES
        ]
    else:
        bad += [
            f"--curriculum-mode {m}: choose from {', '.join(CURRICULUM_MODES)}"
            for m in modes
            if m and m not in CURRICULUM_MODES
        ]
    for flag, axis in (("--curriculum-mode", modes), ("--document-masking", options.document_masking)):
        if len(set(axis)) < len(axis):
            bad.append(f"{flag}: a value is named twice; name each once")
    if bad:
        raise UserError("; ".join(bad))
    refuse_run_flags(base, "sweep")
    mode_axis = len(options.curriculum_mode) > 1  # one value: a setting of every run, not an axis
    mask_axis = len(options.document_masking) > 1
    cells = []
    for lr, k, clip, warmup, pos, masking, mode in itertools.product(
        options.lr or (None,),
        options.scale_batch,
        options.clip_grad,
        options.lr_warmup_iters,
        options.pos,
        options.document_masking,
        options.curriculum_mode,
    ):
        folder = cell_name(lr, k, clip, warmup, pos) + (f"_docmask-{'on' if masking else 'off'}" if mask_axis else "")
        changes = {
            key: v
            for key, v in (
                ("lr", lr),
                ("gradient_clipping", clip),
                ("lr_warmup_iters", warmup),
                ("document_masking", masking),
                ("curriculum_mode", None if mode_axis else mode),
            )
            if v is not None
        }
        if mode_axis:  # each arm's mode is the axis's, never a setting carried by the baseline
            changes["curriculum_mode"] = None
        spec = with_changes(base, rotary=pos == "rotary", **changes)
        plan = plan_compare(
            spec,
            CompareOptions(
                **{**arm_options(options), "out": Path(options.out) / folder},
                scale_batch=k,
                # a mode axis: the cell is a `compare --modes` of one mode, its baseline shared by the modes
                modes=(mode,) if mode_axis else (),
            ),
        )
        arm = mode if mode_axis else "curriculum"
        shared: dict[str, Any] = {}
        if mode_axis:  # the first mode's config (every mode's holds the same, and its cell is planned first)
            shared = {"curriculum_mode": None, "config": Path(options.out) / folder / "configs" / f"{modes[0]}.json"}
        seeds = {}
        for seed, runs in plan.by_seed().items():
            cur = runs[arm]  # at K x batch; the baseline is the same without curriculum (and without a mode)
            base_out = Path(cur.out).parent / "baseline"
            seeds[seed] = {"baseline": with_changes(cur, curriculum=False, out=base_out, **shared), "curriculum": cur}
        cell = {"name": folder + (f"_mode-{mode}" if mode_axis else ""), "lr": lr, "scale_batch": k}
        cell.update(clip_grad=clip, lr_warmup_iters=warmup, pos=pos)
        if mask_axis:
            cell["document_masking"] = masking
        if mode_axis:
            cell["curriculum_mode"] = mode
        cells.append({**cell, "runs": seeds})
    return cells


def _mode_text(mode: str | None) -> str:
    return "cfg" if mode is None else mode


def blow_up_ceiling(vocab_size: Any, threshold: float) -> float | None:
    """The training loss above which a run has blown up: ``threshold`` x the loss of a uniform guess."""
    return threshold * math.log(vocab_size) if isinstance(vocab_size, int) and vocab_size > 1 else None


def run_result(spec: RunSpec, status: dict[str, Any], threshold: float, window: int) -> dict[str, Any]:
    """Final loss, divergence, spikes and the validation curve of one finished (or diverged) run."""
    arm = read_arm(spec.out)
    evals, train = arm.evals, arm.train
    final = arm.summary.get("final_val_loss")
    stab = curves.stability(train, threshold, window)
    non_finite = status.get("status") == "diverged" or not (isinstance(final, (int, float)) and math.isfinite(final))
    finite = arm.finite_losses()
    ceiling = blow_up_ceiling((arm.config.get("model") or {}).get("vocab_size"), threshold)
    blew_up = ceiling is not None and any(v > ceiling for v in finite)
    return {
        "run_dir": str(arm.run_dir),
        "status": status.get("status"),
        "final_val_loss": final,
        "spikes": stab["spikes"],
        "diverged": bool(non_finite or stab["spikes"] or blew_up),
        "non_finite": non_finite,
        "blew_up": blew_up,
        "max_train_loss": max(finite) if finite else None,
        "max_loss_ratio": stab["max_loss_ratio"],
        "peak_lr": (arm.run.get("lr") or {}).get("lr"),
        "global_batch_size": arm.run.get("train_batch_size"),
        "tokens": [r["tokens"] for r in evals],
        "val_loss": [r["val_loss"] for r in evals],
    }


def state_key(out: Path, cell: dict[str, Any], seed: int, arm: str) -> str:
    """The key of one run in ``sweep_state.json``: ``CELL/seed-S/ARM``, where a baseline's CELL is its
    folder's (the cells of a mode axis share one baseline, so one that diverged is remembered as such,
    not trained again for every further mode)."""
    name = cell["name"]
    if arm == "baseline":
        name = Path(cell["runs"][seed]["baseline"].out).relative_to(out).parts[0]
    return f"{name}/seed-{seed}/{arm}"


def run_sweep(base: RunSpec, options: SweepOptions, *, echo=print) -> dict[str, Any]:
    """Run (or reuse / resume) every cell's runs; write sweep.json, sweep.md and sweep.png."""
    cells = plan_sweep(base, options)
    out = Path(options.out)
    runner = ArmRunner(out / "sweep_state.json", echo=echo)
    results = []
    for cell in cells:
        per_seed = []
        for seed, runs in cell["runs"].items():
            keys = {arm: state_key(out, cell, seed, arm) for arm in RUNS}
            status = runner.run(Arm(keys[arm], runs[arm]) for arm in RUNS)
            row: dict[str, Any] = {"seed": seed}
            for arm in RUNS:
                row[arm] = run_result(runs[arm], status[keys[arm]], options.spike_threshold, options.smooth_steps)
            check_same_data([Path(runs[arm].out) for arm in RUNS])
            row["tokens_to_target"] = _tokens_to_target(row)
            per_seed.append(row)
        results.append(
            {
                **{k: v for k, v in cell.items() if k != "runs"},
                "seeds": per_seed,
                **{arm: _arm_spread(per_seed, arm) for arm in RUNS},
            }
        )
    check_same_data([Path(s[arm]["run_dir"]) for c in results for s in c["seeds"] for arm in RUNS])
    report = {
        "out": str(out),
        "grid": {
            "lr": list(options.lr),
            "scale_batch": list(options.scale_batch),
            "clip_grad": list(options.clip_grad),
            "lr_warmup_iters": list(options.lr_warmup_iters),
            "pos": list(options.pos),
            "curriculum_mode": list(options.curriculum_mode),
            "document_masking": list(options.document_masking),
            "seeds": options.seeds,
        },
        "cells": results,
        "against_best_baseline": against_best_baseline(results),
        "stability_limits": stability_limits(results),
        "definitions": {
            "spread": spread.SPREAD_DEFINITION,
            "against_best_baseline": BEST_DEFINITION,
            "diverged": DIVERGED_DEFINITION,
            "stability_limits": LIMITS_DEFINITION,
        },
    }
    write_json(out / "sweep.json", report)
    plot_sweep(results, out / "sweep.png")
    write_text(out / "sweep.md", render_sweep(report))
    return report


def _tokens_to_target(row: dict[str, Any]) -> dict[str, Any]:
    """Tokens each arm takes to the baseline's final loss of the same seed (null: never, or no target)."""
    base, cur = row["baseline"], row["curriculum"]
    if base["non_finite"] or not base["val_loss"]:
        return {"target": None, "baseline": None, "curriculum": None, "speedup": None}
    res = curves.speedup_to_target(base["tokens"], base["val_loss"], cur["tokens"], cur["val_loss"])
    return {"target": res.target, "baseline": res.baseline, "curriculum": res.curriculum, "speedup": res.speedup}


def against_best_baseline(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Every cell and arm against the baseline at its best (see :data:`BEST_DEFINITION`); None when no
    baseline at the smallest batch scale trained without diverging."""
    if not cells:
        return None
    smallest = min(c["scale_batch"] for c in cells)
    stable = [
        c
        for c in cells
        if c["scale_batch"] == smallest
        and not c["baseline"]["diverged"]
        and c["baseline"]["final_val_loss"]["median"] is not None
    ]
    if not stable:
        return None
    best = min(stable, key=lambda c: c["baseline"]["final_val_loss"]["median"])
    targets = {}
    for s in best["seeds"]:
        run, final = s["baseline"], s["baseline"]["final_val_loss"]
        if isinstance(final, (int, float)) and math.isfinite(final):
            own = curves.first_crossing(run["tokens"], run["val_loss"], final)
            targets[s["seed"]] = {"seed": s["seed"], "target": final, "tokens": own}
    rows = []
    for c in cells:
        for arm in RUNS:
            ratios = []
            for s in c["seeds"]:
                t, run = targets.get(s["seed"]), s[arm]
                x = curves.first_crossing(run["tokens"], run["val_loss"], t["target"]) if t else None
                ratios.append(x / t["tokens"] if x is not None and t["tokens"] else None)
            rows.append(
                {
                    "cell": c["name"],
                    "arm": arm,
                    "tokens_ratio": spread.spread(ratios),
                    "reached": sum(r is not None for r in ratios),
                    "seeds": len(c["seeds"]),
                    "per_seed": ratios,
                }
            )
    return {
        "cell": best["name"],
        "lr": best["lr"],
        "scale_batch": best["scale_batch"],
        "targets": list(targets.values()),
        "rows": rows,
    }


def stability_limits(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The largest LR each arm survives, per batch scale / clipping / warmup / position setting (see
    :data:`LIMITS_DEFINITION`); cells at the config's own LR (no ``--lr`` axis) are left out."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        if c.get("lr") is not None:
            key = (c["scale_batch"], c.get("clip_grad"), c.get("lr_warmup_iters"), c.get("pos"))
            key += (c.get("curriculum_mode"), c.get("document_masking"))  # None unless the grid varies them
            groups.setdefault(key, []).append(c)
    out = []
    for (k, clip, warmup, pos, mode, masking), group in groups.items():
        for arm in RUNS:
            stable = [c["lr"] for c in group if not c[arm]["diverged"]]
            failed = [c["lr"] for c in group if c[arm]["diverged"]]
            out.append(
                {
                    "scale_batch": k,
                    "clip_grad": clip,
                    "lr_warmup_iters": warmup,
                    "pos": pos,
                    **({"curriculum_mode": mode} if mode else {}),
                    **({"document_masking": masking} if masking is not None else {}),
                    "arm": arm,
                    "lrs": sorted(c["lr"] for c in group),
                    "largest_stable_lr": max(stable) if stable else None,
                    "smallest_diverged_lr": min(failed) if failed else None,
                }
            )
    return out


def _arm_spread(per_seed: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    out = {
        "final_val_loss": spread.spread(s[arm]["final_val_loss"] for s in per_seed),
        "diverged": sum(s[arm]["diverged"] for s in per_seed),
        "max_loss_ratio": spread.spread(s[arm].get("max_loss_ratio") for s in per_seed),
    }
    if arm == "curriculum":
        out["speedup_tokens"] = spread.spread(s["tokens_to_target"]["speedup"] for s in per_seed)
        out["tokens_to_target"] = spread.spread(s["tokens_to_target"]["curriculum"] for s in per_seed)
        out["reached"] = sum(s["tokens_to_target"]["curriculum"] is not None for s in per_seed)
    return out
