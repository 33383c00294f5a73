"""Every README snippet runs: Python blocks are executed, every `seqwarm ...` command line is run
(training and prepare lines with a tiny budget / tiny input appended, so they finish in seconds)."""

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from seqwarm.cli import build_parser, main

from conftest import make_corpus

ROOT = Path(__file__).resolve().parents[1]
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


def test_readme_opens_with_the_two_commands():
    first = blocks("bash")[0].splitlines()
    assert first[0].startswith("make demo") and first[1].startswith("make test")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


@pytest.mark.parametrize("code", blocks("python"))
def test_python_blocks_run(code):
    exec(compile(code, "README.md", "exec"), {})


def test_every_command_parses():
    parser = build_parser()
    assert commands()
    for line in commands():
        argv = shlex.split(line)[1:]
        if argv == ["train", "--help"]:
            continue
        parser.parse_args(argv)


@pytest.mark.parametrize("line", [c for c in commands() if c.split()[1] in ("check-config", "plan")])
def test_cheap_commands_run(line, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(line)[1:]) == 0
    out = capsys.readouterr().out
    if " plan " in f" {line} ":
        assert "total steps:               45,000" in out


def test_train_and_prepare_commands_run(tmp_path, byte_data, monkeypatch, capsys):
    """The README's prepare/train/export lines, on a tiny corpus and budget (same flags otherwise)."""
    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "my_texts", docs=12, words_per_doc=200)
    small = ["--train-tokens", "1500", "--eval-iters", "1", "--no-progress", "--no-tensorboard",
             "--seq-length", "64", "--global-batch-size", "4", "--micro-batch-size", "4"]
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


def test_help_runs(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    assert "--train-tokens" in capsys.readouterr().out
