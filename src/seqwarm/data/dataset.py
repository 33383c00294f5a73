"""Training and validation batches from a prepared folder (see :mod:`seqwarm.data.prepare`).

A split is one token stream (documents back to back, each ending with EOD). It is cut into
non-overlapping windows of ``seq_length + 1`` tokens with stride ``seq_length`` (window ``i`` is
``tokens[i*S : i*S + S + 1]``), so inputs and shifted labels both have ``S`` tokens. Batches are dicts
of torch tensors at full length; the engine cuts them to the current curriculum length.

Label conventions (``label_style``): ``"megatron"`` (the default) gives ``labels`` = the inputs shifted
by one (``labels[:, t]`` is the token after ``input_ids[:, t]``) plus a ``loss_mask``, for models that
do not shift (seqwarm's GPT, Megatron-DeepSpeed). ``"hf"`` gives ``labels`` = ``input_ids`` (no
``loss_mask``; positions without loss are -100), for Hugging Face causal LMs, which shift labels
themselves: feeding them Megatron labels would shift twice and train on a wrong loss, silently.

Training order (:class:`TrainBatches`): each epoch a seeded permutation of all windows; a *global
micro-batch* is ``micro_batch_size * world_size`` consecutive windows of it and rank ``r`` takes the
``r``-th block of ``micro_batch_size``, so ranks see disjoint windows and together the whole global
micro-batch. An epoch's tail shorter than a global micro-batch is skipped. The position is two integers
(``epoch``, ``sample_index``), saved by :meth:`TrainBatches.state_dict`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from seqwarm.data.indexed import MegatronIndexed
from seqwarm.util.errors import UserError

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]

LABEL_STYLES = ("megatron", "hf")
"""``megatron``: labels are the inputs shifted by one; ``hf``: labels are the inputs (the model shifts)."""


def check_label_style(label_style: str) -> str:
    if label_style not in LABEL_STYLES:
        raise UserError(
            f"label_style must be one of {', '.join(LABEL_STYLES)}, got {label_style!r}: 'megatron' "
            "for models that take shifted labels, 'hf' for Hugging Face models (they shift)"
        )
    return label_style


def build_batch(
    windows: np.ndarray,
    *,
    eod_id: int | None = None,
    eod_mask_loss: bool = False,
    reset_position_ids: bool = False,
    label_style: str = "megatron",
    document_masking: bool = False,
) -> Batch:
    """Turn ``windows`` (int64, ``[B, S+1]``) into ``input_ids``, ``labels`` (int64 ``[B, S]``),
    ``loss_mask`` (float32) and ``position_ids`` (int64).

    ``eod_mask_loss``: no loss where the *input* token is EOD (predicting across a document boundary).
    ``reset_position_ids``: positions restart at 0 on the token after each EOD (Megatron semantics).
    ``label_style="hf"``: ``labels`` = ``input_ids`` and no ``loss_mask`` (the model shifts; with
    ``eod_mask_loss`` the label after an EOD input is -100, the same targets as Megatron's mask).
    ``document_masking``: positions restart after each EOD (as ``reset_position_ids``) and
    ``document_ids`` (int64 ``[B, S]``) number the documents apart over the whole batch (a row's
    document is ``row * S +`` the column it starts at), for attention inside each document.
    """
    check_label_style(label_style)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows must be [B, S+1] with S >= 1, got shape {windows.shape}")
    if (eod_mask_loss or reset_position_ids or document_masking) and eod_id is None:
        raise ValueError("eod_mask_loss / reset_position_ids / document_masking need eod_id")
    windows = np.ascontiguousarray(windows, dtype=np.int64)
    inputs = windows[:, :-1]  # (B, S)
    labels = windows[:, 1:]  # (B, S)
    b, s = inputs.shape
    loss_mask = np.ones((b, s), dtype=np.float32)
    if eod_mask_loss:
        loss_mask[inputs == eod_id] = 0.0
    arange = np.arange(s, dtype=np.int64)
    extra: Batch = {}
    if reset_position_ids or document_masking:
        # A document starts at t = 0 and after every EOD; position = t - (start of t's document).
        starts = np.zeros((b, s), dtype=bool)
        starts[:, 0] = True
        starts[:, 1:] = inputs[:, :-1] == eod_id
        last_start = np.maximum.accumulate(np.where(starts, arange, 0), axis=1)
        position_ids = arange - last_start  # (B, S)
        if document_masking:  # unique over the batch, so a reshape never joins two rows' documents
            extra["document_ids"] = torch.from_numpy(last_start + s * np.arange(b, dtype=np.int64)[:, None])
    else:
        position_ids = np.broadcast_to(arange, (b, s)).copy()
    if label_style == "hf":  # the model predicts labels[:, t + 1] from input t: mask it after an EOD input
        labels = inputs.copy()
        if eod_mask_loss:
            labels[:, 1:][inputs[:, :-1] == eod_id] = -100
        return {
            "input_ids": torch.from_numpy(np.ascontiguousarray(inputs)),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            **extra,
        }
    return {
        "input_ids": torch.from_numpy(np.ascontiguousarray(inputs)),
        "labels": torch.from_numpy(np.ascontiguousarray(labels)),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(position_ids),
        **extra,
    }


class TokenWindows:
    """Fixed windows of ``seq_length + 1`` tokens (stride ``seq_length``) over a 1-D token array.

    ``source``: the token file the array maps; every read first checks that it is still the file opened
    (:meth:`~seqwarm.data.indexed.MegatronIndexed.check_unchanged`, one ``stat``), so a file truncated or
    rewritten under a running job is an error naming it, not a SIGBUS or a silently different run.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_length: int,
        *,
        eod_id: int | None = None,
        eod_mask_loss: bool = False,
        reset_position_ids: bool = False,
        name: str = "split",
        label_style: str = "megatron",
        document_masking: bool = False,
        source: MegatronIndexed | None = None,
    ):
        if int(seq_length) < 1:
            raise UserError(f"seq_length must be at least 1, got {seq_length}")
        self.label_style = check_label_style(label_style)
        self.tokens = tokens
        self.source = source
        self.seq_length = int(seq_length)
        self.eod_id = eod_id
        self.eod_mask_loss = eod_mask_loss
        self.reset_position_ids = reset_position_ids
        self.document_masking = document_masking
        self.name = name
        self.num_windows = (len(tokens) - 1) // self.seq_length if len(tokens) else 0
        if self.num_windows < 1:
            raise UserError(
                f"the {name} split has {len(tokens)} tokens, too few for one window of "
                f"seq_length + 1 = {self.seq_length + 1}; use a shorter sequence length "
                "or more data"
            )

    def __len__(self) -> int:
        return self.num_windows

    def window_array(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The windows ``indices`` as int64 ``[B, S+1]`` (one memmap slice per row)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.num_windows):
            raise IndexError(f"window index out of range 0..{self.num_windows - 1}")
        if self.source is not None:
            self.source.check_unchanged()
        s = self.seq_length
        out = np.empty((len(idx), s + 1), dtype=np.int64)
        for row, i in enumerate(idx.tolist()):
            out[row] = self.tokens[i * s : i * s + s + 1]
        return out

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        return build_batch(
            self.window_array(indices),
            eod_id=self.eod_id,
            eod_mask_loss=self.eod_mask_loss,
            reset_position_ids=self.reset_position_ids,
            label_style=self.label_style,
            document_masking=self.document_masking,
        )

    def with_label_style(self, label_style: str) -> TokenWindows:
        """The same windows with batches in ``label_style`` (``self`` when it already is)."""
        if label_style == self.label_style:
            return self
        return TokenWindows(
            self.tokens,
            self.seq_length,
            eod_id=self.eod_id,
            eod_mask_loss=self.eod_mask_loss,
            reset_position_ids=self.reset_position_ids,
            name=self.name,
            label_style=label_style,
            document_masking=self.document_masking,
            source=self.source,
        )

    def __getitem__(self, i: int) -> Batch:
        """One window as 1-D tensors (map-style dataset, e.g. for a ``torch.utils.data.DataLoader``)."""
        if i < 0:
            i += self.num_windows
        return {k: v[0] for k, v in self.batch([i]).items()}


