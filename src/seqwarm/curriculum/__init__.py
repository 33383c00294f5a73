"""The sequence-length curriculum, one layer below :mod:`seqwarm.config` (it imports nothing from it; each
part owns its config). ``schedule`` (``CurriculumConfig``, ``difficulty_at``, the DeepSpeed-compatible
``CurriculumScheduler``), ``checks`` (a curriculum block's keys, schedule types and field checks), ``lr``
(``LRConfig``, ``lr_at``), ``clock`` (the token clock ``Progress``, the stop rule), ``run`` (what the
curriculum reads of a run config, and the DeepSpeed-config reader ``seqwarm.config`` registers),
``loss_scale`` (the precision rule, ``FP16Config``, the fp16 ``LossScaler``) and ``plan`` (the run ahead of
time) import no torch; ``batch`` (the cuts), ``layouts`` (each batch layout's cut and the one token-counting
rule), ``warmup`` (``SequenceLengthWarmup``, the one implementation of the curriculum wiring), ``engine``
(``CurriculumEngine`` for any PyTorch loop) and ``lr_scheduler`` (``CurriculumLRScheduler``) do. This
``__init__`` imports nothing on purpose, so that ``seqwarm.config`` and ``seqwarm plan`` stay free of torch.
"""
