"""``SequenceLengthWarmup(mode="variable")``: the variable-length sampler inside the one object a loop holds.

In this mode :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` keeps its clock, LR and budget and
hands the lengths to a :class:`~seqwarm.curriculum.variable.VariableLengthSampler` over the documents
(docs/VARIABLE.md): ``begin_step()`` returns the step's length, ``cut`` passes the step's rows through at
that length (a batch of another length is an error) and counts ``B x L`` tokens, ``state_dict()`` holds
the sampler's state. :class:`StepSampler` is that part (``slw.sampler``), and what a ``DataLoader`` takes as
``batch_sampler=``.

The steps are drawn once, in order, by whichever asks first — ``begin_step()`` or the DataLoader's
iterator, which may run ahead with prefetching workers — so both see the same sequence, and the state a
checkpoint holds is the sampler's before the first step not yet ended: a resume draws the steps the run
had not trained, whatever the DataLoader had prefetched. A step ended with ``applied=False`` (an fp16
skip) is not retried: its rows are gone from the DataLoader, so the next step is the next draw.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from seqwarm.curriculum.decompose import Decomposition, decompose, is_power_of_two
from seqwarm.curriculum.inputs import keyword_curriculum
from seqwarm.curriculum.schedule import CurriculumConfig
from seqwarm.curriculum.variable import VariableLengthSampler, VariableStep
from seqwarm.util.errors import UserError
from seqwarm.util.problems import ConfigError, Problem

__all__ = ["MicroBatches", "StepSampler", "variable_lengths", "VARIABLE_SCHEDULES"]

VARIABLE_SCHEDULES = ("natural", "grow_p2", "linear", "root", "discrete")
"""``schedule=`` in mode ``variable``: the sampler's curricula, or a DeepSpeed schedule (root, discrete) as
the cap on the length; with ``curriculum=`` (a DeepSpeed block) and no ``schedule``, the block's schedule."""
_SOURCE = "SequenceLengthWarmup(mode='variable')"


def variable_lengths(args: dict[str, Any]) -> StepSampler | None:
    """The variable mode's part of a SequenceLengthWarmup, from its constructor's arguments (None in another
    mode), every problem of its keywords in one :class:`~seqwarm.util.problems.ConfigError`."""
    mode, documents, tokens_per_step, curriculum = (
        args[k] for k in ("mode", "documents", "tokens_per_step", "curriculum")
    )
    others = {"length_bucket": args["length_bucket"], "stages": args["stages"]}
    mine = {k: args[k] for k in ("documents", "tokens_per_step", "num_cycles", "seed", "rank")}
    if mode != "variable":
        given = [name for name, value in mine.items() if value is not None]
        if given:
            raise ConfigError(
                [
                    Problem(
                        n, _short(mine[n]), f"is a setting of mode 'variable', not {mode!r}", "pass mode='variable'"
                    )
                    for n in given
                ],
                source="SequenceLengthWarmup",
            )
        return None
    problems: list[Problem] = []
    for name, value in others.items():
        if value:
            problems.append(Problem(name, value, "does not apply in mode 'variable'", f"drop {name}="))
    if documents is None:
        problems.append(
            Problem(
                "documents",
                None,
                "is required",
                "pass the documents' offsets into the token stream "
                "(n + 1 integers) or a Decomposition from decompose()",
            )
        )
    if not isinstance(tokens_per_step, int) or isinstance(tokens_per_step, bool) or tokens_per_step < 1:
        problems.append(
            Problem(
                "tokens_per_step",
                tokens_per_step,
                "must be a positive integer",
                "pass the tokens every optimizer step trains, over all ranks",
            )
        )
    low, high, names = _range(args, curriculum, documents, problems)
    sampler_kwargs = _curriculum(args, curriculum, low, high, names, problems)
    if problems:
        raise ConfigError(problems, source=_SOURCE)
    chunks = documents if isinstance(documents, Decomposition) else decompose(documents, low, high)
    rank, world = _ranks(args["rank"], args["world_size"], args["process_group"])
    sampler = VariableLengthSampler(chunks, tokens_per_step, **sampler_kwargs, rank=rank, world_size=world)
    out = StepSampler(sampler)
    if args["rank"] is None or args["world_size"] is None:  # torch.distributed's: checked again at each begin
        out.ranks_from = (args["rank"], args["world_size"], args["process_group"])
    return out


def _short(value: Any) -> Any:
    """A value as a problem shows it: an array or a Decomposition by its kind and size."""
    if isinstance(value, Decomposition):
        return f"Decomposition({value.num_chunks} chunks)"
    return (
        f"{type(value).__name__} of {len(value)}" if hasattr(value, "__len__") and not isinstance(value, str) else value
    )


