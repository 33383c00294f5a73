"""What users hand the curriculum, turned into its parts, and the helpers every engine shares.

:func:`keyword_curriculum` checks ``SequenceLengthWarmup(min_length=..., max_length=..., steps=...)``'s
schedule as DeepSpeed's block (one :class:`~seqwarm.util.problems.ConfigError` naming the keywords);
:func:`check_keys` and :func:`as_batch` read what a loop hands ``cut`` (a dict, under its own key names
or seqwarm's; a tuple or list ``(inputs, targets, ...)``; a tensor) and give the cut back in the same
form, every tensor contiguous; :func:`check_saved_state` says what a state dict handed to
``load_state_dict`` lacks; :func:`set_lr` puts seqwarm's LR on an optimizer; :func:`check_state_format`
checks a state dict's tag.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from seqwarm.curriculum.batch import DOCUMENT_KEY, MASK_KEY, PER_TOKEN_KEYS
from seqwarm.curriculum.checks import aligned_min
from seqwarm.curriculum.run import as_run_config
from seqwarm.curriculum.schedule import CurriculumConfig, validate_curriculum_block
from seqwarm.util.problems import ConfigError, Problem, suggest

__all__ = [
    "BATCH_KEYS",
    "SCHEDULES",
    "STATE_KEYS",
    "as_batch",
    "as_run_config",
    "check_keys",
    "check_saved_state",
    "check_state_format",
    "keyword_curriculum",
    "set_lr",
]
# as_run_config lives in seqwarm.curriculum.run (torch-free); importable from here as before

SCHEDULES = {"linear": "fixed_linear", "root": "fixed_root", "discrete": "fixed_discrete"}
"""The keyword constructor's schedule names -> DeepSpeed's ``schedule_type``."""
_KEYWORD_NAMES = {
    "min_difficulty": "min_length",
    "max_difficulty": "max_length",
    "schedule_config.total_curriculum_step": "steps",
    "schedule_config.difficulty_step": "multiple_of",
    "schedule_config.root_degree": "root_degree",
    "schedule_config.difficulty": "lengths",
    "schedule_config.max_step": "until_steps",
    "schedule_type": "schedule",
}
_KEYWORD_WORDS = {**{k.rsplit(".", 1)[-1]: v for k, v in _KEYWORD_NAMES.items()}, "schedule_config": "the schedule"}
_KEYWORD_WORDS.update({ds: kw for kw, ds in SCHEDULES.items()})
_WORDS = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _KEYWORD_WORDS), key=len, reverse=True)) + r")\b")

BATCH_KEYS = (*PER_TOKEN_KEYS, MASK_KEY, DOCUMENT_KEY)
"""The names seqwarm reads in a dict batch, which ``keys=`` may map to a model's own names."""
STATE_KEYS = ("progress", "skipped_steps", "current_seqlen", "step_seqlen", "pending_samples", "pending_tokens")
"""The keys ``SequenceLengthWarmup.load_state_dict`` needs (those ``state_dict()`` writes, but the optional
``lr`` and ``scheduler``)."""


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every param group gets ``lr * group.get("lr_scale", 1.0)`` (seqwarm owns the learning rate)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def check_state_format(state: Mapping[str, Any], expected: str, owner: str) -> None:
    """Raise ValueError unless ``state["format"]`` is ``expected`` (a state dict of ``owner``)."""
    if state.get("format") != expected:
        raise ValueError(f"not a {owner} state dict (format {state.get('format')!r}, expected {expected!r})")


