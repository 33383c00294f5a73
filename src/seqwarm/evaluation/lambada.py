"""LAMBADA as the paper scored it: greedy prediction of the whole last word (strict mode)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from seqwarm.evaluation.common import (
    EvalMode,
    Model,
    device_of,
    model_logits,
    model_seq_length,
    progress_bar,
    read_text_file,
)
from seqwarm.util.errors import UserError


@dataclass(frozen=True)
class LambadaExample:
    context: list[int]
    """Token ids the model reads before the target."""
    target: list[int]
    """Token ids it must predict (the last word with its leading space; one token when not strict)."""


def lambada_example(text: str, tokenizer, *, strict: bool = True) -> LambadaExample:
    """Split one LAMBADA passage into context and target tokens.

    Strict: the target is the last whitespace-separated word tokenized as ``" " + word``, the context
    is the text before it (surrounding whitespace removed). Non-strict: the whole text is tokenized
    and its last token is the target. ValueError if no context is left.
    """
    text = text.strip()
    if strict:
        words = text.split()
        if len(words) < 2:
            raise ValueError("needs at least two words (a context and a last word)")
        word = words[-1]
        context = tokenizer.encode(text[: len(text) - len(word)].strip())
        target = tokenizer.encode(" " + word)
    else:
        ids = tokenizer.encode(text)
        context, target = ids[:-1], ids[-1:]
    if not context or not target:
        raise ValueError("needs at least two tokens (a context and a target)")
    return LambadaExample(list(context), list(target))


def read_lambada(path: str | Path, key: str = "text") -> list[str]:
    """The passages of a LAMBADA JSONL file (one object with a ``text`` field per line)."""
    p = Path(path)
    raw = read_text_file(p, "LAMBADA")
    texts = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise UserError(f"{p}:{number}: not a JSON object ({err})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
            raise UserError(
                f'{p}:{number}: no {key!r} string field (LAMBADA JSONL needs {{"{key}": "..."}} on every line)'
            )
        texts.append(obj[key])
    return texts


@torch.no_grad()
def evaluate_lambada(
    model: Model,
    tokenizer,
    texts: Sequence[str],
    *,
    strict: bool = True,
    seq_length: int | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    progress: bool = True,
    source: str = "LAMBADA",
) -> dict[str, Any]:
    """LAMBADA accuracy: an example is correct when the argmax at every target position is the target.

    Context longer than the model keeps its last tokens (the input is context + target minus its
    last token, at most ``seq_length`` tokens). Returns ``accuracy``, ``num_examples``,
    ``num_correct``, ``strict``, ``num_target_tokens`` and ``loss`` (mean NLL per target token).
    """
    seq_length = model_seq_length(model, seq_length)
    examples = []
    for i, text in enumerate(texts):
        try:
            ex = lambada_example(text, tokenizer, strict=strict)
        except ValueError as err:
            raise UserError(f"{source} example {i + 1}: {err}") from None
        if len(ex.target) > seq_length:
            raise UserError(
                f"{source} example {i + 1}: its last word is {len(ex.target)} tokens, more than "
                f"the model's length {seq_length}"
            )
        examples.append(ex)
    if not examples:
        raise UserError(f"{source}: no examples")
    dev = device_of(model, device)
    # Longest first: similar lengths share a batch (less padding) and the peak memory shows at once.
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].context + examples[i].target))
    correct, total_nll, num_targets = 0, 0.0, 0
    bar = progress_bar(len(examples), "lambada", "ex", progress)
    try:
        with EvalMode(model):
            for b in range(0, len(order), batch_size):
                batch = [examples[i] for i in order[b : b + batch_size]]
                seqs = [(ex.context + ex.target)[-(seq_length + 1) :] for ex in batch]
                width = max(len(s) for s in seqs) - 1
                # Right padding: with causal attention the padded tail changes nothing before it.
                inputs = torch.zeros(len(batch), width, dtype=torch.long)
                for r, s in enumerate(seqs):
                    inputs[r, : len(s) - 1] = torch.tensor(s[:-1])
                logits = model_logits(model, inputs.to(dev)).float()  # (B, T, V)
                for r, (ex, s) in enumerate(zip(batch, seqs)):
                    n = len(ex.target)
                    pos = torch.arange(len(s) - 1 - n, len(s) - 1, device=dev)  # positions predicting the target
                    row = logits[r, pos]  # (n, V)
                    target = torch.tensor(ex.target, device=dev)
                    correct += bool((row.argmax(-1) == target).all())
                    total_nll += float(F.cross_entropy(row, target, reduction="sum"))
                    num_targets += n
                bar.update(len(batch))
    finally:
        bar.close()
    return {
        "accuracy": correct / len(examples),
        "num_examples": len(examples),
        "num_correct": correct,
        "strict": strict,
        "num_target_tokens": num_targets,
        "loss": total_nll / num_targets,
    }
