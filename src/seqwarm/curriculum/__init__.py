"""The sequence-length curriculum. Its lower half is pure: ``schedule`` (``CurriculumConfig``,
``difficulty_at``, the DeepSpeed-compatible ``CurriculumScheduler``), ``checks`` (a curriculum block's
keys, schedule types and field checks), ``lr`` (``LRConfig``, ``lr_at``) and ``clock`` (the token clock
``Progress``, the stop rule), which import no torch, and ``batch`` (``truncate_batch`` /
``reshape_batch`` / ``bucket_batch`` on tensors). Above :mod:`seqwarm.config` sit ``warmup``
(``SequenceLengthWarmup``, the one implementation of the curriculum wiring), ``engine``
(``CurriculumEngine`` for any PyTorch loop, with its fp16 ``LossScaler`` in ``loss_scale``) and ``plan``
(the run ahead of time). This ``__init__`` imports nothing on purpose: ``seqwarm.config`` imports
``curriculum.schedule`` and ``curriculum.checks``, and ``batch``, ``warmup`` and ``engine`` import torch.
"""
