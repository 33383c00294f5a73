"""The variable-length sampler: one bucket length per optimizer step, the same tokens in every step.

:class:`VariableLengthSampler` walks a :class:`~seqwarm.curriculum.decompose.Decomposition`. Each optimizer
step it picks one bucket length ``L`` and hands out ``tokens_per_step // L`` chunks of that bucket (split
over the data-parallel ranks), so every step trains exactly ``tokens_per_step`` tokens whatever its length,
and every row is one piece of one document. It is a plain iterable of index lists, so a ``DataLoader`` can
take it as ``batch_sampler`` (each rank's list is one step's rows); :meth:`VariableLengthSampler.next_step`
also says the step's length. Docs: docs/VARIABLE.md.

**Epochs.** An epoch uses each bucket's chunks at most once, in an order shuffled per epoch: bucket ``b``
has ``chunks_b // rows_b`` steps (``rows_b = tokens_per_step // L_b``); the ``chunks_b % rows_b`` chunks
left over are not trained in that epoch (a new shuffle leaves others over in the next), and a bucket with
fewer chunks than one step's rows has no steps. When the epoch's steps are used up the next epoch begins
with a new shuffle; the sampler never ends: the loop stops it (its token budget). :meth:`stats` counts
what each of these rules leaves out.

**Curricula** (which bucket a step draws). Every step draws among the buckets that still have steps in the
epoch, with odds ``steps left x weight``:

- ``natural``: weight 1, so the epoch is a uniform shuffle of its steps and each length trains in
  proportion to the tokens its bucket holds.
- ``grow_p2``: the epoch is cut into ``num_cycles`` cycles, each holding an equal share of every bucket's
  steps; within a cycle the i-th shortest bucket weighs ``2 ** (buckets - 1 - i)``, so short buckets are
  used up first and each cycle runs from short to long (Dataset Decomposition's Grow-P2 odds).
- ``linear``: the longest length allowed grows linearly from ``min_length`` at step 1 to ``max_length`` at
  ``total_steps`` (DeepSpeed's ``fixed_linear`` with ``difficulty_step`` 1), natural odds below it.
- ``schedule``: the longest length allowed at step ``s`` is ``difficulty_at(s, schedule)``, any checked
  DeepSpeed curriculum block (``fixed_linear``, ``fixed_root``, ``fixed_discrete``), rounded down to a
  bucket. This is how a DeepSpeed config's curriculum maps onto the variable mode.

Under a cap (``linear``, ``schedule``), when no bucket at or below it has a step left in the epoch the epoch
ends early (its longer steps are skipped, counted in :meth:`stats`); when no bucket at or below it has any
step at all, the shortest bucket that has steps is drawn.

**Ranks and resume.** The draw depends only on the seed and the sampler's state, never on the rank, so
every rank trains the same length each step, each on its own block of the step's rows (``rank``,
``world_size``: no ``torch.distributed`` call). :meth:`state_dict` / :meth:`load_state_dict` carry the whole
state; a resume continues the uninterrupted sequence exactly (also under another ``world_size``), and one
whose length range, ``tokens_per_step``, curriculum, seed or corpus changed is refused with the reason. With a
``DataLoader`` whose workers prefetch, the sampler runs ahead of the loop: save the state of the steps the
loop trained (or iterate the sampler in the loop, as docs/VARIABLE.md does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from seqwarm.curriculum.decompose import Decomposition
from seqwarm.curriculum.schedule import CurriculumConfig, difficulty_at, validate_curriculum_block
from seqwarm.util.errors import UserError

CURRICULA = ("natural", "grow_p2", "linear", "schedule")
"""The curricula over lengths :class:`VariableLengthSampler` takes."""

_STATE_VERSION = 1


@dataclass(frozen=True)
class VariableStep:
    """One optimizer step of the sampler: its length and this rank's chunk indices."""

    step: int
    """1-based optimizer step."""
    length: int
    """The step's length L: every row trains L tokens."""
    indices: list[int]
    """This rank's chunks (indices into the decomposition), ``tokens_per_step // L // world_size`` of them."""
    epoch: int
    cycle: int
    """The Grow-P2 cycle within the epoch (0 for the other curricula)."""

    def micro_batches(self, micro_batch_tokens: int) -> list[list[int]]:
        """This rank's rows split for gradient accumulation into micro-batches of ``micro_batch_tokens``
        tokens each (``micro_batch_tokens // length`` rows): the same tokens, so about the same memory,
        whatever the step's length. ``micro_batch_tokens`` must divide this rank's tokens into whole rows."""
        mine = len(self.indices) * self.length
        if micro_batch_tokens < self.length or micro_batch_tokens % self.length or mine % micro_batch_tokens:
            raise UserError(
                f"variable lengths: micro_batch_tokens {micro_batch_tokens} cannot split this rank's {mine} tokens "
                f"into whole rows of length {self.length}: use a multiple of max_length that divides "
                "tokens_per_step / world_size"
            )
        rows = micro_batch_tokens // self.length
        return [self.indices[i : i + rows] for i in range(0, len(self.indices), rows)]


