"""A short, human description of a checked run config (``check-config``, ``plan`` and ``train`` print it)."""

from __future__ import annotations

from seqwarm.config.reader import APPLIED_DS_KEYS, TRACKER_DS_KEYS
from seqwarm.config.run import RunConfig
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.util.units import human_count


def describe(cfg: RunConfig) -> list[str]:
    """A short, human summary of what ``cfg`` makes a run do."""
    lines = []
    batch = (
        f"{cfg.train_batch_size} sequences per step ({cfg.micro_batch_size} per micro-batch x "
        f"{cfg.gradient_accumulation_steps} accumulation x {cfg.world_size} rank"
        f"{'s' if cfg.world_size != 1 else ''})"
    )
    lines.append(f"batch:       {batch}")
    cur = cfg.curriculum
    if cur is None:
        lines.append("curriculum:  off (every step at full length)")
    else:
        sc = cur.schedule_config
        if cur.schedule_type in ("fixed_linear", "fixed_root"):
            shape = "linearly" if cur.schedule_type == "fixed_linear" else f"as a root of degree {sc['root_degree']:g}"
            start = difficulty_at(1, cur)  # the length step 1 trains at (min_difficulty rounded to the step)
            how = (
                f"{start} -> {cur.max_difficulty} tokens {shape} over "
                f"{sc['total_curriculum_step']:,} steps, in multiples of {sc['difficulty_step']}"
                + (
                    f", min_difficulty {cur.min_difficulty} rounded up to {start}"
                    if start != cur.min_difficulty
                    else ""
                )
            )
        elif cur.schedule_type == "fixed_discrete":
            stages = ", ".join(f"{d} until step {s:,}" for d, s in zip(sc["difficulty"], sc["max_step"]))
            how = f"{stages}, then {sc['difficulty'][-1]}"
        else:
            how = f"custom function, {cur.min_difficulty} -> {cur.max_difficulty}"
        mode = cur.mode or (
            "truncate" if cfg.length_bucket else "inject curriculum_seqlen if the model takes it, else truncate"
        )
        if cfg.length_bucket:
            mode += f", cut to multiples of {cfg.length_bucket} with the loss masked past the length"
        if cur.mode == "variable":  # the schedule above is the cap only under variable_curriculum schedule
            name = cfg.variable_curriculum
            mode += (
                f": every row one document, chunks of power-of-2 lengths {cur.min_difficulty}..{cur.max_difficulty}, "
                f"each step one length with the same tokens; curriculum {name}"
                + (f" ({cfg.variable_cycles} cycles)" if name == "grow_p2" else "")
                + (" (the schedule is the cap on the length)" if name == "schedule" else "")
            )
        lines.append(f"curriculum:  seqlen {how} ({cur.source} block; mode: {mode})")
    for i, stage in enumerate(cfg.stages):
        head = "stages:      " if i == 0 else "             "
        lines.append(f"{head}{i + 1}. from {human_count(stage.start_tokens)} tokens: {stage.describe()}")
    lr = cfg.lr
    warm = (
        f"warmup {lr.warmup_iters or lr.warmup_samples or lr.warmup_tokens:,} {lr.warmup_unit}"
        if lr.warmup_unit
        else "no warmup"
    )
    decay = (
        "constant"
        if lr.decay_style == "constant"
        else (
            f"{lr.decay_style} decay to {lr.min_lr:g}"
            + (f" over {human_count(getattr(lr, 'decay_' + lr.decay_unit))} {lr.decay_unit}" if lr.decay_unit else "")
        )
    )
    lines.append(f"lr:          peak {lr.lr:g}, {warm}, {decay}")
    if lr.rule == "megatron":
        lines.append(
            "rules:       Megatron-DeepSpeed's (its command line was given; --no-megatron for seqwarm's): the LR "
            "of its OptimizerParamScheduler step for step (step n at the LR set after step n-1), the optimizer "
            "from its flags. Deliberate differences: the curriculum gives exactly max_difficulty from "
            "total_curriculum_step on, and the LR warmup end is recorded when the warmup is reached or passed "
            "(Megatron crashes when it is passed over, or when a token decay has no warmup)"
        )
    lines.append(
        f"optimizer:   {cfg.optimizer.type} betas {cfg.optimizer.betas}, weight decay "
        f"{cfg.optimizer.weight_decay:g}, clipping {cfg.gradient_clipping or 'off'}"
    )
    lines.append(f"precision:   {cfg.precision}")
    if cfg.compile:
        lines.append("compile:     torch.compile of seqwarm's GPT, the sequence dimension dynamic")
    budget = [
        f"{human_count(v)} {k}"
        for k, v in (("tokens", cfg.train_tokens), ("iters", cfg.train_iters), ("samples", cfg.train_samples))
        if v
    ]
    lines.append(f"budget:      {', '.join(budget) if budget else 'none set (give --train-tokens to train or plan)'}")
    trackers = [
        k for k in TRACKER_DS_KEYS if isinstance(cfg.deepspeed.get(k), dict) and cfg.deepspeed[k].get("enabled")
    ]
    if trackers:
        lines.append(f"trackers:    {', '.join(trackers)} (logged by seqwarm, with Megatron-DeepSpeed's tags)")
    ds_keys = sorted(k for k in cfg.deepspeed if k not in APPLIED_DS_KEYS and k not in TRACKER_DS_KEYS)
    if ds_keys:
        lines.append(f"for DeepSpeed: {', '.join(ds_keys)} (passed through unchanged)")
    return lines
