"""`seqwarm plan`'s compile count is what Dynamo really traces: seqwarm's GPT compiled in place (as
``--compile`` does) with a counting backend (no code generation, so it is cheap on a CPU), driven through
the engine the way the loop drives it — one cut per micro-batch, trivial keys left out, contiguous copies
(as the CUDA feed makes them), then full-length validation under no_grad."""

import pytest
import torch

from seqwarm import load_config, make_plan
from seqwarm.curriculum.engine import CurriculumEngine
from seqwarm.trainer.feed import lean_batch
from seqwarm.trainer.model import GPT, GPTConfig

SEQ = 32


def _config(mode, **seqwarm):
    return {
        "train_batch_size": 3,
        "train_micro_batch_size_per_gpu": 3,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": SEQ,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 4},
        },
        "seqwarm": {"seq_length": SEQ, "train_tokens": 600, **({"curriculum_mode": mode} if mode else {}), **seqwarm},
    }


def _batch():
    ids = torch.randint(1, 50, (3, SEQ))
    positions = torch.arange(SEQ).expand(3, SEQ)
    return {"input_ids": ids, "labels": ids.clone(), "loss_mask": torch.ones(3, SEQ), "position_ids": positions}


def _traced(cfg) -> int:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, seq_length=SEQ, n_layer=1, n_head=2, n_embd=16))
    counter = CompileCounter()
    model.compile(backend=counter)  # in place, as TorchEngineBuilder does
    engine = CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.0), cfg, layout="dense")
    engine.train()
    while not engine.done:
        engine.begin_step()
        for _ in range(cfg.gradient_accumulation_steps):
            cut = engine.cut(_batch())
            cut = cut if cfg.curriculum.mode == "window" else lean_batch(cut)  # as the loop's feed does
            cut = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in cut.items()}
            engine.backward(engine.run(cut))
        engine.step()
    engine.eval()
    with torch.no_grad():
        engine(_batch())  # validation: full length, every key
    torch._dynamo.reset()
    return counter.frame_count


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, settings",
    [("truncate", {}), (None, {}), ("window", {}), ("reshape", {}), (None, {"length_bucket": 12})],
    ids=["truncate", "inject", "window", "reshape", "bucket"],
)
def test_the_planned_compile_count_is_what_dynamo_traces(mode, settings, one_thread):
    cfg = load_config(_config(mode, **settings))
    plan = make_plan(cfg)
    assert len({p.seqlen for p in plan.points}) > 3  # the run goes through several lengths to full
    assert plan.points[-1].seqlen == SEQ
    assert _traced(cfg) == plan.compiles, plan.compiles_why
