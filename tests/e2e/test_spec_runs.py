"""The Python entry point (RunSpec + run_training) and the `seqwarm train` flags generated from it.

The slow, end-to-end part; the fast tests are in tests/run/test_spec.py.
"""

import json
from dataclasses import replace

import pytest

from conftest import small_config
from seqwarm.run.spec import RunSpec, with_changes
from seqwarm.run.training import run_training


@pytest.mark.slow
def test_tiny_run_from_python(tmp_path, byte_data):
    """A training run from a RunSpec alone: no argparse, no CLI module."""
    spec = RunSpec(
        config=small_config(tmp_path / "c.json", train_tokens=1500),
        data=byte_data,
        out=tmp_path / "run",
        device="cpu",
        eval_iters=2,
        log_interval=1,
        progress_bar=False,
        tensorboard=False,
    )
    result = run_training(spec)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result.stop_reason.startswith("reached the token budget") and result.tokens >= 1500
    assert summary["steps"] == result.steps and summary["final_val_loss"] == pytest.approx(result.final_val_loss)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["options"]["progress_bar"] is False and config["parallelism"] == "none"
    # the same spec again resumes nothing new: the run is finished, a longer budget continues it
    longer = with_changes(spec, train_tokens=3000, resume=True, allow_config_change=True)
    assert run_training(longer).tokens >= 3000
    with pytest.raises(Exception, match="already holds a run"):
        run_training(replace(spec))
