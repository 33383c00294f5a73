"""Who applies a stage's rotary positions: CurriculumEngine sets them on a model that can take them (and
again after a load, before any step), and a model nothing can set them on is refused — a stage that changed the
length but not the positions would train another model than the one asked for."""

from __future__ import annotations

import pytest
import torch

from seqwarm import GPT, CurriculumEngine, GPTConfig, SequenceLengthWarmup
from seqwarm.curriculum.stages import refuse_positions
from seqwarm.util.errors import UserError

STAGE = {"start_tokens": 200, "length": 32, "rope_theta": 500_000.0}


def _config(stages):
    return {
        "train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "seqwarm": {"seq_length": 32, "train_tokens": 1000, "stages": stages},
    }


def _gpt(rotary=True):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, seq_length=32, n_layer=1, n_head=2, n_embd=16, rotary=rotary))


def _tables(theta):
    model = _gpt()
    model.set_positions(theta, None)
    return model.rope_cos.clone()


def _train_until_stage(engine):
    while engine.slw.stage is None:
        tokens = torch.randint(0, 64, (2, 33))
        loss = engine({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]})
        engine.backward(loss)
        engine.step()


def test_the_engine_sets_the_stage_positions_on_the_model_and_again_after_a_load():
    model = _gpt()
    base = model.rope_cos.clone()
    engine = CurriculumEngine(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _config([STAGE]))
    _train_until_stage(engine)
    assert torch.equal(model.rope_cos, _tables(STAGE["rope_theta"])) and not torch.equal(model.rope_cos, base)

    state = engine.state_dict()
    fresh = _gpt()  # a new process: base tables until the state is loaded
    again = CurriculumEngine(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3), _config([STAGE]))
    assert torch.equal(fresh.rope_cos, base)
    again.load_state_dict(state)  # an evaluation right after a resume already sees the stage's positions
    assert torch.equal(fresh.rope_cos, model.rope_cos)


def test_rope_stages_are_refused_where_nothing_can_set_them():
    learned = _gpt(rotary=False)
    with pytest.raises(UserError, match="CurriculumEngine.*rope_theta"):
        CurriculumEngine(learned, torch.optim.AdamW(learned.parameters(), lr=1e-3), _config([STAGE]))
    length_only = {"start_tokens": 200, "length": 32}  # nothing to set: any model trains it as asked
    CurriculumEngine(learned, torch.optim.AdamW(learned.parameters(), lr=1e-3), _config([length_only]))

    slw = SequenceLengthWarmup(min_length=8, max_length=16, steps=2, stages=[STAGE])
    with pytest.raises(UserError, match="MyAdapter: the stages set rope_theta"):
        refuse_positions(slw.stages.stages, "MyAdapter")
    refuse_positions(
        SequenceLengthWarmup(min_length=8, max_length=16, steps=2, stages=[length_only]).stages.stages, "x"
    )


def test_a_checkpoint_written_right_after_a_load_records_the_stage_the_weights_trained_in():
    """seqwarm train saves StagePositions.applied as the checkpoint's positions (what eval and export
    set): after a load, before any step, it is the clock's stage, not None (base positions)."""
    from seqwarm.trainer.distributed import DistInfo
    from seqwarm.trainer.stages import StagePositions

    model = _gpt()
    engine = CurriculumEngine(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _config([STAGE]))
    _train_until_stage(engine)
    trained = StagePositions(engine, model, DistInfo(), torch.device("cpu"), log=None).applied
    assert trained == {"stage": 1, "length": 32, "rope_theta": STAGE["rope_theta"], "rope_scaling": None}

    fresh = _gpt()
    loaded = CurriculumEngine(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3), _config([STAGE]))
    loaded.load_state_dict(engine.state_dict())
    assert loaded.slw.stage is None  # no step since the load
    assert StagePositions(loaded, fresh, DistInfo(), torch.device("cpu"), log=None).applied == trained


def test_a_checkpoint_of_the_last_step_before_a_stage_records_no_stage():
    """The step whose tokens reach a stage's start_tokens still trains before it: its checkpoint (and an
    export of a budget that ends there) must record the positions it trained with, not the stage after it,
    which eval and export would set on weights that never trained with them."""
    from seqwarm.trainer.distributed import DistInfo
    from seqwarm.trainer.stages import StagePositions

    model = _gpt()
    engine = CurriculumEngine(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _config([STAGE]))
    while engine.progress.tokens < STAGE["start_tokens"]:
        tokens = torch.randint(0, 64, (2, 33))
        engine.backward(engine({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}))
        engine.step()
    assert engine.slw.stage is None  # the last step trained before the stage
    assert StagePositions(engine, model, DistInfo(), torch.device("cpu"), log=None).applied is None
