"""GPU training throughput and MFU of a GPT at full and short sequence lengths (bf16).

What the curriculum buys on a GPU: with truncation every step keeps its sequences and cuts their
length, so a short step trains fewer tokens — the question is whether it also takes proportionally
less time, or whether small matmuls leave the GPU idle. For each length this times forward + backward
+ clipping + fused AdamW at a fixed number of sequences per step (or, with --constant-tokens, a fixed
number of tokens, as reshape mode trains) and prints tokens/s, achieved TFLOP/s and MFU against the
GPU's peak dense bf16 FLOP/s. FLOPs per token come from ``GPT.estimate_flops_per_token(length)``
(6N + 12 * layers * d_model * length). Lengths are measured in interleaved rounds; medians are shown.

    python benchmarks/gpu_throughput.py                                   # gpt2-124m, batch 16, 64..1024
    python benchmarks/gpu_throughput.py --peak-tflops 989 --compile       # H100 SXM, torch.compile
    python benchmarks/gpu_throughput.py --constant-tokens 16384 --json out.json

Needs a CUDA GPU; on a machine without one it stops with a message (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a plain checkout needs no install

import torch  # noqa: E402

from seqwarm.trainer.model import GPT, GPTConfig  # noqa: E402

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets, by device name.
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 80GB HBM3": 989.0,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "GH200": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "RTX A6000": 155.0,
}


def detect_peak(name: str) -> float | None:
    """The peak for a device name (longest matching key), or None when the GPU is not in the table."""
    hits = [k for k in PEAK_BF16_TFLOPS if k.lower() in name.lower()]
    return PEAK_BF16_TFLOPS[max(hits, key=len)] if hits else None


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA (a CPU-only build)"
        sys.stderr.write(
            "gpu_throughput.py needs a CUDA GPU, and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, built with {built}).\n"
            "Run it on a GPU machine with a CUDA build of torch; on CPUs use benchmarks/bench_step.py.\n"
        )
        raise SystemExit(2)
    return torch.device("cuda", torch.cuda.current_device())


def step_seconds(model, opt, tokens: torch.Tensor, length: int, steps: int, autocast: bool) -> float:
    """Seconds per optimizer step on ``tokens[:, :length + 1]`` (inputs and shifted labels)."""
    x, y = tokens[:, :length], tokens[:, 1 : length + 1]
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x, labels=y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2-124m", help="model preset (default gpt2-124m)")
    ap.add_argument("--vocab-size", type=int, default=None, help="e.g. 50304 (a multiple of 64) for faster matmuls")
    ap.add_argument("--lengths", default="64,128,256,512,1024", help="comma-separated; the last is the reference")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (truncate mode: fixed)")
    ap.add_argument(
        "--constant-tokens",
        type=int,
        default=None,
        metavar="T",
        help="instead: T tokens per step, batch = T / length (reshape mode)",
    )
    ap.add_argument("--steps", type=int, default=10, help="steps per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median over them)")
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's peak dense bf16 TFLOP/s for MFU (default: looked up by device name)",
    )
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast (TF32 matmuls)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (one compile per length)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)

    device = require_cuda()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    lengths = [int(x) for x in args.lengths.split(",")]
    name = torch.cuda.get_device_name(device)
    peak = args.peak_tflops or detect_peak(name)
    overrides = {"seq_length": max(lengths)}
    if args.vocab_size:
        overrides["vocab_size"] = args.vocab_size
    cfg = GPTConfig.preset(args.preset, **overrides)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    flops_model = model  # estimate_flops_per_token on the plain module
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    def batch_for(length: int) -> int:
        return max(1, args.constant_tokens // length) if args.constant_tokens else args.batch

    data = {n: torch.randint(0, cfg.vocab_size, (batch_for(n), n + 1), device=device) for n in lengths}
    memory = {}
    for n in lengths:  # warm-up: kernels, allocator, optimizer state, compilation
        torch.cuda.reset_peak_memory_stats(device)
        step_seconds(model, opt, data[n], n, 2, not args.fp32)
        memory[n] = torch.cuda.max_memory_allocated(device) / 2**30
    times: dict[int, list[float]] = {n: [] for n in lengths}
    rng = random.Random(0)
    for _ in range(args.repeats):
        order = lengths[:]
        rng.shuffle(order)
        for n in order:
            times[n].append(step_seconds(model, opt, data[n], n, args.steps, not args.fp32))

    rows = []
    ref_t = statistics.median(times[lengths[-1]])
    ref_tokens = batch_for(lengths[-1]) * lengths[-1]
    for n in lengths:
        t = statistics.median(times[n])
        tokens = batch_for(n) * n
        tps = tokens / t
        tflops = flops_model.estimate_flops_per_token(n) * tps / 1e12
        rows.append(
            {
                "length": n,
                "batch": batch_for(n),
                "step_s": t,
                "tokens_per_s": tps,
                "tflops": tflops,
                "mfu": tflops / peak if peak else None,
                "time_vs_full": t / ref_t,
                "tokens_vs_full": tokens / ref_tokens,
                "peak_mem_gib": memory[n],
            }
        )

    precision = "fp32/tf32" if args.fp32 else "bf16 autocast"
    print(
        f"# {args.preset} ({flops_model.num_params() / 1e6:.1f}M params, vocab {cfg.vocab_size}) on {name}, "
        f"{precision}{', compiled' if args.compile else ''}, torch {torch.__version__}, "
        f"{platform.machine()}; median of {args.repeats} interleaved rounds x {args.steps} steps; "
        f"peak {f'{peak:g} TFLOP/s' if peak else 'unknown (pass --peak-tflops for MFU)'}"
    )
    print("| length | batch | step (ms) | tokens/s | TFLOP/s | MFU | time vs full | tokens vs full | peak mem (GiB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(
            f"| {r['length']} | {r['batch']} | {r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{r['tflops']:.1f} | {mfu} | {r['time_vs_full']:.3f} | {r['tokens_vs_full']:.3f} | "
            f"{r['peak_mem_gib']:.1f} |"
        )
    if args.json:
        meta = {
            "preset": args.preset,
            "device": name,
            "peak_tflops": peak,
            "precision": precision,
            "compile": args.compile,
            "torch": torch.__version__,
            "rows": rows,
        }
        with open(args.json, "w") as fh:
            json.dump(meta, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
