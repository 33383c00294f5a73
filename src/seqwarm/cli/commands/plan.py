"""``seqwarm plan [CONFIG] [train flags]``: the run ``seqwarm train`` does with the same arguments, ahead of
time — lengths, tokens and LR at every length change. Without a config it plans the built-in recipe, scaled
to the budget, batch and length as ``train`` scales it (:func:`seqwarm.run.training.recipe_note`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seqwarm.cli.commands.common import positive_int
from seqwarm.cli.commands.plan_variable import run_variable, wants_variable
from seqwarm.cli.commands.spec_flags import spec_from_args
from seqwarm.cli.commands.train import add_train_flags
from seqwarm.config import RunConfig, load_config
from seqwarm.config.defaults import PRESETS
from seqwarm.config.describe import describe
from seqwarm.curriculum.plan import Plan, make_plan
from seqwarm.curriculum.plan_stages import StagePlan, longest_shape
from seqwarm.run.checks import check_spec, model_size
from seqwarm.run.spec import RunSpec, policy_problems, recipe_config, resolve_config, schedule_problems
from seqwarm.run.training import recipe_note
from seqwarm.trainer.memory import estimate_memory, gpt_params
from seqwarm.trainer.plots import plot_plan
from seqwarm.util.errors import UserError
from seqwarm.util.problems import ConfigError, Problem
from seqwarm.util.units import human_count

MAX_TABLE_ROWS = 24
MAX_SHAPES_SHOWN = 8


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="print the run ahead of time (lengths, tokens, LR, steps to the budget)",
        description="The run `seqwarm train` does with the same arguments, without training: where the "
        "curriculum length changes, how many steps reach --train-tokens, the tokens used by the end of the "
        "curriculum and the end of LR warmup. Takes every train flag (those that do not change the plan, "
        "such as --data or --out, are accepted and ignored); without a config, the built-in recipe scaled as "
        "train scales it.",
    )
    p.add_argument(
        "config_file",
        nargs="?",
        type=Path,
        metavar="CONFIG",
        help="DeepSpeed JSON config, the same as --config (default: the built-in recipe)",
    )
    add_train_flags(p)
    p.add_argument("--world-size", type=positive_int, default=1, help="data-parallel ranks")
    p.add_argument("--json", action="store_true", help="print one JSON object, on one line, instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="draw length and LR against steps and tokens")
    p.set_defaults(func=run)


def _table_rows(plan: Plan) -> tuple[list, bool]:
    points = plan.points
    if len(points) <= MAX_TABLE_ROWS:
        return points, False
    stride = -(-(len(points) - 2) // (MAX_TABLE_ROWS - 2))
    picked = [points[0]] + points[1:-1:stride] + [points[-1]]
    return picked, True


def _shapes_line(plan: Plan) -> str:
    """The training micro-batch shapes (rows x columns, per rank): all when few, else the first and last."""
    shown = [f"{r}x{c}" for r, c in plan.shapes]
    if len(shown) > MAX_SHAPES_SHOWN:
        half = MAX_SHAPES_SHOWN // 2
        shown = [*shown[:half], "...", *shown[-half:]]
    count = len(plan.shapes)
    val = plan.val_shape
    return (
        f"{count} training micro-batch shape{'s' if count != 1 else ''} (rows x length, per rank): "
        f"{', '.join(shown)}; validation {val[0]}x{val[1]}"
    )


def print_plan(plan: Plan, out=None, memory: dict | None = None) -> None:
    """The plan as ``seqwarm plan`` prints it; ``memory``: :func:`plan_memory`'s estimate (a run with stages)."""
    out = out or sys.stdout
    rows, thinned = _table_rows(plan)
    print(f"{'step':>10} {'seqlen':>7} {'tokens/step':>12} {'tokens':>10} {'lr':>10}", file=out)
    for p in rows:
        print(
            f"{p.step:>10,} {p.seqlen:>7} {human_count(p.tokens_per_step):>12} {human_count(p.tokens):>10} "
            f"{p.lr:>10.3g}",
            file=out,
        )
    if thinned:
        print(f"({len(rows)} of {len(plan.points)} length changes shown; --json lists all)", file=out)
    print(file=out)
    print(f"total steps:               {plan.total_steps:,}  ({plan.stop_reason})", file=out)
    print(f"total tokens:              {plan.total_tokens:,} ({human_count(plan.total_tokens)})", file=out)
    if plan.curriculum_end_step is not None:
        print(
            f"curriculum ends:           step {plan.curriculum_end_step:,}, after "
            f"{human_count(plan.tokens_at_curriculum_end)} tokens",
            file=out,
        )
    if plan.warmup_end_step == 0:  # no warmup configured: the clock marks its end before step 1
        print("LR warmup:                 none (the peak LR from step 1; token decay starts at once)", file=out)
    elif plan.warmup_end_step is not None:
        print(
            f"LR warmup ends:            step {plan.warmup_end_step:,}, at "
            f"{human_count(plan.warmup_end_tokens)} tokens (token decay starts there)",
            file=out,
        )
    elif plan.warmup_reached is not None:
        print(
            f"LR warmup ends:            never: the run stops first, at {plan.warmup_reached:.0%} of the peak LR",
            file=out,
        )
    _print_stages(plan, out, memory)
    print(f"shapes:                    {_shapes_line(plan)}", file=out)
    print(f"compiles with --compile:   {plan.compiles}  ({plan.compiles_why})", file=out)
    notes = {
        "lr_decay_tokens": "decay by tokens instead: --lr-decay-tokens",
        "lr_warmup_samples": "the token warmup as samples at min_difficulty: --lr-warmup-samples",
        "lr_warmup_iters": "or as iterations: --lr-warmup-iters",
    }
    for key, value in plan.conversions.items():
        print(f"{notes[key]} {value}", file=out)


