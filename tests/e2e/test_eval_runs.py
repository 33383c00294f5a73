"""Validation under two gloo ranks: ``--eval-iters`` with Megatron-DeepSpeed's meaning in a Megatron-style run."""

from __future__ import annotations

import json

import pytest

from conftest import run_torchrun

pytestmark = pytest.mark.slow

EVAL_SHARES = """
import json, sys
import torch
import torch.distributed as dist
from seqwarm.data import open_prepared
from seqwarm.trainer.distributed import init_distributed
from seqwarm.trainer.evaluator import Evaluator

info = init_distributed("cpu")
data = open_prepared(sys.argv[1])
megatron = sys.argv[2] == "megatron"
seen = []

class Engine:  # what Evaluator calls; the loss of a batch is the mean of its tokens
    module = torch.nn.Linear(1, 1)
    def eval(self): self.module.eval()
    def train(self, mode=True): self.module.train(mode)
    def __call__(self, batch):
        seen.extend(batch["input_ids"].tolist())
        return batch["input_ids"].float().mean()

# --eval-iters 3, micro-batch 2, accumulation 2, 2 data-parallel ranks
evaluator = Evaluator(data, 64, 2, 3, torch.device("cpu"), megatron=megatron, accumulation=2,
                      data_parallel=(info.rank, info.world_size), dist_info=info)
val = evaluator(Engine())
rows = [None] * info.world_size
dist.all_gather_object(rows, seen)
vals = [None] * info.world_size
dist.all_gather_object(vals, val)
if info.rank == 0:
    print(json.dumps({"rows": rows, "vals": vals}))
dist.destroy_process_group()
"""


def _shares(tmp_path, byte_data, kind):
    script = tmp_path / "eval_shares.py"
    script.write_text(EVAL_SHARES)
    return json.loads(run_torchrun([str(script), str(byte_data), kind]).strip().splitlines()[-1])


def test_megatron_eval_iters_reads_distinct_samples_of_the_global_batch_split_across_ranks(tmp_path, byte_data):
    """--eval-iters 3 x accumulation 2 x micro-batch 2 x 2 ranks = 24 distinct windows, 12 on each rank,
    and every rank reports the mean over all 24 (Megatron-DeepSpeed's evaluate: eval_iters iterations of
    the global batch)."""
    import numpy as np

    from seqwarm.data import open_prepared
    from seqwarm.data.dataset import eval_window_indices

    out = _shares(tmp_path, byte_data, "megatron")
    ranks = out["rows"]
    assert [len(r) for r in ranks] == [12, 12]
    windows = open_prepared(byte_data).windows("val", 64)
    assert len(windows) > 24
    heads = {tuple(r) for rank in ranks for r in rank}
    assert len(heads) == 24  # distinct windows: no rank reads another's
    chosen = eval_window_indices(len(windows), 24)
    ids = windows.batch(chosen)["input_ids"]
    assert heads == {tuple(row) for row in ids.tolist()}
    # the loss of each batch is its mean token: the mean over all 24 windows, the same on both ranks
    assert out["vals"][0] == out["vals"][1] == pytest.approx(float(np.asarray(ids, dtype=np.float64).mean()))


def test_a_seqwarm_run_reads_eval_iters_micro_batches_on_every_rank(tmp_path, byte_data):
    """Without Megatron's rules --eval-iters 3 x micro-batch 2: the same 6 windows on each rank."""
    out = _shares(tmp_path, byte_data, "seqwarm")
    assert [len(r) for r in out["rows"]] == [6, 6]
    assert out["rows"][0] == out["rows"][1]
