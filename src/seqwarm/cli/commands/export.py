"""``seqwarm export RUN --hf OUT``: a run's checkpoint as a Hugging Face Transformers model folder
(see docs/EVALUATION.md, "Export to Hugging Face")."""

from __future__ import annotations

import argparse
import contextlib
import logging
import warnings
from collections.abc import Iterator

from seqwarm.cli.commands.common import count

OTHER_LIBRARIES = ("transformers", "deepspeed", "torch", "accelerate", "huggingface_hub", "safetensors")
"""Libraries whose warnings an export silences: notices about their own set-up (DeepSpeed's "Setting
accelerator to CPU", Transformers' deprecations, its "Writing model shards" bar), nothing the user can act on."""


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
    with quiet_other_libraries():
        from seqwarm.evaluation.export import export_hf  # imports torch: not at `seqwarm --help`

        result = export_hf(args.run_dir, args.hf, checkpoint=args.checkpoint, data=args.data, force=args.force)
    print(result.summary())
    return 0


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quiet_other_libraries() -> Iterator[None]:
    """While it runs, :data:`OTHER_LIBRARIES` print errors only: their Python warnings are ignored, DeepSpeed's
    logger (which prints to stdout, set up when Transformers imports it) and Transformers' logger keep
    errors, and Transformers' progress bars are off; everything is put back after. seqwarm's own warnings
    are kept."""
    deepspeed = logging.getLogger("DeepSpeed")  # DeepSpeed's logger: the filter outlives its set-up at import
    deepspeed.addFilter(_below_error)
    hf_logging = None
    try:
        with warnings.catch_warnings():
            for module in OTHER_LIBRARIES:
                warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
            try:
                from transformers.utils import logging as hf_logging
            except ImportError:  # export itself says which extra to install
                hf_logging = None
            if hf_logging is not None:
                verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
                hf_logging.set_verbosity_error()
                hf_logging.disable_progress_bar()
            try:
                yield
            finally:
                if hf_logging is not None:
                    hf_logging.set_verbosity(verbosity)
                    if bars:
                        hf_logging.enable_progress_bar()
    finally:
        deepspeed.removeFilter(_below_error)
