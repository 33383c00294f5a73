"""Pure arithmetic on logged curves: crossings of a target, speedups, loss ratios, spikes, fluctuation.

Nothing here reads files or runs training, so every definition used by ``seqwarm compare`` and
``seqwarm tune`` can be checked on synthetic curves.

Definitions (also written into every report):

- **Crossing a target.** A validation curve is the piecewise-linear line through its evaluation points
  ``(x_i, loss_i)`` (x = tokens or elapsed seconds). It reaches ``target`` at the first x where that line
  is at or below the target: ``x_0`` if the first point already is, else between the last point above and
  the first point at or below, by linear interpolation. Before the first evaluation nothing is assumed.
- **Speedup to a target** = baseline x to reach it / curriculum x to reach it. The default target is the
  baseline's final validation loss, so the baseline's x is (at most) its whole budget.
- **Loss ratio** = smoothed training loss / minimum of the smoothed loss so far (>= 1). Smoothing is a
  trailing mean over ``window`` logged points (the first ``window - 1`` points, before the window is
  full, are left out); ``window=1`` is the raw ratio.
- **Spike** = one excursion of the loss ratio above the threshold: consecutive points above it count once.
- **Time per token** of a run = the seconds its training steps took (each logged window's tokens / its
  ``tokens_per_s``, so evaluations and checkpoints are left out) / the tokens they trained, given in
  microseconds: what a shorter row saves in attention shows here.
- **Fluctuation** of a validation-perplexity curve = the largest rise of a point above the best
  (lowest) earlier point, in percent: ``max_i (ppl_i / min_{j<i} ppl_j - 1) * 100``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def first_crossing(xs: Sequence[float], ys: Sequence[float], target: float) -> float | None:
    """The first x at which the piecewise-linear curve through ``(xs, ys)`` is <= ``target``.

    ``xs`` must be non-decreasing. Returns None when no point reaches the target (non-finite ys,
    e.g. a diverged run's NaN, never count as reaching it).
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} vs {len(ys)})")
    prev: tuple[float, float] | None = None
    for x, y in zip(xs, ys):
        if not math.isfinite(y):
            prev = None
            continue
        if y <= target:
            if prev is None:
                return float(x)
            x0, y0 = prev
            # y0 > target >= y: the fraction of the segment spent above the target
            frac = (y0 - target) / (y0 - y)
            return float(x0 + frac * (x - x0))
        prev = (x, y)
    return None


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """The piecewise-linear curve's value at ``x`` (None outside ``[xs[0], xs[-1]]``)."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return float(y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return float(ys[0])  # a single point


@dataclass(frozen=True)
class ToTarget:
    """How far (tokens or seconds) each run needed to reach the target, and the ratio."""

    target: float
    baseline: float | None
    curriculum: float | None
    speedup: float | None
    """baseline / curriculum; None when either never reaches the target."""
    reached: bool
    """Whether the curriculum reached the target at all."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speedup_to_target(
    base_x: Sequence[float],
    base_y: Sequence[float],
    cur_x: Sequence[float],
    cur_y: Sequence[float],
    target: float | None = None,
) -> ToTarget:
    """Speedup of the curriculum over the baseline in reaching ``target`` (default: the baseline's final y)."""
    if not base_y:
        raise ValueError("the baseline curve is empty")
    if target is None:
        target = float(base_y[-1])
    b = first_crossing(base_x, base_y, target)
    c = first_crossing(cur_x, cur_y, target)
    speedup = b / c if b is not None and c is not None and c > 0 else None
    return ToTarget(target=float(target), baseline=b, curriculum=c, speedup=speedup, reached=c is not None)


