"""``seqwarm train``: GPT pretraining with a sequence-length curriculum (the main job).

With no arguments it pretrains the ``tiny`` GPT on the embedded public-domain corpus on CPU in a few
minutes (see :mod:`seqwarm.defaults`) and leaves a run folder with metrics, checkpoints and plots.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from seqwarm.commands.common import add_setting_flags, count, overrides_from_args
from seqwarm.errors import UserError

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from seqwarm.defaults import PRESETS

    p = sub.add_parser(
        "train", help="pretrain a GPT with a sequence-length curriculum (default: tiny GPT, embedded corpus, CPU)",
        description="Pretrain a GPT with sequence-length warmup. With no arguments: the tiny GPT on the "
        "embedded public-domain corpus, on CPU, in about five minutes. Flags override the config.")
    p.add_argument("--config", metavar="FILE", help="DeepSpeed JSON config (curriculum_learning or data_efficiency "
                   "block, batch sizes, optimizer, clipping, precision; optional 'seqwarm' block). Default: the "
                   "built-in CPU demo recipe (examples/tiny_cpu.json)")
    p.add_argument("--data", metavar="DIR", help="a folder written by `seqwarm prepare` (default: the embedded "
                   "corpus, prepared once into the cache)")
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS), help="model size preset (default: tiny)")
    p.add_argument("--rotary", action="store_true", help="rotary position embeddings instead of learned ones")
    p.add_argument("--fsdp", action="store_true", help="under torchrun: shard the model with FSDP2 (fully_shard "
                   "per block) instead of DDP")
    ds = p.add_argument_group("DeepSpeed (pip install 'seqwarm[deepspeed]'; see docs/DISTRIBUTED.md)")
    ds.add_argument("--deepspeed", action="store_true", help="train on a DeepSpeed engine (under torchrun or the "
                    "deepspeed launcher); ZeRO stage, offload, precision and batch sizes come from --config")
    ds.add_argument("--pipeline-stages", type=count, default=0, metavar="K", help="with --deepspeed: a K-stage (K >= 2) "
                    "DeepSpeed pipeline of the GPT (ZeRO stage 0 or 1; K must divide the number of processes)")
    add_setting_flags(p)
    g = p.add_argument_group("run")
    g.add_argument("--out", metavar="RUN", help="run folder (default: runs/<model>-<date>-<time>)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its latest valid checkpoint")
    g.add_argument("--allow-config-change", action="store_true",
                   help="resume even if the curriculum/budget/batch settings differ from the checkpoint's")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    g.add_argument("--eval-interval", type=count, default=50, metavar="N", help="validate every N steps (0: only at the end)")
    g.add_argument("--eval-iters", type=count, default=8, metavar="N", help="validation micro-batches per evaluation")
    g.add_argument("--save-interval", type=count, default=100, metavar="N", help="checkpoint every N steps (and at the end)")
    g.add_argument("--keep-checkpoints", type=count, default=3, metavar="N")
    g.add_argument("--log-interval", type=count, default=10, metavar="N")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--eval-wikitext", metavar="FILE", help="after training, WikiText-103 perplexity on this "
                   "local wiki.test.raw (see docs/EVALUATION.md)")
    g.add_argument("--eval-lambada", metavar="FILE", help="after training, LAMBADA zero-shot accuracy on this "
                   "local lambada_test.jsonl")
    g.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    p.set_defaults(func=run)


def resolve_config(args: argparse.Namespace, world_size: int = 1):
    """The run's RunConfig: the --config file (or the default recipe) with the flags applied."""
    from seqwarm.config import load_config
    from seqwarm.defaults import default_train_config
    from seqwarm.defaults import PRESETS

    source = args.config if args.config else default_train_config()
    overrides = overrides_from_args(args)
    cfg = load_config(source, overrides=overrides, world_size=world_size)
    if cfg.seq_length is None:
        seq = cfg.full_length or PRESETS[args.model]["seq_length"]
        cfg = load_config(source, overrides={**overrides, "seq_length": seq}, world_size=world_size)
    if cfg.rampup_batch_size:
        if cfg.curriculum is not None:
            raise UserError("--rampup-batch-size cannot be combined with a sequence-length curriculum: both cut "
                            "the tokens per batch and SLW is the more stable of the two (Li et al. 2022, §5.4). Keep the "
                            "global batch fixed (consider a larger micro-batch) and drop the ramp")
        raise UserError("--rampup-batch-size (Megatron's batch-size warmup) is not implemented by seqwarm's loop")
    if cfg.curriculum is not None and cfg.curriculum.schedule_type == "custom":
        raise UserError("schedule_type 'custom' is a Python function: `seqwarm train` cannot run it from a "
                        "config file. Use the library (CurriculumScheduler.set_custom_get_difficulty with "
                        "CurriculumEngine), or a fixed_linear / fixed_root / fixed_discrete schedule")
    if cfg.train_tokens is None and cfg.train_iters is None and cfg.train_samples is None:
        raise UserError("no budget: give --train-tokens (or --train-iters / --train-samples), or a 'seqwarm' "
                        "block with train_tokens in the config")
    for message in cfg.warnings:
        logger.warning("warning: %s", message)
    return cfg