def _positions(stage: StagePlan) -> str:
    parts = [] if stage.rope_theta is None else [f"rope_theta {stage.rope_theta:g}"]
    scaling = stage.rope_scaling
    if scaling is not None:
        extra = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in scaling.items() if k != "type"
        )
        parts.append(f"{scaling['type']} ({extra})")
    return "; ".join(parts) or "the model's own positions"


def _print_stages(plan: Plan, out, memory: dict | None = None) -> None:
    """The stages (first step, tokens, length, rows, positions) and the tokens trained at each length."""
    if not plan.stages:
        return
    for s in plan.stages:
        head = f"stage {s.stage}:".ljust(27)
        if s.step is None:
            print(f"{head}never begins (from {human_count(s.start_tokens)} tokens, length {s.length})", file=out)
            continue
        print(
            f"{head}step {s.step:,}, after {human_count(s.tokens_before)} tokens (from {human_count(s.start_tokens)}): "
            f"length {s.length}, {s.rows_per_step:,} rows/step ({human_count(s.tokens_per_step)} tokens), "
            f"{s.steps:,} steps, {human_count(s.tokens)} tokens; {_positions(s)}",
            file=out,
        )
    shares = ", ".join(
        f"{u.length}: {human_count(u.tokens)} ({u.tokens / max(plan.total_tokens, 1):.0%})" for u in plan.lengths
    )
    print(f"tokens at each length:     {shares}", file=out)
    if memory is None:
        print("memory:                    not estimated here (train checks it before step 1)", file=out)
        return
    print(
        f"memory (estimate):         {memory['describe']} per process, at the longest length the run trains; a "
        "lower bound from the model's sizes, before anything is allocated (attention scores, MLP activations and "
        f"the allocator's slack come on top: train runs a trial step at that shape before step 1){memory['note']}",
        file=out,
    )


