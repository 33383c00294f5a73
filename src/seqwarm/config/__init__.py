"""Run configuration: DeepSpeed JSON (legacy and data_efficiency curriculum forms) plus seqwarm settings.

``load_config(path_or_dict, overrides=..., world_size=...)`` reads a DeepSpeed config verbatim, checks
everything, and returns a frozen :class:`RunConfig`. Every problem is collected and raised at once as
one :class:`ConfigError` whose ``.problems`` name the key path, the value, the rule and the fix.
Tutorial advice (multiples of 8/16, ...) becomes ``RunConfig.warnings``, never an error.

Where settings come from, weakest first: defaults; the config's DeepSpeed keys; its optional top-level
``"seqwarm"`` block (Megatron-side settings DeepSpeed never had: ``seq_length``, ``train_tokens``,
``lr_decay_tokens``, ...); ``overrides`` (the CLI flags). Keys DeepSpeed owns (``zero_optimization``,
``bf16``, ``scheduler``, ...) are kept in ``RunConfig.deepspeed`` — the config with the curriculum and
seqwarm blocks removed — ready to hand to ``deepspeed.initialize``.

The package: :mod:`~seqwarm.config.run` (the run config dataclasses), :mod:`~seqwarm.config.reader`
(the DeepSpeed JSON dialect reader, ``load_config``), :mod:`~seqwarm.config.blocks` (the reader's checks
of the individual blocks: curriculum, batch sizes, optimizer, precision, scheduler, LR),
:mod:`~seqwarm.config.settings` (the one table of seqwarm settings and their flags) and
:mod:`~seqwarm.config.describe` (the human summary). The
curriculum's, the LR schedule's and the precision's configs and checks live with their owners
(:mod:`seqwarm.curriculum.schedule` and :mod:`seqwarm.curriculum.checks`, :mod:`seqwarm.curriculum.lr`,
:mod:`seqwarm.curriculum.loss_scale`); ``FP16Config``, ``PRECISIONS`` and ``resolve_precision`` are
re-exported here under their old names. Importing this package registers :func:`load_config` as the
curriculum's reader of DeepSpeed configs (:func:`seqwarm.curriculum.run.register_reader`).
"""

from __future__ import annotations

from seqwarm.config.reader import SEQWARM_KEYS, load_config
from seqwarm.config.run import OptimizerConfig, RunConfig
from seqwarm.curriculum.loss_scale import PRECISIONS, FP16Config, resolve_precision
from seqwarm.curriculum.lr import DECAY_STYLES, LRConfig
from seqwarm.curriculum.run import register_reader
from seqwarm.curriculum.schedule import CURRICULUM_MODES, CurriculumConfig
from seqwarm.util.problems import ConfigError, Problem

# The curriculum, a layer below, reads DeepSpeed configs through this reader (from_deepspeed, the engines):
# registered here, at import, which the package's __init__ does before any seqwarm module runs.
register_reader(load_config)

__all__ = [
    "ConfigError",
    "Problem",
    "CurriculumConfig",
    "FP16Config",
    "OptimizerConfig",
    "LRConfig",
    "RunConfig",
    "load_config",
    "SEQWARM_KEYS",
    "CURRICULUM_MODES",
    "DECAY_STYLES",
    "PRECISIONS",
    "resolve_precision",
]
