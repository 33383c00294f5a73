"""Every README snippet runs: Python blocks are executed, every `seqwarm ...` command line is run
(training and prepare lines with a tiny budget / tiny input appended, so they finish in seconds).

The slow, end-to-end part; the fast tests are in tests/test_readme.py.
"""

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from conftest import make_corpus
from seqwarm.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def commands():
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("seqwarm "):
                out.append(line)
    return out


@pytest.mark.slow
def test_train_and_prepare_commands_run(tmp_path, byte_data, monkeypatch, capsys):
    """The README's prepare/train/export lines, on a tiny corpus and budget (same flags otherwise)."""
    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "my_texts", docs=12, words_per_doc=200)
    small = [
        "--train-tokens",
        "1500",
        "--eval-iters",
        "1",
        "--no-progress",
        "--no-tensorboard",
        "--seq-length",
        "64",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "4",
    ]
    for line in commands():
        argv = shlex.split(line)[1:]
        if argv[0] == "prepare":
            argv = [a if a != "bpe:16384" else "bpe:300" for a in argv]
            assert main(argv + ["--workers", "1"]) == 0
        elif argv[0] == "train" and argv != ["train", "--help"]:
            if "--data" not in argv:
                argv += ["--data", str(byte_data)]
            # the README's budget flags are replaced by the tiny ones appended (argparse: last wins)
            code = main(argv + small + ["--lr-warmup-iters", "1"] + _curriculum_for(argv))
            assert code == 0, capsys.readouterr().err
            assert "data use:" in capsys.readouterr().out  # passes over the data the budget makes
        elif argv[0] == "eval":
            assert main(argv + ["--no-progress"]) == 0, capsys.readouterr().err
            assert "val:" in capsys.readouterr().out
        elif argv[0] == "export" and importlib.util.find_spec("transformers") is not None:
            assert main(argv) == 0, capsys.readouterr().err
            assert (Path(argv[argv.index("--hf") + 1]) / "model.safetensors").is_file()


def _curriculum_for(argv):
    # the default recipe grows 8 -> 256; at --seq-length 64 the curriculum must end at 64 too
    return [] if "--no-curriculum" in argv else ["--config", str(_tiny_cfg())]


def _tiny_cfg():
    from conftest import small_config

    path = Path("tiny_readme.json")
    if not path.exists():
        small_config(path, seq=64, batch=4, micro=4)
    return path.resolve()
