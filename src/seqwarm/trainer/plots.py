"""Every figure seqwarm draws, in one place; matplotlib is imported only when a figure is drawn.

- :func:`plot_run`: a run's curves (``RUN/curves.png``): loss against tokens; length and LR against steps,
  the schedule itself (replayed from ``RUN/config.json`` by :func:`seqwarm.curriculum.plan.make_plan`) with the
  logged values on it.
- :func:`plot_plan`: ``seqwarm plan --plot``: length and LR against steps and tokens, before training.
- :func:`plot_compare_val` and :func:`plot_compare_stability`: the two figures of ``seqwarm compare``'s
  report (``compare_val.png``, ``compare_stability.png``), from the report dict and the runs' curves
  that :mod:`seqwarm.experiments.report` reads.

Figures are written atomically (:func:`seqwarm.util.atomic.atomic_path`), so a reader never sees half a PNG.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seqwarm.config import RunConfig
from seqwarm.curriculum.plan import Plan, make_plan
from seqwarm.trainer.metrics import read_metrics
from seqwarm.util.atomic import atomic_path
from seqwarm.util.errors import MissingDependencyError, UserError
from seqwarm.util.units import human_count

logger = logging.getLogger(__name__)

COMPARE_RUNS = ("baseline", "curriculum")
COMPARE_COLORS = {
    "baseline": "tab:gray",
    "curriculum": "tab:blue",
    "truncate": "tab:blue",
    "reshape": "tab:orange",
    "window": "tab:green",
}


def compare_arms(report: Mapping[str, Any]) -> list[str]:
    """The arms of a compare report: ``baseline`` and ``curriculum``, or ``baseline`` and each mode."""
    return list(report.get("arms") or COMPARE_RUNS)


def compare_arm(report: Mapping[str, Any], name: str, key: str | None = None) -> Any:
    """Arm ``name``'s run summary of a compare report (``key``: that arm's entry of a two-run key such as
    ``tokens_to_target``, which a ``--modes`` report keeps per mode under ``modes``)."""
    modes = report.get("modes") or {}
    if name in modes:
        return modes[name]["curriculum"] if key is None else (modes[name].get(key) or {}).get("curriculum")
    return report[name] if key is None else (report.get(key) or {}).get(name)


def _arm_color(name: str, index: int) -> str:
    return COMPARE_COLORS.get(name, f"C{index % 10}")


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or a UserError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # matplotlib comes with the `train` extra, not with `pip install seqwarm`
        raise MissingDependencyError("matplotlib", "train", "plots") from None
    return plt


def _save(plt, fig, path: Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` atomically (format from the suffix, PNG when it has none) and close it."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    try:
        known = fig.canvas.get_supported_filetypes()
        if fmt not in known:
            raise UserError(
                f"{path}: matplotlib cannot write .{fmt} figures; use one of "
                f"{', '.join('.' + k for k in sorted(known))} (e.g. plan.png)"
            )
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format=fmt)
    finally:
        plt.close(fig)
    return path


def run_plan(run_dir: Path) -> Plan | None:
    """The plan of a run folder's recipe (``config.json`` → ``run``), per step; None when it has none or
    it cannot be replayed (then the figure shows the logged values alone)."""
    try:
        resolved = json.loads((Path(run_dir) / "config.json").read_text())
        return make_plan(RunConfig.from_dict(resolved["run"]), keep_series=True)
    except (OSError, ValueError, KeyError, TypeError, UserError) as err:
        logger.debug("no schedule for %s: %s", run_dir, err)
        return None


def plot_run(run_dir: Path, path: Path | None = None) -> Path:
    """Train loss (current length) and val loss (full length) against tokens; length and LR against
    steps: the schedule (from the run's plan) as a line, every logged step as a dot on it."""
    plt = pyplot()
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    if train:
        ax.plot(
            [r["tokens"] / 1e6 for r in train],
            [r["loss"] for r in train],
            color="tab:blue",
            alpha=0.7,
            label="train loss (current length)",
        )
    if evals:
        ax.plot(
            [r["tokens"] / 1e6 for r in evals],
            [r["val_loss"] for r in evals],
            "o-",
            color="tab:red",
            label="val loss (full length)",
        )
    ax.set_xlabel("tokens trained (M)")
    ax.set_ylabel("loss")
    ax.set_title("loss against tokens")
    ax.legend()
    ax.grid(alpha=0.3)
    plan = run_plan(run_dir)
    if plan is not None:  # one point per step: the staircase is each length's true width
        axes[1].plot(plan.steps, plan.seqlens, drawstyle="steps-post", color="tab:green", label="schedule")
        axes[2].plot(plan.steps, plan.lrs, color="tab:purple", label="schedule")
    if train:
        steps = [r["step"] for r in train]
        axes[1].plot(steps, [r["seqlen"] for r in train], "o", ms=3, color="tab:green", alpha=0.6, label="logged")
        axes[2].plot(steps, [r["lr"] for r in train], "o", ms=3, color="tab:purple", alpha=0.6, label="logged")
    axes[1].set_title("sequence length")
    axes[1].set_ylabel("tokens per sequence")
    axes[2].set_title("learning rate")
    axes[2].set_ylabel("learning rate")
    for a in axes[1:]:
        a.set_xlabel("optimizer step")
        a.grid(alpha=0.3)
        if plan is not None or train:
            a.legend()
    fig.suptitle(f"seqwarm run: {run_dir.name}")
    fig.tight_layout()
    return _save(plt, fig, Path(path) if path else run_dir / "curves.png", dpi=100)


def plot_plan(plan: Plan, path: str | Path) -> Path:
    """Length and LR against optimizer steps and tokens (``plan`` made with ``keep_series=True``)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharey="row")
    scale, unit = (1e9, "B") if plan.total_tokens >= 1e10 else (1e6, "M")
    tokens = [t / scale for t in plan.cum_tokens]
    for col, (x, label) in enumerate(((plan.steps, "optimizer step"), (tokens, f"tokens trained ({unit})"))):
        axes[0][col].plot(x, plan.seqlens, color="tab:blue")
        axes[0][col].set_ylabel("sequence length")
        axes[1][col].plot(x, plan.lrs, color="tab:red")
        axes[1][col].set_ylabel("learning rate")
        axes[1][col].set_xlabel(label)
        for ax in (axes[0][col], axes[1][col]):
            ax.grid(alpha=0.3)
    fig.suptitle(f"seqwarm plan: {plan.total_steps:,} steps, {human_count(plan.total_tokens)} tokens")
    fig.tight_layout()
    try:
        return _save(plt, fig, Path(path), dpi=110)
    except OSError as err:
        raise UserError(f"cannot write the plot to {path}: {err}") from None


# --------------------------------------------------------------------------------------------------
# seqwarm compare


def compare_label(report: Mapping[str, Any], name: str) -> str:
    """The legend entry of arm ``name`` (``baseline``, ``curriculum`` or a mode) of a compare report."""
    run = compare_arm(report, name)
    if name == "baseline":
        return "baseline (full length)"
    k = report["settings"].get("scale_batch", 1)
    m = report["settings"].get("scale_lr", 1)
    extra = f", {k}x batch, {m:g}x LR" if (k, m) != (1, 1) else ""
    return f"{name} (T={run.get('total_curriculum_step')}{extra})"


def plot_compare_val(
    report: Mapping[str, Any], path: Path, seeds: Mapping[str, Mapping[str, Any]] | None = None
) -> Path:
    """Full-length validation loss against tokens and wall-clock, the target and where each run reaches it.

    ``seeds[run]`` (several seeds): ``{"each": [evals, ...], "median": evals}`` (evals as in the report:
    ``tokens``, ``elapsed_s``, ``val_loss`` lists); every seed is drawn thinly, the median boldly. The
    target and its crossings stay the first seed's (the report's top-level keys).
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3), sharey=True)
    target = report.get("target")
    arms = compare_arms(report)
    for i, name in enumerate(arms):
        color, label = _arm_color(name, i), compare_label(report, name)
        arm = (seeds or {}).get(name)
        if arm and len(arm["each"]) > 1:
            for ev in arm["each"]:
                axes[0].plot([t / 1e6 for t in ev["tokens"]], ev["val_loss"], "-", lw=0.7, alpha=0.35, color=color)
                axes[1].plot([s / 60 for s in ev["elapsed_s"]], ev["val_loss"], "-", lw=0.7, alpha=0.35, color=color)
            ev, style = (
                arm["median"],
                {"lw": 2.2, "color": color, "label": f"{label}: median of {len(arm['each'])} seeds"},
            )
        else:
            ev = compare_arm(report, name)["evals"]
            style = {"marker": "o", "ms": 3, "color": color, "label": f"{label}, one seed"}
        axes[0].plot([t / 1e6 for t in ev["tokens"]], ev["val_loss"], **style)
        axes[1].plot([s / 60 for s in ev["elapsed_s"]], ev["val_loss"], **style)
    if target is not None:
        for ax, key, scale in ((axes[0], "tokens_to_target", 1e6), (axes[1], "time_to_target", 60)):
            first = f" (seed {report['seeds'][0]['seed']})" if len(report.get("seeds") or []) > 1 else ""
            ax.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target:.3f}{first}")
            for i, name in enumerate(arms):
                hit = compare_arm(report, name, key)
                if hit is not None:
                    ax.axvline(hit / scale, color=_arm_color(name, i), ls=":", lw=1)
    axes[0].set_xlabel("tokens trained (M)")
    axes[1].set_xlabel("wall-clock (minutes, incl. evaluation)")
    axes[0].set_ylabel("validation loss (full length)")
    agg = report.get("aggregate") or {}
    for ax, key, what in ((axes[0], "speedup_tokens", "tokens"), (axes[1], "speedup_time", "wall-clock")):
        sp, n = agg.get(key) or {}, agg.get("n_seeds", 1)
        if report.get("modes"):  # one speedup per mode: the median over the seeds
            each = [(m, (r.get("aggregate") or {}).get(key) or {}) for m, r in report["modes"].items()]
            text = ", ".join(f"{m} {s['median']:.2f}x" if s.get("n") else f"{m} –" for m, s in each)
            ax.set_title(f"against {what} (speedup{' median' if n > 1 else ''}: {text})", fontsize=10)
        elif n > 1:  # the median and range over the seeds; the target line is the first seed's
            ax.set_title(
                f"against {what} (speedup median {sp['median']:.2f}x, {sp['min']:.2f}–{sp['max']:.2f}x, "
                f"{sp['n']} of {n} seeds reached)"
                if sp.get("n")
                else f"against {what} (no seed reached the target)",
                fontsize=10,
            )
        else:
            ax.set_title(f"against {what} (speedup {report[key]:.2f}x)" if report.get(key) else f"against {what}")
    _zoom(axes[0], [v for n in arms for v in compare_arm(report, n)["evals"]["val_loss"]])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("seqwarm compare: full-length validation loss")
    fig.tight_layout()
    return _save(plt, fig, path, dpi=100)


