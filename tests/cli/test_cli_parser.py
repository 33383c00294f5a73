"""The command line itself: every default in --help, no abbreviations, a "did you mean" after a command."""

from __future__ import annotations

import argparse

import pytest

from seqwarm.cli import build_parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _shown_default(action: argparse.Action):
    """The default --help must show (None: nothing to show: a switch, or 'not given')."""
    default = action.default
    if not action.option_strings or action.help == argparse.SUPPRESS or action.nargs == 0:
        return None
    if default in (None, False, argparse.SUPPRESS):
        return None
    if isinstance(default, tuple):
        return ",".join(map(str, default)) if default and any(v is not None for v in default) else None
    return f"{default:g}" if isinstance(default, float) else str(default)


@pytest.mark.parametrize("command", list(_commands()))
def test_help_shows_every_default(command):
    parser = _commands()[command]
    missing = []
    for action in parser._actions:
        value = _shown_default(action)
        if value is None:
            continue
        formatter = parser._get_formatter()
        formatter.add_argument(action)
        text = " ".join(formatter.format_help().split())
        if "default" not in text.lower() or value not in text.replace("-\n", ""):
            missing.append(f"{action.option_strings[0]} (default {value}): {text}")
    assert not missing, "\n".join(missing)


def test_train_help_shows_the_intervals(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, value in (("--save-interval", 100), ("--eval-interval", 50), ("--log-interval", 10)):
        section = text[text.index(f"{flag} N ") :][:200]
        assert f"default: {value}" in section or f"default {value}" in section, section


def test_a_prefix_of_a_flag_is_refused_with_the_flag_named(capsys):
    assert main_exit(["train", "--train-token", "1k"]) == 2
    err = capsys.readouterr().err
    assert "seqwarm train: error: unrecognized arguments: --train-token 1k; did you mean --train-tokens?" in err
    assert err.startswith("usage: seqwarm train")  # the command's usage, not the top-level one


def test_a_mistyped_flag_after_a_command_gets_that_commands_usage(capsys):
    assert main_exit(["plan", "examples/tiny_cpu.json", "--jsn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: seqwarm plan") and "did you mean --json?" in err


def main_exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize("command", ["compare", "tune", "sweep"])
def test_an_experiment_has_one_folder_flag(command, capsys):
    parser = _commands()[command]
    assert "--save " not in parser.format_help() and "--save," not in parser.format_help()
    assert [a.help for a in parser._actions if a.dest == "out"][0].startswith("folder for")
    assert main_exit([command, "--save", "somewhere"]) == 2
    assert "unrecognized arguments: --save somewhere" in capsys.readouterr().err


def test_a_non_ascii_argument_in_an_ascii_file_system_encoding_is_named_not_a_traceback(monkeypatch):
    """main(argv) from Python with a str the legacy encoding cannot hold: still the message, escaped."""
    import sys

    from seqwarm.cli import _argument_encoding_problem

    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "ascii")
    problem = _argument_encoding_problem(["train", "--out", "café長"])
    assert problem is not None and "caf\\xe9\\u9577" in problem and "PYTHONUTF8=1" in problem
    assert _argument_encoding_problem(["train", "--out", "cafe"]) is None
