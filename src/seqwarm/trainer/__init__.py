"""seqwarm's own training loop (``loop``: ``Run``, what ``seqwarm train`` runs) and the parts a run is built
from: the model, the optimizer, checkpoints and the checkpointer, the device feed, the evaluator, the
metrics, trackers and plots, torch.distributed setup, the run folder and its lock, and ``backends``
(the engine builders the loop calls; DeepSpeed and Hugging Face bring their own). This ``__init__``
imports nothing, so that light modules (``metrics``, ``plots``, ``run_folder``) stay free of torch.
"""
