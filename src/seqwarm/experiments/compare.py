"""``seqwarm compare``: the baseline and the curriculum run on the same data, seed, model and token budget.

:func:`plan_compare` turns a shared :class:`~seqwarm.run.spec.RunSpec` and the :class:`CompareOptions`
into two runs (``DIR/baseline`` with the curriculum off, ``DIR/curriculum``), or with ``--modes`` into the
baseline and one curriculum run per mode (``DIR/truncate``, ``DIR/reshape``, ``DIR/window``, ``DIR/variable``);
:func:`run_compare` hands them, one seed at a time, to the experiments' one runner
(:class:`~seqwarm.experiments.runner.ArmRunner`: a finished run is reused, one with checkpoints resumed),
:func:`build_report` reads a baseline and a curriculum run's metrics into the report
(speedups to the baseline's final validation loss, stability, final losses) and :func:`with_modes`
puts the reports of several modes against the one baseline side by side. The arithmetic is in
:mod:`seqwarm.experiments.curves`; figures and markdown in :mod:`seqwarm.experiments.report`.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from seqwarm.curriculum.plan import make_plan
from seqwarm.curriculum.schedule import CURRICULUM_MODES
from seqwarm.experiments import curves, spread
from seqwarm.experiments.launch import (
    check_same_data,
    read_raw_config,
    scale_schedule_steps,
    scaled_batch,
    scaled_lr_units,
    scaled_stages,
)
from seqwarm.experiments.report import write_report
from seqwarm.experiments.runner import (
    DEFAULT_SMOOTH_STEPS,
    DEFAULT_SPIKE_THRESHOLD,
    Arm,
    ArmOptions,
    ArmRunner,
    check_arm_options,
    check_arms,
    eval_rows,
    read_arm,
    refuse_run_flags,
    require_out,
)
from seqwarm.run.command import command_line
from seqwarm.run.spec import RunSpec, resolve_config, with_changes
from seqwarm.util.atomic import write_json
from seqwarm.util.errors import UserError
from seqwarm.util.version import __version__

__all__ = [  # eval_rows and the defaults stay importable from here, where they were
    "DEFAULT_SMOOTH_STEPS",
    "DEFAULT_SPIKE_THRESHOLD",
    "MODES",
    "RUNS",
    "CompareOptions",
    "ComparePlan",
    "build_report",
    "eval_rows",
    "plan_compare",
    "run_compare",
    "with_modes",
    "with_seed_spread",
]

logger = logging.getLogger(__name__)

RUNS = ("baseline", "curriculum")
MODES = ("truncate", "reshape", "window", "variable")
"""What ``--modes`` takes: the curriculum modes that cut or window the batch before the model, and
``variable`` (rows of one document, the same tokens every step: docs/VARIABLE.md; its arm trains with
``--curriculum-mode variable``). ``inject`` is left out: on seqwarm's GPT it is truncate done inside the
forward (the default mode there), so plain ``compare`` (or ``compare --curriculum-mode inject``) measures it."""
QUICK_FRACTION = 0.3
"""--quick trains this fraction of the config's token budget (curriculum and LR schedule shrunk alike)."""
QUICK_EVAL_ITERS = 4
EVALS_PER_RUN = 16
"""Evaluations over the baseline when --eval-interval is not given (more points, finer crossings)."""
QUICK_EVALS_PER_RUN = 12

TARGET_DEFINITION = (
    "target = the baseline's final full-length validation loss. Each run's tokens (or elapsed seconds) to "
    "reach it = the first point at which the piecewise-linear line through its evaluations is at or below "
    "the target (linear interpolation between the last evaluation above and the first at or below; nothing "
    "is assumed before the first evaluation). speedup = baseline / curriculum."
)
STABILITY_DEFINITION = (
    "loss ratio = training loss (at the current length) smoothed by a trailing mean over {window} logged "
    "steps (from the first full window on), divided by the minimum of that smoothed loss so far; a spike = "
    "one excursion above {threshold} (consecutive points above it count once). max_loss_ratio_raw is the "
    "unsmoothed ratio."
)


