"""``seqwarm compare``: the baseline and the curriculum run on the same data, seed, model and token budget.

:func:`plan_compare` turns the command's flags into two ``seqwarm train`` runs (``DIR/baseline`` with
``--no-curriculum``, ``DIR/curriculum``), :func:`run_compare` runs them one after the other (reusing a
finished run, resuming one that has checkpoints) and :func:`build_report` reads their metrics into the
report (speedups to the baseline's final validation loss, stability, final losses). The arithmetic is
in :mod:`seqwarm.experiments.curves`; figures and markdown in :mod:`seqwarm.experiments.report`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqwarm.errors import UserError
from seqwarm.experiments import curves
from seqwarm.experiments.launch import (
    command_line,
    read_raw_config,
    run_or_reuse,
    scale_schedule_steps,
    train_argv,
    train_namespace,
    write_json,
)

logger = logging.getLogger(__name__)

RUNS = ("baseline", "curriculum")
QUICK_FRACTION = 0.3
"""--quick trains this fraction of the config's token budget (curriculum and LR schedule shrunk alike)."""
QUICK_EVAL_ITERS = 4
EVALS_PER_RUN = 16
"""Evaluations over the baseline when --eval-interval is not given (more points, finer crossings)."""
QUICK_EVALS_PER_RUN = 12
DEFAULT_SPIKE_THRESHOLD = 1.2
DEFAULT_SMOOTH_STEPS = 8

TARGET_DEFINITION = (
    "target = the baseline's final full-length validation loss. Each run's tokens (or elapsed seconds) to "
    "reach it = the first point at which the piecewise-linear line through its evaluations is at or below "
    "the target (linear interpolation between the last evaluation above and the first at or below; nothing "
    "is assumed before the first evaluation). speedup = baseline / curriculum.")
STABILITY_DEFINITION = (
    "loss ratio = training loss (at the current length) smoothed by a trailing mean over {window} logged "
    "steps (from the first full window on), divided by the minimum of that smoothed loss so far; a spike = "
    "one excursion above {threshold} (consecutive points above it count once). max_loss_ratio_raw is the "
    "unsmoothed ratio.")


@dataclass
class ComparePlan:
    out: Path
    runs: dict[str, argparse.Namespace]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest, None) is not None


