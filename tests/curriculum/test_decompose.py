"""Dataset Decomposition's cut (seqwarm.curriculum.decompose): power-of-2 chunks inside one document each."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.curriculum.decompose import decompose
from seqwarm.util.errors import UserError


def by_document(d):
    """{document: [(start, length), ...] in stream order}."""
    out = {}
    for s, n, doc in zip(d.starts.tolist(), d.lengths.tolist(), d.documents.tolist()):
        out.setdefault(doc, []).append((s, n))
    return {k: sorted(v) for k, v in out.items()}


def test_a_700_and_a_1500_token_document_largest_first():
    d = decompose([0, 700, 2200], 32, 512, shift=0)
    docs = by_document(d)
    assert docs[0] == [(0, 512), (512, 128), (640, 32)]
    assert docs[1] == [(700, 512), (1212, 512), (1724, 256), (1980, 128), (2108, 64)]
    assert d.dropped.tolist() == [28, 28] and d.dropped_tokens == 56
    assert d.bucket_lengths == (32, 64, 128, 256, 512)
    assert d.chunks_per_bucket() == (1, 1, 2, 1, 3)
    assert d.tokens_per_bucket() == (32, 64, 256, 256, 1536)


def test_shift_one_decomposes_the_predictions_and_chunks_share_a_token():
    d = decompose([0, 700], 32, 512)  # 699 predictions = 512 + 128 + 32 + 27 dropped
    assert by_document(d)[0] == [(0, 512), (512, 128), (640, 32)]
    assert d.dropped.tolist() == [27]
    tokens = np.arange(700)
    rows = d.rows(tokens, [int(np.flatnonzero(d.lengths == 128)[0])])
    assert rows.shape == (1, 129) and rows[0, 0] == 512 and rows[0, -1] == 640  # its last token starts the next


def test_documents_too_short_give_no_chunk_and_are_counted():
    d = decompose([0, 10, 20, 100], 32, 64)
    assert d.num_chunks == 1 and d.empty_documents == 2
    assert d.dropped.tolist() == [9, 9, 79 - 64]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    kmin=st.integers(0, 6),
    span=st.integers(0, 5),
    shift=st.sampled_from([0, 1]),
    first=st.integers(0, 50),
)
def test_every_chunk_lies_in_one_document_and_the_cut_sums_to_the_document(sizes, kmin, span, shift, first):
    lo, hi = 1 << kmin, 1 << (kmin + span)
    offsets = np.concatenate([[first], first + np.cumsum(sizes)])
    d = decompose(offsets, lo, hi, shift=shift)
    assert ((d.lengths >= lo) & (d.lengths <= hi) & ((d.lengths & (d.lengths - 1)) == 0)).all()
    assert (d.starts >= offsets[d.documents]).all()
    assert (d.starts + d.lengths + shift <= offsets[d.documents + 1]).all()
    assert (d.dropped < lo).all()
    docs = by_document(d)
    for i, n in enumerate(sizes):
        chunks = docs.get(i, [])
        assert sum(c for _, c in chunks) + d.dropped[i] == max(n - shift, 0)
        if chunks:
            assert chunks[0][0] == offsets[i]
        for (s, c), (s2, c2) in zip(chunks, chunks[1:]):
            assert s2 == s + c and c2 <= c  # contiguous, largest first
    for b, length in enumerate(d.bucket_lengths):
        assert (d.lengths[d.bounds[b] : d.bounds[b + 1]] == length).all()


@pytest.mark.parametrize(
    "args, match",
    [
        (([0, 100], 48, 512), "powers of 2"),
        (([0, 100], 64, 32), "powers of 2"),
        (([[0, 100]], 32, 64), "1-D integer"),
        (([0, 100, 50], 32, 64), "never decrease"),
        (([0.0, 100.0], 32, 64), "1-D integer"),
    ],
)
def test_bad_settings_are_user_errors(args, match):
    with pytest.raises(UserError, match=match):
        decompose(*args)


def test_rows_refuse_mixed_lengths_and_fingerprint_tells_corpora_apart():
    d = decompose([0, 700], 32, 512)
    with pytest.raises(ValueError, match="one length"):
        d.rows(np.arange(700), [0, 2])
    assert d.fingerprint() == decompose([0, 700], 32, 512).fingerprint()
    assert d.fingerprint() != decompose([0, 701], 32, 512).fingerprint()
    assert d.fingerprint() != decompose([0, 700], 32, 256).fingerprint()