@dataclass(frozen=True)
class CompareOptions(ArmOptions):
    """What ``seqwarm compare`` takes besides the runs' shared spec, and :class:`ArmOptions`: ``out``,
    ``seeds`` (the first seed's pair in DIR/baseline and DIR/curriculum, the others in DIR/seed-S/), the
    spike threshold and smoothing, ``eval_interval`` (None: EVALS_PER_RUN evaluations over the baseline),
    ``eval_iters`` (None: 8, or QUICK_EVAL_ITERS with ``quick``) and ``log_interval``."""

    quick: bool = False
    """A short comparison: QUICK_FRACTION x the token budget, curriculum and LR schedule shrunk alike."""
    scale_batch: int = 1
    """Run the curriculum at K x the global batch (the paper: 8)."""
    scale_lr: float = 1.0
    """Run the curriculum at M x the learning rate (the paper: 4)."""
    modes: tuple[str, ...] = ()
    """Curriculum modes to compare (from :data:`MODES`), each an arm of its own in DIR/<mode> against the
    one baseline (empty: the single ``curriculum`` arm, in the config's or --curriculum-mode's mode)."""


@dataclass
class ComparePlan:
    out: Path
    runs: dict[str, RunSpec]
    """The first seed's runs by arm: ``baseline`` and ``curriculum``, or ``baseline`` and each mode."""
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    seed_runs: dict[int, dict[str, RunSpec]] = field(default_factory=dict)
    """The runs of every seed, the first seed's being :attr:`runs` (empty: that one seed only)."""

    @property
    def curricula(self) -> tuple[str, ...]:
        """The arms compared with the baseline: ``("curriculum",)`` or the ``--modes``."""
        return tuple(name for name in self.runs if name != "baseline")

    def by_seed(self) -> dict[int, dict[str, RunSpec]]:
        return self.seed_runs or {int(self.runs["baseline"].seed): self.runs}

    def for_seed(self, seed: int, arm: str = "curriculum") -> ComparePlan:
        """One seed's baseline and curriculum arm ``arm``, as a one-seed, two-run comparison (the arm is
        named ``curriculum`` in it, so :func:`build_report` reads any mode alike)."""
        runs = self.by_seed()[seed]
        return replace(self, runs={"baseline": runs["baseline"], "curriculum": runs[arm]}, seed_runs={})


