"""``seqwarm eval RUN``: zero-shot WikiText-103 perplexity, LAMBADA accuracy and full-length validation
loss of a run's checkpoint, as the paper measured them (see docs/EVALUATION.md)."""

from __future__ import annotations

import argparse
import json

from seqwarm.cli.commands.common import count
from seqwarm.trainer.metrics import format_results
from seqwarm.util.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a run's checkpoint on WikiText-103, LAMBADA and/or the validation split",
        description="Evaluate a checkpoint of a `seqwarm train` run folder the way the paper did: WikiText-103 "
        "perplexity with overlapping windows (token-level and adjusted word-level), LAMBADA strict "
        "last-word accuracy, and full-length validation loss. Results are printed and merged into RUN/eval.json "
        "under the checkpoint's step.",
    )
    p.add_argument("run_dir", metavar="RUN", help="run folder written by seqwarm train")
    p.add_argument("--checkpoint", type=count, metavar="STEP", help="step of the checkpoint (default: the latest)")
    p.add_argument("--wikitext", metavar="FILE", help="WikiText-103 raw test file (wiki.test.raw)")
    p.add_argument("--lambada", metavar="FILE", help='LAMBADA JSONL, one {"text": ...} per line (lambada_test.jsonl)')
    p.add_argument(
        "--val",
        action="store_true",
        help="full-length loss on the run's validation split, scored as training validated (its document masking)",
    )
    p.add_argument(
        "--val-windows",
        type=count,
        metavar="N",
        help="with --val: only N windows, spread evenly over the split (default: all)",
    )
    p.add_argument(
        "--overlapping-eval",
        type=count,
        metavar="N",
        help="WikiText window stride: each window after the first scores its last N tokens "
        "(default 32, or the model's length if shorter; the model's length = disjoint windows)",
    )
    p.add_argument(
        "--non-strict", action="store_true", help="LAMBADA: predict only the last token instead of the whole last word"
    )
    p.add_argument(
        "--batch-size", type=count, default=8, metavar="B", help="windows/examples per forward pass (default 8)"
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument(
        "--data", metavar="DIR", help="the prepared data folder holding the tokenizer, if the run's was moved"
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from seqwarm.evaluation import EVAL_FILE, run_paper_evals  # imports torch: not at `seqwarm --help`

    if args.val_windows is not None and not args.val:
        raise UserError("--val-windows only applies with --val")
    if args.wikitext is None and args.lambada is None and not args.val:
        raise UserError("nothing to evaluate: give --wikitext FILE, --lambada FILE and/or --val")
    for flag, value in (
        ("--overlapping-eval", args.overlapping_eval),
        ("--batch-size", args.batch_size),
        ("--val-windows", args.val_windows),
    ):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    result = run_paper_evals(
        args.run_dir,
        wikitext=args.wikitext,
        lambada=args.lambada,
        val=args.val,
        val_windows=args.val_windows,
        checkpoint=args.checkpoint,
        overlapping_eval=args.overlapping_eval,
        batch_size=args.batch_size,
        device=args.device,
        strict=not args.non_strict,
        data=args.data,
        progress=not args.no_progress,
    )
    if args.json:
        sections = {k: result[k] for k in ("wikitext", "lambada", "val") if k in result}
        print(json.dumps(sections, indent=2))
    else:
        for line in format_results(result):
            print(line)
        print(f"results written to {args.run_dir.rstrip('/')}/{EVAL_FILE}")
    return 0