def plan_memory(spec: RunSpec, cfg: RunConfig, world_size: int) -> dict | None:
    """An estimate of one process's memory at the longest length a run with stages trains (its rows per
    micro-batch there), from the model's sizes alone — :func:`seqwarm.trainer.memory.estimate_memory`'s lower
    bound, nothing built; None without stages, or for an ``hf:`` model (train checks those)."""
    if not cfg.stages or spec.model not in PRESETS:
        return None
    preset, size = PRESETS[spec.model], model_size(spec)
    vocab, note = preset["vocab_size"], f"; the {spec.model} preset's vocabulary of {preset['vocab_size']:,}"
    meta = Path(spec.data) / "meta.json" if spec.data else None
    if spec.vocab_size:
        vocab, note = spec.vocab_size, ""
    elif meta is not None and meta.is_file():
        vocab, note = int(json.loads(meta.read_text(encoding="utf-8"))["vocab_size"]), ""
    multiple = preset.get("vocab_multiple", 1)
    vocab_rows = -(-vocab // multiple) * multiple
    rows, length = longest_shape(cfg)
    params = gpt_params(size["n_embd"], size["n_layer"], vocab_rows, length, rotary=spec.rotary)
    half = cfg.precision in ("bf16", "fp16")
    if not cfg.precision_named:
        note += "; counted in fp32 (a run on CUDA without a precision trains in bf16: less)"
    estimate = estimate_memory(
        params,
        vocab_rows=vocab_rows,
        n_embd=size["n_embd"],
        n_layer=size["n_layer"],
        micro_batch=rows,
        seq_length=length,
        half=half,
        shards=world_size if spec.fsdp else 1,
    )
    return {
        "estimate": True,
        "bytes": estimate.total,
        "length": length,
        "rows": rows,
        "params": params,
        "activations_bytes": estimate.activations,
        "describe": estimate.describe(),
        "note": note,
    }


def _resolve(spec: RunSpec, world_size: int) -> tuple[RunConfig, list[Problem]]:
    """The config ``train`` resolves for ``spec`` (the recipe scaled as train scales it). A valid config that
    train's loop refuses (no budget, a batch-size ramp, ...) is planned all the same: its problems come back
    to be shown as warnings; any other problem is the error train gives."""
    try:
        return resolve_config(spec, world_size=world_size), []
    except ConfigError as err:
        error = err
    source = str(spec.config) if spec.config else recipe_config(spec)
    cfg = load_config(source, overrides=dict(spec.settings), world_size=world_size)
    length = cfg.full_length or PRESETS.get(spec.model, {}).get("seq_length")
    if cfg.seq_length is None and length:
        cfg = load_config(source, overrides={**spec.settings, "seq_length": length}, world_size=world_size)
    refused = policy_problems(cfg) + schedule_problems(cfg)  # the plan shows the latter, then exits 2
    if not refused or any(p not in refused for p in error.problems):
        raise error
    return cfg, refused


def run(args: argparse.Namespace) -> int:
    if args.config_file and args.config and args.config_file != args.config:
        raise UserError(
            f"CONFIG {args.config_file} and --config {args.config}: two configs; give one (CONFIG is --config)"
        )
    spec = spec_from_args(args, config=args.config_file or args.config)
    check_spec(spec)  # what train refuses first (an unknown --model, --fsdp with --deepspeed, ...)
    if wants_variable(spec):
        if args.plot:
            raise UserError("--plot draws the warmup's schedule; the variable mode's plan is printed (--json)")
        return run_variable(args, spec, _resolve)
    cfg, refused = _resolve(spec, args.world_size)
    plan = make_plan(cfg, keep_series=bool(args.plot), check=False)  # the plan first, then its problems
    note = recipe_note(spec)
    if args.plot:
        plot_plan(plan, args.plot)
    memory = plan_memory(spec, cfg, args.world_size)
    if args.json:
        print(json.dumps({**plan.to_dict(), "recipe": note, **({"memory": memory} if memory else {})}))
    else:
        for line in describe(cfg):
            print(line)
        if note:
            print(note)
        print()
        print_plan(plan, memory=memory)
        if args.plot:
            print(f"plot written to {args.plot}")
    for problem in (p for p in refused if p not in plan.problems):
        print(f"warning: train refuses this run: {problem}", file=sys.stderr)
    said = [] if refused else cfg.warnings  # resolve_config logged the config's own warnings when it passed
    for message in plan.warnings:
        if message not in said:
            print(f"warning: {message}", file=sys.stderr)
    if plan.problems:
        raise ConfigError(plan.problems)
    return 0
