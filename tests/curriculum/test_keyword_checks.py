"""Configuration mistakes made through the keyword API are errors at construction, every problem listed with
its fix, in the keyword API's own words; the DeepSpeed-JSON path keeps what a config file that runs today
does (the same values, read from a file, give the same schedule)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from seqwarm.config import load_config
from seqwarm.curriculum.clock import Progress
from seqwarm.curriculum.lr import LRConfig, lr_at
from seqwarm.curriculum.lr_scheduler import CurriculumLRScheduler
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.util.problems import ConfigError


def ramp(**kw):
    return SequenceLengthWarmup(min_length=8, max_length=64, steps=10, multiple_of=8, **kw)


def file_config(seqwarm, min_difficulty=8, step=8):
    return load_config(
        {
            "train_batch_size": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "curriculum_learning": {
                "enabled": True,
                "curriculum_type": "seqlen",
                "min_difficulty": min_difficulty,
                "max_difficulty": 64,
                "schedule_type": "fixed_linear",
                "schedule_config": {"total_curriculum_step": 10, "difficulty_step": step},
            },
            "seqwarm": seqwarm,
        }
    )


# -- LRConfig ------------------------------------------------------------------------------------------


def test_lr_config_lists_every_problem_with_its_fix():
    with pytest.raises(ConfigError) as err:
        LRConfig(lr=1e-4, min_lr=1e-3, decay_style="cosinus", warmup_iters=-1)
    text = str(err.value)
    assert "3 problems in LRConfig" in text
    assert "decay_style = 'cosinus': unknown decay style. Fix: did you mean \"cosine\"?" in text
    assert "min_lr = 0.001: must not exceed the peak learning rate lr (0.0001)" in text
    assert "warmup_iters = -1" in text


def test_lr_config_refuses_two_lengths_and_a_warmup_past_the_decay():
    with pytest.raises(ConfigError, match="only one warmup length"):
        LRConfig(warmup_iters=10, warmup_samples=100)
    with pytest.raises(ConfigError, match="only one decay length"):
        LRConfig(decay_style="linear", decay_tokens=100, decay_iters=10)
    with pytest.raises(ConfigError, match="warmup must end before the decay does"):
        LRConfig(decay_style="linear", warmup_iters=10, decay_iters=10)
    with pytest.raises(ConfigError, match="unknown LR rule"):
        LRConfig(rule="megatrn")


def test_a_cosine_decay_without_a_length_spans_the_budget_as_in_a_config_file():
    lr = LRConfig(lr=1e-3, decay_style="cosine", warmup_iters=2)
    slw = ramp(lr=lr, train_tokens=5000)
    assert slw.lr_config.decay_tokens == 5000
    assert slw.lr_config == file_config({"train_tokens": 5000, "lr_warmup_iters": 2, "lr_decay_style": "cosine"}).lr
    half = Progress(step=20, samples=40, tokens=2500, warmup_end_tokens=0)
    assert lr_at(half, slw.lr_config) == pytest.approx(0.5e-3 * (1 + math.cos(math.pi / 2)))
    assert lr_at(Progress(step=40, samples=80, tokens=5000, warmup_end_tokens=0), slw.lr_config) == 0.0
    by_iters = ramp(lr=LRConfig(decay_style="linear"), train_iters=50)
    assert by_iters.lr_config.decay_iters == 50 and by_iters.lr_config.decay_tokens is None


def test_a_decay_with_nothing_to_span_is_an_error_at_construction_not_mid_run():
    lr = LRConfig(lr=1e-3, decay_style="cosine", warmup_iters=100)
    with pytest.raises(ConfigError, match="cosine decay needs a length to decay over") as err:
        ramp(lr=lr)
    assert "lr.decay_style" in str(err.value) and "train_tokens=" in str(err.value)
    with pytest.raises(ValueError, match="would hold the peak LR"):
        lr_at(Progress(), lr)  # the pure function refuses it at once, not at the end of the warmup
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="would hold the peak LR"):
        CurriculumLRScheduler(optimizer, lr)


def test_the_file_path_treats_the_same_values_as_before():
    """What a config file says about the same mistakes is unchanged (errors there were errors already)."""
    with pytest.raises(ConfigError, match='did you mean "cosine"'):
        file_config({"train_tokens": 5000, "lr_decay_style": "cosinus"})
    with pytest.raises(ConfigError, match="must not exceed the peak"):
        file_config({"train_tokens": 5000, "lr": 1e-4, "min_lr": 1e-3})
    with pytest.raises(ConfigError, match="needs a length to decay over"):
        file_config({"lr_decay_style": "cosine"})


# -- the schedule's keywords -----------------------------------------------------------------------


def test_a_start_that_is_not_a_multiple_is_refused_with_both_fixes():
    with pytest.raises(ConfigError) as err:
        SequenceLengthWarmup(min_length=12, max_length=64, steps=10, multiple_of=8)
    text = str(err.value)
    assert "min_length = 12: is not a multiple of multiple_of (8, the default)" in text
    assert "would start at 16" in text and "use min_length=16, or multiple_of=4" in text
    # a DeepSpeed file with the same values still runs, with its warning naming the start
    cfg = file_config({}, min_difficulty=12)
    assert cfg.curriculum.min_difficulty == 12
    assert any("the schedule starts at 16" in w for w in cfg.warnings)
    # a discrete schedule has no multiple_of: any start is fine
    SequenceLengthWarmup(schedule="discrete", lengths=[12, 64], until_steps=[5])


def test_keyword_errors_and_warnings_use_the_keyword_words():
    with pytest.raises(ConfigError) as err:
        SequenceLengthWarmup(min_length=64, max_length=8, steps=10)
    text = str(err.value)
    assert "must not exceed max_length (8)" in text and "difficulty" not in text
    slw = ramp()
    slw.begin_step()
    with pytest.warns(UserWarning, match="curriculum max_length 64 != the batch's sequence length 128") as rec:
        slw.cut(torch.zeros(2, 128, dtype=torch.long))
    assert "max_difficulty" not in str(rec[0].message)
    slw.end_step()
    with pytest.raises(RuntimeError, match=r"^step_lr\(\) outside a step"):
        ramp(lr=LRConfig()).step_lr()
    from_file = SequenceLengthWarmup.from_config(file_config({}))
    from_file.begin_step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_file.cut(torch.zeros(2, 128, dtype=torch.long))
    assert any("curriculum max_difficulty 64" in str(w.message) for w in caught)  # the file's own word