class TrainBatches:
    """Infinite training micro-batches: shuffled per epoch, sharded by rank, resumable.

    ``next_batch()`` returns this rank's ``micro_batch_size`` windows of the next global micro-batch.
    All ranks must call it equally often (they do: gradient accumulation is the same everywhere).
    """

    def __init__(
        self,
        windows: TokenWindows,
        micro_batch_size: int,
        *,
        seed: int = 1234,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ):
        if micro_batch_size < 1:
            raise UserError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")
        if seed < 0:
            raise UserError(f"data seed must be non-negative, got {seed}")
        self.windows = windows
        self.micro_batch_size = int(micro_batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.global_micro_batch = self.micro_batch_size * self.world_size
        if len(windows) < self.global_micro_batch:
            raise UserError(
                f"the {windows.name} split has {len(windows)} windows of {windows.seq_length + 1} "
                f"tokens, fewer than one global micro-batch ({self.micro_batch_size} x "
                f"{self.world_size} ranks); use more data, a shorter sequence or a smaller batch"
            )
        self.epoch = 0
        self.sample_index = 0  # global windows already served in this epoch
        self._order_epoch = -1
        self._order = np.zeros(0, dtype=np.int64)

    @property
    def samples_per_epoch(self) -> int:
        """Global windows served per epoch (the tail shorter than a global micro-batch is skipped)."""
        return len(self.windows) // self.global_micro_batch * self.global_micro_batch

    def order(self, epoch: int) -> np.ndarray:
        """The window order of ``epoch`` (same on every rank: it depends only on seed and epoch)."""
        if epoch != self._order_epoch:
            n = len(self.windows)
            self._order = (
                np.random.default_rng([self.seed, epoch]).permutation(n)
                if self.shuffle
                else np.arange(n, dtype=np.int64)
            )
            self._order_epoch = epoch
        return self._order

    def next_indices(self) -> np.ndarray:
        """Window indices of this rank's next micro-batch; advances the position."""
        if self.sample_index + self.global_micro_batch > len(self.windows):
            self.epoch += 1
            self.sample_index = 0
        start = self.sample_index + self.rank * self.micro_batch_size
        idx = self.order(self.epoch)[start : start + self.micro_batch_size]
        self.sample_index += self.global_micro_batch
        return idx

    def next_batch(self) -> Batch:
        return self.windows.batch(self.next_indices())

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "sample_index": self.sample_index,
            "seed": self.seed,
            "num_windows": len(self.windows),
            "seq_length": self.windows.seq_length,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "epoch" not in state:  # another source's position: say which
            kind = (
                "curriculum mode variable"
                if "variable" in state
                else "stages, whose windows change length"
                if "source" in state
                else "a --data-path blend of several sources"
            )
            raise UserError(
                f"cannot resume the data position: the checkpoint was written with other training data ({kind}); "
                "resume it with the settings it was written with, or start a new run (--out)"
            )
        for key, mine in (
            ("seq_length", self.windows.seq_length),
            ("seed", self.seed),
            ("shuffle", self.shuffle),
            ("num_windows", len(self.windows)),
        ):
            if key in state and state[key] != mine:
                raise UserError(
                    f"cannot resume the data position: the checkpoint has {key}={state[key]} "
                    f"but this run has {key}={mine} (different data, sequence length or seed)"
                )
        epoch, index = int(state["epoch"]), int(state["sample_index"])
        if epoch < 0 or not 0 <= index <= len(self.windows):
            raise UserError(f"invalid data position in checkpoint: epoch {epoch}, sample_index {index}")
        self.epoch, self.sample_index = epoch, index


def eval_window_indices(total: int, num_windows: int | None) -> np.ndarray:
    """Which windows an evaluation of ``num_windows`` uses: all of them, or that many spread evenly
    over the split (first and last included), so every held-out document is represented — the first
    K windows in order would all come from the first document."""
    if num_windows is None or num_windows >= total:
        return np.arange(total, dtype=np.int64)
    return np.unique(np.linspace(0, total - 1, num_windows).round().astype(np.int64))


def iter_eval_batches(
    windows: TokenWindows, micro_batch_size: int, *, num_windows: int | None = None, rank: int = 0, world_size: int = 1
) -> Iterator[Batch]:
    """``num_windows`` windows (all when ``None``) spread evenly over the split, in order, at full length.

    Rank ``r`` of ``world_size`` takes every ``world_size``-th of them, starting at ``r``, and every rank
    the same number (the last ``len % world_size`` windows are left out: a sharded model's ranks must run
    the same forwards); the last batch may be smaller.
    """
    if micro_batch_size < 1:
        raise UserError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
    total = len(windows)
    if num_windows is not None:
        if num_windows < 1:
            raise UserError(f"the number of evaluation windows must be at least 1, got {num_windows}")
        if num_windows > total:
            logger.warning(
                "the %s split has %d windows of %d tokens; evaluating all of them, not %d",
                windows.name,
                total,
                windows.seq_length + 1,
                num_windows,
            )
    chosen = eval_window_indices(total, num_windows)
    mine = chosen[: len(chosen) - len(chosen) % world_size][rank::world_size]
    for i in range(0, len(mine), micro_batch_size):
        yield windows.batch(mine[i : i + micro_batch_size])
