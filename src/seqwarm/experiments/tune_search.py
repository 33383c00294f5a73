"""The search of ``seqwarm tune``, alone: which ``total_curriculum_step`` values to probe, and the verdicts.

:func:`search_largest_passing` finds the largest T whose probe passes, assuming small values pass and
large ones fail. It takes any ``probe(T) -> ProbeResult`` (tests pass a fake one), probes up to ``jobs``
values per round (a k-ary search: with one job it is plain bisection), skips values already done (resume)
and reports each result as it arrives. :class:`ProbeResult` holds one probe's evidence and judges it: a
probe fails when some evaluation is more than ``fluctuation_pct`` percent above the best (lowest) earlier
one (see :func:`seqwarm.experiments.curves.fluctuation`), or when it diverged.

Nothing here trains: the real probe runs, the state file and the report are in
:mod:`seqwarm.experiments.tune`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from seqwarm.experiments import curves
from seqwarm.util.errors import UserError


@dataclass
class ProbeResult:
    """One probe's evidence; ``passed`` is derived from it and the fluctuation threshold."""

    value: int
    steps: list[int] = field(default_factory=list)
    val_ppl: list[float] = field(default_factory=list)
    diverged: bool = False
    message: str = ""
    elapsed_s: float = 0.0
    max_rise_pct: float = 0.0
    rise_step: int | None = None
    passed: bool = True

    def judge(self, fluctuation_pct: float) -> ProbeResult:
        """Set max_rise_pct / rise_step / passed from the evidence."""
        f = curves.fluctuation(self.val_ppl)
        self.max_rise_pct = f.max_rise_pct
        self.rise_step = self.steps[f.at_index] if f.at_index is not None and f.at_index < len(self.steps) else None
        self.passed = not self.diverged and f.finite and f.max_rise_pct <= fluctuation_pct
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not math.isfinite(d["max_rise_pct"]):
            d["max_rise_pct"] = None  # JSON has no infinity
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeResult:
        known = {k: d[k] for k in ("value", "steps", "val_ppl", "diverged", "message", "elapsed_s") if k in d}
        return cls(**known)

    def verdict(self) -> str:
        if self.diverged:
            return "FAIL (diverged)"
        return "pass" if self.passed else "FAIL"

    def evidence(self) -> str:
        if self.diverged:
            return self.message or "the loss became NaN/inf"
        ppl = f"val ppl {self.val_ppl[0]:.1f} -> {self.val_ppl[-1]:.1f}" if self.val_ppl else "no evaluation"
        rise = f"max rise {self.max_rise_pct:.2f}% above the best so far"
        where = f" (step {self.rise_step})" if self.rise_step is not None else ""
        return f"{rise}{where}; {ppl} over {len(self.val_ppl)} evals"


@dataclass
class SearchOutcome:
    chosen: int | None
    """The largest passing value found (None when even ``lo`` fails)."""
    lowest_failing: int | None
    """The smallest failing value above ``chosen`` (None when ``hi`` passes)."""
    results: dict[int, ProbeResult]
    reason: str
    warnings: list[str] = field(default_factory=list)


Probe = Callable[[int], ProbeResult]
Runner = Callable[[Probe, list[int]], Iterable[tuple[int, ProbeResult]]]


def run_sequentially(probe: Probe, values: list[int]) -> Iterator[tuple[int, ProbeResult]]:
    for v in values:
        yield v, probe(v)


def interior_points(good: int, bad: int, n: int) -> list[int]:
    """Up to ``n`` integers strictly between ``good`` and ``bad``, evenly spaced (n=1: the midpoint)."""
    pts = {good + (bad - good) * i // (n + 1) for i in range(1, n + 1)}
    return sorted(p for p in pts if good < p < bad)


def search_largest_passing(
    probe: Probe,
    lo: int,
    hi: int,
    *,
    fluctuation_pct: float,
    jobs: int = 1,
    resolution: int = 1,
    done: Mapping[int, ProbeResult] | None = None,
    runner: Runner = run_sequentially,
    on_result: Callable[[int, ProbeResult, bool], None] | None = None,
) -> SearchOutcome:
    """The largest T in [lo, hi] whose probe passes, assuming small values pass and large ones fail.

    Rounds of up to ``jobs`` probes: first ``hi`` (with ``lo`` too when jobs > 1), then ``lo``, then
    evenly spaced points inside the bracket (passing, failing), until it is at most ``resolution`` wide.
    Values in ``done`` are not probed again (their verdicts are re-judged with ``fluctuation_pct``).
    ``on_result(value, result, reused)`` is called for every verdict the search uses, as it arrives.
    """
    if not 1 <= lo <= hi:
        raise UserError(f"the search range must satisfy 1 <= lo <= hi (got lo {lo}, hi {hi})")
    if jobs < 1 or resolution < 1:
        raise UserError("--jobs and --resolution must be >= 1")
    results: dict[int, ProbeResult] = {}
    previous = dict(done or {})

    def run(values: list[int]) -> None:
        todo = []
        for v in values:
            if v in results:
                continue
            if v in previous:
                results[v] = previous[v].judge(fluctuation_pct)
                if on_result:
                    on_result(v, results[v], True)
            else:
                todo.append(v)
        for v, r in runner(probe, todo):
            results[v] = r.judge(fluctuation_pct)
            if on_result:
                on_result(v, results[v], False)

    run([hi] if jobs == 1 or lo == hi else [lo, hi])
    if results[hi].passed:
        return SearchOutcome(
            hi,
            None,
            results,
            f"the top of the range (hi = {hi}) passes; a larger value may pass too (raise --hi to look further)",
        )
    run([lo])
    if not results[lo].passed:
        return SearchOutcome(
            None,
            lo,
            results,
            f"even the bottom of the range (lo = {lo}) fails: lower --lo, "
            "raise --fluctuation, or lower the learning rate",
        )
    good, bad = lo, hi
    while bad - good > resolution:
        run(interior_points(good, bad, jobs))
        for v in sorted(x for x in results if good < x < bad):
            if results[v].passed:
                good = v
            else:
                bad = v
                break
    warnings = [
        f"T = {v} passed although the smaller T = {bad} failed (fluctuation is not monotone in T: "
        "noise, or a threshold too close to it)"
        for v in sorted(results)
        if v > bad and results[v].passed
    ]
    return SearchOutcome(good, bad, results, f"largest passing value; {bad} fails (resolution {resolution})", warnings)
