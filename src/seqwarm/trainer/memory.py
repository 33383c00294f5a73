"""Memory checked before allocating: will the model, its gradients, AdamW's states and the largest
activations fit? Asked before the model is built, so a run too big for the machine stops with a clear
exit 2 instead of an allocator traceback (or the kernel's OOM killer) minutes later.

The estimate is a lower bound, from the model config alone (no tensor is made):

- weights, gradients: 4 bytes per parameter each (fp32 master weights; autocast does not change them);
- AdamW: two fp32 states per parameter (8 bytes);
- activations: the residual stream kept for the backward, one ``micro x seq x n_embd`` tensor per layer
  plus the embedding output, and the logits with their log-probabilities (``micro x seq x vocab``, 4 bytes
  each; 2 + 4 in half precision);
- sharded states (FSDP2, DeepSpeed ZeRO) divided by the number of processes that share them.

What a run really needs is more (attention scores, MLP activations, the allocator's slack, CUDA's
context), so passing this check does not promise the run fits: the trial step at full length
(:meth:`seqwarm.trainer.loop.Run._probe_memory`) catches the rest. Failing it means the run cannot fit.

Available memory: on a CPU, ``MemAvailable`` from ``/proc/meminfo`` (else ``os.sysconf``), lowered to a
cgroup v2 limit when the process runs under one, and shared by the processes of this machine
(``LOCAL_WORLD_SIZE``); on a GPU, the device's free memory (``torch.cuda.mem_get_info``), and the host
must also hold the weights, which are built there first. ``SEQWARM_MEMORY_LIMIT`` (bytes, or with a unit:
``512MiB``, ``24GiB``, ``1.5e9``) replaces the measured figure; ``off`` skips the check.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqwarm.util.errors import UserError

__all__ = [
    "LIMIT_ENV",
    "MemoryEstimate",
    "estimate_memory",
    "gpt_params",
    "parse_bytes",
    "available_memory",
    "check_memory",
]

LIMIT_ENV = "SEQWARM_MEMORY_LIMIT"
"""Environment variable: the memory a run may assume it has (``off``: no check)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """``"24GiB"`` -> 25769803776; ``"1.5e9"``, ``"512MB"``, ``"4096"``. ValueError with the reason."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (write e.g. 24GiB, 512MB or 1e9)")
    try:
        value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    except ValueError:
        raise ValueError(f"{text!r} is not a size (write e.g. 24GiB, 512MB or 1e9)") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} must be a positive size")
    return int(value)


def gib(n: float) -> str:
    """Bytes as GiB (MiB below 1 GiB), for messages."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


@dataclass(frozen=True)
class MemoryEstimate:
    """The lower bound of what one process holds, in bytes, by part."""

    params: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    shape: str
    """How the activations were counted (micro-batch x length x vocabulary)."""

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def describe(self) -> str:
        return (
            f"{gib(self.total)} ({self.params:,} parameters: weights {gib(self.weights)}, gradients "
            f"{gib(self.gradients)}, AdamW states {gib(self.optimizer)}; activations {gib(self.activations)} "
            f"for {self.shape})"
        )


