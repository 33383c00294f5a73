"""seqwarm's GPT attends at the cost of the span: every plan of trainer.attention gives the numbers of the
dense block-diagonal causal mask (forward and gradients, fp32 on CPU), and picks the cheap shape it claims."""

import pytest
import torch
import torch.nn.functional as F

from seqwarm.curriculum.batch import number_documents, window_batch
from seqwarm.trainer.attention import QUERY_BLOCK, document_mask, plan_attention
from seqwarm.trainer.model import GPT, GPTConfig


def _docs(lengths_per_row: list[list[int]]) -> torch.Tensor:
    """(B, T) ids from each row's document lengths (numbered apart over the batch)."""
    rows = [torch.repeat_interleave(torch.arange(len(ls)), torch.tensor(ls)) for ls in lengths_per_row]
    return number_documents(torch.stack(rows))


def _random_docs(b: int, t: int, low: int, high: int, gen: torch.Generator) -> torch.Tensor:
    rows = []
    for _ in range(b):
        lengths, left = [], t
        while left:
            n = min(left, int(torch.randint(low, high + 1, (1,), generator=gen)))
            lengths.append(n)
            left -= n
        rows.append(lengths)
    return _docs(rows)


def _window(t: int, w: int, docs: torch.Tensor | None = None, b: int = 2) -> torch.Tensor:
    batch = {"input_ids": torch.zeros(b, t, dtype=torch.long)}
    if docs is not None:
        batch["document_ids"] = docs
    return window_batch(batch, w)["document_ids"]


def _check(ids: torch.Tensor, kind: str, heads: int = 2, hd: int = 8) -> None:
    """The plan for ``ids`` is ``kind`` and equals dense SDPA under the block mask, forward and backward."""
    gen = torch.Generator().manual_seed(int(ids.sum()) % 1000)
    b, t = ids.shape
    q, k, v = (torch.randn(b, heads, t, hd, generator=gen, requires_grad=True) for _ in range(3))
    plan = plan_attention(ids, t, None)
    assert plan.kind == kind
    out = plan.attend(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(ids, t, None))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t, w", [(64, 8), (64, 64), (40, 16), (37, 5), (300, 150)])
def test_window_fragments_run_as_rows_without_a_mask(t, w):
    ids = _window(t, w)
    plan = plan_attention(ids, t, None)
    assert plan.tile_masks == (None, None) and plan.width == w
    _check(ids, "tiles")


@pytest.mark.parametrize("t, w", [(64, 16), (50, 16), (96, 32)])
def test_documents_inside_window_fragments_get_a_mask_per_fragment(t, w):
    gen = torch.Generator().manual_seed(t + w)
    ids = _window(t, w, _random_docs(3, t, 3, 40, gen), b=3)  # documents cross fragment boundaries
    plan = plan_attention(ids, t, None)
    main = plan.tile_masks[0]
    assert main is not None and main.shape == (3 * (t // w), 1, w, w)  # per fragment, not per row
    _check(ids, "tiles")


def test_documents_inside_wide_window_fragments_run_by_query_blocks():
    gen = torch.Generator().manual_seed(1)
    t, w = 2 * QUERY_BLOCK + 50, QUERY_BLOCK + 30  # wider than a query block, not dividing the row
    _check(_window(t, w, _random_docs(2, t, 20, 90, gen)), "chunks")


@pytest.mark.parametrize(
    "t, low, high", [(300, 20, 90), (QUERY_BLOCK * 2, 1, 3), (300, 60, 200)], ids=["some", "tiny", "few"]
)
def test_document_masking_skips_the_key_blocks_no_query_sees(t, low, high):
    gen = torch.Generator().manual_seed(t + low)
    ids = _random_docs(3, t, low, high, gen)  # documents cross query-block boundaries
    plan = plan_attention(ids, t, None)
    assert plan.kind == "chunks"  # a query block attends from its earliest document start, not from column 0
    assert sum(q1 - k0 for _, q1, k0, _ in plan.spans) < sum(q1 for _, q1, _, _ in plan.spans)
    _check(ids, "chunks")


def test_a_long_document_in_one_row_does_not_widen_the_other_rows_keys():
    gen = torch.Generator().manual_seed(7)
    t = 2 * QUERY_BLOCK + 40
    short = _random_docs(2, t, 5, 30, gen)
    ids = number_documents(torch.cat([torch.zeros(1, t, dtype=torch.long), short]))  # row 0: one document
    plan = plan_attention(ids, t, None)
    assert plan.by_row and len(plan.spans) == 3 * 3  # a call per row and query block
    _check(ids, "chunks")


def test_a_single_document_per_row_is_plain_causal_attention():
    ids = _docs([[70], [70]])
    plan = plan_attention(ids, 70, None)
    assert plan.kind == "tiles" and plan.width == 70 and plan.tile_masks == (None, None)
    _check(ids, "tiles")


def test_documents_starting_together_in_every_row_at_uneven_columns():
    ids = _docs([[10, 30, 5, 25], [10, 12, 18, 5, 25]])  # every row starts at 0, 10, 40, 45: not one width
    _check(ids, "chunks")
    q = QUERY_BLOCK  # a document from column q to past 2q in both rows: that query block is plain causal
    ids = _docs([[50, q - 50, q + 100], [q - 20, 20, q + 100]])
    plan = plan_attention(ids, 2 * q + 100, None)
    assert [(q0, k0, m is None) for q0, _, k0, m in plan.spans] == [(0, 0, False), (q, q, True), (2 * q, q, False)]
    _check(ids, "chunks")


def test_a_padding_mask_with_documents_keeps_the_dense_reference():
    ids = _docs([[5, 11], [16]])
    keep = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    plan = plan_attention(ids, 16, keep)
    assert plan.kind == "dense" and plan.mask.shape == (2, 1, 16, 16)
    with pytest.raises(ValueError, match=r"document_ids must be \(batch, 16\)"):
        plan_attention(ids[:, :8], 16, None)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_block_mask_matches_the_dense_reference():
    """The CUDA plan's block mask, run forward on the CPU (FlexAttention has no CPU backward in torch 2.13)."""
    from seqwarm.trainer.attention import _flex_plan

    gen = torch.Generator().manual_seed(3)
    t = 256
    ids = _window(t, 64, _random_docs(2, t, 10, 100, gen))
    q, k, v = (torch.randn(2, 2, t, 16, generator=gen) for _ in range(3))
    plan = _flex_plan(ids, t)
    assert plan.kind == "flex"
    with torch.no_grad():
        out = plan.attend(q, k, v)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(ids, t, None))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rotary", [False, True])
def test_the_gpt_loss_and_gradients_equal_the_dense_mask(rotary):
    """A (B, S) padding mask of ones sends the same batch through the dense path: same loss and gradients."""
    torch.manual_seed(0)
    t = 160
    gpt = GPT(GPTConfig(vocab_size=64, seq_length=t, n_layer=2, n_head=2, n_embd=16, rotary=rotary))
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (2, t), generator=gen)
    batch = window_batch({"input_ids": ids, "document_ids": _random_docs(2, t, 10, 60, gen)}, 48)
    fast = gpt(ids, labels=ids, position_ids=batch["position_ids"], document_ids=batch["document_ids"])
    grads = torch.autograd.grad(fast, list(gpt.parameters()))
    dense = gpt(
        ids,
        labels=ids,
        position_ids=batch["position_ids"],
        document_ids=batch["document_ids"],
        attention_mask=torch.ones(2, t, dtype=torch.long),
    )
    torch.testing.assert_close(fast, dense, rtol=1e-5, atol=1e-6)
    for g, h in zip(grads, torch.autograd.grad(dense, list(gpt.parameters()))):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-6)


