"""Document masking in seqwarm's GPT (issue #25): a packed row with ``document_ids`` gives every token the
logits it has when its document (or fragment) runs alone, whatever the cut; the window mode compiles once."""

import numpy as np
import pytest
import torch

from seqwarm.curriculum.batch import reshape_batch, truncate_batch, window_batch
from seqwarm.data.dataset import build_batch
from seqwarm.trainer.model import GPT, GPTConfig

EOD = 0
SEQ = 32


def _model(rotary=False, seq=SEQ):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, seq_length=seq, n_layer=2, n_head=2, n_embd=16, rotary=rotary)).eval()


def _packed(rows=3, lengths=(5, 9, 7, 11), seed=0):
    """``rows`` windows of SEQ + 1 tokens, each of documents of ``lengths`` tokens ending in EOD."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rows):
        parts = [np.append(rng.integers(1, 50, n - 1), EOD) for n in np.roll(lengths, r)]
        out.append(np.concatenate(parts)[: SEQ + 1] if sum(lengths) > SEQ else np.concatenate(parts))
    windows = np.stack([np.pad(w, (0, SEQ + 1 - len(w)), constant_values=7) for w in out])
    return build_batch(windows, eod_id=EOD, document_masking=True)


def _apart(model, batch):
    """Logits of every token with each run of equal document_ids in its row run on its own."""
    rows, seq = batch["input_ids"].shape
    out = torch.empty(rows, seq, model.config.vocab_size)
    docs = batch["document_ids"]
    for r in range(rows):
        start = 0
        for end in range(1, seq + 1):
            if end == seq or docs[r, end] != docs[r, start]:
                out[r, start:end] = model(batch["input_ids"][r : r + 1, start:end])[0]
                start = end
    return out


def _masked(model, batch):
    keys = ("input_ids", "position_ids", "document_ids")
    return model(**{k: batch[k] for k in keys if k in batch})


@pytest.mark.parametrize("rotary", [False, True])
def test_a_packed_row_with_document_masking_equals_each_document_run_alone(rotary):
    model, batch = _model(rotary), _packed()
    assert batch["position_ids"][0, :6].tolist() == [0, 1, 2, 3, 4, 0]  # restart after the first EOD
    with torch.no_grad():
        masked, apart = _masked(model, batch), _apart(model, batch)
        unmasked = model(batch["input_ids"])  # attends across documents: not the same
    assert torch.allclose(masked, apart, atol=1e-5)
    assert not torch.allclose(unmasked, apart, atol=1e-3)
    labels = batch["labels"]
    loss = torch.nn.functional.cross_entropy(masked.reshape(-1, 50), labels.reshape(-1), reduction="none")
    alone = torch.nn.functional.cross_entropy(apart.reshape(-1, 50), labels.reshape(-1), reduction="none")
    assert torch.allclose(loss, alone, atol=1e-5)  # per-token losses


@pytest.mark.parametrize("cut", [truncate_batch, reshape_batch, window_batch])
@pytest.mark.parametrize("length", [6, 13])
def test_every_cut_of_a_document_masked_batch_keeps_documents_apart(cut, length):
    model, batch = _model(), _packed(rows=4)
    out = cut(batch, length)
    if cut is reshape_batch:
        assert out["input_ids"].shape == (4 * SEQ // length, length)  # several rows, per-document masks
    with torch.no_grad():
        assert torch.allclose(_masked(model, out), _apart(model, out), atol=1e-5)


def test_window_without_document_masking_attends_inside_fragments():
    model = _model()
    batch = {"input_ids": torch.randint(1, 50, (2, SEQ)), "position_ids": torch.arange(SEQ).expand(2, SEQ)}
    out = window_batch(batch, 8)
    with torch.no_grad():
        assert torch.allclose(_masked(model, out), _apart(model, out), atol=1e-5)


def test_the_loss_with_document_ids_matches_the_documents_loss():
    model, batch = _model(), _packed(rows=2)
    with torch.no_grad():
        loss = model(**batch)
        logits = _apart(model, batch)
    mask = batch["loss_mask"].reshape(-1)
    terms = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), batch["labels"].reshape(-1), reduction="none")
    assert torch.allclose(loss, (terms * mask).sum() / mask.sum(), atol=1e-5)


def _compiles(mode_cut, lengths):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    model = _model().train()
    compiled = torch.compile(model, backend=counter)
    batch = _packed(rows=2)
    for length in lengths:
        loss = compiled(**mode_cut(batch, length))
        loss.backward()
    torch._dynamo.reset()
    return counter.frame_count


def test_window_mode_compiles_once_for_the_whole_curriculum():
    lengths = [4, 8, 12, 16, 24, 32]
    assert _compiles(window_batch, lengths) == 1
    assert _compiles(truncate_batch, lengths) > 1  # the shapes change: the counter sees recompiles
