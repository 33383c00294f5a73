"""Numbers at the edges (issue #26, item 5): a diverging run (LR 1e6) exits 3 and keeps its last good
checkpoint; a budget smaller than one step trains one whole step; total_curriculum_step 1 trains at full
length from step 1; max_difficulty 1 trains length-1 sequences (warned); clipping 0 is no clipping."""

import json

import pytest
import torch

from conftest import small_config, train_rows
from seqwarm.cli import main
from seqwarm.trainer.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

FAST = ["--model", "tiny", "--eval-iters", "1", "--no-progress", "--no-tensorboard", "--log-interval", "1"]


def train(tmp_path, byte_data, *args, **cfg):
    path = small_config(tmp_path / "c.json", **cfg)
    out = tmp_path / "run"
    code = main(["train", *FAST, "--config", str(path), "--data", str(byte_data), "--out", str(out), *args])
    return code, out


def test_a_diverging_run_exits_3_keeping_its_last_good_checkpoint(tmp_path, byte_data, capsys):
    path = small_config(tmp_path / "c.json", train_tokens=20_000)
    cfg = json.loads(path.read_text())
    cfg["optimizer"]["params"]["lr"] = 1e6
    path.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    args = ["--config", str(path), "--data", str(byte_data), "--out", str(out), "--save-interval", "1"]
    assert main(["train", *FAST, *args, "--eval-interval", "0"]) == 3
    err = capsys.readouterr().err
    saved = list_checkpoints(out / "checkpoints")
    assert saved and f"the last good checkpoint is {saved[-1][1]}" in err, err
    tensors = list(tensors_of(torch.load(saved[-1][1], weights_only=False)))
    assert tensors and all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())  # finite


def tensors_of(value):
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_of(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_of(v)


def test_a_budget_smaller_than_one_step_trains_one_whole_step(tmp_path, byte_data, caplog):
    code, out = train(tmp_path, byte_data, train_tokens=10)
    assert code == 0
    rows = train_rows(out)
    assert [r["step"] for r in rows] == [1] and rows[0]["tokens"] == 8 * 16  # 8 sequences at length 16
    assert "training stops at step 1" in caplog.text


def test_total_curriculum_step_1_trains_at_full_length_from_step_1(tmp_path, byte_data):
    code, out = train(tmp_path, byte_data, "--train-iters", "3", total_step=1, train_tokens=100_000)
    assert code == 0
    assert [r["seqlen"] for r in train_rows(out)] == [64, 64, 64]


def test_max_difficulty_1_trains_length_one_sequences(tmp_path, byte_data, caplog):
    path = small_config(tmp_path / "c.json", train_tokens=24)
    cfg = json.loads(path.read_text())
    cfg["curriculum_learning"].update(min_difficulty=1, max_difficulty=1)
    cfg["curriculum_learning"]["schedule_config"]["difficulty_step"] = 1
    path.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    assert main(["train", *FAST, "--config", str(path), "--data", str(byte_data), "--out", str(out)]) == 0
    rows = train_rows(out)
    assert {r["seqlen"] for r in rows} == {1} and rows[-1]["tokens"] == 24
    assert "max_difficulty 1 < seq_length 64" in caplog.text


def test_clipping_0_is_no_clipping(tmp_path, byte_data):
    losses = {}
    for clip in (0.0, 1e9, 1e-3):
        (tmp_path / str(clip)).mkdir()
        code, out = train(tmp_path / str(clip), byte_data, "--train-iters", "3", "--clip-grad", str(clip))
        assert code == 0
        losses[clip] = [r["loss"] for r in train_rows(out)]
        assert json.loads((out / "config.json").read_text())["run"]["gradient_clipping"] == clip
    # 0 trains as a clip no gradient reaches; clipped to 1e-3, the later steps start from other weights
    assert losses[0.0] == pytest.approx(losses[1e9], rel=1e-6)
    assert losses[0.0][2] != pytest.approx(losses[1e-3][2], rel=1e-4)