def test_compiled_window_mode_traces_one_graph_for_every_window_length():
    """Under torch.compile the window length stays data (document_ids): one graph for the run, not one per
    length (Dynamo's counting backend: tracing only, no code generation)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    t = 32
    gpt = GPT(GPTConfig(vocab_size=50, seq_length=t, n_layer=1, n_head=2, n_embd=16))
    counter = CompileCounter()
    gpt.compile(backend=counter)
    ids = torch.randint(0, 50, (2, t))
    gen = torch.Generator().manual_seed(0)
    try:
        for w in (4, 8, 12, 32):
            batch = window_batch({"input_ids": ids, "document_ids": _random_docs(2, t, 2, 20, gen)}, w)
            gpt(ids, labels=ids, position_ids=batch["position_ids"], document_ids=batch["document_ids"]).backward()
        assert counter.frame_count == 1
    finally:
        torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_compiled_flex_attention_traces_one_graph_for_every_window_length(monkeypatch):
    """The CUDA plan inside a compiled model, traced on the CPU (forward only, no code generation): the block
    mask is built in the graph from document_ids, so every window length runs the same graph, with the
    eager plans' loss."""
    from torch._dynamo.testing import CompileCounter

    import seqwarm.trainer.model as model_module
    from seqwarm.trainer.attention import AttentionPlan, _flex_plan

    torch._dynamo.reset()
    t = 32
    gpt = GPT(GPTConfig(vocab_size=50, seq_length=t, n_layer=1, n_head=2, n_embd=32))
    ids = torch.randint(0, 50, (2, t))
    batches = [window_batch({"input_ids": ids}, w) for w in (4, 12, 32)]
    with torch.no_grad():
        eager = [
            float(gpt(ids, labels=ids, position_ids=b["position_ids"], document_ids=b["document_ids"])) for b in batches
        ]
    monkeypatch.setattr(
        model_module,
        "plan_attention",
        lambda docs, t, mask, dropout=False, compiled=False: (
            AttentionPlan("causal") if docs is None else _flex_plan(docs, t)
        ),
    )
    counter = CompileCounter()
    gpt.compile(backend=counter)
    try:
        with torch.no_grad():
            for b, want in zip(batches, eager):
                got = gpt(ids, labels=ids, position_ids=b["position_ids"], document_ids=b["document_ids"])
                assert float(got) == pytest.approx(want, rel=1e-5)
        assert counter.frame_count == 1
    finally:
        torch._dynamo.reset()


def test_blocks_compiled_one_by_one_get_one_graph_for_every_window_length():
    """FSDP2 compiles each block, not the model: the model then plans without data-dependent shapes too."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    t = 32
    gpt = GPT(GPTConfig(vocab_size=50, seq_length=t, n_layer=1, n_head=2, n_embd=16))
    counter = CompileCounter()
    gpt.blocks[0].compile(backend=counter)  # as TorchEngineBuilder does under FSDP2
    ids = torch.randint(0, 50, (2, t))
    gen = torch.Generator().manual_seed(2)
    try:
        for w in (4, 8, 12, 32):
            batch = window_batch({"input_ids": ids, "document_ids": _random_docs(2, t, 2, 20, gen)}, w)
            gpt(ids, labels=ids, position_ids=batch["position_ids"], document_ids=batch["document_ids"]).backward()
        assert counter.frame_count == 1
    finally:
        torch._dynamo.reset()
