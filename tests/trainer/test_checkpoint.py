"""Checkpoints: atomic writes, the newest kept, leftovers of a killed write removed."""

from __future__ import annotations

import torch

from seqwarm.trainer.checkpoint import list_checkpoints, load_newest, save_checkpoint
from seqwarm.util.atomic import TMP_MARK


def test_save_keeps_the_newest_and_removes_leftover_temporaries(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stale = folder / f".step_00000002.pt{TMP_MARK}99999-deadbeef"  # a write killed mid-way
    stale.write_bytes(b"half a checkpoint")
    for step in (1, 2, 3):
        save_checkpoint(folder, step, {"w": torch.tensor([float(step)])}, keep=2)
    assert [s for s, _ in list_checkpoints(folder)] == [2, 3]
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000002.pt", "step_00000003.pt"]
    path, state = load_newest(folder)
    assert path.name == "step_00000003.pt" and state["step"] == 3 and state["w"].item() == 3.0
