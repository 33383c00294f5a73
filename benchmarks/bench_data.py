"""Data pipeline speed: ``prepare`` throughput on the embedded corpus, and batch fetch time.

    python benchmarks/bench_data.py [--tokenizers byte,bpe:8192,gpt2] [--workers 1 2] [--repeats 3]
                                    [--seq-length 256] [--micro-batch 16]

Prints medians. Batch fetch time is compared with a forward+backward step of the ``tiny`` model
(seqwarm.trainer.model) on the same batch, when that module is importable.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from seqwarm.data.prepare import default_workers, prepare_dataset  # noqa: E402


def bench_prepare(tmp: Path, tokenizers: list[str], workers: list[int], repeats: int) -> dict[str, Path]:
    print(f"prepare, embedded corpus, median of {repeats} (workers: asked->used; byte runs in-process):")
    print(
        f"  {'tokenizer':<10} {'workers':>7} {'MB':>6} {'tokens':>11} {'tokenize s':>10} {'MB/s':>7} "
        f"{'Mtok/s':>7} {'train tok s':>11} {'total s':>8}"
    )
    folders: dict[str, Path] = {}
    for name in tokenizers:
        for w in workers:
            runs = []
            for _ in range(repeats):
                out = tmp / f"{name.replace(':', '')}-w{w}"
                runs.append(prepare_dataset(out, None, tokenizer=name, workers=w, force=True, progress=False))
                folders[name] = out
            med = lambda f, runs=runs: statistics.median(f(x) for x in runs)  # noqa: E731
            res = runs[0]
            used = f"{w}" if res.workers == w else f"{w}->{res.workers}"
            print(
                f"  {name:<10} {used:>7} {res.input_bytes / 1e6:>6.1f} {res.tokens:>11,} "
                f"{med(lambda x: x.tokenize_seconds):>10.2f} {med(lambda x: x.mb_per_second):>7.2f} "
                f"{med(lambda x: x.tokens_per_second) / 1e6:>7.2f} "
                f"{med(lambda x: x.tokenizer_seconds):>11.2f} {med(lambda x: x.total_seconds):>8.2f}"
            )
    return folders


def bench_fetch(folder: Path, seq_length: int, micro_batch: int, n: int = 2000) -> tuple[float, dict]:
    from seqwarm.data import open_prepared

    t0 = time.perf_counter()
    data = open_prepared(folder)
    open_s = time.perf_counter() - t0
    batches = data.train_batches(seq_length, micro_batch, reset_position_ids=True, eod_mask_loss=True)
    for _ in range(20):
        batches.next_batch()
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        batch = batches.next_batch()
        times.append(time.perf_counter_ns() - t)
    times.sort()
    med = times[len(times) // 2] / 1e3
    p90 = times[int(len(times) * 0.9)] / 1e3
    print(
        f"\nbatch fetch {micro_batch}x{seq_length} from {folder.name} (open + verify {open_s * 1e3:.0f} ms): "
        f"median {med:.1f} us, p90 {p90:.1f} us over {n} batches"
    )
    return med, batch


def bench_step(batch: dict, vocab_size: int, seq_length: int, fetch_us: float, steps: int = 10) -> None:
    try:
        import torch

        from seqwarm.trainer.model import GPT, GPTConfig
    except ImportError as err:
        print(f"(no model step comparison: {err})")
        return
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=vocab_size, seq_length=seq_length))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        loss = model(
            batch["input_ids"], labels=batch["labels"], loss_mask=batch["loss_mask"], position_ids=batch["position_ids"]
        )
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    print(
        f"tiny model forward+backward on that batch ({torch.get_num_threads()} threads): median "
        f"{step * 1e3:.0f} ms; fetch = {fetch_us / 1e3 / (step * 1e3) * 100:.3f}% of a step"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizers", default="byte,bpe:8192,gpt2")
    p.add_argument("--workers", type=int, nargs="+", default=sorted({1, default_workers()}))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=16)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = [t for t in args.tokenizers.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="seqwarm-bench-") as tmp:
        folders = bench_prepare(Path(tmp), names, args.workers, args.repeats)
        folder = folders.get("bpe:8192") or next(iter(folders.values()))
        fetch_us, batch = bench_fetch(folder, args.seq_length, args.micro_batch)
        from seqwarm.data import open_prepared

        bench_step(batch, open_prepared(folder).vocab_size, args.seq_length, fetch_us)


if __name__ == "__main__":
    main()
