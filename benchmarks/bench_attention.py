"""What window mode and document masking cost in seqwarm's GPT, against the full-length causal step.

Forward + backward (no optimizer) of a small GPT (2 layers, d 128, 4 heads, batch 4) at each length S:
full causal; the ``window`` mode at spans S/8 and S/2 (``window_batch``); document masking with few and
many documents a row (``document_ids``, positions restarting per document); truncation to S/8 for
reference. The window and document cases also run through the dense ``(B, 1, S, S)`` mask (what the GPT
did before issue #38: a ``(B, S)`` padding mask of ones sends them down that path), in the same run.
Every case runs once per round in a shuffled order (interleaved), the table shows medians and each as
a ratio to the full causal step of its length.

    python benchmarks/bench_attention.py                       # S = 1024 and 2048, 1 thread
    python benchmarks/bench_attention.py --lengths 512 --rounds 3
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a plain checkout needs no install

import torch  # noqa: E402

from seqwarm.curriculum.batch import block_starts, number_documents, run_starts, window_batch  # noqa: E402
from seqwarm.trainer.attention import plan_attention  # noqa: E402
from seqwarm.trainer.model import GPT, GPTConfig  # noqa: E402


def documents(b: int, s: int, per_row: int, gen: torch.Generator) -> torch.Tensor:
    """(B, S) ids: each row cut at ``per_row - 1`` random columns into documents of random lengths."""
    rows = []
    for _ in range(b):
        cuts = torch.zeros(s, dtype=torch.bool)
        cuts[torch.randperm(s - 1, generator=gen)[: per_row - 1] + 1] = True
        cuts[0] = True
        rows.append(cuts.cumsum(0))
    return number_documents(torch.stack(rows))


def cases(s: int, b: int, vocab: int, few: int, many: int) -> dict[str, dict]:
    """name -> the model's keyword arguments."""
    gen = torch.Generator().manual_seed(s)
    x = torch.randint(0, vocab, (b, s + 1), generator=gen)
    ids, labels = x[:, :s], x[:, 1:]
    ones = torch.ones(b, s, dtype=torch.long)
    out = {"full causal": dict(input_ids=ids, labels=labels)}
    for name, w in ((f"window S/8 ({s // 8})", s // 8), (f"window S/2 ({s // 2})", s // 2)):
        cut = window_batch({"input_ids": ids, "labels": labels}, w)
        out[name] = cut
        out[name + ", dense mask"] = {**cut, "attention_mask": ones}
    for name, n in ((f"documents, {few} a row", few), (f"documents, {many} a row", many)):
        docs = documents(b, s, n, gen)
        pos = torch.arange(s).expand(b, s) - run_starts(block_starts(docs))
        out[name] = dict(input_ids=ids, labels=labels, position_ids=pos, document_ids=docs)
        out[name + ", dense mask"] = {**out[name], "attention_mask": ones}
    t = s // 8
    out[f"truncate S/8 ({t})"] = dict(input_ids=ids[:, :t].contiguous(), labels=labels[:, :t].contiguous())
    return out


def step(model: GPT, kwargs: dict) -> float:
    start = time.perf_counter()
    model(**kwargs).backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=257, help="257: the byte tokenizer; 8192: the demo BPE")
    ap.add_argument("--few", type=int, default=4, help="documents a row, 'few'")
    ap.add_argument("--many", type=int, default=16, help="documents a row, 'many'")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median over them)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"# seqwarm GPT, 2 layers, d 128, 4 heads, vocab {args.vocab}, batch {args.batch}, forward + backward, "
        f"{args.threads} thread(s), torch {torch.__version__}, {platform.machine()}; median of {args.rounds} "
        "interleaved rounds"
    )
    print("| S | case | attention plan | step (ms) | vs full causal |")
    print("|---:|---|---|---:|---:|")
    for s in (int(v) for v in args.lengths.split(",")):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=args.vocab, seq_length=s, n_layer=2, n_head=4, n_embd=128))
        todo = cases(s, args.batch, args.vocab, args.few, args.many)
        times: dict[str, list[float]] = {name: [] for name in todo}
        for kwargs in todo.values():  # warm-up: allocator, kernels
            step(model, kwargs)
        rng = random.Random(s)
        for _ in range(args.rounds):
            order = list(todo)
            rng.shuffle(order)
            for name in order:
                times[name].append(step(model, todo[name]))
        ref = statistics.median(times["full causal"])
        for name, kwargs in todo.items():
            med = statistics.median(times[name])
            docs = kwargs.get("document_ids")
            kind = (
                "dense"
                if "attention_mask" in kwargs
                else plan_attention(docs, s, None).kind
                if docs is not None
                else "causal"
            )
            print(f"| {s} | {name} | {kind} | {1000 * med:,.0f} | {med / ref:.2f}x |")


if __name__ == "__main__":
    main()
