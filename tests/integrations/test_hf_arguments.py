"""TrainingArguments under the curriculum: the LR schedule is transformers' own (checked against its
``get_scheduler``, one step ahead), values set in two places must agree, and nothing is replaced silently."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from seqwarm.curriculum.clock import Progress  # noqa: E402
from seqwarm.curriculum.lr import lr_at  # noqa: E402
from seqwarm.integrations.hf.arguments import curriculum_config_for, lr_settings_for, trainer_deepspeed_config  # noqa: E402
from seqwarm.util.errors import UserError  # noqa: E402

CURRICULUM = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 8,
    "max_difficulty": 64,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8},
}
STEPS = 20


def args(tmp_path, **kw):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, report_to=[], use_cpu=True, **kw
    )


def hf_lrs(targs, steps=STEPS):
    """The LR transformers' own scheduler gives each step 1..steps (stepped after each optimizer step)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=targs.learning_rate)
    sched = transformers.get_scheduler(
        targs.lr_scheduler_type,
        opt,
        num_warmup_steps=targs.get_warmup_steps(steps),
        num_training_steps=steps,
        scheduler_specific_kwargs=targs.lr_scheduler_kwargs,
    )
    out = []
    for _ in range(steps + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out  # out[k]: the LR of step k + 1


def seqwarm_lrs(cfg, steps=STEPS):
    return [lr_at(Progress(step=k, samples=2 * k, tokens=16 * k), cfg.lr) for k in range(1, steps + 1)]


@pytest.mark.parametrize(
    "kw",
    [
        {"learning_rate": 1e-3, "lr_scheduler_type": "cosine", "warmup_steps": 3},
        {"learning_rate": 2e-3},  # transformers' defaults: linear decay to 0, no warmup
        {"learning_rate": 1e-3, "lr_scheduler_type": "linear", "warmup_steps": 0.25},  # a ratio of the steps
        {"learning_rate": 1e-3, "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 4},
        {"learning_rate": 1e-3, "lr_scheduler_type": "constant", "warmup_steps": 4},  # transformers: no warmup
        {
            "learning_rate": 1e-3,
            "lr_scheduler_type": "cosine_with_min_lr",
            "warmup_steps": 2,
            "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        },
    ],
)
def test_the_trainers_schedule_is_transformers_own_one_step_ahead(tmp_path, kw):
    targs = args(tmp_path, **kw)
    raw = {"curriculum_learning": CURRICULUM, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    cfg = curriculum_config_for(raw, targs, STEPS)
    theirs = hf_lrs(targs)
    assert seqwarm_lrs(cfg) == pytest.approx(theirs[1:], rel=1e-9, abs=1e-15)
    settings, note = lr_settings_for(raw, targs, STEPS)
    assert settings["lr"] == kw["learning_rate"] and "step k + 1" in note


def test_the_configs_schedule_wins_over_defaults_and_conflicts_are_refused(tmp_path):
    raw = {
        "curriculum_learning": CURRICULUM,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "seqwarm": {"lr_warmup_iters": 2, "lr_decay_style": "cosine", "lr_decay_iters": 10},
    }
    cfg = curriculum_config_for(raw, args(tmp_path, weight_decay=0.1), STEPS)
    assert (cfg.lr.lr, cfg.lr.warmup_iters, cfg.lr.decay_style, cfg.lr.decay_iters) == (3e-3, 2, "cosine", 10)
    with pytest.raises(UserError) as err:
        curriculum_config_for(raw, args(tmp_path, learning_rate=1e-3, lr_scheduler_type="cosine", warmup_steps=5))
    message = str(err.value)
    for part in (
        "optimizer.params.weight_decay = 0.1 but TrainingArguments weight_decay = 0.0",
        "optimizer.params.lr = 0.003 but TrainingArguments learning_rate = 0.001",
        "lr_scheduler_type = 'cosine'",
        "warmup_steps = 5",
    ):
        assert part in message
    with pytest.raises(UserError, match="lr_scheduler_type = 'polynomial' has no exact equivalent"):
        curriculum_config_for({"curriculum_learning": CURRICULUM}, args(tmp_path, lr_scheduler_type="polynomial"))


def test_the_deepspeed_config_leaves_the_lr_to_the_trainer():
    raw = {
        "curriculum_learning": CURRICULUM,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
    }
    ds = trainer_deepspeed_config(raw)
    assert ds == {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}
    assert raw["optimizer"]["params"]["lr"] == 3e-3  # the input is not changed
