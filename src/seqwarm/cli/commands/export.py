"""``seqwarm export RUN --hf OUT``: a run's checkpoint as a Hugging Face Transformers model folder
(see docs/EVALUATION.md, "Export to Hugging Face")."""

from __future__ import annotations

import argparse

from seqwarm.cli.commands.common import count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face Transformers model folder",
        description="Write a checkpoint of a `seqwarm train` run folder as OUT/{model.safetensors, config.json, "
        "generation_config.json} plus the files of the run's tokenizer (from its prepared data, or for a "
        "--data-path run the tokenizer it named), loadable with transformers' "
        "AutoModelForCausalLM/AutoTokenizer.from_pretrained(OUT), vLLM or lm-evaluation-harness. seqwarm's GPT "
        "exports as GPT-2 (learned positions) or GPT-NeoX (rotary), its logits checked to match before anything "
        "is written; a --model hf:PATH run is saved as the Transformers model it trained. Needs the hf extra: "
        "pip install 'seqwarm[hf]'.",
    )
    p.add_argument("run_dir", metavar="RUN", help="run folder written by seqwarm train")
    p.add_argument("--hf", required=True, metavar="OUT", help="output folder of the Transformers model")
    p.add_argument("--checkpoint", type=count, metavar="STEP", help="step of the checkpoint (default: the latest)")
    p.add_argument(
        "--data", metavar="DIR", help="the prepared data folder holding the tokenizer, if the run's was moved"
    )
    p.add_argument("--force", action="store_true", help="replace an existing non-empty OUT")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from seqwarm.evaluation.export import export_hf  # imports torch: not at `seqwarm --help`

    result = export_hf(args.run_dir, args.hf, checkpoint=args.checkpoint, data=args.data, force=args.force)
    print(result.summary())
    return 0