class VariableLengthSampler:
    """Each step one bucket length and ``tokens_per_step // length`` chunks of it (see the module)."""

    def __init__(
        self,
        decomposition: Decomposition,
        tokens_per_step: int,
        *,
        curriculum: str = "natural",
        num_cycles: int = 8,
        total_steps: int | None = None,
        schedule: CurriculumConfig | dict[str, Any] | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        d = decomposition
        if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise UserError(f"variable lengths: rank {rank!r} must be in [0, world_size {world_size!r})")
        unit = d.max_length * world_size
        if not isinstance(tokens_per_step, int) or tokens_per_step < unit or tokens_per_step % unit:
            raise UserError(
                f"variable lengths: tokens_per_step {tokens_per_step!r} must be a multiple of max_length x world_size "
                f"= {d.max_length} x {world_size} = {unit}, so that every length's rows divide over the ranks"
            )
        if curriculum not in CURRICULA:
            raise UserError(f"variable lengths: curriculum {curriculum!r} is not one of {', '.join(CURRICULA)}")
        if curriculum == "grow_p2" and (not isinstance(num_cycles, int) or num_cycles < 1):
            raise UserError(f"variable lengths: num_cycles must be a positive integer, got {num_cycles!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise UserError(f"variable lengths: seed must be an integer >= 0, got {seed!r}")
        if curriculum == "linear":
            if schedule is not None:
                raise UserError("variable lengths: curriculum 'linear' takes total_steps, not schedule=")
            if not isinstance(total_steps, int) or total_steps < 1:
                raise UserError(f"variable lengths: curriculum 'linear' needs total_steps >= 1, got {total_steps!r}")
            schedule = {
                "enabled": True,
                "curriculum_type": "seqlen",
                "min_difficulty": d.min_length,
                "max_difficulty": d.max_length,
                "schedule_type": "fixed_linear",
                "schedule_config": {"total_curriculum_step": total_steps, "difficulty_step": 1},
            }
        if curriculum in ("linear", "schedule"):
            if schedule is None:
                raise UserError(
                    "variable lengths: curriculum 'schedule' needs schedule= (a DeepSpeed curriculum block)"
                )
            if not isinstance(schedule, CurriculumConfig):
                schedule = validate_curriculum_block(schedule, "schedule")
            if schedule.max_difficulty < d.max_length:
                raise UserError(
                    f"variable lengths: the schedule's max_difficulty {schedule.max_difficulty} never reaches "
                    f"max_length {d.max_length}: the longer buckets would never train; set them equal"
                )
            if schedule.schedule_type == "custom":
                raise UserError("variable lengths: a 'custom' schedule has no lengths to follow; use fixed_* or linear")
        elif schedule is not None or (total_steps is not None and curriculum != "linear"):
            raise UserError(f"variable lengths: curriculum {curriculum!r} takes no schedule or total_steps")
        if d.num_chunks == 0:
            raise UserError(
                f"variable lengths: every one of the {d.num_documents} documents is shorter than min_length "
                f"{d.min_length} (+ shift {d.shift}); lower min_length or use a corpus with longer documents"
            )
        self.decomposition = d
        self.tokens_per_step = tokens_per_step
        self.curriculum = curriculum
        self.num_cycles = num_cycles if curriculum == "grow_p2" else 1
        self.schedule: CurriculumConfig | None = schedule
        self.seed = int(seed)
        self.rank, self.world_size = rank, world_size
        self._lengths = np.array(d.bucket_lengths, dtype=np.int64)
        self._rows = tokens_per_step // self._lengths  # (buckets,) global rows per step
        self._steps = np.array(d.chunks_per_bucket(), dtype=np.int64) // self._rows  # steps per epoch
        if self._steps.sum() == 0:
            raise UserError(
                f"variable lengths: no bucket holds tokens_per_step {tokens_per_step} tokens (chunks per bucket "
                f"{dict(zip(d.bucket_lengths, d.chunks_per_bucket()))}); lower tokens_per_step or add data"
            )
        # (buckets, cycles + 1): steps of each bucket before each cycle (grow_p2's equal shares)
        share = [np.array([len(a) for a in np.array_split(np.arange(n), self.num_cycles)]) for n in self._steps]
        self._before = np.array([np.concatenate([[0], np.cumsum(s)]) for s in share], dtype=np.int64)
        n = len(d.bucket_lengths)
        self._weights = 2.0 ** np.arange(n - 1, -1, -1) if curriculum == "grow_p2" else np.ones(n)
        self._perms: dict[int, np.ndarray] = {}
        self._perm_epoch = -1
        self._fingerprint: str | None = None
        self.step, self.epoch, self.cycle, self.skipped_steps = 0, 0, 0, 0
        self._used = np.zeros(n, dtype=np.int64)

    # ------------------------------------------------------------------ the steps

    @property
    def steps_per_epoch(self) -> int:
        """Steps in a full epoch (a cap can end one earlier)."""
        return int(self._steps.sum())

    def _cap_mask(self, step: int) -> np.ndarray:
        if self.schedule is None:
            return np.ones(self._lengths.size, dtype=bool)
        allowed = self._lengths <= difficulty_at(step, self.schedule)
        if not (allowed & (self._steps > 0)).any():  # nothing at or below the cap ever has a step
            allowed = self._lengths == self._lengths[np.argmax(self._steps > 0)]
        return allowed

    def _odds(self, step: int) -> np.ndarray | None:
        """The draw's odds for this step, moving on a cycle or an epoch as needed (None: the epoch is over)."""
        allowed = self._cap_mask(step)
        while True:
            left = self._before[:, self.cycle + 1] - self._used  # (buckets,) steps left in the cycle
            odds = left * self._weights * allowed
            if odds.sum() > 0:
                return odds
            if self.schedule is None and self.cycle + 1 < self.num_cycles:
                self.cycle += 1
                continue
            return None

    def next_step(self, at: int | None = None, *, indices: bool = True) -> VariableStep:
        """Draw the next optimizer step: its length and this rank's chunk indices. ``at``: the run's step
        number it trains (default: one after the last drawn), which a cap (``linear``, ``schedule``) reads;
        for a sampler that draws only some of a run's steps (one source of a blend). ``indices=False``: no
        indices, the draw alone, as ``plan`` replays a run; the state moves on the same."""
        step = self.step + 1 if at is None else int(at)
        if step <= self.step:
            raise ValueError(f"next_step(at={at}): step {self.step} was drawn already; steps only move forward")
        odds = self._odds(step)
        if odds is None:  # the epoch is used up (or, under a cap, what the cap allows of it)
            self.skipped_steps += int((self._steps - self._used).sum())
            self.epoch, self.cycle = self.epoch + 1, 0
            self._used[:] = 0
            odds = self._odds(step)
            assert odds is not None  # a fresh epoch has steps at or below every cap (see _cap_mask)
        rng = np.random.default_rng([0, self.seed, self.epoch, int(self._used.sum())])
        b = int(rng.choice(odds.size, p=odds / odds.sum()))
        rows = int(self._rows[b])
        lo = int(self._used[b]) * rows
        mine = np.zeros(0, dtype=np.int64)
        if indices:
            chunk = self._perm(b)[lo : lo + rows]  # (rows,) this step's global rows
            per_rank = rows // self.world_size
            mine = chunk[self.rank * per_rank : (self.rank + 1) * per_rank] + self.decomposition.bounds[b]
        self._used[b] += 1
        self.step = step
        return VariableStep(
            step=step, length=int(self._lengths[b]), indices=mine.tolist(), epoch=self.epoch, cycle=self.cycle
        )

    def _perm(self, b: int) -> np.ndarray:
        if self._perm_epoch != self.epoch:
            self._perms, self._perm_epoch = {}, self.epoch
        if b not in self._perms:
            n = int(self.decomposition.bounds[b + 1] - self.decomposition.bounds[b])
            self._perms[b] = np.random.default_rng([1, self.seed, self.epoch, b]).permutation(n)
        return self._perms[b]

    def __iter__(self):
        """This rank's chunk indices, one list per optimizer step, without end (a DataLoader's batch_sampler)."""
        while True:
            yield self.next_step().indices

    # ------------------------------------------------------------------ what it leaves out, and resume

    def stats(self) -> dict[str, Any]:
        """What the decomposition and the sampler leave out, and each bucket's share (JSON-able)."""
        d = self.decomposition
        tokens = np.array(d.tokens_per_bucket(), dtype=np.int64)
        return {
            "buckets": {
                int(length): {
                    "chunks": int(c),
                    "tokens": int(t),
                    "share": float(t / tokens.sum()),
                    "steps_per_epoch": int(s),
                    "chunks_left_over_per_epoch": int(c - s * r),
                }
                for length, c, t, s, r in zip(d.bucket_lengths, d.chunks_per_bucket(), tokens, self._steps, self._rows)
            },
            "dropped_tokens": d.dropped_tokens,
            "empty_documents": d.empty_documents,
            "steps_per_epoch": self.steps_per_epoch,
            "skipped_steps": self.skipped_steps,
        }

    def _settings(self) -> dict[str, Any]:
        d = self.decomposition
        return {
            "min_length": d.min_length,
            "max_length": d.max_length,
            "shift": d.shift,
            "tokens_per_step": self.tokens_per_step,
            "curriculum": self.curriculum,
            "num_cycles": self.num_cycles,
            "schedule": None if self.schedule is None else self.schedule.block(),
            "seed": self.seed,
            "corpus": self._corpus(),
        }

    def _corpus(self) -> str:
        if self._fingerprint is None:  # hashing every chunk takes a moment on a large corpus: once
            self._fingerprint = self.decomposition.fingerprint()
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """The sampler's whole state after the steps drawn so far (plain Python, JSON-able)."""
        return {
            "version": _STATE_VERSION,
            "step": self.step,
            "epoch": self.epoch,
            "cycle": self.cycle,
            "used": self._used.tolist(),
            "skipped_steps": self.skipped_steps,
            "settings": self._settings(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refused (UserError, naming what changed) when the settings differ."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or "settings" not in state:
            raise UserError("variable lengths: this is not a VariableLengthSampler state (version 1)")
        saved, mine = state["settings"], self._settings()
        changed = [f"{k}: {saved.get(k)!r} in the checkpoint, {mine[k]!r} now" for k in mine if saved.get(k) != mine[k]]
        if changed:
            raise UserError(
                "variable lengths: a resume cannot change the length range, tokens_per_step, curriculum, seed or "
                "corpus (the steps would not continue the run's sequence); changed: " + "; ".join(changed)
            )
        used = np.asarray(state["used"], dtype=np.int64)
        if used.shape != self._used.shape or (used > self._steps).any() or (used < 0).any():
            raise UserError("variable lengths: the state's per-bucket counts do not fit this corpus")
        self.step, self.epoch, self.cycle = int(state["step"]), int(state["epoch"]), int(state["cycle"])
        self.skipped_steps = int(state["skipped_steps"])
        self._used = used.copy()