def keyword_curriculum(
    min_length: Any,
    max_length: Any,
    steps: Any,
    multiple_of: Any,
    schedule: Any,
    root_degree: Any,
    lengths: Any,
    until_steps: Any,
) -> CurriculumConfig:
    """The keyword constructor's schedule, checked like a DeepSpeed block; problems name the keywords."""
    if schedule not in SCHEDULES:
        raise ConfigError(
            [
                Problem(
                    "schedule",
                    schedule,
                    f"must be one of {sorted(SCHEDULES)}",
                    "use 'linear' (recommended), 'root' or 'discrete'",
                )
            ],
            source="SequenceLengthWarmup",
        )
    block: dict[str, Any] = {
        "min_difficulty": min_length,
        "max_difficulty": max_length,
        "schedule_type": SCHEDULES[schedule],
    }
    if schedule == "discrete":
        block["schedule_config"] = {"difficulty": lengths, "max_step": until_steps}
        if isinstance(lengths, (list, tuple)) and lengths and all(isinstance(n, int) for n in lengths):
            block["min_difficulty"] = min(lengths) if min_length is None else min_length  # the lengths' range
            block["max_difficulty"] = max(lengths) if max_length is None else max_length
    else:
        block["schedule_config"] = {
            "total_curriculum_step": steps,
            "difficulty_step": multiple_of,
            **({"root_degree": root_degree} if schedule == "root" else {}),
        }
    block["schedule_config"] = {k: v for k, v in block["schedule_config"].items() if v is not None}
    block = {k: v for k, v in block.items() if v is not None}
    try:
        cfg = validate_curriculum_block(block, path="")
    except ConfigError as err:
        problems = []
        for p in err.problems:
            path = p.path.lstrip(".")
            problems.append(
                Problem(_KEYWORD_NAMES.get(path, path), p.value, _keyword_words(p.rule), _keyword_words(p.fix))
            )
        raise ConfigError(problems, source="SequenceLengthWarmup") from None
    _check_start(cfg, min_length, multiple_of, schedule)
    return cfg


def _keyword_words(text: str) -> str:
    """A message about a DeepSpeed block in the keyword constructor's words (max_difficulty -> max_length)."""
    return _WORDS.sub(lambda m: _KEYWORD_WORDS[m.group(1)], text)


def _check_start(cfg: CurriculumConfig, min_length: Any, multiple_of: int, schedule: str) -> None:
    """A rising schedule starts at the first multiple of ``multiple_of`` from ``min_length`` on: a
    ``min_length`` that is not one would silently start later, so it is refused with both fixes (a
    DeepSpeed block keeps its warning: a config file that runs today still runs)."""
    if schedule == "discrete" or cfg.min_difficulty % multiple_of == 0:
        return
    start = aligned_min(cfg.min_difficulty, multiple_of)
    divisor = math.gcd(cfg.min_difficulty, multiple_of)
    problem = Problem(
        "min_length",
        min_length,
        f"is not a multiple of multiple_of ({multiple_of}{', the default' if multiple_of == 8 else ''}): every "
        f"length is one, so the schedule would start at {start}",
        f"use min_length={start}, or multiple_of={divisor} (a length every step of the ramp is a multiple of)",
    )
    raise ConfigError([problem], source="SequenceLengthWarmup")


def check_keys(keys: Any) -> dict[str, str]:
    """``keys=`` of SequenceLengthWarmup checked: seqwarm's name -> the batch's name (a ConfigError lists
    every problem)."""
    if keys is None:
        return {}
    problems = []
    if not isinstance(keys, Mapping):
        problems.append(Problem("keys", keys, "must be a dict", 'map seqwarm\'s names to yours: {"input_ids": "idx"}'))
        raise ConfigError(problems, source="SequenceLengthWarmup")
    for ours, theirs in keys.items():
        if ours not in BATCH_KEYS:
            guess = suggest(str(ours), BATCH_KEYS)
            hint = f'did you mean "{guess}"?' if guess else f"seqwarm's names are {', '.join(BATCH_KEYS)}"
            problems.append(Problem(f"keys[{ours!r}]", theirs, "is not a name seqwarm reads", hint))
        if not isinstance(theirs, str) or not theirs:
            problems.append(Problem(f"keys[{ours!r}]", theirs, "must be a key name (a str)", "write the batch's key"))
    seen = [t for t in keys.values() if isinstance(t, str)]
    for name in sorted({t for t in seen if seen.count(t) > 1}):
        problems.append(Problem("keys", name, "names one batch key for two of seqwarm's", "map each key once"))
    if problems:
        raise ConfigError(problems, source="SequenceLengthWarmup")
    return {ours: theirs for ours, theirs in keys.items() if ours != theirs}


