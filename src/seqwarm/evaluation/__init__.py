"""The evaluators behind :mod:`seqwarm.evaluate` (import them from there)."""