def _range(
    keywords: dict[str, Any], curriculum: CurriculumConfig | None, documents: Any, problems: list[Problem]
) -> tuple[int, int, tuple[str, str]]:
    """The length range: the keywords, a DeepSpeed block's min/max_difficulty, or a Decomposition's own."""
    names = ("min_difficulty", "max_difficulty") if curriculum is not None else ("min_length", "max_length")
    given = (curriculum.min_difficulty, curriculum.max_difficulty) if curriculum is not None else None
    given = given or (keywords["min_length"], keywords["max_length"])
    if isinstance(documents, Decomposition):
        own = (documents.min_length, documents.max_length)
        if given == (None, None):
            return (*own, names)
        if tuple(given) != own:
            problems.append(
                Problem(
                    f"{names[0]}, {names[1]}",
                    list(given),
                    f"differ from the decomposition's {list(own)}",
                    "decompose() with the same range, or pass the offsets instead",
                )
            )
    for name, value in zip(names, given):
        if not is_power_of_two(value):
            problems.append(
                Problem(
                    name,
                    value,
                    "must be a power of 2 in mode 'variable' (the buckets' lengths)",
                    "use e.g. 64 and 1024",
                )
            )
    low, high = given
    if is_power_of_two(low) and is_power_of_two(high) and low > high:
        problems.append(Problem(names[0], low, f"is above {names[1]} {high}", "swap them"))
    low, high = (int(v) if is_power_of_two(v) else 0 for v in (low, high))  # 0: a problem said above
    return low, high, names


def _curriculum(
    keywords: dict[str, Any], curriculum: CurriculumConfig | None, low: int, high: int, names, problems: list[Problem]
) -> dict[str, Any]:
    """The sampler's curriculum keywords from ``schedule`` (and ``steps``, ``num_cycles``, the DeepSpeed
    keywords) or the block's schedule."""
    schedule, steps, cycles, seed = keywords["schedule"], keywords["steps"], keywords["num_cycles"], keywords["seed"]
    if schedule is None:
        schedule = "schedule" if curriculum is not None else "natural"
    elif schedule not in VARIABLE_SCHEDULES:
        problems.append(
            Problem(
                "schedule",
                schedule,
                f"is not one of {', '.join(VARIABLE_SCHEDULES)} in mode 'variable'",
                "natural (in proportion to each bucket's tokens), grow_p2, or linear with steps=",
            )
        )
        return {}
    out: dict[str, Any] = {"curriculum": schedule, "seed": 0 if seed is None else seed}
    if schedule == "grow_p2":
        out["num_cycles"] = 8 if cycles is None else cycles
    elif cycles is not None:
        problems.append(Problem("num_cycles", cycles, "is a setting of schedule 'grow_p2'", "drop it"))
    if schedule == "linear" and steps is None:
        problems.append(
            Problem(
                "steps",
                None,
                "is required by schedule 'linear'",
                f"pass the optimizer steps over which the cap grows to {names[1]}",
            )
        )
    if schedule == "linear":
        out["total_steps"] = steps
    elif steps is not None and schedule in ("natural", "grow_p2"):
        problems.append(Problem("steps", steps, f"is not used by schedule {schedule!r}", "drop it, or use 'linear'"))
    if schedule in ("root", "discrete"):  # a DeepSpeed schedule as the cap, checked as the keyword constructor does
        rest = [keywords[k] for k in ("multiple_of", "root_degree", "lengths", "until_steps")]
        try:
            out["schedule"] = keyword_curriculum(low, high, steps, rest[0], schedule, *rest[1:])
        except ConfigError as err:
            problems.extend(err.problems)
        out["curriculum"] = "schedule"
    elif schedule == "schedule":
        out["schedule"] = curriculum
    return out


def _ranks(rank: Any, world_size: Any, group: Any = None) -> tuple[int, int]:
    """This process's rank and the data-parallel size: given, or torch.distributed's (in ``group``, the
    clock's ``process_group``), or 0 and 1."""
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    world = world_size if world_size is not None else (dist.get_world_size(group) if live else 1)
    return (rank if rank is not None else (dist.get_rank(group) if live else 0)), world