def plan_compare(args: argparse.Namespace) -> ComparePlan:
    """The two runs' ``seqwarm train`` settings (writes their configs into ``args.out/configs``)."""
    from seqwarm.commands.train import resolve_config
    from seqwarm.plan import make_plan

    if not args.out:
        raise UserError("--out DIR is required: the folder for the two runs and the report")
    if args.scale_batch < 1:
        raise UserError(f"--scale-batch {args.scale_batch}: must be a whole number >= 1 (the paper used 8)")
    if not args.scale_lr > 0 or not math.isfinite(args.scale_lr):
        raise UserError(f"--scale-lr {args.scale_lr}: must be a positive number (the paper used 4)")
    if not args.spike_threshold > 1:
        raise UserError(f"--spike-threshold {args.spike_threshold}: must be above 1 (a ratio to the minimum "
                        "loss so far), e.g. 1.2")
    if args.smooth_steps < 1:
        raise UserError(f"--smooth-steps {args.smooth_steps}: must be >= 1 (1 = no smoothing)")
    for dest, flag in (("no_curriculum", "--no-curriculum"), ("resume", "--resume"),
                       ("allow_config_change", "--allow-config-change")):
        if getattr(args, dest, False):
            raise UserError(f"{flag} is not a compare flag: compare runs the baseline with --no-curriculum "
                            "itself and resumes or reuses runs found in --out")
    out = Path(args.out)
    raw = read_raw_config(args.config)
    cfg = resolve_config(train_namespace(args, out=str(out / "baseline")))
    if cfg.curriculum is None:
        raise UserError("the config has no enabled sequence-length curriculum, so there is nothing to compare "
                        "with the baseline: add a curriculum_learning block (see examples/tiny_cpu.json)")
    notes: list[str] = []
    changes: dict[str, Any] = {}
    fraction = 1.0
    explicit_budget = any(_given(args, d) for d in ("train_tokens", "train_iters", "train_samples"))
    if args.quick and not explicit_budget:
        fraction = QUICK_FRACTION
        for unit in ("tokens", "iters", "samples"):
            value = getattr(cfg, f"train_{unit}")
            if value:
                changes[f"train_{unit}"] = max(1, round(value * fraction))
        changes.update(_scaled_lr_units(cfg.lr, fraction, fraction))
        notes.append(f"--quick: {fraction:g}x the config's budget; the curriculum, LR warmup and LR decay are "
                     "shrunk by the same factor so the recipe keeps its shape")
    elif args.quick:
        notes.append("--quick with an explicit budget: the budget is kept, only evaluations are fewer")

    base_ns = train_namespace(args, **changes, out=str(out / "baseline"), no_curriculum=True)
    base_cfg = resolve_config(base_ns)
    base_steps = make_plan(base_cfg).total_steps
    evals = QUICK_EVALS_PER_RUN if args.quick else EVALS_PER_RUN
    eval_interval = args.eval_interval if _given(args, "eval_interval") else max(1, round(base_steps / evals))
    shared = {
        "eval_interval": eval_interval,
        "eval_iters": args.eval_iters if _given(args, "eval_iters") else (QUICK_EVAL_ITERS if args.quick else 8),
        "log_interval": args.log_interval if _given(args, "log_interval") else 1,
    }
    k, m = args.scale_batch, args.scale_lr
    cur_changes = dict(changes)
    if k != 1 or m != 1:
        cur_changes.update(_scaled_batch(cfg, base_cfg, k, m, changes))
        notes.append(f"curriculum at {k}x global batch and {m:g}x learning rate (peak and min): "
                     f"total_curriculum_step and any warmup/decay/cap counted in steps divided by {k}, so "
                     "they cover the same samples")
    cur_raw = scale_schedule_steps(raw, fraction / k)
    base_path = write_json(out / "configs" / "baseline.json", scale_schedule_steps(raw, fraction))
    cur_path = write_json(out / "configs" / "curriculum.json", cur_raw)
    runs = {
        "baseline": train_namespace(args, **changes, **shared, config=str(base_path), out=str(out / "baseline"),
                                    no_curriculum=True),
        "curriculum": train_namespace(args, **cur_changes,
                                      **{**shared, "eval_interval": max(1, round(eval_interval / k))},
                                      config=str(cur_path), out=str(out / "curriculum")),
    }
    settings = {"quick": bool(args.quick), "budget_fraction": fraction, "scale_batch": k, "scale_lr": m,
                "spike_threshold": args.spike_threshold, "smooth_steps": args.smooth_steps,
                "eval_interval": {name: ns.eval_interval for name, ns in runs.items()},
                "eval_iters": shared["eval_iters"], "log_interval": shared["log_interval"]}
    return ComparePlan(out, runs, settings, notes)


def _scaled_lr_units(lr, step_factor: float, amount_factor: float) -> dict[str, Any]:
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


def _scaled_batch(cfg, base_cfg, k: int, m: float, changes: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "global_batch_size": base_cfg.train_batch_size * k,
        "gradient_accumulation_steps": base_cfg.gradient_accumulation_steps * k,
        "micro_batch_size": base_cfg.micro_batch_size,
        "lr": base_cfg.lr.lr * m,
        "min_lr": base_cfg.lr.min_lr * m if base_cfg.lr.min_lr else None,
    }
    out.update(_scaled_lr_units(base_cfg.lr, 1.0 / k, 1.0))
    if base_cfg.train_iters:
        out["train_iters"] = max(1, math.ceil(base_cfg.train_iters / k))
    return out


# --------------------------------------------------------------------------------------------------
# running


def run_compare(args: argparse.Namespace, *, echo=print) -> dict[str, Any]:
    """Plan, run (or reuse / resume) both runs, and write the report. Returns the report dict."""
    from seqwarm.train import TrainingDiverged

    plan = plan_compare(args)
    state_path = plan.out / "compare_state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    status: dict[str, dict[str, Any]] = {}
    for note in plan.notes:
        echo(f"note: {note}")
    for name in RUNS:
        ns = plan.runs[name]
        echo(f"\n=== {name}: {command_line(ns)}")
        known = state.get(name, {})
        if known.get("status") == "diverged" and known.get("argv") == train_argv(ns):
            echo(f"{name}: diverged before ({known.get('message')}); not run again")
            status[name] = known
            continue
        t0 = time.perf_counter()
        try:
            what, _ = run_or_reuse(ns)
            status[name] = {"status": what, "argv": train_argv(ns)}
        except TrainingDiverged as err:
            status[name] = {"status": "diverged", "argv": train_argv(ns), "message": str(err)}
            echo(f"{name}: diverged: {err}")
        status[name]["session_s"] = round(time.perf_counter() - t0, 1)
        if status[name]["status"] == "reused":
            echo(f"{name}: reusing the finished run in {ns.out}")
        write_json(state_path, {**state, **status})
    report = build_report(plan, status)
    from seqwarm.experiments.report import write_report

    write_report(plan.out, report)
    return report