def _zoom(ax, values: list[float]) -> None:
    """Leave out the first evaluations' very high losses so the end of the race is readable."""
    finite = sorted(v for v in values if isinstance(v, (int, float)) and math.isfinite(v))
    if len(finite) >= 4:
        lo, hi = finite[0], finite[int(len(finite) * 0.85)]
        pad = (hi - lo) * 0.08 or 0.1
        ax.set_ylim(lo - pad, hi + pad)


STABILITY_PANELS = ("ratio", "loss", "seqlen", "grad_norm", "adam_v_l1", "adam_v_max")


def plot_compare_stability(
    report: Mapping[str, Any],
    curves: Mapping[str, Mapping[str, Sequence]],
    path: Path,
    other_seeds: Sequence[Mapping[str, Mapping[str, Sequence]]] = (),
) -> Path:
    """Loss ratio (with the spike threshold), training loss, length, gradient norm and Adam's second moment.

    ``curves[run][panel]`` is that run's ``(tokens, values)`` pair for each of :data:`STABILITY_PANELS`
    (a panel left out or with no points is not drawn); the caller computes the loss ratio, so the
    definition stays with the rest of the compare arithmetic. ``other_seeds``: the same for the other
    seeds, drawn thinly behind the first seed's lines.
    """
    plt = pyplot()
    window = report["stability"]["smooth_steps"]
    threshold = report["stability"]["threshold"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    panels = dict(zip(STABILITY_PANELS, [axes[0][0], axes[0][1], axes[0][2], axes[1][0], axes[1][1], axes[1][2]]))
    for i, name in enumerate(compare_arms(report)):
        for seed_curves in other_seeds:
            for key, (xs, ys) in seed_curves.get(name, {}).items():
                if len(xs):
                    panels[key].plot([t / 1e6 for t in xs], ys, color=_arm_color(name, i), lw=0.6, alpha=0.3)
        first = f", seed {report['seeds'][0]['seed']} (others thin)" if other_seeds else ""
        style = {"color": _arm_color(name, i), "label": compare_label(report, name) + first, "lw": 1}
        for key, (xs, ys) in curves.get(name, {}).items():
            if len(xs):
                panels[key].plot([t / 1e6 for t in xs], ys, **style)
    panels["ratio"].axhline(threshold, color="tab:red", ls="--", lw=1, label=f"spike threshold {threshold:g}")
    titles = {
        "ratio": f"loss ratio (trailing mean of {window} / min so far)",
        "loss": "training loss (current length)",
        "seqlen": "sequence length",
        "grad_norm": "gradient norm (before clipping)",
        "adam_v_l1": "Adam second moment: l1 norm",
        "adam_v_max": "Adam second moment: max",
    }
    for key, ax in panels.items():
        ax.set_title(titles[key], fontsize=10)
        ax.set_xlabel("tokens trained (M)")
        ax.grid(alpha=0.3)
        if key in ("adam_v_l1", "adam_v_max", "loss"):
            ax.set_yscale("log")
    panels["ratio"].legend(fontsize=8)
    fig.suptitle("seqwarm compare: stability")
    fig.tight_layout()
    return _save(plt, fig, path, dpi=100)


# --------------------------------------------------------------------------------------------------
# seqwarm sweep


def plot_sweep(cells: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Final full-length validation loss against peak LR: one line per arm and batch scale (and clipping,
    warmup, position embeddings, curriculum mode and document masking where the grid varies them), the median
    over seeds drawn, their min–max shaded; a seed that diverged is marked with an x at its final loss (when finite)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    lines: dict[tuple, list[tuple[float, list[float], list[float]]]] = {}
    for c in cells:
        for arm in COMPARE_RUNS:
            runs = [s[arm] for s in c["seeds"]]
            lr = c.get("lr") or next((r["peak_lr"] for r in runs if r.get("peak_lr")), None)
            if lr is None:
                continue
            key = (arm, c["scale_batch"], c.get("clip_grad"), c.get("lr_warmup_iters"), c.get("pos"))
            key += (c.get("curriculum_mode"), c.get("document_masking"))  # None unless the grid varies them
            ok = [r["final_val_loss"] for r in runs if not r["diverged"] and _finite(r["final_val_loss"])]
            bad = [r["final_val_loss"] for r in runs if r["diverged"] and _finite(r["final_val_loss"])]
            lines.setdefault(key, []).append((lr, ok, bad))
    varies = [i for i in (2, 3, 4, 5, 6) if len({k[i] for k in lines}) > 1]
    names = {2: "clip", 3: "warmup", 4: "pos", 5: "mode", 6: "document masking"}
    for n, (key, points) in enumerate(sorted(lines.items(), key=lambda kv: tuple(map(str, kv[0])))):
        points.sort(key=lambda p: p[0])
        label = f"{key[0]}, {key[1]}x batch" + "".join(f", {names[i]} {key[i]}" for i in varies)
        color = COMPARE_COLORS[key[0]] if len(lines) <= 2 else f"C{n % 10}"
        style = "-" if key[0] == "curriculum" else "--"
        xs = [p[0] for p in points if p[1]]
        med = [statistics.median(p[1]) for p in points if p[1]]
        ax.plot(xs, med, style, marker="o", ms=4, lw=2, color=color, label=label)
        ax.fill_between(
            xs, [min(p[1]) for p in points if p[1]], [max(p[1]) for p in points if p[1]], color=color, alpha=0.15, lw=0
        )
        for lr, _, bad in points:
            ax.plot([lr] * len(bad), bad, "x", color=color, ms=7)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final validation loss (full length)")
    ax.set_title("seqwarm sweep: median over seeds, min–max shaded, x = diverged", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(plt, fig, path, dpi=100)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
