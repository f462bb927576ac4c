"""A small Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU, grouped-query
attention — the model the platform trains end to end.

Module names follow torchtitan's Llama (`tok_embeddings`, `layers.<i>.attention.wq`, …,
`norm`, `output`) so the tensor-parallel plan, the pipeline split and checkpoints address the
same fully-qualified names. `layers` is a `ModuleDict` keyed by the layer index: a pipeline
stage deletes the layers it does not own and the survivors keep their names, so a checkpoint
written with one pipeline layout loads into another.

Parameter count (exact; the advisor computes the same number from `ModelHints`), with
h = hidden_size, L = num_layers, V = vocab_size, F = ffn_hidden_size,
kv = num_kv_heads · head_dim, head_dim = h / num_heads, no biases anywhere:

    tok_embeddings            V·h
    per layer  attention_norm h        (RMSNorm weight)
               attention.wq   h·h
               attention.wk   h·kv
               attention.wv   h·kv
               attention.wo   h·h
               ffn_norm       h        (RMSNorm weight)
               feed_forward.w1 h·F     (gate)
               feed_forward.w3 h·F     (up)
               feed_forward.w2 F·h     (down)
    norm                      h        (final RMSNorm)
    output                    V·h      (0 when tie_embeddings: it shares tok_embeddings)

    total = V·h·(1 if tied else 2) + L·(2h + 2h² + 2h·kv + 3h·F) + h

The demo (h 128, L 4, 4 heads, 2 KV heads, F 352, V 256) has 2·256·128 + 4·(256 + 32768 +
16384 + 135168) + 128 = 803,968 parameters. `num_params` implements the formula and
`param_breakdown` itemises it by path; the unit tests compare both with `numel()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from trainyard.config.spec import ModelHints, ModelShape


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256
    """Byte-level by default: one token per byte."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    """Grouped-query attention: every `num_heads / num_kv_heads` query heads share a K/V head."""
    ffn_hidden_size: int = 352
    max_seq_len: int = 128
    """Longest sequence the rotary tables are built for."""
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    """Share the embedding matrix with the output head (not with tensor or pipeline parallelism)."""
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "ffn_hidden_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size({self.hidden_size}) is not divisible by "
                             f"num_heads({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads({self.num_heads}) is not divisible by "
                             f"num_kv_heads({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim({self.head_dim}) must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hints(cls, hints: ModelHints) -> LlamaConfig:
        """The model a spec's `parallelism.hints` describe (the shape the advisor planned for:
        both read `ModelHints.shape`), its rotary table as long as the spec's sequences."""
        return cls.from_shape(hints.shape(), max_seq_len=hints.sequence_length)

    @classmethod
    def from_shape(cls, shape: ModelShape, *, max_seq_len: int) -> LlamaConfig:
        """The Llama of a derived `ModelShape`; refuses a shape this model cannot be."""
        if shape.activation != "swiglu":
            raise ValueError(f"the Llama model uses SwiGLU; hints.activation is {shape.activation!r}")
        if shape.num_experts:
            raise ValueError(f"the Llama model is dense; hints.numExperts is {shape.num_experts}")
        return cls(
            vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_layers=shape.num_layers,
            num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
            ffn_hidden_size=shape.ffn_hidden_size, max_seq_len=max_seq_len,
            tie_embeddings=shape.tie_embeddings,
        )


def param_breakdown(config: LlamaConfig) -> dict[str, int]:
    """Parameters by path (layers summed over `num_layers`), as in nanoGPT's sizing notebook."""
    h, f, v, n = config.hidden_size, config.ffn_hidden_size, config.vocab_size, config.num_layers
    kv = config.num_kv_heads * config.head_dim
    return {
        "tok_embeddings": v * h,
        "layers/attention_norm": n * h,
        "layers/attention/wq": n * h * h,
        "layers/attention/wk": n * h * kv,
        "layers/attention/wv": n * h * kv,
        "layers/attention/wo": n * h * h,
        "layers/ffn_norm": n * h,
        "layers/feed_forward/w1": n * h * f,
        "layers/feed_forward/w3": n * h * f,
        "layers/feed_forward/w2": n * f * h,
        "norm": h,
        "output": 0 if config.tie_embeddings else v * h,
    }


def num_params(config: LlamaConfig) -> int:
    """Exact parameter count, closed form (see the module docstring)."""
    h, f, v, n = config.hidden_size, config.ffn_hidden_size, config.vocab_size, config.num_layers
    kv = config.num_kv_heads * config.head_dim
    per_layer = 2 * h + 2 * h * h + 2 * h * kv + 3 * h * f
    return v * h * (1 if config.tie_embeddings else 2) + n * per_layer + h


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (max_seq_len, head_dim / 2), in fp32.

    Real-valued (not complex) so the tables survive bf16 casts, DTensor and pipeline copies.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (batch, seq, heads, head_dim) by the position's angles."""
    seq = x.shape[1]
    cos = cos[:seq].view(1, seq, 1, -1).to(x.dtype)
    sin = sin[:seq].view(1, seq, 1, -1).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.n_rep = config.num_heads // config.num_kv_heads
        kv = config.num_kv_heads * config.head_dim
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, kv, bias=False)
        self.wv = nn.Linear(config.hidden_size, kv, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # `-1` heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) · w3 x)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.ffn_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Tokens (batch, seq) → logits (batch, seq, vocab).

    A pipeline stage is this same class with some parts set to None: without
    `tok_embeddings` it takes hidden states instead of tokens, without `output` it returns
    hidden states (see `trainyard.worker.distributed.pipeline_parallel`).
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(config) for i in range(config.num_layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.output: nn.Linear | None = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        # Not persistent: derived from the config, so not part of a checkpoint.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, init_std) for matrices; output projections of each residual branch scaled by
        1/sqrt(2·num_layers) (GPT-2), so the residual stream's variance does not grow with depth."""
        std, depth_std = self.config.init_std, self.config.init_std / math.sqrt(2 * self.config.num_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                last = name.rsplit(".", 1)[-1]
                nn.init.normal_(module.weight, mean=0.0, std=depth_std if last in ("wo", "w2") else std)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over every position, computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
