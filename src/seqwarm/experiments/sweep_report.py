"""``sweep.md``, the markdown of ``seqwarm sweep``'s report (from the dict ``sweep.json`` holds), and the
definitions the report writes beside its numbers. What the numbers are is worked out in
:mod:`seqwarm.experiments.sweep`; the figure, ``sweep.png``, is :func:`seqwarm.trainer.plots.plot_sweep`.
"""

from __future__ import annotations

from typing import Any

from seqwarm.experiments import spread
from seqwarm.experiments.compare import RUNS

DIVERGED_DEFINITION = (
    "diverged = a non-finite loss, a smoothed loss-ratio spike above the threshold, or a blow-up: a training "
    "loss above threshold x ln(vocabulary size), worse than that many times a uniform guess (the loss ratio, "
    "measured against the lowest loss so far, misses a blow-up that comes before the loss has fallen)"
)


BEST_DEFINITION = (
    "the best baseline = the cell, at the grid's smallest batch scale, whose baseline has the lowest median "
    "final val loss among those that diverged on no seed; its final loss on each seed is that seed's target; "
    "tokens ratio = a run's tokens to reach the target / the best baseline's own tokens to it (same seed; "
    "below 1: fewer tokens than the best baseline)."
)


LIMITS_DEFINITION = (
    "for each arm and each setting of the other grid axes: the largest peak LR of the grid at which no seed "
    "diverged, and the smallest at which some seed did (none: no LR of the grid made it diverge, so the "
    "limit lies above the grid)."
)


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
