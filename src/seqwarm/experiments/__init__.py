"""Experiments built from training runs: ``seqwarm compare`` (baseline vs curriculum) and ``seqwarm tune``
(the search for ``total_curriculum_step``).

- :mod:`seqwarm.experiments.curves`: pure arithmetic on logged curves (target crossings, speedups, loss
  ratio and spikes, validation fluctuation), unit-tested on synthetic curves.
- :mod:`seqwarm.experiments.launch`: derived configs, run-folder reuse/resume (runs are RunSpecs).
- :mod:`seqwarm.experiments.compare`: plan, run and report a comparison.
- :mod:`seqwarm.experiments.report`: the comparison's report.json, report.md and figures.
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
