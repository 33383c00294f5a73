"""Evaluation as the paper did it: WikiText-103 perplexity, LAMBADA accuracy, full-length validation.

Every evaluator takes a *model callable* mapping ``input_ids (B, T)`` to ``logits (B, T, V)`` (the
seqwarm :class:`~seqwarm.trainer.model.GPT` does this when called without labels; an object with a
``.logits`` attribute, as Hugging Face models return, is accepted too) and a tokenizer with
``encode(text) -> list[int]``. Forward passes are batched, run under ``torch.no_grad()`` with the
model in eval mode (its previous mode is restored), and show a tqdm bar on stderr.

WikiText-103 (:func:`evaluate_wikitext`): the raw word-level test file is detokenized
(:func:`wikitext_detokenize`), tokenized as one text, and scored with sliding windows of the model's
length (:func:`wikitext_windows`): every target token is scored exactly once, the first window scores
all its targets, later windows score only their last ``overlapping_eval`` targets, and the final
window is moved back to end on the last token so the tail is scored with a full window of context.

LAMBADA (:func:`evaluate_lambada`): strict mode (the paper's) asks the model to predict the whole last
word, tokenized with its leading space, greedily and token by token under teacher forcing; non-strict
mode asks only for the text's last token.

:func:`run_paper_evals` evaluates a checkpoint of a ``seqwarm train`` run folder and records the
results in ``RUN/eval.json`` (what ``seqwarm eval`` runs).

The code is in :mod:`.common` (model calls, validation), :mod:`.wikitext`, :mod:`.lambada` and
:mod:`.runs` (run folders and ``eval.json``); import the names from this package.
"""

from __future__ import annotations

from seqwarm.evaluation.common import Model, evaluate_val
from seqwarm.evaluation.lambada import LambadaExample, evaluate_lambada, lambada_example, read_lambada
from seqwarm.evaluation.runs import EVAL_FILE, LoadedRun, check_eval_files, load_run, record_results, run_paper_evals
from seqwarm.evaluation.wikitext import (
    DEFAULT_OVERLAPPING_EVAL,
    count_original_words,
    evaluate_wikitext,
    read_wikitext,
    wikitext_detokenize,
    wikitext_windows,
)

__all__ = [
    "DEFAULT_OVERLAPPING_EVAL",
    "EVAL_FILE",
    "LambadaExample",
    "LoadedRun",
    "Model",
    "check_eval_files",
    "count_original_words",
    "evaluate_lambada",
    "evaluate_val",
    "evaluate_wikitext",
    "lambada_example",
    "load_run",
    "read_lambada",
    "read_wikitext",
    "record_results",
    "run_paper_evals",
    "wikitext_detokenize",
    "wikitext_windows",
]