class StepSampler:
    """``slw.sampler`` in mode ``variable``: the sampler's steps as SequenceLengthWarmup begins and ends
    them, and what a ``DataLoader`` takes as ``batch_sampler=`` — iterated, this rank's chunk indices, one
    list per step in the order ``begin_step()`` trains them, without end (:meth:`micro_batches`: one list
    per micro-batch). A new iterator starts at the first step not yet ended. See the module."""

    def __init__(self, sampler: VariableLengthSampler):
        self.sampler = sampler
        """The :class:`~seqwarm.curriculum.variable.VariableLengthSampler` drawing the steps."""
        self.ended = sampler.step
        """Steps ended so far (applied or skipped): the next :meth:`begin` is step ``ended + 1``."""
        self.step: VariableStep | None = None
        """The step in flight (or the last one): its length, this rank's chunk indices, epoch, cycle."""
        self._drawn: dict[int, tuple[dict[str, Any], VariableStep]] = {}  # step -> (state before it, it)
        self.ranks_from: tuple[Any, Any, Any] | None = None
        """``(rank, world_size, process_group)`` as given when one was left to torch.distributed: :meth:`begin`
        checks it still gives the same."""

    def step_at(self, number: int) -> VariableStep:
        """Step ``number`` (1-based), drawn now when nobody drew it yet."""
        while self.sampler.step < number:
            before = self.sampler.state_dict()
            drawn = self.sampler.next_step()
            self._drawn[drawn.step] = (before, drawn)
        if number not in self._drawn:
            raise RuntimeError(f"variable lengths: step {number} was ended already (the next step is {self.ended + 1})")
        return self._drawn[number][1]

    def begin(self) -> int:
        """Begin step ``ended + 1``: its length. UserError when the ranks were taken from torch.distributed
        and it now has others (built before the process group: every rank would train the same rows)."""
        if self.ranks_from is not None:
            now, built = _ranks(*self.ranks_from), (self.sampler.rank, self.sampler.world_size)
            if now != built:
                raise UserError(
                    f"variable lengths: the sampler was built for rank {built[0]} of {built[1]}, but this process "
                    f"is rank {now[0]} of {now[1]} (SequenceLengthWarmup was built before torch.distributed was "
                    "initialized): every rank would train the same rows; build it after init_process_group, or pass "
                    "rank= and world_size= (e.g. from the launcher's RANK and WORLD_SIZE)"
                )
        self.step = self.step_at(self.ended + 1)
        return self.step.length

    def end(self) -> None:
        self.ended += 1
        self._drawn = {n: v for n, v in self._drawn.items() if n > self.ended}

    def check_cut(self, seq: int) -> None:
        """A micro-batch at another length than the step's is not one of its rows: said, not trained."""
        if self.step is not None and seq != self.step.length:
            raise ValueError(
                f"mode 'variable': the batch's rows are {seq} tokens long but step {self.step.step} trains length "
                f"{self.step.length}: hand cut() the step's rows at its length (inputs row[:, :-1], targets "
                "row[:, 1:] of rows read with shift=1), exactly the step's micro-batches "
                "(slw.sampler.micro_batches(tokens).per_step of them)"
            )

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state before the first step not yet ended (so a resume draws it again)."""
        first = self._drawn.get(self.ended + 1)
        return first[0] if first is not None else self.sampler.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Continue from a :meth:`state_dict`; the sampler refuses a changed range, corpus or curriculum."""
        if state is None:
            raise UserError(
                "variable lengths: the saved SequenceLengthWarmup state has no sampler state (saved in another "
                "mode): a resume in mode 'variable' needs a state saved in it"
            )
        self.sampler.load_state_dict(state)
        self.ended, self._drawn, self.step = self.sampler.step, {}, None

    @property
    def decomposition(self) -> Decomposition:
        """The chunks the steps' indices point at (``decomposition.rows(tokens, indices)`` reads them)."""
        return self.sampler.decomposition

    def stats(self) -> dict[str, Any]:
        """The sampler's :meth:`~seqwarm.curriculum.variable.VariableLengthSampler.stats`."""
        return self.sampler.stats()

    def micro_batches(self, micro_batch_tokens: int) -> MicroBatches:
        """The same steps, one index list per micro-batch of ``micro_batch_tokens`` tokens on this rank."""
        return MicroBatches(self, micro_batch_tokens)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(MicroBatches(self, None))


class MicroBatches:
    """``slw.sampler.micro_batches(tokens)``: each step's rows on this rank as :attr:`per_step` index lists
    of ``micro_batch_tokens / L`` rows each (:meth:`VariableStep.micro_batches
    <seqwarm.curriculum.variable.VariableStep.micro_batches>`), for ``DataLoader(batch_sampler=...)``."""

    def __init__(self, steps: StepSampler, micro_batch_tokens: int | None):
        self._steps = steps
        s = steps.sampler
        per_rank = s.tokens_per_step // s.world_size
        top, m = s.decomposition.max_length, per_rank if micro_batch_tokens is None else micro_batch_tokens
        if not isinstance(m, int) or m < top or m % top or per_rank % m:
            rule = f"must be a multiple of max_length {top} that divides this rank's {per_rank} tokens per step"
            raise ConfigError([Problem("micro_batch_tokens", m, rule, f"use e.g. {per_rank}")], source="slw.sampler")
        self.micro_batch_tokens = m
        self.per_step = per_rank // m
        """Index lists (micro-batches) per step: the loop's gradient accumulation."""

    def __iter__(self) -> Iterator[list[int]]:
        number = self._steps.ended + 1
        while True:
            yield from self._steps.step_at(number).micro_batches(self.micro_batch_tokens)
            number += 1
