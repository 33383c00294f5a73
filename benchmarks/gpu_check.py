"""One command for a lent GPU: how fast seqwarm's training loop is, against the chip and a bare loop.

In at most ~8 minutes on one GPU it prints:

- the bf16 matmul ceiling it measures (8192^3 GEMMs) next to the chip's data-sheet dense bf16 peak;
- for gpt2-124m at lengths 64..1024, eager and compiled, truncate and reshape: tokens/s, MFU
  (``6N + 12 * layers * d * L`` FLOPs per token, ``GPT.estimate_flops_per_token``) against the peak and
  against the measured ceiling, peak memory, host syncs per optimizer step
  (``torch.cuda.set_sync_debug_mode``), and the ratio to a bare PyTorch loop (same model, optimizer,
  batches; ``model(x[:, :L])``, backward, clip, step) measured in the same run;
- window mode and document masking (issue #38) at the full length, eager and compiled, in the run's
  precision: forward + backward step time of each case of ``bench_attention.py`` (window S/8 and S/2,
  few and many documents a row, each also through the dense mask, truncation to S/8) as a ratio to the
  full causal step, and the graphs each case adds to the compiled model (Dynamo's counter: the window
  cases should add one graph for the run, not one per span);
- the same tables as JSON with ``--json FILE`` (``rows``, ``attention``).

"seqwarm's loop" is what ``seqwarm train`` runs per optimizer step (:meth:`seqwarm.trainer.loop.Run._train_step`)
driving a :class:`~seqwarm.curriculum.engine.CurriculumEngine` (curriculum length, shaping, token count, clock,
LR, clipping, fused AdamW from :func:`seqwarm.trainer.optim.build_optimizer`) in the run's resolved precision.

    python benchmarks/gpu_check.py                 # on the GPU machine, after the README's set-up
    python benchmarks/gpu_check.py --json gpu.json --budget-s 280
    python benchmarks/gpu_check.py --smoke         # CPU, tiny model, seconds: the test suite runs this

Targets (issue #14): loop >= 0.97x bare; >= 40% MFU compiled at L=1024 (bf16).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a plain checkout needs no install

import torch  # noqa: E402

from seqwarm.config import load_config  # noqa: E402
from seqwarm.curriculum.engine import CurriculumEngine  # noqa: E402
from seqwarm.trainer.model import GPT, GPTConfig  # noqa: E402
from seqwarm.trainer.optim import build_optimizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_throughput import detect_peak  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: torch.device, n: int, dtype: torch.dtype, reps: int) -> float:
    """Measured TFLOP/s of ``n x n @ n x n`` matmuls (the best the chip does on big GEMMs)."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def run_config(length: int, full: int, batch: int, mode: str, precision: str) -> dict:
    """A curriculum that stays at ``length`` (its schedule would reach ``full`` after 10^9 steps)."""
    return {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": batch,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": length,
            "max_difficulty": full,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 10**9, "difficulty_step": 8},
        },
        "seqwarm": {"seq_length": full, "curriculum_mode": mode, "precision": precision, "lr_warmup_iters": 0},
    }


