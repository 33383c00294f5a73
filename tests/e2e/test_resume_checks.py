"""What ``--resume`` checks (issue #26, item 3), on a tiny byte-level run stopped at step 4 of 6: another
model size, sequence length or tokenizer is refused with exit 2 and a diff of recorded -> given, also with
--allow-config-change (the weights would not fit); another seqwarm version continues and is recorded; a
run folder moved elsewhere (with its data moved too) resumes to the same losses."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import make_corpus, small_config, train_rows
from seqwarm.cli import main
from seqwarm.data import prepare_dataset

pytestmark = pytest.mark.slow

FAST = ["--model", "tiny", "--eval-iters", "1", "--no-progress", "--no-tensorboard", "--log-interval", "1"]
RUN = ["--train-iters", "6", "--save-interval", "2", "--eval-interval", "0", "--keep-checkpoints", "0"]


def train(args):
    try:
        return main(["train", *FAST, *RUN, *args])
    except SystemExit as exc:
        return exc.code


@pytest.fixture(scope="module")
def finished(tmp_path_factory, byte_data):
    """A finished 6-step run (checkpoints 2, 4, 6) on a copy of the byte data, and its config."""
    base = tmp_path_factory.mktemp("checks")
    data = base / "data"
    shutil.copytree(byte_data, data)
    cfg = small_config(base / "c.json", train_tokens=100_000, total_step=3)
    assert train(["--config", str(cfg), "--data", str(data), "--out", str(base / "run")]) == 0
    return base / "run", cfg, data


def stopped_copy(finished, where: Path) -> Path:
    """The finished run as if stopped after step 4 (its newest checkpoint)."""
    shutil.copytree(finished[0], where)
    (where / "summary.json").unlink()
    (where / "checkpoints" / "step_00000006.pt").unlink()
    return where


@pytest.mark.parametrize(
    "given, diff",
    [(["--n-layer", "2"], "n_layer 4 -> 2"), (["--n-embd", "128"], "n_embd 256 -> 128"), ([], "seq_length 64 -> 32")],
    ids=["layers", "width", "seq-length"],
)
def test_another_model_or_length_is_refused_with_the_diff(finished, tmp_path, capsys, given, diff):
    run = stopped_copy(finished, tmp_path / "run")
    cfg = finished[1] if given else small_config(tmp_path / "c32.json", train_tokens=100_000, total_step=3, seq=32)
    common = ["--config", str(cfg), "--data", str(finished[2]), "--out", str(run), "--resume"]
    for extra in ([], ["--allow-config-change"]):
        assert train([*common, *given, *extra]) == 2
        err = capsys.readouterr().err
        assert diff in err and "Traceback" not in err, err
    assert not (run / "checkpoints" / "step_00000006.pt").exists()  # nothing was trained


def test_another_tokenizer_is_refused_with_the_diff(finished, tmp_path, capsys):
    run = stopped_copy(finished, tmp_path / "run")
    corpus = make_corpus(tmp_path / "corpus", docs=10, words_per_doc=300)
    other = tmp_path / "bpe"
    prepare_dataset(other, [corpus], tokenizer="bpe:300", val_fraction=0.1, workers=1, progress=False)
    common = ["--config", str(finished[1]), "--data", str(other), "--out", str(run), "--resume"]
    for extra in ([], ["--allow-config-change"]):
        assert train([*common, *extra]) == 2
        err = capsys.readouterr().err
        assert "vocab_size" in err and "->" in err and "Traceback" not in err, err


def test_another_seqwarm_version_continues_and_is_recorded(finished, tmp_path):
    run = stopped_copy(finished, tmp_path / "run")
    ckpt = run / "checkpoints" / "step_00000004.pt"
    state = torch.load(ckpt, weights_only=False)
    state["config"]["versions"]["seqwarm"] = "0.0.1"
    torch.save(state, ckpt)
    assert train(["--config", str(finished[1]), "--data", str(finished[2]), "--out", str(run), "--resume"]) == 0
    resume = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    resume = [e for e in resume if e["event"] == "resume"]
    assert resume[-1]["changed"]["versions.seqwarm"][0] == "0.0.1"
    assert [r["loss"] for r in train_rows(run)] == [r["loss"] for r in train_rows(finished[0])]


def test_a_run_folder_moved_with_its_data_resumes_to_the_same_losses(finished, tmp_path):
    run = stopped_copy(finished, tmp_path / "elsewhere" / "run")
    data = tmp_path / "elsewhere" / "data"
    shutil.copytree(finished[2], data)
    assert train(["--config", str(finished[1]), "--data", str(data), "--out", str(run), "--resume"]) == 0
    assert [r["loss"] for r in train_rows(run)] == [r["loss"] for r in train_rows(finished[0])]
    assert (run / "checkpoints" / "step_00000006.pt").exists()
