"""The time a run has left, from its plan and its measured steps (the ``eta`` of the console line).

A curriculum's first steps are short, and a short step costs more per token than a long one: every step
pays a fixed part (the optimizer update, clipping, launching the work) on top of a part that grows with
its tokens. Extrapolating the tokens per second of the first steps therefore overestimates a run many
times over (and steps per second underestimates it). :class:`EtaEstimator` fits the measured step times to

    seconds(step) = per_step + per_token * tokens(step)

by least squares, and sums the fit over what the plan (:func:`seqwarm.curriculum.plan.make_plan`) says is
left: ``per_step * steps_left + per_token * tokens_left``. A timed trial at the full length (the loop's
memory probe) gives the fit a long step before the run has taken one, so the estimate is close from
the first step on; the first step measured is left out of the fit once others are (it also pays
for the one-off start-up: allocation, first kernel launches, caches).
"""

from __future__ import annotations

__all__ = ["EtaEstimator"]


class EtaEstimator:
    """Seconds left of a planned run of ``total_steps`` optimizer steps and ``total_tokens`` tokens."""

    def __init__(self, total_steps: int, total_tokens: int):
        self.total_steps, self.total_tokens = total_steps, total_tokens
        self._first: tuple[float, float] | None = None  # the first step, used only until another is measured
        self._sums = [0.0] * 5  # n, sum x, sum t, sum x*x, sum x*t over the measured steps after the first
        self._trial: tuple[float, float] | None = None

    def trial(self, tokens: int, seconds: float) -> None:
        """A timed trial forward + backward of ``tokens`` (summed over ranks) at the full length."""
        if tokens > 0 and seconds > 0:
            self._trial = (float(tokens), float(seconds))

    def observe(self, tokens: int, seconds: float) -> None:
        """One optimizer step trained ``tokens`` (summed over ranks) in ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        if self._first is None:  # the run's (or the resumed run's) first step: start-up included
            self._first = (float(tokens), float(seconds))
            return
        _add(self._sums, float(tokens), float(seconds))

    def cost(self) -> tuple[float, float] | None:
        """The fitted ``(seconds per step, seconds per token)``; None before any step is measured.

        The trial is a full-length step without the update: it joins the fit as that step with the fixed
        part the measured steps show added, so it anchors the long end until long steps are measured."""
        observed = list(self._sums)
        if not observed[0] and self._first is not None:
            observed = _add([0.0] * 5, *self._first)
        if not observed[0]:
            return None
        if self._trial is None:
            return _fit(observed)
        x, t = self._trial  # first the trial's cost per token, the measured steps' the rest
        per_token = t / x
        per_step = max(0.0, (observed[2] - per_token * observed[1]) / observed[0])
        for _ in range(2 if self._sums[0] else 0):  # then a fit with the trial as a step (two rounds settle it)
            per_step, per_token = _fit(_add(list(observed), x, t + per_step))
        return per_step, per_token

    def seconds_left(self, step: int, tokens: int) -> float | None:
        """Seconds until the plan's end, after ``step`` steps and ``tokens`` tokens (None: not known yet)."""
        fitted = self.cost()
        if fitted is None:
            return None
        per_step, per_token = fitted
        steps_left = max(0, self.total_steps - step)
        tokens_left = max(0, self.total_tokens - tokens)
        if steps_left == 0 and tokens_left > 0:  # past the plan (e.g. loss-mask counts): at least one step
            steps_left = 1
        return per_step * steps_left + per_token * tokens_left


def _add(sums: list[float], x: float, t: float) -> list[float]:
    for i, v in enumerate((1.0, x, t, x * x, x * t)):
        sums[i] += v
    return sums


def _fit(sums: list[float]) -> tuple[float, float]:
    """Least squares ``t = per_step + per_token * x`` from the sums; both parts kept >= 0."""
    n, sx, st, sxx, sxt = sums
    spread = n * sxx - sx * sx
    if spread > 1e-9 * max(sx * sx, 1.0):
        per_token = (n * sxt - sx * st) / spread
        per_step = (st - per_token * sx) / n
        if per_token >= 0 and per_step >= 0:
            return per_step, per_token
        if per_token < 0:  # longer steps measured faster (noise, load): a cost per step alone
            return st / n, 0.0
    # one length only, or a negative fixed part: a cost per token alone (a line through zero)
    return 0.0, sxt / sxx if sxx else 0.0
