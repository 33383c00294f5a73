"""A run's checkpoint as a Hugging Face Transformers model folder (``seqwarm export RUN --hf OUT``).

The folder holds ``model.safetensors``, ``config.json``, ``generation_config.json`` and the tokenizer
files of the run's prepared data folder, so ``AutoModelForCausalLM.from_pretrained(OUT)``,
``AutoTokenizer.from_pretrained(OUT)``, vLLM and lm-evaluation-harness load it as they load any model.

The mapping is exact (same logits, up to float rounding), so it is checked on a short input before
anything is written:

- learned positions (seqwarm's default) -> ``GPT2LMHeadModel``: the same pre-LN blocks, tanh GELU,
  tied LM head; GPT-2's ``Conv1D`` layers store ``weight`` as (in, out), the transpose of ``nn.Linear``;
- ``rotary=True`` -> ``GPTNeoXForCausalLM`` with ``rotary_percent`` of each head rotated (its ``rotary_pct``)
  and sequential residuals (``use_parallel_residual=False``): NeoX rotates the half-split pairs
  ``(x[i], x[i + d/2])`` as seqwarm does; its fused QKV is ordered per head (q, k, v of head 0, then
  head 1 ...) where seqwarm's is all q, all k, all v.

A model without biases (``bias=False``) gets zero biases, which compute the same thing.

A run with stages (:mod:`seqwarm.curriculum.stages`) exports the rotary settings of the stage its
checkpoint trained in (the checkpoint's ``positions``, which :func:`~seqwarm.evaluation.runs.load_run` sets
on the GPT): θ as ``rotary_emb_base``, linear / YaRN as ``rope_scaling`` in Transformers' keys (Transformers
5 stores them in ``rope_parameters``), and ``max_position_embeddings`` the stage's length; the logits check
runs at that length.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqwarm.data.meta import read_meta
from seqwarm.evaluation.runs import load_run
from seqwarm.trainer.model import GPT, GPTConfig
from seqwarm.util.errors import MissingDependencyError, SeqwarmError, UserError

logger = logging.getLogger(__name__)

TOLERANCE = 1e-4
"""Largest |logit difference| the in-memory check accepts (fp32 rounding is ~1e-6)."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_hf` wrote."""

    out: Path
    """The model folder."""
    architecture: str
    """The Transformers class it loads as (``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``)."""
    step: int
    """Step of the exported checkpoint."""
    files: tuple[str, ...]
    """Names of the files in ``out``."""
    max_logit_diff: float | None
    """Largest |logit difference| between seqwarm's model and the export on the check input (None: the
    run trained the Transformers model itself, ``--model hf:PATH``, so nothing was converted)."""

    def summary(self) -> str:
        how = (
            "the run's own Transformers model"
            if self.max_logit_diff is None
            else f"logits match to {self.max_logit_diff:.1e}"
        )
        return f"wrote {self.out}: {self.architecture} from step {self.step} ({how}); files: {', '.join(self.files)}"


def _transformers() -> Any:
    try:
        import safetensors  # noqa: F401 - save_pretrained writes model.safetensors with it
        import transformers
    except ImportError as err:
        raise MissingDependencyError(err.name or "transformers", "hf", "seqwarm export --hf") from None
    return transformers


def _linear(
    state: dict[str, torch.Tensor],
    src: str,
    dst: str,
    out: dict[str, torch.Tensor],
    *,
    size: int,
    transpose: bool = False,
) -> None:
    """Copy ``src.weight``/``src.bias`` to ``dst``; a missing bias (``bias=False``) becomes zeros."""
    weight = state[f"{src}.weight"]
    out[f"{dst}.weight"] = (weight.t() if transpose else weight).contiguous().clone()
    bias = state.get(f"{src}.bias")
    out[f"{dst}.bias"] = bias.clone() if bias is not None else torch.zeros(size, dtype=weight.dtype)


