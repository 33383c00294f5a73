"""WikiText-103 as the paper scored it: detokenize, tokenize the whole file, overlapping windows."""

from __future__ import annotations

import re
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
    safe_exp,
)
from seqwarm.util.errors import UserError

DEFAULT_OVERLAPPING_EVAL = 32


# --------------------------------------------------------------------------------------------------
# WikiText detokenizer

# Each rule is (pattern, replacement), applied in order. WikiText-103 is stored tokenized: words and
# punctuation separated by spaces, in-number separators written " @-@ ", " @,@ ", " @.@ ", headings
# as "= = Title = =". The rules undo that so the text reads like the web text GPT-2 was trained on.
_DETOKENIZE_RULES: tuple[tuple[re.Pattern[str], Any], ...] = (
    # 1 @-@ 2 -> 1-2 ; 1 @,@ 000 -> 1,000 ; 3 @.@ 5 -> 3.5
    (re.compile(r" @([-,.])@ "), r"\1"),
    # "word , word" -> "word, word": no space before : ; . ! ? , when a space, line end or text end follows
    (re.compile(r" ([:;.!?,])(?=[ \n]|$)"), r"\1"),
    # ( x ) -> (x), [ x ] -> [x], { x } -> {x}: spaces just inside a bracket pair on one line
    (re.compile(r"\( *([^()\n]*?) *\)"), r"(\1)"),
    (re.compile(r"\[ *([^\[\]\n]*?) *\]"), r"[\1]"),
    (re.compile(r"\{ *([^{}\n]*?) *\}"), r"{\1}"),
    # " x " -> "x": double quotes pair up in order within a line; the spaces just inside go
    (re.compile(r'" *([^"\n]*?) *"'), r'"\1"'),
    # possessive / contraction: "Boulter 's" -> "Boulter's"
    (re.compile(r" 's\b"), "'s"),
    # degree sign: "20 ° C" -> "20°C"
    (re.compile(" \u00b0 "), "\u00b0"),
    # heading markers: "= = = Title = = =" -> "=== Title ===" (only runs of lone "=" signs)
    (re.compile(r"(?<!\S)=(?: =)+(?!\S)"), lambda m: "=" * m.group(0).count("=")),
    # no spaces at the start or end of a line
    (re.compile(r" +\n"), "\n"),
    (re.compile(r"\n +"), "\n"),
)


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText's word-level tokenization (see the rules above); newlines are kept."""
    for pattern, replacement in _DETOKENIZE_RULES:
        text = pattern.sub(replacement, text)
    return text


def count_original_words(raw_text: str) -> int:
    """Words of the *raw* WikiText file for the adjusted perplexity: the paper's count.

    The whole file with leading/trailing whitespace removed, split on the single space character,
    counting every piece: a bare newline between two spaces (each line end, each blank line) and the
    empty piece between two adjacent spaces count as words. This is the number the published
    adjusted perplexities divide by (it approximates WikiText's token count, which has one ``<eos>``
    per line).
    """
    return len(raw_text.strip().split(" "))


# --------------------------------------------------------------------------------------------------
# Sliding windows


def wikitext_windows(num_tokens: int, seq_length: int, overlapping_eval: int) -> list[tuple[int, int]]:
    """The windows that score a stream of ``num_tokens`` tokens: ``(start, num_scored)`` each.

    A window's inputs are ``tokens[start : start + seq_length]`` and its targets are the tokens one
    position later; it scores its last ``num_scored`` targets. Window 0 starts at 0 and scores all
    ``seq_length`` targets. Window ``k`` ends at ``min(seq_length + k * overlapping_eval, N)`` with
    ``N = num_tokens - 1`` targets, is always full length (so it starts at its end minus
    ``seq_length``), and scores the targets after the previous window's end: ``overlapping_eval``
    of them, fewer in the last window. Every target is scored exactly once, with at least
    ``seq_length - overlapping_eval`` tokens of context after the first window.
    ``overlapping_eval == seq_length`` gives disjoint windows (the last one moved back to end on the
    last token, scoring only what is new).
    """
    if seq_length < 1:
        raise ValueError(f"seq_length must be at least 1, got {seq_length}")
    if not 1 <= overlapping_eval <= seq_length:
        raise UserError(
            f"overlapping_eval must be between 1 and the model's length {seq_length}, got {overlapping_eval}"
        )
    targets = num_tokens - 1
    if targets < seq_length:
        raise UserError(
            f"the text has {num_tokens:,} tokens, fewer than one window needs (seq_length + 1 = {seq_length + 1:,})"
        )
    windows = [(0, seq_length)]
    end = seq_length
    while end < targets:
        new_end = min(end + overlapping_eval, targets)
        windows.append((new_end - seq_length, new_end - end))
        end = new_end
    return windows


