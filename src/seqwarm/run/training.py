"""A training run from Python: :func:`run_training` on a :class:`~seqwarm.run.spec.RunSpec` (what
``seqwarm train``, ``compare`` and ``tune`` call)::

    from seqwarm.run.spec import RunSpec
    from seqwarm.run.training import run_training

    result = run_training(RunSpec(config="examples/tiny_cpu.json", settings={"train_tokens": 20_000},
                                  out="runs/demo", device="cpu"))  # paths may be str or Path
    print(result.final_val_loss, result.run_dir)

It checks the spec, sets up torch.distributed when launched by torchrun, opens the data (a prepared
folder, the embedded corpus or Megatron files), picks the backend (one device / DDP / FSDP2, DeepSpeed,
a Hugging Face model), locks the run folder and runs :class:`seqwarm.trainer.loop.Run`.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from seqwarm.config import RunConfig
from seqwarm.config.defaults import CURRICULUM_FRACTION, default_train_config
from seqwarm.config.settings import flag_for
from seqwarm.curriculum.plan import Plan, data_use, make_plan
from seqwarm.curriculum.plan_stages import longest_shape, model_length
from seqwarm.curriculum.plan_variable_text import bucket_lines
from seqwarm.run.checks import check_spec, model_overrides
from seqwarm.run.command import command_line
from seqwarm.run.spec import RunSpec, recipe_config, resolve_config
from seqwarm.trainer.memory import check_memory, estimate_memory
from seqwarm.trainer.metrics import format_results
from seqwarm.util.errors import UserError
from seqwarm.util.units import human_count

if TYPE_CHECKING:  # seqwarm.trainer.loop imports torch: only when a run starts
    from seqwarm.trainer.backends import RunChoices
    from seqwarm.trainer.options import RunOptions
    from seqwarm.trainer.record import TrainResult

__all__ = ["run_training", "recipe_note", "run_options", "RECORDED_OPTIONS"]

logger = logging.getLogger(__name__)

RECORDED_OPTIONS = (
    "out", "data", "model", "seed", "device", "eval_interval", "eval_iters", "save_interval", "keep_checkpoints",
    "log_interval", "allow_config_change", "progress_bar", "tensorboard", "tensorboard_dir", "wandb_project",
    "wandb_run_name", "exit_duration_in_mins", "dist_timeout_s",
)  # fmt: skip
"""The spec's fields recorded under ``options`` in ``RUN/config.json`` (the run's options, not its recipe)."""


def run_options(spec: RunSpec) -> RunOptions:
    """The :class:`~seqwarm.trainer.options.RunOptions` the loop reads, from a spec whose ``out`` is set."""
    from seqwarm.trainer.options import RunOptions

    if spec.out is None:
        raise ValueError("a run needs spec.out, the run folder")
    same = [f.name for f in fields(RunOptions) if f.name not in ("out", "model_name", "recorded")]  # spec's names
    return RunOptions(
        out=Path(spec.out),
        model_name=spec.model,
        recorded={k: getattr(spec, k) for k in RECORDED_OPTIONS},
        **{name: getattr(spec, name) for name in same},
    )


def run_training(spec: RunSpec) -> TrainResult:
    """Train as ``seqwarm train`` does and return the :class:`~seqwarm.trainer.record.TrainResult`.

    Under torchrun every rank calls this: DDP (or FSDP2 with ``fsdp``) over the process group torchrun
    describes; rank 0 alone prints, logs and writes files. With ``deepspeed`` a process group is made
    for a single process too (DeepSpeed needs one).

    SIGTERM, SIGINT, SIGUSR1 and SIGHUP (and ``exit_duration_in_mins``) end the run early at a step
    boundary, every rank at the same one, with a checkpoint: :class:`~seqwarm.trainer.stop.RunStopped`
    (exit code 75), whose message holds the command that continues it (:mod:`seqwarm.trainer.stop`).
    """
    from seqwarm.trainer import distributed
    from seqwarm.trainer.stop import StopRequest

    check_spec(spec)
    stop = StopRequest(minutes=spec.exit_duration_in_mins)  # the wall-clock limit counts from here
    info = distributed.init_distributed(spec.device, spec.dist_timeout_s)
    if not info.is_main:
        logging.getLogger().setLevel(logging.ERROR)
    try:
        with stop:  # a signal during the set-up stops the run before its first step
            if spec.deepspeed:
                from seqwarm.integrations.deepspeed.run import deepspeed_process_group

                with deepspeed_process_group(spec.device):
                    return _run(spec, info, stop)
            result = _run(spec, info, stop)
        distributed.barrier(info)  # no rank tears the group down while another still sends (or saves)
        return result
    except Exception as exc:  # under torchrun: a peer that died, raised or stalled is named, never waited for
        if not info.enabled or isinstance(exc, distributed.RankFailed):
            raise
        if not distributed.collective_failure(exc):
            distributed.note_failure(info, exc)
            raise
        raise distributed.rank_failure(info, exc) from None
    finally:
        if info.enabled:  # free the run's cycles (its DDP model holds the group) while the interpreter is
            gc.collect()  # whole: gloo work freed at exit can abort a finished rank (pytorch #190489)
        distributed.cleanup(info)


def recipe_note(spec: RunSpec) -> str | None:
    """The console line saying that, and why, a run without ``--config`` trains the built-in recipe
    scaled to its budget, batch or length (:func:`seqwarm.config.defaults.default_train_config`); None when
    it trains the recipe as written, or a config file of its own (which is never scaled)."""
    if spec.config:
        return None
    written, scaled = default_train_config(), recipe_config(spec)
    before, after = written["curriculum_learning"], scaled["curriculum_learning"]
    changes = [
        f"{key} {old[key]} -> {new[key]}"
        for old, new in ((before, after), (before["schedule_config"], after["schedule_config"]))
        for key in old
        if not isinstance(old[key], dict) and old[key] != new[key]
    ]
    if not changes:
        return None
    settings, recipe = spec.settings, written["seqwarm"]
    causes = [
        f"{flag_for(key)} {human_count(settings[key]) if key == 'train_tokens' else settings[key]}"
        for key, default in (
            ("train_tokens", recipe["train_tokens"]),
            ("train_batch_size", written["train_batch_size"]),
            ("seq_length", recipe["seq_length"]),
        )
        if settings.get(key) is not None and settings[key] != default
    ]
    length = scaled["seqwarm"]["seq_length"]
    if settings.get("seq_length") is None and length != recipe["seq_length"]:
        causes.append(f"--model {spec.model} (length {length})")
    return (
        f"recipe:      the built-in recipe, scaled to {' and '.join(causes)}: {', '.join(changes)} (the "
        f"curriculum keeps its share: {CURRICULUM_FRACTION:.0%} of the steps the budget takes at full length; "
        "--config FILE trains a recipe as written)"
    )


def _print_plan(cfg: RunConfig, start_step: int, train_windows: int | None = None) -> Plan | None:
    """What the run will do, from the same pure schedules the engine uses; with ``train_windows`` (the
    training split's windows), how many passes over the data the budget makes. Returns the plan (None:
    it cannot be planned), from which the console's ETA counts the steps and tokens left."""

    try:
        plan = make_plan(cfg)
    except UserError:
        return None
    ends = (
        f"; the curriculum reaches full length at step {plan.curriculum_end_step:,}" if plan.curriculum_end_step else ""
    )
    print(
        f"plan:        about {plan.total_steps:,} steps{ends}"
        + (f" (resuming at {start_step:,})" if start_step else ""),
        flush=True,
    )
    warnings = list(plan.warnings)
    if train_windows:
        line, too_many = data_use(plan, train_windows)
        print(line, flush=True)
        warnings += [too_many] if too_many else []
    for message in warnings:
        if message not in cfg.warnings:
            logger.warning("warning: %s", message)
    return plan


