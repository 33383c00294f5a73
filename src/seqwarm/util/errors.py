"""Exceptions shared by the library and the CLI.

A :class:`UserError` is a mistake the user can fix (bad config, missing file, bad flag combination):
the CLI prints its message and exits with code 2, without a traceback. Anything else is a bug.
"""

from __future__ import annotations


class SeqwarmError(Exception):
    """Base class of every error seqwarm raises on purpose."""


class UserError(SeqwarmError):
    """Bad input from the user. The CLI prints ``str(err)`` and exits with :attr:`exit_code`."""

    exit_code = 2


class MissingDependencyError(UserError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str = ""):
        self.package = package
        self.extra = extra
        why = f" (needed for {purpose})" if purpose else ""
        super().__init__(f"{package} is not installed{why}. Install it with: pip install 'seqwarm[{extra}]'")