def step_time_per_token(train_rows: Sequence[dict[str, Any]]) -> float | None:
    """Seconds of training steps per token trained (see the module), from the train rows of metrics.jsonl
    (cumulative ``tokens``, each row's window ``tokens_per_s``); None without a usable row."""
    seconds, tokens, before = 0.0, 0, 0
    for row in train_rows:
        window, rate = row.get("tokens", 0) - before, row.get("tokens_per_s")
        before = row.get("tokens", before)
        if window > 0 and isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate):
            seconds, tokens = seconds + window / rate, tokens + window
    return seconds / tokens if tokens else None


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """``out[i]`` = mean of ``values[max(0, i - window + 1) .. i]`` (no look-ahead)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_ratio(losses: Sequence[float], window: int = 1) -> list[float]:
    """Smoothed loss over the minimum of the smoothed loss so far (the paper's stability signal).

    The first ``window - 1`` points, whose mean is not over a full window yet, get ratio 1 and do not
    set the minimum. A non-finite loss gives an infinite ratio.
    """
    smooth = trailing_mean(losses, window)
    out, best = [], math.inf
    for i, v in enumerate(smooth):
        if not math.isfinite(v):
            out.append(math.inf)
            continue
        if i < window - 1:
            out.append(1.0)
            continue
        best = min(best, v)
        out.append(v / best if best > 0 else math.inf)
    return out


@dataclass(frozen=True)
class Spike:
    start: int
    """Index of the first point above the threshold."""
    end: int
    """Index of the last point above it (inclusive)."""
    peak: float


def find_spikes(ratios: Sequence[float], threshold: float) -> list[Spike]:
    """Excursions above ``threshold``: each maximal run of consecutive points above it is one spike."""
    spikes: list[Spike] = []
    start, peak = None, 0.0
    for i, r in enumerate(ratios):
        if r > threshold:
            if start is None:
                start, peak = i, r
            peak = max(peak, r)
        elif start is not None:
            spikes.append(Spike(start, i - 1, peak))
            start = None
    if start is not None:
        spikes.append(Spike(start, len(ratios) - 1, peak))
    return spikes


def stability(train_rows: Sequence[dict[str, Any]], threshold: float, window: int) -> dict[str, Any]:
    """Loss-ratio maxima, spike count and optimizer-state extremes of one run's ``train`` rows."""
    rows = [r for r in train_rows if r.get("loss") is not None]
    losses = [float(r["loss"]) for r in rows]
    raw = loss_ratio(losses, 1)
    smooth = loss_ratio(losses, window)
    spikes = find_spikes(smooth, threshold)

    def top(key: str) -> float | None:
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        return max(vals) if vals else None

    at = max(range(len(smooth)), key=smooth.__getitem__) if smooth else None
    return {
        "points": len(rows),
        "max_loss_ratio": smooth[at] if at is not None else None,
        "max_loss_ratio_step": rows[at]["step"] if at is not None else None,
        "max_loss_ratio_raw": max(raw) if raw else None,
        "spikes": len(spikes),
        "spike_steps": [rows[s.start]["step"] for s in spikes],
        "spike_peaks": [s.peak for s in spikes],
        "max_grad_norm": top("grad_norm"),
        "max_adam_v_l1": top("adam_v_l1"),
        "max_adam_v_max": top("adam_v_max"),
    }


@dataclass(frozen=True)
class Fluctuation:
    max_rise_pct: float
    """Largest rise of a point above the best earlier point, in percent (0 for a falling curve)."""
    at_index: int | None
    """Index of that point (None when nothing rose)."""
    finite: bool
    """False when a value is NaN or infinite (a diverged probe)."""


def fluctuation(values: Sequence[float]) -> Fluctuation:
    """The worst rise of ``values`` (e.g. validation perplexities) above their running minimum."""
    best, worst, at = math.inf, 0.0, None
    for i, v in enumerate(values):
        if not math.isfinite(v):
            return Fluctuation(math.inf, i, False)
        if i > 0 and best < math.inf:
            rise = (v / best - 1.0) * 100.0
            if rise > worst:
                worst, at = rise, i
        best = min(best, v)
    return Fluctuation(worst, at, True)