def host_syncs(step, device: torch.device) -> int | None:
    """Synchronizing CUDA calls in one call of ``step`` (None off CUDA)."""
    if device.type != "cuda":
        return None
    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def timed(step, device: torch.device, steps: int) -> float:
    """Median seconds of ``step()`` over ``steps`` calls (after the caller's warm-up)."""
    out = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(args, device, cfg_model, length, mode, compiled, precision, batches, peak, ceiling) -> dict:
    """One row: seqwarm's loop and the bare loop on the same model, optimizer settings and batches."""
    torch.manual_seed(0)
    model = GPT(cfg_model).to(device)
    if compiled:
        model.compile()
    cfg = load_config(run_config(length, cfg_model.seq_length, args.batch, mode, precision))
    opt = build_optimizer(model, cfg)
    engine = CurriculumEngine(model, opt, cfg)
    engine.train()
    it = iter(batches * 1000)

    def loop():  # what seqwarm's loop does per step: the length once, each micro-batch cut once, the step
        engine.begin_step()
        loss = engine.run(engine.cut(next(it)))
        engine.backward(loss)
        engine.end_step(engine.update())  # clip, LR from the clock, optimizer step; then the clock
        return torch.stack([loss.detach()]).mean()  # the loop's mean over micro-batches, read at log rows

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(engine.config.precision)
    # the bare loop: what a hand-written loop does with the same batch at the same length
    bare_model = GPT(cfg_model).to(device)
    if compiled:
        bare_model.compile()
    bare_opt = build_optimizer(bare_model, cfg)

    def bare():
        b = next(it)
        if mode == "reshape":  # the same tokens as reshape mode: B*S/L rows of L
            x = b["input_ids"].reshape(-1, length)
            y = b["labels"].reshape(-1, length)
        else:
            x, y = b["input_ids"][:, :length], b["labels"][:, :length]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = bare_model(x, labels=y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(bare_model.parameters(), 1.0)
        for g in bare_opt.param_groups:
            g["lr"] = 1e-4
        bare_opt.step()
        bare_opt.zero_grad(set_to_none=True)
        return loss.detach()  # no host read: the loop reads its loss only at log rows

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):  # kernels, allocator, optimizer state, compilation
        loop()
        bare()
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    syncs = host_syncs(loop, device)
    t_loop, t_bare = [], []
    for _ in range(args.rounds):  # interleaved, so load elsewhere hits both alike
        t_loop.append(timed(loop, device, args.steps))
        t_bare.append(timed(bare, device, args.steps))
    s_loop, s_bare = statistics.median(t_loop), statistics.median(t_bare)
    tokens = args.batch * cfg_model.seq_length if mode == "reshape" else args.batch * length
    tps = tokens / s_loop
    tflops = model.estimate_flops_per_token(length) * tps / 1e12
    return {
        "length": length,
        "mode": mode,
        "compiled": compiled,
        "precision": engine.config.precision,
        "tokens_per_step": tokens,
        "step_ms": s_loop * 1e3,
        "tokens_per_s": tps,
        "tflops": tflops,
        "mfu_peak": tflops / peak if peak else None,
        "mfu_ceiling": tflops / ceiling if ceiling else None,
        "peak_mem_gib": mem,
        "host_syncs_per_step": syncs,
        "bare_step_ms": s_bare * 1e3,
        "loop_vs_bare": s_bare / s_loop,
    }


