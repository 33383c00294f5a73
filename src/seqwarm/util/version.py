"""seqwarm's version, in a module of its own so that any layer can read it without the package facade.

The one place it is written: pyproject.toml reads it from here (``tool.setuptools.dynamic``), and
CHANGELOG.md's newest heading names it. It moves with every release; a change to the public API moves it
and gets a CHANGELOG line.
"""

__version__ = "0.2.0"