def _evals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluation rows in order, one per step (a resumed run may log the final step twice)."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r.get("kind") == "eval":
            by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]


def _run_summary(name: str, ns: argparse.Namespace, status: dict[str, Any], rows: list[dict[str, Any]],
                 threshold: float, window: int) -> dict[str, Any]:
    run_dir = Path(ns.out)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").is_file() else {}
    run_cfg = config.get("run", {})
    evals = _evals(rows)
    train = [r for r in rows if r.get("kind") == "train"]
    cur = run_cfg.get("curriculum")
    return {
        "run_dir": str(run_dir),
        "status": status.get("status"),
        "diverged": status.get("status") == "diverged",
        "command": command_line(ns),
        "final_val_loss": summary.get("final_val_loss"),
        "final_val_ppl": summary.get("final_val_ppl"),
        "tokens": summary.get("tokens", train[-1]["tokens"] if train else None),
        "steps": summary.get("steps", train[-1]["step"] if train else None),
        "wall_time_s": summary.get("wall_time_s", train[-1]["elapsed_s"] if train else None),
        "tokens_per_s": summary.get("tokens_per_s"),
        "global_batch_size": run_cfg.get("train_batch_size"),
        "lr": (run_cfg.get("lr") or {}).get("lr"),
        "total_curriculum_step": (cur or {}).get("schedule_config", {}).get("total_curriculum_step") if cur else None,
        "num_params": summary.get("num_params") or config.get("model", {}).get("num_params"),
        "evals": {"step": [r["step"] for r in evals], "tokens": [r["tokens"] for r in evals],
                  "elapsed_s": [r["elapsed_s"] for r in evals], "val_loss": [r["val_loss"] for r in evals]},
        "stability": curves.stability(train, threshold, window),
    }


def build_report(plan: ComparePlan, status: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report from the two run folders' metrics (pure reading; nothing is trained here)."""
    from seqwarm import __version__
    from seqwarm.metrics import read_metrics

    threshold, window = plan.settings["spike_threshold"], plan.settings["smooth_steps"]
    runs = {}
    for name in RUNS:
        rows = read_metrics(Path(plan.runs[name].out) / "metrics.jsonl")
        runs[name] = _run_summary(name, plan.runs[name], status.get(name, {}), rows, threshold, window)
    base, cur = runs["baseline"], runs["curriculum"]
    report: dict[str, Any] = {
        "seqwarm_version": __version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "out": str(plan.out),
        "settings": plan.settings,
        "notes": plan.notes,
        "commands": {name: runs[name]["command"] for name in RUNS},
        "baseline": base,
        "curriculum": cur,
        "definitions": {"target": TARGET_DEFINITION,
                        "stability": STABILITY_DEFINITION.format(window=window, threshold=threshold)},
    }
    be, ce = base["evals"], cur["evals"]
    if base["diverged"] or not be["val_loss"]:
        report.update(target=None, reached=False, speedup_tokens=None, speedup_time=None,
                      tokens_to_target=None, time_to_target=None)
        report["target_note"] = "the baseline diverged or has no evaluation: there is no target to reach"
    else:
        tok = curves.speedup_to_target(be["tokens"], be["val_loss"], ce["tokens"], ce["val_loss"])
        sec = curves.speedup_to_target(be["elapsed_s"], be["val_loss"], ce["elapsed_s"], ce["val_loss"],
                                       target=tok.target)
        report.update(target=tok.target, reached=tok.reached, speedup_tokens=tok.speedup,
                      speedup_time=sec.speedup, tokens_to_target=tok.to_dict(), time_to_target=sec.to_dict())
        report["val_gap"] = _val_gap(be, ce)
    report["stability"] = {"threshold": threshold, "smooth_steps": window,
                           "baseline": base["stability"], "curriculum": cur["stability"]}
    return report


def _val_gap(be: dict[str, list], ce: dict[str, list]) -> list[dict[str, float]]:
    """Curriculum minus baseline full-length val loss at the baseline's evaluation token counts."""
    out = []
    for t, v in zip(be["tokens"], be["val_loss"]):
        c = curves.interpolate(ce["tokens"], ce["val_loss"], t)
        if c is not None:
            out.append({"tokens": t, "baseline": v, "curriculum": c, "difference": c - v})
    return out