def plan_compare(base: RunSpec, options: CompareOptions) -> ComparePlan:
    """The runs' specs (the baseline and one curriculum arm, or one per ``--modes`` mode), built from
    ``base`` (writes their configs into ``options.out/configs``). Every arm's settings are checked here,
    before anything trains."""

    require_out(options.out, "the runs and the report")
    if options.scale_batch < 1:
        raise UserError(f"--scale-batch {options.scale_batch}: must be a whole number >= 1 (the paper used 8)")
    if not options.scale_lr > 0 or not math.isfinite(options.scale_lr):
        raise UserError(f"--scale-lr {options.scale_lr}: must be a positive number (the paper used 4)")
    check_arm_options(options)
    _check_modes(base, options.modes)
    refuse_run_flags(base, "compare")
    out = Path(options.out)
    raw = read_raw_config(base)
    cfg = resolve_config(replace(base, out=out / "baseline"))
    if cfg.curriculum is None:
        raise UserError(
            "the config has no enabled sequence-length curriculum, so there is nothing to compare "
            "with the baseline: add a curriculum_learning block (see examples/tiny_cpu.json)"
        )
    notes: list[str] = []
    changes: dict[str, Any] = {}
    fraction = 1.0
    explicit_budget = any(base.settings.get(k) is not None for k in ("train_tokens", "train_iters", "train_samples"))
    if options.quick and not explicit_budget:
        fraction = QUICK_FRACTION
        for unit in ("tokens", "iters", "samples"):
            value = getattr(cfg, f"train_{unit}")
            if value:
                changes[f"train_{unit}"] = max(1, round(value * fraction))
        changes.update(scaled_lr_units(cfg.lr, fraction, fraction))
        if cfg.stages:  # each stage begins at its share of the shrunk budget, as the warmup ends at its own
            changes["stages"] = scaled_stages(cfg.stages, fraction)
        notes.append(
            f"--quick: {fraction:g}x the config's budget; the curriculum, LR warmup and LR decay"
            f"{' and the start_tokens of the stages' if cfg.stages else ''} are shrunk by the same factor so the "
            "recipe keeps its shape"
        )
    elif options.quick:
        notes.append("--quick with an explicit budget: the budget is kept, only evaluations are fewer")

    base_cfg = resolve_config(with_changes(base, **changes, out=out / "baseline", curriculum=False))
    base_steps = make_plan(base_cfg).total_steps
    evals = QUICK_EVALS_PER_RUN if options.quick else EVALS_PER_RUN
    eval_interval = options.eval_interval if options.eval_interval is not None else max(1, round(base_steps / evals))
    shared = {
        "eval_interval": eval_interval,
        "eval_iters": options.eval_iters
        if options.eval_iters is not None
        else (QUICK_EVAL_ITERS if options.quick else 8),
        "log_interval": options.log_interval if options.log_interval is not None else 1,
    }
    k, m = options.scale_batch, options.scale_lr
    cur_changes = dict(changes)
    if k != 1 or m != 1:
        cur_changes.update(scaled_batch(base_cfg, k, m))
        notes.append(
            f"curriculum at {k}x global batch and {m:g}x learning rate (peak and min): "
            f"total_curriculum_step and any warmup/decay/cap counted in steps divided by {k}, so "
            "they cover the same samples"
        )
    cur_raw = scale_schedule_steps(raw, fraction / k)
    base_path = write_json(out / "configs" / "baseline.json", scale_schedule_steps(raw, fraction))
    runs = {
        "baseline": with_changes(base, **changes, **shared, config=base_path, out=out / "baseline", curriculum=False)
    }
    # every curriculum arm is the same run but for its mode (and its folder): one arm without --modes
    for arm, mode in ((m, m) for m in options.modes) if options.modes else (("curriculum", None),):
        runs[arm] = with_changes(
            base,
            **cur_changes,
            **{**shared, "eval_interval": max(1, round(eval_interval / k))},
            **({"curriculum_mode": mode} if mode else {}),
            config=write_json(out / "configs" / f"{arm}.json", cur_raw),
            out=out / arm,
        )
    check_arms(runs)
    if options.modes:
        notes.append(
            f"--modes: one curriculum run per mode ({', '.join(options.modes)}) in {out}/<mode>, each "
            "with that curriculum_mode (over the config's own), against one baseline trained once per "
            "seed; everything else is the same in every arm"
        )
    settings = {
        "quick": bool(options.quick),
        "budget_fraction": fraction,
        "scale_batch": k,
        "scale_lr": m,
        "spike_threshold": options.spike_threshold,
        "smooth_steps": options.smooth_steps,
        "eval_interval": {name: spec.eval_interval for name, spec in runs.items()},
        "eval_iters": shared["eval_iters"],
        "log_interval": shared["log_interval"],
    }
    if options.modes:  # only then, so a one-mode report.json keeps exactly its keys
        settings["modes"] = list(options.modes)
    seeds = [base.seed + i for i in range(options.seeds)]
    settings["seeds"] = seeds
    seed_runs = {seeds[0]: runs}
    for seed in seeds[1:]:
        seed_runs[seed] = {
            name: with_changes(spec, seed=seed, out=out / f"seed-{seed}" / name) for name, spec in runs.items()
        }
    return ComparePlan(out, runs, settings, notes, seed_runs)


