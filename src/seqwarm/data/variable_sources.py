"""Curriculum mode variable's settings and training documents, read the same way by ``seqwarm train`` and
``seqwarm plan``, without torch.

:class:`VariableSettings` is what the mode reads of a run config (:meth:`VariableSettings.of`): the length
range, the tokens per step, the curriculum and its keywords (Grow-P2's cycles, the block's schedule as the
cap, ``linear``'s steps from the budget). :func:`document_offsets` is the one reader of a source's training
documents: the offsets of its train split's documents into that split's token stream. Training reads them
from the opened data's sources (:func:`sources_of`), the plan from the files' indexes alone
(:func:`read_sources`: a prepared folder, the embedded corpus or ``--data-path`` with its weights and
``--split``). :func:`variable_plan` plans a run from these: every source decomposed, its weight, the same
seeds and the same sampler keywords as training (:class:`~seqwarm.curriculum.variable_blend.VariableSteps`),
so the plan's lengths are the run's, step by step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.config import RunConfig
from seqwarm.curriculum.decompose import Decomposition, decompose
from seqwarm.curriculum.plan_variable import VariablePlan, plan_variable
from seqwarm.curriculum.schedule import CurriculumConfig
from seqwarm.data.data_path import parse_data_path, source_weights, split_documents
from seqwarm.data.indexed import MEGATRON_FIX, PREPARE_FIX, MegatronIndexed
from seqwarm.data.meta import read_meta
from seqwarm.util.errors import UserError

__all__ = [
    "VariableSettings",
    "DocumentSource",
    "document_offsets",
    "sources_of",
    "read_sources",
    "decompose_sources",
    "variable_plan",
    "in_run_terms",
]


@dataclass(frozen=True)
class VariableSettings:
    """What curriculum mode variable reads of a run config (:meth:`of`)."""

    min_length: int
    """The shortest chunk: the curriculum's ``min_difficulty`` (a power of 2)."""
    max_length: int
    """The longest chunk: its ``max_difficulty`` (a power of 2)."""
    micro_batch_size: int
    """Full-length rows per micro-batch: a micro-batch holds ``micro_batch_size x max_length`` tokens."""
    accumulation: int
    """Micro-batches per optimizer step on each rank."""
    curriculum: str = "schedule"
    """The sampler's curriculum (``variable_curriculum``)."""
    num_cycles: int = 8
    """Grow-P2's cycles per epoch (``variable_cycles``)."""
    schedule: CurriculumConfig | None = None
    """The cap of the ``schedule`` curriculum: the config's curriculum block."""
    train_tokens: int | None = None
    """The budget, from which ``linear`` counts its steps."""
    train_iters: int | None = None

    @classmethod
    def of(cls, cfg: RunConfig) -> VariableSettings:
        cur = cfg.curriculum
        if cur is None or cur.mode != "variable":
            raise ValueError("VariableSettings.of needs a config in curriculum mode variable")
        return cls(
            cur.min_difficulty,
            cur.max_difficulty,
            cfg.micro_batch_size,
            cfg.gradient_accumulation_steps,
            cfg.variable_curriculum,
            cfg.variable_cycles,
            cur,
            cfg.train_tokens,
            cfg.train_iters,
        )

    def tokens_per_step(self, world_size: int) -> int:
        """The tokens of every optimizer step, all ranks: the full-length global batch's."""
        return self.micro_batch_size * self.accumulation * world_size * self.max_length

    def sampler_options(self, world_size: int) -> dict[str, Any]:
        """The curriculum keywords of :class:`~seqwarm.curriculum.variable.VariableLengthSampler`."""
        if self.curriculum == "grow_p2":
            return {"curriculum": "grow_p2", "num_cycles": self.num_cycles}
        if self.curriculum == "schedule":
            return {"curriculum": "schedule", "schedule": self.schedule}
        if self.curriculum == "linear":  # the cap grows over the budget's steps
            per_step = self.tokens_per_step(world_size)
            steps = math.ceil(self.train_tokens / per_step) if self.train_tokens else self.train_iters
            if not steps:
                raise UserError(
                    "variable_curriculum linear grows the length over the budget's steps: give --train-tokens "
                    "(or --train-iters)"
                )
            return {"curriculum": "linear", "total_steps": int(steps)}
        return {"curriculum": self.curriculum}


