"""The sequence-length curriculum, one layer below :mod:`seqwarm.config` (it imports nothing from it; each part
owns its config). Without torch: ``schedule`` (``CurriculumConfig``, ``difficulty_at``, the
DeepSpeed-compatible ``CurriculumScheduler``), ``checks`` (a curriculum block's keys, schedule types and field
checks), ``lr`` and ``lr_checks`` (``LRConfig``, ``lr_at``, their checks), ``clock`` (the token clock
``Progress``, the stop rule), ``stages`` and ``rope`` (the stages after the warmup, their rotary settings),
``decompose`` and ``variable`` (documents in power-of-2 chunks, the variable-length sampler), ``run`` (what
the curriculum reads of a run config, and the DeepSpeed-config reader ``seqwarm.config`` registers),
``loss_scale`` (the precision rule, ``FP16Config``, the fp16 ``LossScaler``) and ``plan`` / ``plan_stages``
(the run ahead of time). With torch: ``batch`` (the cuts and ``tokens_trained``, the one token-counting rule),
``layouts`` (each batch layout's cut), ``modes`` (how the length reaches the model), ``inputs`` (what users
hand the curriculum), ``ranks`` (a step's counts over data-parallel ranks), ``warmup``
(``SequenceLengthWarmup``, the one implementation of the curriculum wiring), ``engine`` (``CurriculumEngine``
for any PyTorch loop) and ``lr_scheduler`` (``CurriculumLRScheduler``). This ``__init__`` imports nothing on
purpose, so that ``seqwarm.config`` and ``seqwarm plan`` stay free of torch.
"""