def _check_modes(base: RunSpec, modes: tuple[str, ...]) -> None:
    """Refuse --modes values outside :data:`MODES`, a mode named twice, and --modes with --curriculum-mode."""
    if not modes:
        return
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UserError(
            f"--modes {','.join(modes)}: {', '.join(map(repr, unknown))} is not a mode to compare; choose "
            f"from {', '.join(MODES)} (comma-separated, e.g. --modes {','.join(MODES)})"
        )
    if "variable" in modes and "variable" not in CURRICULUM_MODES:
        raise UserError(
            "--modes variable: its arm trains with `seqwarm train --curriculum-mode variable`, which this seqwarm "
            "does not run yet (docs/VARIABLE.md, 'What is not done yet'); compare the other modes"
        )
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:
        raise UserError(f"--modes {','.join(modes)}: {', '.join(twice)} named twice; name each mode once")
    if base.settings.get("curriculum_mode") is not None:
        raise UserError(
            f"--modes and --curriculum-mode {base.settings['curriculum_mode']} together: --modes sets each "
            "arm's mode itself; drop --curriculum-mode (or drop --modes to compare that one mode)"
        )


# --------------------------------------------------------------------------------------------------
# running


def run_compare(base: RunSpec, options: CompareOptions, *, echo=print) -> dict[str, Any]:
    """Plan, run (or reuse / resume) every arm of every seed, and write the report. Returns its dict."""
    plan = plan_compare(base, options)
    runner = ArmRunner(plan.out / "compare_state.json", echo=echo)
    for note in plan.notes:
        echo(f"note: {note}")
    first = plan.settings["seeds"][0]
    reports: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in plan.curricula}
    for seed, runs in plan.by_seed().items():
        # the first seed's keys are the one-seed keys, so an earlier one-seed comparison is extended
        keys = {name: name if seed == first else f"seed-{seed}/{name}" for name in runs}
        # the baseline first, once per seed, then each curriculum arm
        status = runner.run(Arm(keys[name], spec) for name, spec in runs.items())
        for arm in plan.curricula:
            pair = {"baseline": status[keys["baseline"]], "curriculum": status[keys[arm]]}
            reports[arm][seed] = build_report(plan.for_seed(seed, arm), pair)
    if options.modes:
        report = with_modes({arm: with_seed_spread(reports[arm]) for arm in plan.curricula})
    else:
        report = with_seed_spread(reports["curriculum"])
    write_report(plan.out, report)
    return report


def with_seed_spread(reports: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The first seed's report (today's keys), plus ``seeds`` (one row per seed) and ``aggregate``
    (median and min–max over the seeds, and whether the difference exceeds the seed spread)."""
    seeds = list(reports)
    rows = [spread.seed_row(seed, reports[seed]) for seed in seeds]
    check_same_data([Path(d) for r in rows for d in r["run_dirs"].values()])
    report = dict(reports[seeds[0]])
    report["seeds"] = rows
    report["aggregate"] = spread.aggregate(rows)
    report["definitions"] = {**report["definitions"], "spread": spread.SPREAD_DEFINITION}
    return report


SHARED_KEYS = ("seqwarm_version", "date", "machine", "out", "settings", "notes", "definitions", "baseline")
"""The keys every mode's report shares with the others (the same baseline, plan and machine)."""


