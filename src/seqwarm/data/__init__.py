"""Data pipeline: embedded corpus, tokenizers, indexed token files, datasets."""
