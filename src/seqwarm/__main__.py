"""``python -m seqwarm`` runs the command-line interface."""

from seqwarm.cli import main

raise SystemExit(main())