def estimate_memory(
    num_params: int,
    *,
    vocab_rows: int,
    n_embd: int,
    n_layer: int,
    micro_batch: int,
    seq_length: int,
    half: bool = False,
    shards: int = 1,
) -> MemoryEstimate:
    """The lower bound of one process's memory (see the module's docstring); ``shards``: processes that
    split the weights, gradients and optimizer states (FSDP2, ZeRO), 1 when every process holds them all."""
    shards = max(1, int(shards))
    per = -(-int(num_params) // shards)
    tokens = int(micro_batch) * int(seq_length)
    act_bytes = 2 if half else 4
    residual = tokens * int(n_embd) * act_bytes * (int(n_layer) + 1)
    logits = tokens * int(vocab_rows) * (act_bytes + 4)  # the logits, and the fp32 log-probs of the loss
    return MemoryEstimate(
        params=int(num_params),
        weights=4 * per,
        gradients=4 * per,
        optimizer=8 * per,
        activations=residual + logits,
        shape=f"micro-batch {micro_batch} x length {seq_length} x vocabulary {vocab_rows:,}",
    )


def gpt_params(
    n_embd: int,
    n_layer: int,
    vocab_rows: int,
    seq_length: int,
    *,
    bias: bool = True,
    rotary: bool = False,
    non_embedding: bool = False,
) -> int:
    """The parameters of seqwarm's GPT from its sizes, without building it (what
    :meth:`~seqwarm.trainer.model.GPTConfig.num_params` and ``seqwarm plan``'s estimate count): the tied
    embedding (``vocab_rows`` rows), per layer two LayerNorms, the attention's qkv and output, the MLP, the
    final LayerNorm, and learned positions (``seq_length`` rows) unless ``rotary``."""
    d, n = int(n_embd), int(n_layer)
    ln = 2 * d if bias else d
    b = 1 if bias else 0
    per_layer = 2 * ln + (3 * d * d + b * 3 * d) + (d * d + b * d)  # two LNs, qkv, out-proj
    per_layer += (4 * d * d + b * 4 * d) + (4 * d * d + b * d)  # MLP up, down
    total = int(vocab_rows) * d + n * per_layer + ln
    if not rotary and not non_embedding:
        total += int(seq_length) * d
    return total


def _limit_from_env() -> int | None | str:
    """The limit ``SEQWARM_MEMORY_LIMIT`` sets: bytes, ``"off"``, or None when it is not set."""
    raw = os.environ.get(LIMIT_ENV, "").strip()
    if not raw:
        return None
    if raw.lower() in ("off", "none"):
        return "off"
    try:
        return parse_bytes(raw)
    except ValueError as err:
        raise UserError(
            f"{LIMIT_ENV}={raw}: {err}; set it to the memory a run may use (e.g. 24GiB), or to off "
            "to skip the memory check"
        ) from None


def _meminfo_available() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _cgroup_room() -> int | None:
    """What a cgroup v2 memory limit leaves this process's group (None: no limit)."""
    try:
        line = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
        rel = next(x.split(":", 2)[2] for x in line if x.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text(encoding="ascii").strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text(encoding="ascii").strip()))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def host_available() -> tuple[int, str] | None:
    """Free host memory in bytes and where the figure comes from (None when it cannot be read)."""
    found = _meminfo_available()
    source = "MemAvailable in /proc/meminfo"
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            source = "free physical pages (os.sysconf)"
        except (ValueError, OSError, AttributeError):
            return None
    room = _cgroup_room()
    if room is not None and room < found:
        found, source = room, "the cgroup's memory.max less memory.current"
    return found, source


def available_memory(device: Any) -> tuple[int, str] | None:
    """``(bytes, source)`` free on ``device`` (a torch.device or "cpu" / "cuda:N"), or None when unknown."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free memory of {device} (torch.cuda.mem_get_info)"
    if kind == "cpu":
        return host_available()
    return None  # mps and others: no reliable figure


def _fix(sharded: bool) -> str:
    more = "" if sharded else ", shard the states over more GPUs with --fsdp"
    return (
        "choose a smaller --model (or --n-layer / --n-embd), a smaller train_micro_batch_size_per_gpu "
        f"(raise gradient_accumulation_steps to keep the global batch){more}, or run where more memory is "
        f"free; if the estimate is wrong for this machine, set {LIMIT_ENV} to the memory to assume (or off)"
    )


def check_memory(estimate: MemoryEstimate, device: Any, *, local_processes: int = 1, sharded: bool = False) -> None:
    """UserError (exit 2) when ``estimate`` cannot fit on ``device``; on a GPU the host must also hold the
    weights while the model is built. ``local_processes``: processes of this run on this host (they share
    its memory). Nothing is checked when the free memory cannot be read or ``SEQWARM_MEMORY_LIMIT=off``."""
    limit = _limit_from_env()
    if limit == "off":
        return
    kind = getattr(device, "type", str(device).split(":")[0])
    checks = [(estimate.total, device, estimate.describe())]
    if kind == "cuda":
        checks.append((estimate.weights, "cpu", f"{gib(estimate.weights)} of weights, built on the host first"))
    for need, where, what in checks:
        where_kind = getattr(where, "type", str(where).split(":")[0])
        if isinstance(limit, int):
            have, source = limit, f"{LIMIT_ENV}={os.environ[LIMIT_ENV].strip()}"
        else:
            found = available_memory(where)
            if found is None:
                continue
            have, source = found
        share = max(1, int(local_processes)) if where_kind == "cpu" else 1
        if need * share > have:
            each = f" for each of {share} processes on this machine" if share > 1 else ""
            raise UserError(
                f"not enough memory on {where}: the run needs at least {what}{each}, but {gib(have)} is available "
                f"({source}); {_fix(sharded)}"
            )
