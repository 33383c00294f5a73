"""Seed spread: a comparison repeated over seeds, summed up as median and min–max, and said plainly.

Pure arithmetic on per-seed rows (what :func:`seed_row` takes from one seed's compare report), so the
aggregate and the verdict can be checked on synthetic numbers.

Definitions (also written into every report):

- **Spread** of a metric over seeds = its median and its min–max range over the seeds where it is a
  finite number (a speedup is null on a seed whose curriculum never reached the target: that seed is
  counted in ``reached``, not in the speedup's spread).
- **The difference exceeds the seed spread** when the two arms' min–max ranges of final full-length
  validation loss do not overlap (every seed of one arm is below every seed of the other). With one
  seed there is no spread, and the report says so instead of judging.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ARMS = ("baseline", "curriculum")

SPREAD_DEFINITION = (
    "spread over seeds = median and min–max of a metric over the seeds where it is a finite number (a "
    "seed whose curriculum never reached the target has no speedup and is counted in `reached` instead). "
    "The difference exceeds the seed spread when the two arms' min–max ranges of final full-length "
    "validation loss do not overlap."
)


def spread(values: Iterable[Any]) -> dict[str, Any]:
    """``{"median", "min", "max", "n"}`` of the finite numbers among ``values`` (None when there are none)."""
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not finite:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(finite), "min": min(finite), "max": max(finite), "n": len(finite)}


def seed_row(seed: int, report: Mapping[str, Any]) -> dict[str, Any]:
    """One seed's line of ``report.json["seeds"]``, from that seed's two-run compare report."""
    return {
        "seed": seed,
        "run_dirs": {arm: report[arm]["run_dir"] for arm in ARMS},
        "reached": report.get("reached"),
        "speedup_tokens": report.get("speedup_tokens"),
        "speedup_time": report.get("speedup_time"),
        "target": report.get("target"),
        "final_val_loss": {arm: report[arm]["final_val_loss"] for arm in ARMS},
        "spikes": {arm: report["stability"][arm]["spikes"] for arm in ARMS},
        "steps": {arm: report[arm].get("steps") for arm in ARMS},
        "tokens_to_target": {arm: (report.get("tokens_to_target") or {}).get(arm) for arm in ARMS},
        "step_us_per_token": {arm: report[arm].get("step_us_per_token") for arm in ARMS},
        "diverged": {arm: report[arm]["diverged"] for arm in ARMS},
        "evals": {arm: report[arm]["evals"] for arm in ARMS},
    }


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and min–max over the seeds of speedups, final losses and spike counts, and the verdict."""
    out: dict[str, Any] = {
        "n_seeds": len(rows),
        "reached": sum(bool(r.get("reached")) for r in rows),
        "speedup_tokens": spread(r.get("speedup_tokens") for r in rows),
        "speedup_time": spread(r.get("speedup_time") for r in rows),
        "final_val_loss": {arm: spread(r["final_val_loss"][arm] for r in rows) for arm in ARMS},
        "spikes": {arm: spread(r["spikes"][arm] for r in rows) for arm in ARMS},
        "steps": {arm: spread((r.get("steps") or {}).get(arm) for r in rows) for arm in ARMS},
        **{
            key: {arm: spread((r.get(key) or {}).get(arm) for r in rows) for arm in ARMS}
            for key in ("tokens_to_target", "step_us_per_token")
        },
        "diverged": {arm: sum(bool(r["diverged"][arm]) for r in rows) for arm in ARMS},
    }
    out["verdict"] = verdict(out)
    return out


def verdict(agg: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the arms' final losses differ by more than the seed spread, and sentences saying so.

    ``exceeds_spread``: True / False, or None with one seed (or a loss missing on every seed of an arm).
    """
    n = agg["n_seeds"]
    base, cur = agg["final_val_loss"]["baseline"], agg["final_val_loss"]["curriculum"]
    lines: list[str] = []
    if n < 2:
        exceeds, side = None, None
        lines.append(
            "One seed: no spread measured, so this cannot say whether the difference is larger than "
            "the seed-to-seed noise (run with --seeds 3 or more)."
        )
    elif base["n"] == 0 or cur["n"] == 0:
        exceeds, side = None, None
        lines.append("An arm has no final loss on any seed (diverged or unfinished): no comparison of spreads.")
    elif cur["max"] < base["min"]:
        exceeds, side = True, "curriculum"
        lines.append(
            f"The curriculum's final loss is lower than the baseline's on every one of the {n} seeds "
            f"(curriculum {_range(cur)}, baseline {_range(base)}): the difference exceeds the seed "
            "spread."
        )
    elif base["max"] < cur["min"]:
        exceeds, side = True, "baseline"
        lines.append(
            f"The baseline's final loss is lower than the curriculum's on every one of the {n} seeds "
            f"(baseline {_range(base)}, curriculum {_range(cur)}): the difference exceeds the seed "
            "spread."
        )
    else:
        exceeds, side = False, None
        lines.append(
            f"The final-loss ranges over {n} seeds overlap (baseline {_range(base)}, curriculum "
            f"{_range(cur)}): the difference does not exceed the seed spread."
        )
    if n >= 2:
        sp = agg["speedup_tokens"]
        reached = agg["reached"]
        if reached == 0:
            lines.append(f"The curriculum reached the baseline's final loss on none of the {n} seeds.")
        else:
            where = "on every seed" if reached == n else f"on {reached} of {n} seeds (the others: never)"
            lines.append(
                f"speedup_tokens {where}: median {sp['median']:.2f}x, range {sp['min']:.2f}x–{sp['max']:.2f}x."
            )
    return {"exceeds_spread": exceeds, "lower": side, "text": lines}


def _range(s: Mapping[str, Any]) -> str:
    return f"{s['min']:.4f}–{s['max']:.4f} (median {s['median']:.4f})"


def median_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[list[float], list[float]]:
    """Point-by-point median of several ``(xs, ys)`` curves, over the length of the shortest.

    The seeds of one arm evaluate at the same steps, so their token counts agree and the median is of
    the losses at each evaluation (against wall-clock, x is the median elapsed time of that evaluation).
    """
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return [], []
    n = min(len(xs) for xs, _ in curves)
    xs = [statistics.median(float(c[0][i]) for c in curves) for i in range(n)]
    ys = []
    for i in range(n):
        finite = [float(c[1][i]) for c in curves if math.isfinite(float(c[1][i]))]
        ys.append(statistics.median(finite) if finite else math.nan)
    return xs, ys
