"""Every README snippet runs: Python blocks are executed, every `seqwarm ...` command line is run
(training and prepare lines with a tiny budget / tiny input appended, so they finish in seconds). The
Python blocks of the pages in PAGES (docs/YOUR_LOOP.md, ...) run too.

The slow, end-to-end tests of this file are in tests/e2e/test_readme_runs.py.
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from seqwarm.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = ("docs/YOUR_LOOP.md", "docs/STAGES.md", "docs/VARIABLE.md")
"""Pages of docs/ whose Python blocks run here like the README's."""


def blocks(lang, text=README):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


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


PAGE_BLOCKS = [(page, code) for page in PAGES for code in blocks("python", (ROOT / page).read_text())]


@pytest.mark.parametrize("page, code", PAGE_BLOCKS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(PAGE_BLOCKS)])
def test_python_blocks_of_the_pages_run(page, code):
    exec(compile(code, page, "exec"), {})


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


def test_help_runs(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    assert "--train-tokens" in capsys.readouterr().out


def test_every_command_and_doc_is_in_the_readme():
    """A new user finds every command (a `seqwarm CMD` line) and every page of docs/ from the README."""
    shown = {shlex.split(line)[1] for line in commands()}
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) <= shown, f"commands missing from the README: {set(sub.choices) - shown}"
    linked = set(re.findall(r"\]\((docs/[A-Z_]+\.md)", README))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README never links: {pages - linked}"


DURATION = re.compile(r"\b\d+m\d+s\b|~?\d+(?:\.\d+)? ?(?:min(?:ute)?s?)\b")


def _demo_section() -> str:
    return README.split("## What `make demo` does")[1].split("\n## ")[0]


def test_the_demo_time_is_stated_once_and_is_the_measured_one():
    """The demo's duration lives in "What `make demo` does" (the figure of docs/PERFORMANCE.md's
    measurement); the opening lines and `train --help` point there instead of giving their own."""
    first = blocks("bash")[0]
    assert not DURATION.search(first), first
    from seqwarm.cli.commands.train import DESCRIPTION

    assert not DURATION.search(DESCRIPTION) and "What `make demo` does" in DESCRIPTION
    perf = (ROOT / "docs" / "PERFORMANCE.md").read_text().split("## The main job")[1]
    whole = re.search(r"\| whole command \| (\d+m\d+s) wall", perf).group(1)
    training = re.search(r"\| training, 358 steps, [\d,]+ tokens \| (\d+m\d+s)", perf).group(1)
    section = _demo_section()
    assert f"**{whole}**" in section and f"{training} of training" in section
    outside = README.replace(section, "")
    demo_lines = [line for line in outside.splitlines() if "demo" in line and DURATION.search(line)]
    assert not demo_lines, demo_lines


def test_the_quick_compare_time_is_the_measured_one():
    """`compare --quick`'s time: RESULTS.md's measurement, quoted by the README; --help gives no figure."""
    results = (ROOT / "docs" / "RESULTS.md").read_text().split("## `seqwarm compare --quick`")[1]
    measured = re.search(r"\*\*Total time\*\*: (\d+m\d+s)", results).group(1)
    line = next(c for c in README.splitlines() if c.startswith("seqwarm compare --quick"))
    assert f"# {measured} on 2 idle cores (docs/RESULTS.md)" in line
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    quick = next(a for a in sub["compare"]._actions if "--quick" in a.option_strings)
    assert not DURATION.search(quick.help) and "docs/RESULTS.md" in quick.help


def test_the_demo_section_matches_the_default_recipe():
    """Steps, budget, batch and curriculum the README states are what the default run's plan says."""
    from seqwarm.curriculum.plan import make_plan
    from seqwarm.run.spec import RunSpec, resolve_config

    cfg = resolve_config(RunSpec())
    plan = make_plan(cfg)
    section = _demo_section()
    cur = cfg.curriculum
    assert f"{plan.total_steps} optimizer steps" in section
    assert f"{cfg.train_tokens / 1e6:g}M tokens" in section
    assert f"{cur.min_difficulty} → {cur.max_difficulty} tokens" in section
    assert f"{cfg.train_batch_size} sequences per step" in section


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_what_the_readme_writes_into_the_checkout_is_ignored():
    """`data/...`, `runs/...`, `hf/...`: the README's commands write there; git status stays clean."""
    outputs = set()
    for line in commands():
        argv = shlex.split(line)
        outputs |= {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--out", "--hf")}
    outputs.add("runs/tiny-20261201-120000")  # `seqwarm train` without --out
    assert {p.split("/")[0] for p in outputs} >= {"data", "runs", "hf"}
    for path in sorted(outputs):
        done = subprocess.run(["git", "check-ignore", "-q", f"{path}/x"], cwd=ROOT)
        assert done.returncode == 0, f"{path} (written by a README command) is not git-ignored"
    tracked = subprocess.run(["git", "check-ignore", "-q", "src/seqwarm/data/dataset.py"], cwd=ROOT)
    assert tracked.returncode == 1, "the ignore rule for data/ must not hide the seqwarm.data package"
