"""``seqwarm train --help`` says which exit code each stop signal gives, and why Ctrl-C gives 75 (issue #39)."""

from __future__ import annotations

import signal

from seqwarm.cli import build_parser


def train_help() -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return " ".join(sub.choices["train"].format_help().split())  # one line: argparse wraps the text


def test_train_help_says_which_exit_code_each_signal_gives():
    text = train_help()
    assert "exits 75" in text and "SIGTERM, SIGINT (Ctrl-C), SIGUSR1" in text and "SIGHUP" in text
    assert "requeue" in text  # why 75 and not 130 for Ctrl-C
    for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP"):  # a second signal: 128+N, by this platform's N
        assert f"{128 + getattr(signal, name)} {name}" in text
    assert "130 SIGINT" in text and "143 SIGTERM" in text