def attention_rows(args, device, cfg_model, precision, budget_end: float) -> list[dict]:
    """Window mode and document masking against the causal step at the full length (bench_attention's cases)."""
    from bench_attention import cases
    from torch._dynamo.testing import CompileCounterWithBackend

    s = cfg_model.seq_length
    todo = {
        name: {k: v.to(device) for k, v in kw.items()}
        for name, kw in cases(s, args.batch, cfg_model.vocab_size, 4, 16).items()
    }
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    rows = []
    for variant in args.variants.split(","):
        if time.perf_counter() > budget_end:
            print(f"# attention budget reached: {variant} left out")
            break
        torch.manual_seed(0)
        model = GPT(cfg_model).to(device)
        counter = None
        if variant == "compiled":
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("inductor")
            model.compile(backend=counter)

        def step(kw, model=model):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(**kw)
            loss.backward()
            model.zero_grad(set_to_none=True)

        graphs, failed = {}, set()
        for name, kw in todo.items():  # in order: the graphs each case adds to the ones before
            before = counter.frame_count if counter else 0
            try:
                for _ in range(args.warmup):
                    step(kw)
            except Exception as err:  # a path that fails on this GPU: say so, measure the rest
                print(f"# attention {variant} {name}: {type(err).__name__}: {str(err)[:300]}")
                failed.add(name)
            graphs[name] = counter.frame_count - before if counter else None
        ok = [name for name in todo if name not in failed]
        times: dict[str, list[float]] = {name: [] for name in ok}
        for _ in range(args.rounds):  # interleaved
            for name in ok:
                times[name].append(timed(lambda kw=todo[name]: step(kw), device, args.steps))
        ref = statistics.median(times["full causal"]) if times.get("full causal") else None
        for name in ok:
            med = statistics.median(times[name])
            rows.append(
                {
                    "variant": variant,
                    "case": name,
                    "length": s,
                    "step_ms": med * 1e3,
                    "vs_causal": med / ref if ref else None,
                    "new_graphs": graphs[name],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, two short lengths, eager (for the tests)")
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--lengths", default="64,128,256,512,1024")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step at full length")
    ap.add_argument("--modes", default="truncate,reshape")
    ap.add_argument("--variants", default="eager,compiled")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=280.0, help="stop starting new rows after this long")
    ap.add_argument(
        "--attention-budget-s", type=float, default=150.0, help="window / document rows: no new variant after this"
    )
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    if args.smoke:
        device, args.preset, args.lengths, args.batch = torch.device("cpu"), "tiny", "16,32", 4
        args.variants, args.steps, args.rounds, args.warmup = "eager", 2, 1, 1
    elif not torch.cuda.is_available():
        sys.stderr.write(
            f"gpu_check.py needs a CUDA GPU (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda or 'not built in'}); on CPUs run it with --smoke\n"
        )
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    lengths = [int(n) for n in args.lengths.split(",")]
    small = {"vocab_size": 256} if args.smoke else {}
    cfg_model = GPTConfig.preset(args.preset, seq_length=max(lengths), **small)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = detect_peak(name) if device.type == "cuda" else None
    if device.type == "cuda":
        ceiling = matmul_ceiling(device, 8192, torch.bfloat16, 50)
    else:
        ceiling = matmul_ceiling(device, 256, torch.float32, 5)
    precision = "bf16" if device.type == "cuda" else "fp32"
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(8):
        t = torch.randint(0, cfg_model.vocab_size, (args.batch, cfg_model.seq_length + 1), generator=g)
        batches.append({"input_ids": t[:, :-1].to(device), "labels": t[:, 1:].to(device)})
    print(
        f"# seqwarm gpu_check: {args.preset} on {name}, torch {torch.__version__}, {precision}; "
        f"peak {peak or '?'} TFLOP/s (data sheet), measured matmul ceiling {ceiling:.1f} TFLOP/s"
    )
    rows = []
    for variant in args.variants.split(","):
        for mode in args.modes.split(","):
            for length in lengths:
                if time.perf_counter() - start > args.budget_s:
                    print(f"# budget of {args.budget_s:.0f} s reached: rows left out from {variant} {mode} {length}")
                    break
                rows.append(
                    measure(
                        args, device, cfg_model, length, mode, variant == "compiled", precision, batches, peak, ceiling
                    )
                )
    print(
        "| variant | mode | L | tokens/s | step ms | MFU (peak) | MFU (ceiling) | peak GiB | syncs/step | loop/bare |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")

    def pct(x):
        return num(x, ".1%")

    def num(x, spec):
        return "-" if x is None else format(x, spec)

    for r in rows:
        print(
            f"| {'compiled' if r['compiled'] else 'eager'} | {r['mode']} | {r['length']} | "
            f"{r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {pct(r['mfu_peak'])} | {pct(r['mfu_ceiling'])} | "
            f"{num(r['peak_mem_gib'], '.2f')} | {num(r['host_syncs_per_step'], 'd')} | "
            f"{r['loop_vs_bare']:.3f} |"
        )
    attention = attention_rows(args, device, cfg_model, precision, time.perf_counter() + args.attention_budget_s)
    print(f"| variant | case (S = {cfg_model.seq_length}) | step ms | vs full causal | graphs added |")
    print("|---|---|---:|---:|---:|")
    for r in attention:
        print(
            f"| {r['variant']} | {r['case']} | {r['step_ms']:.1f} | {num(r['vs_causal'], '.2f')} | "
            f"{num(r['new_graphs'], 'd')} |"
        )
    print(f"# {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "device": name,
                    "peak_tflops": peak,
                    "ceiling_tflops": ceiling,
                    "torch": torch.__version__,
                    "rows": rows,
                    "attention": attention,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
