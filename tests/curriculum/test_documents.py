"""Document masking and the window mode in the batch ops (issue #25): per-token ``document_ids`` move
with their tokens through every cut, and ``window_batch`` keeps shapes while splitting rows into fragments."""

import pytest
import torch

from seqwarm.curriculum.batch import number_documents, reshape_batch, truncate_batch, window_batch
from seqwarm.curriculum.clock import micro_batch_shape
from seqwarm.curriculum.warmup import SequenceLengthWarmup


def _batch(rows=3, seq=8):
    ids = torch.arange(rows * seq).reshape(rows, seq)
    docs = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2]).repeat(rows, 1)  # the same numbers in every row
    pos = torch.tensor([0, 1, 2, 0, 1, 2, 3, 0]).repeat(rows, 1)
    return {"input_ids": ids, "labels": ids + 100, "position_ids": pos, "document_ids": docs}


def test_number_documents_keeps_rows_apart():
    docs = torch.tensor([[5, 5, 6], [6, 6, 5]])
    assert number_documents(docs).tolist() == [[0, 0, 1], [2, 2, 3]]


def test_reshape_with_document_ids_over_several_rows_never_joins_two_rows_documents():
    batch = {"input_ids": torch.arange(24).reshape(3, 8), "document_ids": torch.full((3, 8), 7)}
    out = reshape_batch(batch, 6)  # 24 tokens -> 4 rows of 6; rows 1 and 2 span a seam
    assert out["input_ids"].tolist() == torch.arange(24).reshape(4, 6).tolist()
    assert out["document_ids"].tolist() == [[0] * 6, [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 2, 2], [2] * 6]
    assert batch["document_ids"].tolist() == [[7] * 8] * 3  # the input is not changed


def test_reshape_keeps_a_per_sample_4d_mask_refused_and_names_document_ids():
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": torch.ones(2, 1, 4, 4)}
    with pytest.raises(ValueError, match="document_ids"):
        reshape_batch(batch, 2)


def test_truncate_cuts_document_ids_with_the_tokens():
    out = truncate_batch(_batch(), 5)
    assert out["document_ids"].tolist() == [[0, 0, 0, 1, 1]] * 3


def test_window_splits_rows_into_fragments_and_keeps_the_shape():
    out = window_batch(_batch(rows=2), 3)
    assert out["input_ids"].shape == (2, 8) and out["labels"].shape == (2, 8)
    # fragments start at 0, 3, 6; documents at 0, 3, 7: blocks 0-2, 3-5, 6, 7 in each row, numbered apart
    assert out["document_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 2, 3], [4, 4, 4, 5, 5, 5, 6, 7]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 0, 0]] * 2


def test_window_without_documents_uses_fragments_only_and_writes_them_at_full_length():
    batch = {"input_ids": torch.arange(16).reshape(2, 8), "position_ids": torch.arange(8).expand(2, 8)}
    out = window_batch(batch, 3)
    assert out["document_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 2, 2], [3, 3, 3, 4, 4, 4, 5, 5]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 0, 1]] * 2
    full = window_batch(batch, 8)  # the full length: still written, so the model's inputs never change
    assert full["document_ids"].tolist() == [[0] * 8, [1] * 8]
    assert full["position_ids"].tolist() == [list(range(8))] * 2


def test_window_mode_counts_every_token_like_the_baseline():
    assert micro_batch_shape(4, 8, 2, "window") == (4, 8)
    window = SequenceLengthWarmup(2, 8, 4, multiple_of=2, mode="window")
    baseline = SequenceLengthWarmup()
    lengths = []
    for _ in range(5):
        lengths.append(window.begin_step())
        baseline.begin_step()
        out = window.cut(_batch())
        baseline.cut(_batch())
        assert out["input_ids"].shape == (3, 8)
        window.end_step()
        baseline.end_step()
        assert window.progress.tokens == baseline.progress.tokens
    assert lengths == [2, 4, 6, 8, 8]
    assert window.progress.tokens == 5 * 3 * 8


def test_window_mode_refuses_a_length_bucket_padded_batches_and_models_without_document_ids():
    with pytest.raises(ValueError, match="truncate"):
        SequenceLengthWarmup(2, 8, 4, multiple_of=2, mode="window", length_bucket=4)

    def forward(input_ids, labels=None):
        return input_ids

    with pytest.raises(ValueError, match="document_ids"):
        SequenceLengthWarmup(2, 8, 4, multiple_of=2, mode="window", forward=forward)
    with pytest.raises(ValueError, match="pipeline"):
        SequenceLengthWarmup(2, 8, 4, multiple_of=2, mode="window", pipeline=True)
    slw = SequenceLengthWarmup(2, 8, 4, multiple_of=2, mode="window")
    slw.begin_step()
    padded = {
        "input_ids": torch.zeros(2, 8, dtype=torch.long),
        "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3]),
    }
    with pytest.raises(ValueError, match="window works on dense rows"):
        slw.cut(padded)
