"""``seqwarm export RUN --hf OUT``: a run's checkpoint as a Hugging Face Transformers model folder
(see docs/EVALUATION.md, "Export to Hugging Face")."""

from __future__ import annotations

import argparse

from seqwarm.commands.common import count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a run's checkpoint as a Hugging Face Transformers model folder",
        description="Write a checkpoint of a `seqwarm train` run folder as OUT/{model.safetensors, config.json, "
        "generation_config.json} plus the tokenizer files of the run's prepared data, loadable with "
        "transformers' AutoModelForCausalLM/AutoTokenizer.from_pretrained(OUT), vLLM or lm-evaluation-harness. "
        "Learned positions export as GPT-2, rotary as GPT-NeoX; the logits are checked to match before "
        "anything is written. Needs the hf extra: pip install 'seqwarm[hf]'.")
    p.add_argument("run_dir", metavar="RUN", help="run folder written by seqwarm train")
    p.add_argument("--hf", required=True, metavar="OUT", help="output folder of the Transformers model")
    p.add_argument("--checkpoint", type=count, metavar="STEP", help="step of the checkpoint (default: the latest)")
    p.add_argument("--data", metavar="DIR", help="the prepared data folder holding the tokenizer, if the run's was moved")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty OUT")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from seqwarm.export import export_hf  # imports torch: not at `seqwarm --help`

    result = export_hf(args.run_dir, args.hf, checkpoint=args.checkpoint, data=args.data, force=args.force)
    print(result.summary())
    return 0
