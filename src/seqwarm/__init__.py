"""seqwarm: sequence-length curriculum learning for GPT pretraining."""

__version__ = "0.1.0"