def as_batch(
    batch: Any, keys: Mapping[str, str], inject: Any = False
) -> tuple[dict[str, Any], Callable[[Mapping[str, Any]], Any]]:
    """What a loop hands ``cut`` as a dict of seqwarm's names, and the function that gives a cut dict back
    in the caller's form: a dict under the caller's names (``keys``: seqwarm's name -> the batch's), a
    tuple / list / named tuple of ``(inputs, targets, ...)`` in the same order, or a tensor. Every tensor
    handed back is contiguous, so a model may ``.view()`` it (a cut is otherwise a strided view).

    In a tuple the first tensor is the inputs (``input_ids``) and the second the targets (``labels``: -100
    where no loss); a further element is cut like the tokens when it is shaped ``(B, S, ...)``, and passes
    as it is otherwise (use a dict for a 4-D attention mask, which is cut as a square). ``inject``: the
    cut passes ``curriculum_seqlen``, which only a dict can carry (ValueError for another form)."""
    if inject and not isinstance(batch, Mapping):
        raise ValueError(
            f"curriculum mode inject passes curriculum_seqlen as a keyword, which a {type(batch).__name__} batch "
            "cannot carry: cut(batch, trim=True) and call the model with curriculum_seqlen=length yourself, or "
            "use mode 'truncate'"
        )
    if isinstance(batch, torch.Tensor):
        return {"input_ids": batch}, lambda out: _contiguous(out["input_ids"])
    if isinstance(batch, (tuple, list)):
        names = [f"_{i}" for i in range(len(batch))]
        names[:2] = ["input_ids", "labels"][: len(batch)]
        if not batch or not isinstance(batch[0], torch.Tensor):
            got = type(batch[0]).__name__ if batch else "nothing"
            raise TypeError(
                f"cut() got a {type(batch).__name__} whose first element is {got}: a tuple batch is "
                "(inputs, targets, ...) tensors"
            )

        def back_sequence(out: Mapping[str, Any]) -> Any:
            items = [_contiguous(out[name]) for name in names]
            if hasattr(batch, "_fields"):  # a named tuple
                return type(batch)(*items)
            return items if isinstance(batch, list) else tuple(items)

        return dict(zip(names, batch)), back_sequence
    if not isinstance(batch, Mapping):
        raise TypeError(
            f"cut() takes a dict of tensors, a tuple or list of tensors (inputs, targets, ...) or one tensor; "
            f"got a {type(batch).__name__}"
        )
    theirs = {t: ours for ours, t in keys.items()}
    clash = [ours for ours, t in keys.items() if ours in batch and t in batch]
    if clash:
        raise ValueError(f"the batch holds both {clash[0]!r} and {keys[clash[0]]!r}, which keys= maps onto it")
    ours = {theirs.get(k, k): v for k, v in batch.items()}
    if not any(isinstance(ours.get(k), torch.Tensor) for k in PER_TOKEN_KEYS):
        raise ValueError(
            f"the batch has none of seqwarm's keys {list(PER_TOKEN_KEYS)} as a tensor (got keys "
            f"{sorted(map(str, batch))}); name yours with SequenceLengthWarmup(..., keys={{'input_ids': "
            "'idx', 'labels': 'targets'}), or hand cut() a tuple (inputs, targets)"
        )
    return ours, lambda out: {keys.get(k, k): _contiguous(v) for k, v in out.items()}


def _contiguous(value: Any) -> Any:
    return value.contiguous() if isinstance(value, torch.Tensor) else value


def check_saved_state(state: Any) -> None:
    """Raise ValueError naming what a state dict handed to ``SequenceLengthWarmup.load_state_dict`` lacks
    (a checkpoint saved without ``slw.state_dict()``, or the whole checkpoint instead of its entry)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"load_state_dict() takes the dict slw.state_dict() returned, got a {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if not missing:
        return
    inside = [k for k, v in state.items() if isinstance(v, Mapping) and all(n in v for n in STATE_KEYS)]
    where = f"; it holds one under {inside[0]!r}: pass state[{inside[0]!r}]" if inside else ""
    what = "no seqwarm state" if len(missing) == len(STATE_KEYS) else "an incomplete seqwarm state"
    raise ValueError(
        f"SequenceLengthWarmup.load_state_dict: the state handed in has {what} (missing "
        f"{', '.join(missing)}; got keys {sorted(map(str, state))[:12]}){where}. Save slw.state_dict() with "
        "every checkpoint and load that entry; without it the ramp would restart at min_length"
    )
