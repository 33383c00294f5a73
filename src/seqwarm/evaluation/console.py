"""The console lines of an evaluation result (``seqwarm eval``, and ``seqwarm train --eval-wikitext/--eval-lambada``)."""

from __future__ import annotations

__all__ = ["format_results"]


def format_results(result: dict) -> list[str]:
    """One line per section of a :func:`~seqwarm.evaluation.runs.run_paper_evals` result."""
    tokens = f", {result['tokens']:,} tokens" if result.get("tokens") is not None else ""
    lines = [f"checkpoint: {result['checkpoint']} (step {result['step']:,}{tokens})"]
    if "wikitext" in result:
        w = result["wikitext"]
        lines.append(f"wikitext:   ppl {w['ppl']:.3f} | adjusted ppl {w['adjusted_ppl']:.3f} | loss {w['loss']:.4f} | "
                     f"{w['num_tokenized_tokens']:,} tokens, {w['num_original_words']:,} original words | "
                     f"{w['num_windows']:,} windows of {w['seq_length']}, stride {w['overlapping_eval']}")
    if "lambada" in result:
        lam = result["lambada"]
        lines.append(f"lambada:    accuracy {100 * lam['accuracy']:.2f}% ({lam['num_correct']:,}/{lam['num_examples']:,}, "
                     f"{'strict' if lam['strict'] else 'non-strict'}) | target loss {lam['loss']:.4f}")
    if "val" in result:
        v = result["val"]
        lines.append(f"val:        loss {v['loss']:.4f} | ppl {v['ppl']:.3f} | {v['num_windows']:,} windows of "
                     f"{v['seq_length']} ({v['num_tokens']:,} tokens)")
    return lines
