"""Experiments built from training runs: ``seqwarm compare`` (baseline vs curriculum), ``seqwarm tune``
(the search for ``total_curriculum_step``) and ``seqwarm sweep`` (compare over a grid), on one runner.

- :mod:`seqwarm.experiments.curves`: pure arithmetic on logged curves (target crossings, speedups, loss
  ratio and spikes, validation fluctuation), unit-tested on synthetic curves.
- :mod:`seqwarm.experiments.runner`: the one runner: trains a list of arms (reuse, resume, divergence,
  the state file), and what the three commands share (refused flags, options, reading an arm's folder).
- :mod:`seqwarm.experiments.launch`: derived configs and flags, run-folder reuse/resume (runs are RunSpecs).
- :mod:`seqwarm.experiments.compare`: plan, run and report a comparison.
- :mod:`seqwarm.experiments.report`: the comparison's report.json, report.md and figures.
- :mod:`seqwarm.experiments.sweep`, :mod:`seqwarm.experiments.sweep_report`: the grid, its runs and sweep.md.
- :mod:`seqwarm.experiments.tune_search`: the injectable search for ``total_curriculum_step``.
- :mod:`seqwarm.experiments.tune`: the real probe runs, the resumable state and ``tune.json``.
"""

from seqwarm.experiments.curves import (
    Fluctuation,
    Spike,
    ToTarget,
    find_spikes,
    first_crossing,
    fluctuation,
    interpolate,
    loss_ratio,
    speedup_to_target,
    stability,
    trailing_mean,
)

__all__ = [
    "Fluctuation",
    "Spike",
    "ToTarget",
    "find_spikes",
    "first_crossing",
    "fluctuation",
    "interpolate",
    "loss_ratio",
    "speedup_to_target",
    "stability",
    "trailing_mean",
]