def _print_plan(cfg, start_step: int) -> None:
    """What the run will do, from the same pure schedules the engine uses."""
    from seqwarm.plan import make_plan

    try:
        plan = make_plan(cfg)
    except UserError:
        return
    ends = (f"; the curriculum reaches full length at step {plan.curriculum_end_step:,}"
            if plan.curriculum_end_step else "")
    print(f"plan:        about {plan.total_steps:,} steps{ends}" + (f" (resuming at {start_step:,})" if start_step else ""),
          flush=True)
    for message in plan.warnings:
        if message not in cfg.warnings:
            logger.warning("warning: %s", message)


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``seqwarm train`` flags (for programs that launch runs, e.g. compare/tune)."""
    parser = argparse.ArgumentParser(prog="seqwarm")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def run(args: argparse.Namespace) -> int:
    execute(args)
    return 0


def execute(args: argparse.Namespace):
    """Run training as ``seqwarm train`` does; return the :class:`~seqwarm.train.TrainResult`.

    Under torchrun every rank runs this: DDP (or FSDP2 with ``--fsdp``) over the process group that
    torchrun describes; rank 0 alone prints, logs and writes files.
    """
    from seqwarm.distributed import cleanup, init_distributed

    _check_deepspeed_flags(args)
    info = init_distributed(args.device)
    if not info.is_main:
        logging.getLogger().setLevel(logging.ERROR)
    try:
        if getattr(args, "deepspeed", False):  # DeepSpeed needs a process group even for one process
            from seqwarm.integrations.deepspeed_run import deepspeed_process_group
            with deepspeed_process_group(args.device):
                return _execute(args, info)
        return _execute(args, info)
    finally:
        cleanup(info)


def _check_deepspeed_flags(args: argparse.Namespace) -> None:
    deepspeed, stages = getattr(args, "deepspeed", False), getattr(args, "pipeline_stages", 0)
    if stages and not deepspeed:
        raise UserError("--pipeline-stages needs --deepspeed (the pipeline is DeepSpeed's PipelineEngine)")
    if deepspeed and getattr(args, "fsdp", False):
        raise UserError("--deepspeed and --fsdp both shard the model: choose one (ZeRO-3 in the DeepSpeed config "
                        "is the DeepSpeed counterpart of --fsdp)")
    if deepspeed:
        from seqwarm.integrations.deepspeed import require_deepspeed
        require_deepspeed()


def _execute(args: argparse.Namespace, info):
    from seqwarm.data import embedded_data_dir, open_prepared
    from seqwarm.distributed import barrier
    from seqwarm.model import GPTConfig
    from seqwarm.train import Run, TrainOptions, finish_lines, format_start, prepare_run_dir, write_resolved_config

    say = print if info.is_main else (lambda *a, **k: None)
    stages = getattr(args, "pipeline_stages", 0) or 1  # pipeline stages share one data-parallel replica
    if info.world_size % stages:
        raise UserError(f"--pipeline-stages {stages} must divide the number of processes ({info.world_size})")
    cfg = resolve_config(args, world_size=info.world_size // stages)
    if args.eval_wikitext or args.eval_lambada:
        from seqwarm.evaluation import check_eval_files
        check_eval_files(wikitext=args.eval_wikitext, lambada=args.eval_lambada)  # fail before training
    out = Path(args.out) if args.out else Path("runs") / f"{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    if info.enabled and not args.out:
        raise UserError("under torchrun, give --out (every rank must agree on the run folder)")
    opts = TrainOptions(out=out, data=Path(args.data) if args.data else None, model=args.model, seed=args.seed,
                        device=args.device, eval_interval=args.eval_interval, eval_iters=args.eval_iters,
                        save_interval=args.save_interval, keep_checkpoints=args.keep_checkpoints,
                        log_interval=max(1, args.log_interval), resume=args.resume,
                        allow_config_change=args.allow_config_change, progress_bar=not args.no_progress,
                        tensorboard=not args.no_tensorboard)
    prepare_run_dir(opts, info)
    if opts.data:
        data_dir = opts.data
    else:  # rank 0 prepares the embedded corpus once; the others wait for it
        if info.is_main:
            embedded_data_dir()
        barrier(info)
        data_dir = embedded_data_dir()
    if not data_dir.exists():
        raise UserError(f"--data {data_dir}: no such folder (create it with `seqwarm prepare --out {data_dir}`)")
    data = open_prepared(data_dir)
    model_cfg = GPTConfig.preset(args.model, vocab_size=data.vocab_size, seq_length=cfg.seq_length,
                                 rotary=args.rotary)
    if getattr(args, "deepspeed", False):
        from seqwarm.integrations.deepspeed_run import DeepSpeedRun
        run = DeepSpeedRun(cfg, opts, data, model_cfg, dist_info=info, pipeline_stages=stages if stages > 1 else 0)
    else:
        run = Run(cfg, opts, data, model_cfg, dist_info=info, fsdp=args.fsdp)
    resumed = run.resume() if opts.resume else False
    if info.is_main:
        write_resolved_config(run)
    for line in format_start(run):
        say(line, flush=True)
    if resumed:
        say(f"resuming at step {run.engine.global_steps:,} ({run.engine.progress.tokens:,} tokens)", flush=True)
    if info.is_main:
        _print_plan(cfg, run.engine.global_steps)
    result = run.train()
    for line in finish_lines(result):
        say(line, flush=True)
    if (args.eval_wikitext or args.eval_lambada) and info.is_main:
        from seqwarm.commands.eval import format_results
        from seqwarm.evaluation import run_paper_evals
        res = run_paper_evals(run.run_dir, wikitext=args.eval_wikitext, lambada=args.eval_lambada,
                              device=args.device, progress=not args.no_progress)
        for line in format_results(res):
            print(line, flush=True)
    return result
