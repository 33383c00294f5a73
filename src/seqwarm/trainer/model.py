"""A nanoGPT-style GPT-2 whose forward takes ``curriculum_seqlen`` (DeepSpeed's legacy contract).

Architecture: token embeddings + learned position embeddings (or rotary embeddings when
``rotary=True``, on ``rotary_percent`` of each head), pre-LayerNorm blocks (causal self-attention, GELU
MLP), a final LayerNorm and an LM head tied to the token embeddings. GPT-2 initialisation:
normal(0, ``init_std`` = 0.02) weights, zero biases,
residual output projections scaled by ``1/sqrt(2 * n_layer)``.

The model knows nothing about distribution or the curriculum schedule; it only honours a
``curriculum_seqlen`` it is given, by cutting its inputs with :func:`seqwarm.curriculum.batch.truncate_batch`.

Presets keep GPT-2's real vocabulary of 50257 tokens so parameter counts match the published sizes
(124M / 355M / 774M / 1.56B). Pass ``vocab_size=50304`` (a multiple of 64) for faster matmuls on GPUs;
the extra rows are never targets and simply learn low logits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from seqwarm.config.defaults import PRESETS
from seqwarm.curriculum.batch import truncate_batch
from seqwarm.curriculum.rope import rope_frequencies
from seqwarm.trainer.attention import AttentionPlan, plan_attention
from seqwarm.trainer.memory import gpt_params

__all__ = ["GPTConfig", "GPT"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    """Rows of the (tied) token embedding / LM head."""
    seq_length: int
    """Longest sequence the model accepts (rows of the position / rotary tables)."""
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    """Dropout on embeddings, attention probabilities and residual branches (training only)."""
    bias: bool = True
    """Biases in Linear and LayerNorm layers (GPT-2: True)."""
    rotary: bool = False
    """Rotary position embeddings in attention instead of learned absolute position embeddings."""
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    """The share of each head's channels rotated (Megatron's ``--rotary-percent``, GPT-NeoX's ``rotary_pct``):
    the first ``int(head_size * rotary_percent)``, which must be even; the others pass through unrotated."""
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    """Standard deviation of the normal initialisation (Megatron's ``--init-method-std``; the residual
    output projections get ``init_std / sqrt(2 * n_layer)``, as Megatron's ``scaled_init_method_normal``)."""
    vocab_multiple: int = 1
    """Embedding / LM-head rows are ``vocab_size`` rounded up to a multiple of this (the presets: 64).
    The padded rows never get probability: logits are cut to ``vocab_size``."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_length", "n_layer", "n_head", "n_embd", "vocab_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be an int >= 1, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.rotary and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"rotary embeddings need an even head size, got n_embd/n_head = "
                f"{self.n_embd}/{self.n_head} = {self.n_embd // self.n_head}"
            )
        if self.rotary and not (0.0 < self.rotary_percent <= 1.0 and self.rotary_dim >= 2 and self.rotary_dim % 2 == 0):
            raise ValueError(
                f"GPTConfig.rotary_percent {self.rotary_percent!r} rotates {self.rotary_dim} of the "
                f"{self.n_embd // self.n_head} channels of a head: it must be in (0, 1] and rotate an even number >= 2"
            )
        if not self.init_std > 0:
            raise ValueError(f"GPTConfig.init_std must be > 0, got {self.init_std!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named size (``tiny``, ``gpt2-124m``, ``gpt2-350m``, ``gpt2-774m``, ``gpt2-1.5b``)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that rotary embeddings rotate (Megatron's ``rotary_dim``)."""
        return int(self.n_embd // self.n_head * self.rotary_percent)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and the LM head (``vocab_size`` rounded up to ``vocab_multiple``)."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def replace(self, **changes: Any) -> GPTConfig:
        return dataclasses.replace(self, **changes)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count from the formula (equals ``GPT(self).num_params()``;
        :func:`~seqwarm.trainer.memory.gpt_params`, which the torch-free plan counts with too)."""
        sizes = (self.n_embd, self.n_layer, self.padded_vocab_size, self.seq_length)
        return gpt_params(*sizes, bias=self.bias, rotary=self.rotary, non_embedding=non_embedding)


def _rotary_tables(cfg: GPTConfig, inv_freq: list[float] | None = None, scale: float = 1.0):
    """cos and sin (S, rot/2) at every position; ``inv_freq`` / ``scale``: a stage's (set_positions)."""
    rot = cfg.rotary_dim  # the head size, or its rotary_percent share
    if inv_freq is None:
        inv = 1.0 / (cfg.rotary_base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    else:
        inv = torch.tensor(inv_freq, dtype=torch.float32)
    angles = torch.outer(torch.arange(cfg.seq_length, dtype=torch.float32), inv)  # (S, rot/2)
    return angles.cos() * scale, angles.sin() * scale


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + rot/2]) of the first rot = 2 * cos.shape[-1] channels of x (B, H, T, hd)
    by the angles in cos/sin; the channels after them pass through (a rotary_percent below 1)."""
    rot = 2 * cos.shape[-1]
    x, rest = (x, None) if rot == x.shape[-1] else (x[..., :rot], x[..., rot:])
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out if rest is None else torch.cat((out, rest), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_projection = True
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, plan: AttentionPlan
    ) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if rope is not None:  # (B, H, T, hd)
            q, k = _apply_rotary(q, *rope), _apply_rotary(k, *rope)
        y = plan.attend(q, k, v, dropout_p=self.dropout if self.training else 0.0)  # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # (B, T, C)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_projection = True
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, plan):
        x = x + self.attn(self.ln_1(x), rope, plan)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 language model. ``forward`` returns the mean loss when ``labels`` are given, else logits."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd)
        self.wpe = None if cfg.rotary else nn.Embedding(cfg.seq_length, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        if cfg.rotary:
            cos, sin = _rotary_tables(cfg)
            self.register_buffer("rope_cos", cos, persistent=False)  # (S, hd/2)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.positions: dict[str, Any] = {"rope_theta": cfg.rotary_base, "rope_scaling": None}
        """The rotary settings in use (:meth:`set_positions`)."""
        self.apply(self._init_weights)

    def set_positions(self, rope_theta: float | None = None, rope_scaling: dict[str, Any] | None = None) -> None:
        """Rebuild the rotary tables in place for a stage's settings (:mod:`seqwarm.curriculum.stages`):
        base ``rope_theta`` (None: the config's ``rotary_base``) and ``rope_scaling`` (Transformers' keys,
        type linear or yarn; None: none), by :func:`seqwarm.curriculum.rope.rope_frequencies`; YaRN's
        attention factor multiplies cos and sin, as Transformers applies it. Not saved: a loop sets it again
        from the clock after a resume. ValueError on a model with learned positions."""
        if not self.config.rotary:
            raise ValueError("set_positions needs rotary embeddings; this GPT learns its positions (rotary=False)")
        theta = self.config.rotary_base if rope_theta is None else float(rope_theta)
        inv_freq, scale = rope_frequencies(self.config.rotary_dim, theta, rope_scaling)
        cos, sin = _rotary_tables(self.config, inv_freq, scale)
        with torch.no_grad():  # in place: the buffers keep their device, and a compiled graph its inputs
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
        self.positions = {"rope_theta": theta, "rope_scaling": dict(rope_scaling) if rope_scaling else None}

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            if getattr(module, "residual_projection", False):
                std = std / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (the tied embedding counted once); ``non_embedding`` drops ``wpe``."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding and self.wpe is not None:
            total -= self.wpe.weight.numel()
        return total

    def estimate_flops_per_token(self, seq_length: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token at ``seq_length`` (default: full length).

        ``6 * N`` for the matmuls over the non-position-embedding parameters (the tied LM head
        included) plus ``12 * n_layer * n_embd * T`` for attention scores and values (PaLM, App. B).
        """
        cfg = self.config
        t = cfg.seq_length if seq_length is None else seq_length
        return 6.0 * self.num_params(non_embedding=True) + 12.0 * cfg.n_layer * cfg.n_embd * t

    def _attention_mask(self, attention_mask: torch.Tensor, t: int) -> torch.Tensor:
        """A boolean mask for SDPA (True = may attend) from a padding or 4-D mask."""
        if attention_mask.dim() == 4:  # (B|1, 1, T, T): True/1 = attend, or an additive float mask
            return attention_mask if attention_mask.is_floating_point() else attention_mask.bool()
        keep = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys that are real tokens
        causal = torch.ones(t, t, dtype=torch.bool, device=attention_mask.device).tril()
        # A query always sees itself, so a padded query never has an empty row (no NaN); padded
        # positions are meant to be excluded from the loss by labels/loss_mask.
        return (causal & keep) | torch.eye(t, dtype=torch.bool, device=attention_mask.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        curriculum_seqlen: int | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Loss (mean over ``loss_mask``; mean over labels != -100 without one, bit for bit the loss of an
        all-ones mask, so a loop may leave a trivial mask out) or logits.

        ``curriculum_seqlen`` < S cuts every input to its first positions with
        :func:`seqwarm.curriculum.batch.truncate_batch`, so the loss equals the loss on a truncated batch.
        ``attention_mask`` may be a ``(B, S)`` padding mask (1 = real token) or a 4-D
        ``(B|1, 1, S, S)`` mask in PyTorch's convention (True = may attend, or an additive float
        mask); Megatron's masks are the inverse (True = masked): pass ``~mask``. ``document_ids``
        ``(B, S)`` (document masking, the ``window`` mode): a token attends only to earlier tokens of
        the same id (block-diagonal causal, intersected with ``attention_mask``), computed at the cost of
        the blocks' span (:mod:`seqwarm.trainer.attention`: window fragments as rows, documents by query
        blocks, FlexAttention on CUDA). Without either the attention is causal via ``is_causal=True`` and
        no mask is materialised.
        """
        if curriculum_seqlen is not None:
            cut = truncate_batch(
                {
                    k: v
                    for k, v in dict(
                        input_ids=input_ids,
                        labels=labels,
                        loss_mask=loss_mask,
                        position_ids=position_ids,
                        attention_mask=attention_mask,
                        document_ids=document_ids,
                    ).items()
                    if v is not None
                },
                curriculum_seqlen,
            )
            input_ids = cut["input_ids"]
            labels, loss_mask = cut.get("labels"), cut.get("loss_mask")
            position_ids, attention_mask = cut.get("position_ids"), cut.get("attention_mask")
            document_ids = cut.get("document_ids")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq), got shape {list(input_ids.shape)}")
        b, t = input_ids.shape
        if t > self.config.seq_length:
            raise ValueError(
                f"input length {t} (input_ids shape {[b, t]}) exceeds the model's seq_length "
                f"{self.config.seq_length}; cut the batch or build the model with a longer seq_length"
            )
        x = self.wte(input_ids)  # (B, T, C)
        rope = None
        if self.wpe is not None:
            pos = position_ids if position_ids is not None else torch.arange(t, device=x.device)
            x = x + self.wpe(pos)
        elif position_ids is not None:  # cos/sin rows at each token's position: (B, 1, T, hd/2)
            rope = (self.rope_cos[position_ids][:, None], self.rope_sin[position_ids][:, None])
        else:  # sliced to the current length: (T, hd/2)
            rope = (self.rope_cos[:t], self.rope_sin[:t])
        mask = None if attention_mask is None else self._attention_mask(attention_mask, t)
        # Once per forward, for every layer: the attention at the cost of the span (trainer.attention).
        dropout = self.training and self.config.dropout > 0
        blocks_compiled = getattr(self.blocks[0], "_compiled_call_impl", None) is not None  # FSDP2's compile
        plan = plan_attention(document_ids, t, mask, dropout=dropout, compiled=blocks_compiled)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rope, plan)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V padded)
        if logits.size(-1) != self.config.vocab_size:  # padded rows: no probability, in loss or generation
            logits = logits[..., : self.config.vocab_size]  # (B, T, V)
        if labels is None:
            return logits
        flat_logits = logits.float().reshape(-1, logits.size(-1))
        losses = F.cross_entropy(flat_logits, labels.reshape(-1), reduction="none")  # 0 where labels are -100
        if loss_mask is None:  # the arithmetic of an all-ones loss_mask, bit for bit (the loop leaves one out)
            return losses.sum() / (labels != -100).sum().to(losses.dtype).clamp(min=1.0)
        mask = loss_mask.reshape(-1).to(losses.dtype)
        return (losses * mask).sum() / mask.sum().clamp(min=1.0)
