"""Foundations every layer may use: ``errors`` (``UserError`` -> exit 2, ``MissingDependencyError``),
``units`` (1.5M-style counts), ``atomic`` (the temp-file-and-rename every file seqwarm writes goes
through), ``problems`` (the ``Checker`` that collects every config problem, ``ConfigError``) and
``version``. These modules import nothing of seqwarm but each other; nothing is re-exported here,
import the module that defines the name.
"""