VARIABLE_PLAN_STEPS = 250_000
"""The most steps a run in curriculum mode variable replays at its start to print its plan (~20 s)."""


def _print_variable_plan(cfg: RunConfig, run, say) -> None:
    """Curriculum mode variable at the start of a run: the mode line, the bucket table ``seqwarm plan``
    prints (short form, from the run's own decompositions and samplers' settings) and its warnings."""
    say(run.batches.describe(), flush=True)
    per_step, longest = run.batches.tokens_per_step, run.batches.settings.max_length
    bounds = [-(-cfg.train_tokens // per_step)] if cfg.train_tokens else []
    bounds += [cfg.train_iters] if cfg.train_iters else []
    bounds += [-(-cfg.train_samples * longest // per_step)] if cfg.train_samples else []  # >= per_step / longest rows
    if min(bounds, default=0) > VARIABLE_PLAN_STEPS:  # the replay takes ~80 us a step: not minutes before step 1
        say(
            f"plan:        up to {min(bounds):,} steps, too many to replay here (over {VARIABLE_PLAN_STEPS:,}); "
            "seqwarm plan --curriculum-mode variable with the same arguments shows the buckets and warnings",
            flush=True,
        )
        if cfg.train_tokens:  # every step the same tokens
            run.log.expect(bounds[0], bounds[0] * per_step)
        return
    try:
        plan = run.batches.plan(cfg)
    except UserError as err:  # e.g. a budget past the plan's step limit: the run itself goes on
        logger.warning("warning: no plan of the variable-length run (%s)", err)
        return
    for line in bucket_lines(plan, short=True):
        say(line, flush=True)
    resuming = f" (resuming at {run.engine.global_steps:,})" if run.engine.global_steps else ""
    say(
        f"plan:        {plan.total_steps:,} steps of {human_count(plan.tokens_per_step)} tokens{resuming}; "
        f"passes: the times a bucket's chunks are trained over the run (seqwarm plan shows the rest)",
        flush=True,
    )
    for message in plan.warnings:
        if message not in cfg.warnings:
            logger.warning("warning: %s", message)
    run.log.expect(plan.total_steps, plan.total_tokens)


def _data_dir(spec: RunSpec, info) -> Path:
    from seqwarm.data import embedded_data_dir
    from seqwarm.trainer.distributed import barrier

    if spec.data:
        data_dir = Path(spec.data)
    else:  # rank 0 prepares the embedded corpus once; the others wait for it
        if info.is_main:
            embedded_data_dir()
        barrier(info)
        data_dir = embedded_data_dir()
    if not data_dir.exists():
        raise UserError(
            f"--data {data_dir}: no such folder (make it from your text with "
            f"`seqwarm prepare --input TEXT --out {data_dir}`; TEXT: .txt/.jsonl files or folders of them)"
        )
    return data_dir


def _check_memory(spec: RunSpec, cfg: RunConfig, model_cfg, info, device, choices: RunChoices) -> None:
    """:func:`seqwarm.trainer.memory.check_memory` for this run's model, batch, precision and sharding."""
    zero = (cfg.deepspeed or {}).get("zero_optimization") or {}
    sharded = spec.fsdp or (spec.deepspeed and isinstance(zero, dict) and int(zero.get("stage") or 0) > 0)
    half = choices.precision in ("fp16", "bf16")
    rows, length = longest_shape(cfg) if cfg.stages else (cfg.micro_batch_size, model_cfg.seq_length)
    estimate = estimate_memory(
        model_cfg.num_params(),
        vocab_rows=getattr(model_cfg, "padded_vocab_size", model_cfg.vocab_size),
        n_embd=model_cfg.n_embd,
        n_layer=model_cfg.n_layer,
        micro_batch=rows,
        seq_length=length,
        half=half,
        shards=info.world_size if sharded else 1,
    )
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) if info.enabled else 1
    check_memory(estimate, device, local_processes=local, sharded=sharded)


def _run(spec: RunSpec, info, stop) -> TrainResult:
    from seqwarm.trainer.run_folder import prepare_run_dir

    say = print if info.is_main else (lambda *a, **k: None)
    stages = spec.pipeline_stages or 1  # pipeline stages share one data-parallel replica
    if info.world_size % stages:
        raise UserError(f"--pipeline-stages {stages} must divide the number of processes ({info.world_size})")
    cfg = resolve_config(spec, world_size=info.world_size // stages)
    if spec.eval_wikitext or spec.eval_lambada:
        from seqwarm.evaluation import check_eval_files

        check_eval_files(wikitext=spec.eval_wikitext, lambada=spec.eval_lambada)  # fail before training
    if info.enabled and not spec.out:
        raise UserError("under torchrun, give --out (every rank must agree on the run folder)")
    name = spec.model if not spec.model.startswith("hf:") else "hf-" + Path(spec.model[3:]).stem
    out = Path(spec.out) if spec.out else Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    spec = replace(spec, out=out)  # the run folder, named
    folder = prepare_run_dir(spec, info)  # locked until the run ends; removed again if it stays empty
    try:
        return _train_in(folder, spec, cfg, info, say, stop)
    finally:
        folder.close()


def _train_in(folder, spec: RunSpec, cfg: RunConfig, info, say, stop) -> TrainResult:
    """The run in its locked folder (see :func:`_run`)."""
    from seqwarm.data import open_prepared
    from seqwarm.trainer.backends import TorchEngineBuilder, decide
    from seqwarm.trainer.distributed import device_for
    from seqwarm.trainer.loop import Run
    from seqwarm.trainer.model import GPTConfig
    from seqwarm.trainer.optim import apply_optimizer_settings
    from seqwarm.trainer.record import finish_lines, format_start, record_session
    from seqwarm.trainer.resume import saved_section
    from seqwarm.trainer.stop import RunStopped

    stages = spec.pipeline_stages or 1
    if spec.data_path:
        from seqwarm.data.megatron import open_megatron

        data = open_megatron(
            spec.data_path,
            split=spec.split,
            split_rounding=spec.split_rounding,
            tokenizer=spec.tokenizer,
            vocab_size=spec.vocab_size,
            eod_id=spec.eod_id,
        )
    else:
        data_dir = _data_dir(spec, info)
        folder.hold_data(data_dir)  # prepare --force refuses to replace the data under this run
        data = open_prepared(data_dir)
    if spec.model.startswith("hf:"):
        from seqwarm.integrations.hf.run import HFEngineBuilder, HFModelConfig, hf_model_path

        model_cfg = HFModelConfig.from_path(  # its positions must hold the longest stage too
            hf_model_path(spec.model),
            vocab_size=data.vocab_size,
            seq_length=model_length(cfg) if cfg.stages else cfg.seq_length,
        )
        builder = HFEngineBuilder()
    else:
        model_cfg = GPTConfig.preset(
            spec.model,
            vocab_size=data.vocab_size,
            seq_length=model_length(cfg) if spec.rotary else cfg.seq_length,  # rotary: the longest stage's
            rotary=spec.rotary,
            **model_overrides(spec),
        )
        if spec.deepspeed:
            from seqwarm.integrations.deepspeed.run import DeepSpeedEngineBuilder

            builder = DeepSpeedEngineBuilder(pipeline_stages=stages if stages > 1 else 0)
        else:
            builder = TorchEngineBuilder(fsdp=spec.fsdp, compile=cfg.compile)
    # the precision and the curriculum mode, decided once, before anything is built
    device = device_for(info, spec.device)
    resumed = saved_section(Path(spec.out), "run").get("precision") if spec.resume else None
    choices = decide(cfg, builder, model_cfg, device, resumed)
    _check_memory(spec, cfg, model_cfg, info, device, choices)  # before the model is built: an exit 2, not an OOM
    options = run_options(spec)
    run = Run(cfg, options, data, model_cfg, dist_info=info, builder=builder, choices=choices, stop=stop)
    spec = replace(spec, start_over=False)  # done: the old record is moved aside (a stopped run continues)
    resuming = bool(spec.resume) and folder.holds_run  # --resume auto on a folder with no run: a new one
    resumed = run.resume() if resuming else False
    if resumed:  # a changed weight decay / betas / eps (--allow-config-change) is used, not the old one
        apply_optimizer_settings(run.optimizer, run.cfg)
    if resuming and not resumed:
        say(
            f"{spec.out} has no checkpoint yet (the run stopped before its first one): starting it again from step 0",
            flush=True,
        )
    # config.json when the run starts; a resume appends to history.jsonl and leaves config.json alone
    recorded = record_session(run, run.resumed_from if resumed else None, folder.moved_to) if info.is_main else []
    for line in format_start(run):
        say(line, flush=True)
    note = recipe_note(spec)
    if note:
        say(note, flush=True)
    if resumed:
        say(f"resuming at step {run.engine.global_steps:,} ({run.engine.progress.tokens:,} tokens)", flush=True)
    for line in recorded:
        logger.warning("%s", line)
    if info.is_main and run.choices.mode == "variable":  # what the mode does; every step the same tokens
        _print_variable_plan(cfg, run, say)
    elif info.is_main:
        plan = _print_plan(cfg, run.engine.global_steps, len(run.batches.windows))
        if plan is not None:
            run.log.expect(plan.total_steps, plan.total_tokens)
    try:
        result = run.train()
    except RunStopped as stopped:  # the command that continues the run (under torchrun: launched the same way)
        stopped.resume_command = command_line(spec) + ("" if spec.resume else " --resume")
        stopped.quiet = not info.is_main
        raise
    for line in finish_lines(result):
        say(line, flush=True)
    if (spec.eval_wikitext or spec.eval_lambada) and info.is_main:
        from seqwarm.evaluation import run_paper_evals

        res = run_paper_evals(
            run.run_dir,
            wikitext=spec.eval_wikitext,
            lambada=spec.eval_lambada,
            device=spec.device,
            progress=spec.progress_bar,
        )
        for line in format_results(res):
            print(line, flush=True)
    return result
