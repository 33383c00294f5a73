"""``seqwarm sweep``: the baseline and the curriculum over a grid of peak LR, batch scale, clipping,
LR warmup, position embeddings, curriculum mode and document masking, several seeds each.

A *cell* is one point of the grid; each cell is laid out as a ``seqwarm compare --seeds N`` of its own
(``DIR/CELL/baseline``, ``DIR/CELL/curriculum``, ``DIR/CELL/seed-S/...``), planned by
:func:`seqwarm.experiments.compare.plan_compare`, except that at batch scale K *both* arms train at K x
the global batch (the curriculum's and the LR schedule's step counts divided by K, so they cover the
same samples). Finished runs are reused and runs with checkpoints resumed, so a killed sweep continues.

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
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqwarm.curriculum.schedule import CURRICULUM_MODES
from seqwarm.experiments import curves, spread
from seqwarm.experiments.compare import (
    DEFAULT_SMOOTH_STEPS,
    DEFAULT_SPIKE_THRESHOLD,
    MODES,
    RUNS,
    CompareOptions,
    eval_rows,
    plan_compare,
    run_one,
)
from seqwarm.experiments.launch import check_same_data
from seqwarm.run.spec import RunSpec, with_changes
from seqwarm.trainer.metrics import read_metrics
from seqwarm.trainer.plots import plot_sweep
from seqwarm.util.atomic import write_json, write_text
from seqwarm.util.errors import UserError

POSITIONS = ("learned", "rotary")


@dataclass(frozen=True)
class SweepOptions:
    """The grid of ``seqwarm sweep`` (each axis a list; None on an axis: the config's value)."""

    out: Path | None = None
    """Folder for the cells, sweep.json, sweep.md and sweep.png (required)."""
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
    seeds: int = 1
    """Seeds per cell and arm."""
    spike_threshold: float = DEFAULT_SPIKE_THRESHOLD
    """A spike is an excursion of the smoothed loss ratio above this."""
    smooth_steps: int = DEFAULT_SMOOTH_STEPS
    """Trailing-mean window of the loss ratio, in logged steps."""
    eval_interval: int | None = None
    """Validate every N steps (None: as compare chooses)."""
    eval_iters: int | None = None
    """Validation micro-batches per evaluation (None: as compare chooses)."""
    log_interval: int | None = None
    """A train row every N steps (None: every step)."""


def _num(value: float | None) -> str:
    return "cfg" if value is None else f"{value:g}"


def cell_name(lr: float | None, k: int, clip: float | None, warmup: int | None, pos: str) -> str:
    """The cell's folder name, e.g. ``lr-0.004_bs-8_clip-1_wu-cfg_pos-learned``."""
    return f"lr-{_num(lr)}_bs-{k}_clip-{_num(clip)}_wu-{_num(warmup)}_pos-{pos}"


def plan_sweep(base: RunSpec, options: SweepOptions) -> list[dict[str, Any]]:
    """Every cell: its grid values and, per seed, the two runs' specs (writes each cell's configs)."""
    if not options.out:
        raise UserError("--out DIR is required: the folder for the sweep's runs and its report")
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
                out=Path(options.out) / folder,
                scale_batch=k,
                seeds=options.seeds,
                spike_threshold=options.spike_threshold,
                smooth_steps=options.smooth_steps,
                eval_interval=options.eval_interval,
                eval_iters=options.eval_iters,
                log_interval=options.log_interval,
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


DIVERGED_DEFINITION = (
    "diverged = a non-finite loss, a smoothed loss-ratio spike above the threshold, or a blow-up: a training "
    "loss above threshold x ln(vocabulary size), worse than that many times a uniform guess (the loss ratio, "
    "measured against the lowest loss so far, misses a blow-up that comes before the loss has fallen)"
)


def blow_up_ceiling(vocab_size: Any, threshold: float) -> float | None:
    """The training loss above which a run has blown up: ``threshold`` x the loss of a uniform guess."""
    return threshold * math.log(vocab_size) if isinstance(vocab_size, int) and vocab_size > 1 else None


def run_result(spec: RunSpec, status: dict[str, Any], threshold: float, window: int) -> dict[str, Any]:
    """Final loss, divergence, spikes and the validation curve of one finished (or diverged) run."""
    run_dir = Path(spec.out)
    rows = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").is_file() else {}
    evals = eval_rows(rows)
    final = summary.get("final_val_loss")
    stab = curves.stability([r for r in rows if r.get("kind") == "train"], threshold, window)
    non_finite = status.get("status") == "diverged" or not (isinstance(final, (int, float)) and math.isfinite(final))
    losses = [float(r["loss"]) for r in rows if r.get("kind") == "train" and isinstance(r.get("loss"), (int, float))]
    finite = [v for v in losses if math.isfinite(v)]
    ceiling = blow_up_ceiling((config.get("model") or {}).get("vocab_size"), threshold)
    blew_up = ceiling is not None and any(v > ceiling for v in finite)
    return {
        "run_dir": str(run_dir),
        "status": status.get("status"),
        "final_val_loss": final,
        "spikes": stab["spikes"],
        "diverged": bool(non_finite or stab["spikes"] or blew_up),
        "non_finite": non_finite,
        "blew_up": blew_up,
        "max_train_loss": max(finite) if finite else None,
        "max_loss_ratio": stab["max_loss_ratio"],
        "peak_lr": (config.get("run", {}).get("lr") or {}).get("lr"),
        "global_batch_size": config.get("run", {}).get("train_batch_size"),
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
    state_path = out / "sweep_state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    results = []
    for cell in cells:
        per_seed = []
        for seed, runs in cell["runs"].items():
            row: dict[str, Any] = {"seed": seed}
            for arm in RUNS:
                key = state_key(out, cell, seed, arm)
                state[key] = run_one(key, runs[arm], state.get(key, {}), echo)
                write_json(state_path, state)
                row[arm] = run_result(runs[arm], state[key], options.spike_threshold, options.smooth_steps)
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


BEST_DEFINITION = (
    "the best baseline = the cell, at the grid's smallest batch scale, whose baseline has the lowest median "
    "final val loss among those that diverged on no seed; its final loss on each seed is that seed's target; "
    "tokens ratio = a run's tokens to reach the target / the best baseline's own tokens to it (same seed; "
    "below 1: fewer tokens than the best baseline)."
)


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


LIMITS_DEFINITION = (
    "for each arm and each setting of the other grid axes: the largest peak LR of the grid at which no seed "
    "diverged, and the smallest at which some seed did (none: no LR of the grid made it diverge, so the "
    "limit lies above the grid)."
)


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


def render_sweep(report: dict[str, Any]) -> str:
    """sweep.md: one row per cell and arm."""
    n = report["grid"]["seeds"]
    lines = [
        "# seqwarm sweep: baseline vs curriculum over a grid",
        "",
        f"{n} seed(s) per cell"
        + (" (one seed: no spread measured)" if n == 1 else "")
        + "; values are median (min–max over seeds).",
        "",
        "| cell | arm | final val loss | diverged | max loss ratio | tokens to target | reached | speedup_tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cells"]:
        for arm in RUNS:
            a = c[arm]
            sp, tt = a.get("speedup_tokens"), a.get("tokens_to_target")
            reach = f"{_cell(tt, ',.0f')} | {a['reached']}/{n} | {_cell(sp, '.2f')}" if tt else "– | – | –"
            lines.append(
                f"| {c['name']} | {arm} | {_cell(a['final_val_loss'], '.4f')} | {a['diverged']}/{n} | "
                f"{_cell(a.get('max_loss_ratio') or {}, '.3f')} | {reach} |"
            )
    lines += [
        "",
        DIVERGED_DEFINITION + "; max loss ratio = the largest "
        "smoothed training loss over the lowest before it (the spike signal; a spike is above the "
        "threshold); target = the baseline's final "
        "loss (same cell and seed); tokens to target = the curriculum's tokens to reach it; speedup_tokens "
        "= the baseline's tokens to it / the curriculum's.",
        "",
        f"_{report['definitions']['spread']}_",
        "",
    ]
    lines += _render_limits(report.get("stability_limits") or [])
    lines += _render_best(report.get("against_best_baseline"))
    lines += ["![final loss against LR](sweep.png)", ""]
    return "\n".join(lines)


def _render_best(best: dict[str, Any] | None) -> list[str]:
    """sweep.md's section: every cell and arm in tokens to the best baseline's final loss."""
    if not best:
        return [
            "No baseline at the smallest batch scale trained without diverging: no best baseline to "
            "measure the cells against.",
            "",
        ]
    targets = spread.spread(t["target"] for t in best["targets"])
    lines = [
        "## Against the best baseline",
        "",
        f"The best baseline is `{best['cell']}` (final val loss {_cell(targets, '.4f')}). "
        "Tokens ratio = tokens to reach that seed's best-baseline final loss / the best baseline's own.",
        "",
        "| cell | arm | tokens ratio | reached |",
        "|---|---|---:|---:|",
    ]
    for r in best["rows"]:
        lines.append(f"| {r['cell']} | {r['arm']} | {_cell(r['tokens_ratio'], '.2f')} | {r['reached']}/{r['seeds']} |")
    return lines + ["", "_" + BEST_DEFINITION[0].upper() + BEST_DEFINITION[1:] + "_", ""]


def _render_limits(limits: list[dict[str, Any]]) -> list[str]:
    """sweep.md's section: the largest LR each arm survives."""
    if not limits:
        return []
    lines = [
        "## The largest LR each arm survives",
        "",
        "| batch scale | clipping | warmup | positions | arm | largest LR, no seed diverged | smallest LR that "
        "diverged |",
        "|---:|---|---|---|---|---:|---:|",
    ]
    for r in limits:
        clip = "config" if r["clip_grad"] is None else ("off" if r["clip_grad"] == 0 else f"{r['clip_grad']:g}")
        warmup = "config" if r["lr_warmup_iters"] is None else str(r["lr_warmup_iters"])
        stable = "none" if r["largest_stable_lr"] is None else f"{r['largest_stable_lr']:g}"
        failed = (
            f"none up to {max(r['lrs']):g}" if r["smallest_diverged_lr"] is None else f"{r['smallest_diverged_lr']:g}"
        )
        arm = r["arm"] + (f", {r['curriculum_mode']} cells" if r.get("curriculum_mode") else "")
        if r.get("document_masking") is not None:
            arm += f", document masking {'on' if r['document_masking'] else 'off'}"
        lines.append(
            f"| x{r['scale_batch']} | {clip} | {warmup} | {r['pos'] or 'config'} | {arm} | {stable} | {failed} |"
        )
    return lines + ["", "_" + LIMITS_DEFINITION[0].upper() + LIMITS_DEFINITION[1:] + "_", ""]


def _cell(s: dict[str, Any], fmt: str) -> str:
    if s.get("median") is None:
        return "–"
    if s["n"] == 1:
        return format(s["median"], fmt)
    return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}–{format(s['max'], fmt)})"