@dataclass(frozen=True)
class DocumentSource:
    """One source's training documents: its name, blend weight, the offsets of its documents into its
    train split's token stream (``offsets[0] == 0``) and its token file (None: not opened for reading)."""

    name: str
    weight: float
    offsets: np.ndarray
    file: Any = None
    start: int = 0
    """The train split's first document in the file."""


def document_offsets(file: MegatronIndexed, start: int, stop: int) -> np.ndarray:
    """The offsets of documents ``start .. stop - 1`` of ``file`` into the stream they make (from 0): the
    one reader of a source's training documents, in training and in the plan."""
    offsets = np.asarray(file.doc_offsets[start : stop + 1], dtype=np.int64)
    return offsets - offsets[0]


def sources_of(data: Any) -> list[DocumentSource]:
    """The training documents of an opened :class:`~seqwarm.data.megatron.TokenData` (a prepared folder,
    the embedded corpus, a ``--data-path`` blend): each source's train split, weight and name."""
    out = []
    for source in data.sources:
        file, (start, stop) = source.files[0], source.ranges[0]
        out.append(DocumentSource(source.names[0], source.weight, document_offsets(file, start, stop), file, start))
    return out


def read_sources(
    *, data: str | Path | None = None, data_path: Sequence[str] | None = None, split: str = "", rounding: str = ""
) -> list[DocumentSource]:
    """The training documents of a run's data from the files' indexes alone (no token read, no torch): the
    prepared folder ``data`` (None and no ``data_path``: the embedded corpus), or the ``--data-path``
    sources split by ``--split`` as training splits them, weighted as training weighs them."""
    if data_path:
        parsed = parse_data_path(data_path)
        files, ranges = [], []
        for _, prefix in parsed:
            indexed = MegatronIndexed(prefix, fix=MEGATRON_FIX)
            files.append(indexed)
            ranges.append(split_documents(indexed.num_docs, split, rounding)[0])
        sizes = [int(f.doc_offsets[b] - f.doc_offsets[a]) for f, (a, b) in zip(files, ranges)]
        weights = source_weights([w for w, _ in parsed], sizes, " ".join(map(str, data_path)))
        return [
            DocumentSource(
                f"train split of {f.prefix} (--split {split}; {b - a:,} documents)", w, document_offsets(f, a, b)
            )
            for f, (a, b), w in zip(files, ranges, weights)
        ]
    if data:
        folder = Path(data)
    else:
        from seqwarm.data.prepare import embedded_data_dir  # the corpus's tokenizer: only without --data

        folder = embedded_data_dir()
    read_meta(folder)  # a clear error for a folder that is not prepared data
    indexed = MegatronIndexed(folder / "train", fix=PREPARE_FIX)
    name = f"{folder}/train" if data else "the embedded corpus (train split)"
    return [DocumentSource(name, 1.0, document_offsets(indexed, 0, indexed.num_docs))]


def in_run_terms(err: UserError, name: str | None = None) -> UserError:
    """A sampler's error in a run's terms: the source it is about, ``min_difficulty`` for ``min_length``."""
    message = f"curriculum mode variable{', ' + name if name else ''}: {err}"
    return UserError(message.replace("min_length", "min_difficulty"))


def decompose_sources(sources: Sequence[DocumentSource], settings: VariableSettings) -> list[Decomposition]:
    """Each source's training documents cut into power-of-2 chunks between the settings' lengths."""
    return [decompose(s.offsets, settings.min_length, settings.max_length) for s in sources]


def variable_plan(
    cfg: RunConfig,
    decompositions: Sequence[Decomposition],
    weights: Sequence[float],
    *,
    names: Sequence[str] | None = None,
    seed: int,
    world_size: int,
    rows: int = 24,
    keep_steps: bool = False,
) -> VariablePlan:
    """The run of ``cfg`` in curriculum mode variable over these sources ahead of time: the draw training
    makes (the same settings, seeds and steps), to the config's budget, with its LR (``keep_steps``: every
    step's length too)."""
    settings = VariableSettings.of(cfg)
    try:
        return plan_variable(
            list(decompositions),
            settings.tokens_per_step(world_size),
            weights=list(weights),
            names=list(names) if names else None,
            seed=seed,
            world_size=world_size,
            train_tokens=cfg.train_tokens,
            train_iters=cfg.train_iters,
            train_samples=cfg.train_samples,
            lr=cfg.lr,
            rows=rows,
            keep_steps=keep_steps,
            **settings.sampler_options(world_size),
        )
    except UserError as err:
        raise in_run_terms(err) from None
