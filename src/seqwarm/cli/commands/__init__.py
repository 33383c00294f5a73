"""The commands of the ``seqwarm`` command line, one module per command, each exposing
``register(subparsers)`` (which adds its sub-parser and sets ``func(args) -> int``); ``common`` holds the
shared flag and printing helpers and ``spec_flags`` the ``seqwarm train`` flags generated from
``RunSpec``. Only the CLI layer imports argparse or these modules (tests/test_layers.py).
"""
