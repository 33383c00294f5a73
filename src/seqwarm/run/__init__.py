"""A training run from Python: ``spec`` holds ``RunSpec`` and ``run_training(spec)`` (what the CLI,
``compare``, ``tune`` and ``sweep`` call; it picks seqwarm's loop, the DeepSpeed or Hugging Face backend
and the evaluations), ``command`` renders a spec as the ``seqwarm train`` command line that reproduces
it. The package sits above ``integrations`` and ``evaluation``; this ``__init__`` imports nothing.
"""