def with_modes(by_mode: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The reports of several modes against one baseline (each from :func:`with_seed_spread`), as one.

    The first mode's report is the top level, so readers of a one-mode ``report.json`` still find its
    keys (``curriculum`` is that mode's run); ``modes`` holds every mode's own keys (``curriculum``,
    speedups, ``stability``, ``seeds``, ``aggregate``, ...) and ``arms`` the order of the arms.
    """
    modes = list(by_mode)
    check_same_data([Path(d) for r in by_mode.values() for row in r["seeds"] for d in row["run_dirs"].values()])
    report = dict(by_mode[modes[0]])
    report["arms"] = ["baseline", *modes]
    report["modes"] = {mode: {k: v for k, v in r.items() if k not in SHARED_KEYS} for mode, r in by_mode.items()}
    report["commands"] = {"baseline": report["commands"]["baseline"]}
    report["commands"].update({mode: r["commands"]["curriculum"] for mode, r in by_mode.items()})
    report["commands"]["curriculum"] = report["commands"][modes[0]]  # the one-mode key, for old readers
    report["definitions"] = {
        **report["definitions"],
        "modes": f"each mode is compared with the same baseline run of each seed; the top-level "
        f"curriculum keys are the first mode's ({modes[0]}), every mode's are under modes",
    }
    return report


def _run_summary(spec: RunSpec, status: dict[str, Any], threshold: float, window: int) -> dict[str, Any]:
    arm = read_arm(spec.out)
    summary, run_cfg, evals, train = arm.summary, arm.run, arm.evals, arm.train
    cur = run_cfg.get("curriculum")
    return {
        "run_dir": str(arm.run_dir),
        "status": status.get("status"),
        "diverged": status.get("status") == "diverged",
        "command": command_line(spec),
        "final_val_loss": summary.get("final_val_loss"),
        "final_val_ppl": summary.get("final_val_ppl"),
        "tokens": summary.get("tokens", train[-1]["tokens"] if train else None),
        "steps": summary.get("steps", train[-1]["step"] if train else None),
        "wall_time_s": summary.get("wall_time_s", train[-1]["elapsed_s"] if train else None),
        "tokens_per_s": summary.get("tokens_per_s"),
        "step_us_per_token": _micro(curves.step_time_per_token(train)),
        "global_batch_size": run_cfg.get("train_batch_size"),
        "lr": (run_cfg.get("lr") or {}).get("lr"),
        "total_curriculum_step": (cur or {}).get("schedule_config", {}).get("total_curriculum_step") if cur else None,
        "num_params": summary.get("num_params") or arm.config.get("model", {}).get("num_params"),
        "curriculum_mode": (cur or {}).get("mode") if cur else None,
        "evals": {
            "step": [r["step"] for r in evals],
            "tokens": [r["tokens"] for r in evals],
            "elapsed_s": [r["elapsed_s"] for r in evals],
            "val_loss": [r["val_loss"] for r in evals],
        },
        "stability": curves.stability(train, threshold, window),
    }


def _micro(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def build_report(plan: ComparePlan, status: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report from the two run folders' metrics (pure reading; nothing is trained here)."""

    threshold, window = plan.settings["spike_threshold"], plan.settings["smooth_steps"]
    check_same_data([Path(plan.runs[name].out) for name in RUNS])
    runs = {name: _run_summary(plan.runs[name], status.get(name, {}), threshold, window) for name in RUNS}
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
        "definitions": {
            "target": TARGET_DEFINITION,
            "stability": STABILITY_DEFINITION.format(window=window, threshold=threshold),
        },
    }
    be, ce = base["evals"], cur["evals"]
    if base["diverged"] or not be["val_loss"]:
        report.update(
            target=None,
            reached=False,
            speedup_tokens=None,
            speedup_time=None,
            tokens_to_target=None,
            time_to_target=None,
        )
        report["target_note"] = "the baseline diverged or has no evaluation: there is no target to reach"
    else:
        tok = curves.speedup_to_target(be["tokens"], be["val_loss"], ce["tokens"], ce["val_loss"])
        sec = curves.speedup_to_target(
            be["elapsed_s"], be["val_loss"], ce["elapsed_s"], ce["val_loss"], target=tok.target
        )
        report.update(
            target=tok.target,
            reached=tok.reached,
            speedup_tokens=tok.speedup,
            speedup_time=sec.speedup,
            tokens_to_target=tok.to_dict(),
            time_to_target=sec.to_dict(),
        )
        report["val_gap"] = _val_gap(be, ce)
    report["stability"] = {
        "threshold": threshold,
        "smooth_steps": window,
        "baseline": base["stability"],
        "curriculum": cur["stability"],
    }
    return report


def _val_gap(be: dict[str, list], ce: dict[str, list]) -> list[dict[str, float]]:
    """Curriculum minus baseline full-length val loss at the baseline's evaluation token counts."""
    out = []
    for t, v in zip(be["tokens"], be["val_loss"]):
        c = curves.interpolate(ce["tokens"], ce["val_loss"], t)
        if c is not None:
            out.append({"tokens": t, "baseline": v, "curriculum": c, "difference": c - v})
    return out