def gpt2_weights(model: GPT) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``GPT2Config`` keywords and the ``GPT2LMHeadModel`` state dict of a learned-position GPT."""
    cfg, state = model.config, model.state_dict()
    c = cfg.n_embd
    config = dict(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.seq_length,
        n_embd=c,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=4 * c,
        activation_function="gelu_new",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_eps,
        initializer_range=cfg.init_std,
        scale_attn_weights=True,
        tie_word_embeddings=True,
    )
    out = {
        "transformer.wte.weight": state["wte.weight"][: cfg.vocab_size].clone(),  # padded rows dropped
        "transformer.wpe.weight": state["wpe.weight"].clone(),
    }
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}", f"transformer.h.{i}"
        for name in ("ln_1", "ln_2"):
            _linear(state, f"{src}.{name}", f"{dst}.{name}", out, size=c)
        _linear(state, f"{src}.attn.c_attn", f"{dst}.attn.c_attn", out, size=3 * c, transpose=True)
        _linear(state, f"{src}.attn.c_proj", f"{dst}.attn.c_proj", out, size=c, transpose=True)
        _linear(state, f"{src}.mlp.c_fc", f"{dst}.mlp.c_fc", out, size=4 * c, transpose=True)
        _linear(state, f"{src}.mlp.c_proj", f"{dst}.mlp.c_proj", out, size=c, transpose=True)
    _linear(state, "ln_f", "transformer.ln_f", out, size=c)
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return config, out


def rope_config(model: GPT, max_positions: int | None = None) -> dict[str, Any]:
    """The ``GPTNeoXConfig`` keywords of the rotary settings ``model`` uses (a stage's, :meth:`GPT.set_positions`):
    ``rotary_emb_base`` (θ), ``rope_scaling`` in Transformers' keys (``rope_type``, ``factor``,
    ``original_max_position_embeddings``, ...; Transformers 5 keeps them, θ and ``partial_rotary_factor`` in
    ``rope_parameters``) and ``max_position_embeddings`` (``max_positions``: the last stage's length)."""
    cfg = model.config
    theta = model.positions.get("rope_theta") or cfg.rotary_base
    out: dict[str, Any] = {"rotary_emb_base": theta, "max_position_embeddings": max_positions or cfg.seq_length}
    scaling = model.positions.get("rope_scaling")
    if scaling:
        kind = scaling.get("type", scaling.get("rope_type"))
        out["rope_scaling"] = {
            "rope_type": kind,
            **{k: v for k, v in scaling.items() if k not in ("type", "rope_type")},
        }
    return out


def neox_weights(model: GPT, max_positions: int | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``GPTNeoXConfig`` keywords and the ``GPTNeoXForCausalLM`` state dict of a rotary GPT (its rotary
    settings: :func:`rope_config`)."""
    cfg, state = model.config, model.state_dict()
    c, h = cfg.n_embd, cfg.n_head
    config = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=c,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=h,
        intermediate_size=4 * c,
        hidden_act="gelu_new",
        rotary_pct=cfg.rotary_percent,
        **rope_config(model, max_positions),
        use_parallel_residual=False,
        attention_bias=True,
        layer_norm_eps=cfg.layer_norm_eps,
        initializer_range=cfg.init_std,
        attention_dropout=cfg.dropout,
        hidden_dropout=cfg.dropout,
        tie_word_embeddings=True,
    )
    out = {"gpt_neox.embed_in.weight": state["wte.weight"][: cfg.vocab_size].clone()}  # padded rows dropped

    def per_head(t: torch.Tensor) -> torch.Tensor:  # (3C, ...) q|k|v -> per head [q_h, k_h, v_h]
        return t.reshape(3, h, c // h, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()

    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}", f"gpt_neox.layers.{i}"
        _linear(state, f"{src}.ln_1", f"{dst}.input_layernorm", out, size=c)
        _linear(state, f"{src}.ln_2", f"{dst}.post_attention_layernorm", out, size=c)
        _linear(state, f"{src}.attn.c_attn", f"{dst}.attention.query_key_value", out, size=3 * c)
        for kind in ("weight", "bias"):
            key = f"{dst}.attention.query_key_value.{kind}"
            out[key] = per_head(out[key])
        _linear(state, f"{src}.attn.c_proj", f"{dst}.attention.dense", out, size=c)
        _linear(state, f"{src}.mlp.c_fc", f"{dst}.mlp.dense_h_to_4h", out, size=4 * c)
        _linear(state, f"{src}.mlp.c_proj", f"{dst}.mlp.dense_4h_to_h", out, size=c)
    _linear(state, "ln_f", "gpt_neox.final_layer_norm", out, size=c)
    return config, out


def build_hf_model(model: GPT, eod_id: int | None = None, max_positions: int | None = None) -> Any:
    """The Transformers model computing what ``model`` computes (in eval mode), on the CPU, with its rotary
    settings (a stage's); ``max_positions``: the length it last trained at (default its ``seq_length``)."""
    transformers = _transformers()
    model = model.cpu()
    if model.config.rotary:
        kwargs, state = neox_weights(model, max_positions)
        config_cls, model_cls = transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM
    else:
        kwargs, state = gpt2_weights(model)
        config_cls, model_cls = transformers.GPT2Config, transformers.GPT2LMHeadModel
    if eod_id is not None:  # GPT-2's convention: the document separator is bos and eos
        kwargs.update(bos_token_id=eod_id, eos_token_id=eod_id)
    try:
        hf = model_cls(config_cls(**kwargs))
    except (ValueError, KeyError) as err:  # an older Transformers without this rope_scaling for GPT-NeoX
        raise UserError(
            f"transformers {transformers.__version__} cannot express the rotary settings "
            f"{kwargs.get('rope_scaling')} in a {config_cls.__name__} ({err}); upgrade transformers"
        ) from None
    own = hf.state_dict()
    # The LM head's name differs across Transformers versions (NeoX: embed_out / lm_head); it is tied.
    for head in ("lm_head.weight", "embed_out.weight"):
        if head in own and head not in state:
            state[head] = state.get("gpt_neox.embed_in.weight", state.get("transformer.wte.weight"))
    unexpected = sorted(set(state) - set(own))
    missing = sorted(k for k in set(own) - set(state) if not k.endswith((".attn.bias", ".attn.masked_bias")))
    if missing or unexpected:
        raise SeqwarmError(
            f"export to {model_cls.__name__}: the weight names do not match this Transformers "
            f"version (missing {missing[:4]}, unexpected {unexpected[:4]}); please report it"
        )
    hf.load_state_dict(state, strict=False)
    return hf.eval()


def max_logit_diff(model: GPT, hf: Any, length: int = 16) -> float:
    """Largest |logit difference| of the two models on a fixed input of ``length`` tokens."""
    cfg: GPTConfig = model.config
    t = min(length, cfg.seq_length)
    ids = (torch.arange(2 * t, dtype=torch.long).reshape(2, t) * 7919) % cfg.vocab_size
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ours = model(ids).float()
            theirs = hf(input_ids=ids).logits.float()
    finally:
        model.train(was_training)
    return float((ours - theirs).abs().max())


def _tokenizer_files(data_dir: Path | None, tmp: Path, seq_length: int, tokenizer: Any = None) -> list[str]:
    """Copy the prepared folder ``data_dir``'s tokenizer files (None: a --data-path run, whose sources hold
    none: write ``tokenizer``'s); add a tokenizer_config.json when there is none."""
    prepared = data_dir is not None
    info = read_meta(data_dir).get("tokenizer", {}) if prepared else tokenizer.describe()
    names = [str(n) for n in info.get("files", [])]
    if not names:
        logger.warning("the %s tokenizer has no Hugging Face form; the export holds the model only", info.get("name"))
        return []
    if prepared:
        for name in names:
            shutil.copy2(data_dir / name, tmp / name)
    else:
        names = tokenizer.save(tmp)
    if "tokenizer_config.json" not in names:
        eod = info.get("eod_token")
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": eod,
            "bos_token": eod,
            "model_max_length": seq_length,
            "clean_up_tokenization_spaces": False,
        }
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        names.append("tokenizer_config.json")
    return names


def export_hf(
    run_dir: str | Path,
    out: str | Path,
    *,
    checkpoint: int | None = None,
    data: str | Path | None = None,
    force: bool = False,
) -> ExportResult:
    """Write the checkpoint ``checkpoint`` (default: the newest that loads) of ``run_dir`` to ``out``
    as a Transformers model folder; UserError on anything the user can fix, ``out`` untouched then."""
    _transformers()  # a missing extra fails before the checkpoint is read
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"--hf {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"--hf {str(out)!r} already exists and is not empty; pass --force to replace it")
    loaded = load_run(run_dir, checkpoint=checkpoint, device="cpu", data=data)
    if loaded.is_hf:  # a --model hf:PATH run trained the Transformers model itself: nothing to convert
        hf, diff = loaded.model.eval(), None
    else:
        stage = loaded.stage or {}
        if (stage.get("rope_theta") or stage.get("rope_scaling")) and not loaded.model.config.rotary:
            raise UserError(f"{run_dir}: its stage sets rotary positions, but the model learns its positions")
        hf = build_hf_model(loaded.model, loaded.need_tokenizer().eod_id, stage.get("length"))
        diff = max_logit_diff(loaded.model, hf, stage.get("length") or 16)
    if diff is not None and not diff <= TOLERANCE:
        raise SeqwarmError(
            f"export of {run_dir}: the {type(hf).__name__} logits differ from seqwarm's by "
            f"{diff:.2e} (> {TOLERANCE}); nothing written, please report it"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        hf.save_pretrained(str(tmp), safe_serialization=True)
        prepared = loaded.data_dir if data is not None or loaded.data is None else None
        _tokenizer_files(prepared, tmp, loaded.seq_length, loaded.need_tokenizer())
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(
        out=out,
        architecture=type(hf).__name__,
        step=loaded.step,
        files=tuple(sorted(p.name for p in out.iterdir())),
        max_logit_diff=diff,
    )
