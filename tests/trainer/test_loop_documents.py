"""`seqwarm train --curriculum-mode window --document-masking` (issue #25): the run trains at full length
with the tokens per step of the baseline, the setting is read from the config too, and models that
cannot build per-document attention are refused with one line."""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from helpers import offline_val_masks_documents_as_training_did
from seqwarm import ConfigError, load_config
from seqwarm.cli import main


def _train_rows(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def _run(tmp_path, byte_data, name, *extra):
    cfg = small_config(tmp_path / f"{name}.json")
    out = tmp_path / name
    code = main(
        ["train", *FAST_TRAIN_FLAGS, "--device", "cpu", "--log-interval", "1", "--config", str(cfg)]
        + ["--data", str(byte_data)]
        + ["--out", str(out), *extra]
    )
    assert code == 0
    return _train_rows(out)


@pytest.mark.slow  # three short runs, about a minute on two cores
def test_window_mode_with_document_masking_trains_the_baselines_tokens_per_step(tmp_path, byte_data):
    window = _run(tmp_path, byte_data, "window", "--curriculum-mode", "window", "--document-masking")
    baseline = _run(tmp_path, byte_data, "baseline", "--no-curriculum")
    truncate = _run(tmp_path, byte_data, "truncate")
    assert [r["tokens"] for r in window] == [r["tokens"] for r in baseline]
    assert [r["tokens"] for r in truncate] != [r["tokens"] for r in baseline]
    lengths = [r["seqlen"] for r in window]
    assert lengths[0] < 64 and lengths == [r["seqlen"] for r in truncate][: len(lengths)]  # the same schedule
    assert json.loads((tmp_path / "window" / "config.json").read_text())["run"]["document_masking"] is True
    offline_val_masks_documents_as_training_did(tmp_path / "window")


def test_document_masking_comes_from_the_config_and_is_checked():
    base = {"train_batch_size": 8, "curriculum_learning": {"enabled": False}}
    assert load_config({**base, "seqwarm": {"document_masking": True}}).document_masking is True
    assert load_config(base).document_masking is False
    assert load_config({**base, "seqwarm": {"curriculum_mode": "window"}}).curriculum is None  # no curriculum
    with pytest.raises(ConfigError, match="document_masking"):
        load_config({**base, "seqwarm": {"document_masking": "yes"}})


def test_window_mode_is_refused_for_a_hugging_face_attention_that_cannot_mask_with_one_line(
    tmp_path, byte_data, capsys
):
    pytest.importorskip("transformers")
    model = tmp_path / "hf"
    model.mkdir()
    config = {
        "model_type": "gpt2",
        "n_positions": 64,
        "n_embd": 16,
        "n_layer": 1,
        "n_head": 2,
        "vocab_size": 300,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "attn_implementation": "paged|eager",  # continuous batching's: no mask from position_ids
    }
    (model / "config.json").write_text(json.dumps(config))
    cfg = small_config(tmp_path / "c.json")
    args = ["train", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--data", str(byte_data), "--out", str(tmp_path / "r")]
    code = main([*args, "--model", f"hf:{model}", "--curriculum-mode", "window"])
    err = capsys.readouterr().err
    assert code == 2 and "curriculum_mode 'window'" in err and "'sdpa' (the default)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
