"""seqwarm.run.checks: Megatron's model flags (--rotary-percent, --init-method-std) reach the GPT or are
refused with exit 2 before any work; the option combinations no backend runs."""

from __future__ import annotations

import pytest

from seqwarm.cli import main
from seqwarm.run.checks import model_overrides
from seqwarm.run.spec import RunSpec

FAST = ["--no-progress", "--device", "cpu", "--no-tensorboard"]


def test_the_megatron_model_flags_reach_the_gpt():
    assert model_overrides(RunSpec()) == {}
    spec = RunSpec(rotary=True, rotary_percent=0.25, init_method_std=0.013, n_layer=3)
    assert model_overrides(spec) == {"n_layer": 3, "rotary_percent": 0.25, "init_std": 0.013}


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--rotary-percent", "0.25"], "--rotary-percent 0.25: only rotary embeddings rotate; add --rotary"),
        (["--rotary", "--rotary-percent", "0.05"], "rotates 3 of the 64 channels of a head"),
        (["--use-rotary-position-embeddings", "--rotary-percent", "1.5"], "must be in (0, 1]"),
        (["--init-method-std", "0"], "--init-method-std 0.0: must be > 0"),
        (["--model", "hf:somewhere", "--init-method-std", "0.01"], "--init-method-std cannot be combined"),
    ],
)
def test_bad_megatron_model_flags_exit_2_before_any_work(tmp_path, capsys, flags, fragment):
    argv = ["train", *FAST, "--model", "gpt2-124m", *flags, "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()
