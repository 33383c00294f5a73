"""The embedded corpus with shorter documents: each Bible chapter and each Shakespeare scene one document.

The default corpus has 174 documents (plays, poems, Bible books) of ~20,000 tokens on average, so nearly
every 256-token window lies inside one document. Variable sequence length (issue #37) and document
masking matter where documents are short; this writes the same text cut at chapters and scenes (a few
hundred to a few thousand tokens each) as JSONL and prepares it with ``seqwarm prepare``:

    python benchmarks/short_documents.py OUT_DIR      # OUT_DIR/data: a prepared folder (--data OUT_DIR/data)

Prints the document count and the length quantiles in tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from seqwarm.data.corpus import iter_default_documents
from seqwarm.data.indexed import MegatronIndexed

CUTS = {
    "shakespeare": re.compile(r"(?m)^(?=\s*SCENE\b|\s*Scene\b)"),  # each scene (the text before the first too)
    "bible": re.compile(r"(?m)^(?=Chapter \d+$)"),  # each chapter (the book's title joins the first)
}


def short_documents():
    for name, text in iter_default_documents():
        cut = CUTS["shakespeare" if name.startswith("shakespeare/") else "bible"]
        for i, part in enumerate(p for p in cut.split(text) if p.strip()):
            yield f"{name}/{i}", part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / "documents.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for name, text in short_documents():
            f.write(json.dumps({"name": name, "text": text}) + "\n")
    data = args.out / "data"
    cmd = [sys.executable, "-m", "seqwarm", "prepare", "--input", str(jsonl), "--out", str(data), "--no-progress"]
    subprocess.run(cmd + (["--force"] if data.exists() else []), check=True)
    sizes = np.diff(MegatronIndexed(data / "train").doc_offsets)  # tokens per document, its EOD included
    q = np.percentile(sizes, [10, 50, 90]).astype(int)
    print(f"{len(sizes)} training documents, {int(sizes.sum()):,} tokens; length p10 {q[0]}, median {q[1]}, p90 {q[2]}")


if __name__ == "__main__":
    main()