# --------------------------------------------------------------------------------------------------
# WikiText-103


@torch.no_grad()
def evaluate_wikitext(
    model: Model,
    tokenizer,
    raw_text: str,
    *,
    seq_length: int | None = None,
    overlapping_eval: int | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    progress: bool = True,
    detokenize: bool = True,
) -> dict[str, Any]:
    """Zero-shot WikiText perplexity of ``model`` on ``raw_text`` (the raw word-level file's text).

    ``seq_length`` defaults to ``model.config.seq_length``; ``overlapping_eval`` to 32, or the
    length when that is shorter. Returns ``loss`` (mean NLL per scored token, nats),
    ``ppl = exp(loss)``, ``adjusted_ppl = exp(total NLL / (num_original_words - 1))``,
    ``num_tokenized_tokens`` (tokens of the detokenized text; all but the first are scored),
    ``num_original_words`` (:func:`count_original_words`), ``num_scored_tokens``, ``num_windows``,
    ``seq_length``, ``overlapping_eval``.
    """
    seq_length = model_seq_length(model, seq_length)
    if overlapping_eval is None:
        overlapping_eval = min(DEFAULT_OVERLAPPING_EVAL, seq_length)
    text = wikitext_detokenize(raw_text) if detokenize else raw_text
    tokens = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    windows = wikitext_windows(len(tokens), seq_length, overlapping_eval)
    dev = device_of(model, device)
    total_nll, scored = 0.0, 0
    bar = progress_bar(len(windows), "wikitext", "win", progress)
    try:
        with EvalMode(model):
            for i in range(0, len(windows), batch_size):
                chunk = windows[i : i + batch_size]
                rows = torch.stack([tokens[s : s + seq_length + 1] for s, _ in chunk]).to(dev)  # (B, L+1)
                widest = max(n for _, n in chunk)
                logits = model_logits(model, rows[:, :-1])[:, -widest:].float()  # (B, widest, V)
                nll = F.cross_entropy(logits.transpose(1, 2), rows[:, -widest:], reduction="none")  # (B, widest)
                keep = (
                    torch.arange(widest, device=dev)[None, :]
                    >= torch.tensor([widest - n for _, n in chunk], device=dev)[:, None]
                )  # the last n of each row
                total_nll += float(nll.double()[keep].sum())
                scored += int(keep.sum())
                bar.update(len(chunk))
    finally:
        bar.close()
    assert scored == len(tokens) - 1, (scored, len(tokens))
    words = count_original_words(raw_text)
    loss = total_nll / scored
    return {
        "loss": loss,
        "ppl": safe_exp(loss),
        "adjusted_ppl": safe_exp(total_nll / max(words - 1, 1)),
        "num_tokenized_tokens": len(tokens),
        "num_original_words": words,
        "num_scored_tokens": scored,
        "num_windows": len(windows),
        "seq_length": seq_length,
        "overlapping_eval": overlapping_eval,
    }


def read_wikitext(path: str | Path) -> str:
    """The raw text of a WikiText file (e.g. ``wiki.test.raw``); UserError if missing or empty."""
    return read_text_file(path, "WikiText")
