"""`ModelProfile`: the model's shape, its parameter count and its FLOPs per token.

The architecture is the worker's Llama-style decoder (`worker/models/llama.py`), which has no
biases: token embedding V·h; per layer two RMSNorm weights (h each), attention q (h·h),
k and v (h·kv each, kv = kv_heads·head_dim), o (h·h), and an MLP — SwiGLU gate, up (h·F) and
down (F·h), or GELU up and down; a final RMSNorm (h) and an output head V·h unless tied.
A mixture-of-experts layer has `num_experts` copies of the MLP and a router (h·E).

GPT-style models with biases and learned positions (Megatron's `12lh²(1 + 13/12h + (V+s)/12lh)`)
differ from this count by less than 0.1 % for h ≥ 2048.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trainyard.config.spec import ModelHints, ModelShape, Precision


@dataclass(frozen=True)
class ModelProfile:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    sequence_length: int
    global_batch_size: int
    precision: Precision = "bf16"
    activation: Literal["gelu", "swiglu"] = "swiglu"
    tie_embeddings: bool = False
    num_experts: int | None = None
    expert_top_k: int | None = None
    declared_parameters: int | None = None
    """`modelParameters` from the spec, if given (only used for the mismatch warning)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size({self.hidden_size}) is not divisible by "
                             f"num_heads({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads({self.num_heads}) is not a multiple of "
                             f"num_kv_heads({self.num_kv_heads})")
        if self.num_experts and (self.expert_top_k or 1) > self.num_experts:
            raise ValueError(f"expert_top_k({self.expert_top_k}) exceeds num_experts({self.num_experts})")

    @classmethod
    def from_hints(cls, hints: ModelHints) -> ModelProfile:
        """The model the spec describes (`ModelHints.shape`, the one reading of the hints),
        planned for the spec's sequence length, global batch and precision."""
        return cls.from_shape(hints.shape(), sequence_length=hints.sequence_length,
                              global_batch_size=hints.global_batch_size,
                              precision=hints.mixed_precision,
                              declared_parameters=hints.model_parameters)

    @classmethod
    def from_shape(cls, shape: ModelShape, *, sequence_length: int, global_batch_size: int,
                   precision: Precision = "bf16",
                   declared_parameters: int | None = None) -> ModelProfile:
        """The profile of a derived `ModelShape` — every architecture field copied as it is."""
        return cls(**{f.name: getattr(shape, f.name) for f in fields(shape)},
                   sequence_length=sequence_length, global_batch_size=global_batch_size,
                   precision=precision, declared_parameters=declared_parameters)

    @property
    def shape(self) -> ModelShape:
        """The architecture alone, as the worker's `LlamaConfig.from_shape` takes it."""
        from trainyard.config.spec import ModelShape

        return ModelShape(**{f.name: getattr(self, f.name) for f in fields(ModelShape)})

    # --- shape -----------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_ratio(self) -> float:
        """K (or V) width over hidden: 1 for multi-head attention, 1/8 for Llama-3-70B's GQA."""
        return self.num_kv_heads / self.num_heads

    @property
    def ffn_ratio(self) -> float:
        return self.ffn_hidden_size / self.hidden_size

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def experts_per_token(self) -> int:
        return (self.expert_top_k or 1) if self.is_moe else 1

    @property
    def bytes_per_element(self) -> int:
        """Activations and the compute copy of the weights: 2 (bf16/fp16) or 4 (fp32)."""
        return 4 if self.precision == "fp32" else 2

    # --- parameters ------------------------------------------------------------------------

    def attention_parameters(self) -> int:
        """q, k, v, o of one layer."""
        h = self.hidden_size
        return 2 * h * h + 2 * h * self.kv_dim

    def expert_parameters(self) -> int:
        """One MLP (one expert of a MoE layer)."""
        return self.mlp_matrices * self.hidden_size * self.ffn_hidden_size

    def router_parameters(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    def layer_parameters(self) -> int:
        """All parameters of one transformer layer (every expert of a MoE layer)."""
        experts = self.num_experts if self.is_moe else 1
        return (2 * self.hidden_size + self.attention_parameters()
                + experts * self.expert_parameters() + self.router_parameters())

    def layer_dense_parameters(self) -> int:
        """One layer without its experts: what tensor parallelism alone splits."""
        return 2 * self.hidden_size + self.attention_parameters() + self.router_parameters()

    def layer_expert_parameters(self) -> int:
        """The MLP part of one layer (all experts): what expert parallelism splits further."""
        return (self.num_experts if self.is_moe else 1) * self.expert_parameters()

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_parameters(self) -> int:
        """The output head's own parameters: 0 when tied to the embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def parameter_breakdown(self) -> dict[str, int]:
        """Parameters by path (layers summed over `num_layers`), keyed like the worker's model."""
        h, f, n, kv = self.hidden_size, self.ffn_hidden_size, self.num_layers, self.kv_dim
        experts = self.num_experts if self.is_moe else 1
        out = {
            "tok_embeddings": self.embedding_parameters(),
            "layers/attention_norm": n * h,
            "layers/attention/wq": n * h * h,
            "layers/attention/wk": n * h * kv,
            "layers/attention/wv": n * h * kv,
            "layers/attention/wo": n * h * h,
            "layers/ffn_norm": n * h,
        }
        if self.activation == "swiglu":
            out |= {"layers/feed_forward/w1": n * experts * h * f,
                    "layers/feed_forward/w3": n * experts * h * f,
                    "layers/feed_forward/w2": n * experts * f * h}
        else:
            out |= {"layers/feed_forward/w1": n * experts * h * f,
                    "layers/feed_forward/w2": n * experts * f * h}
        if self.is_moe:
            out["layers/feed_forward/router"] = n * self.router_parameters()
        out |= {"norm": h, "output": self.head_parameters()}
        return out

    def parameter_count(self) -> int:
        """Exact count, closed form: V·h·(1 or 2) + L·layer + h."""
        return (self.embedding_parameters() + self.head_parameters()
                + self.num_layers * self.layer_parameters() + self.hidden_size)

    def active_parameters(self) -> int:
        """Parameters one token passes through (top-k experts of each MoE layer)."""
        per_layer = (2 * self.hidden_size + self.attention_parameters() + self.router_parameters()
                     + self.experts_per_token * self.expert_parameters())
        return (self.embedding_parameters() + self.head_parameters()
                + self.num_layers * per_layer + self.hidden_size)

    def parameter_mismatch(self, tolerance: float = 0.05) -> float | None:
        """Relative difference of the declared count from ours when above `tolerance`."""
        if not self.declared_parameters:
            return None
        ours = self.parameter_count()
        diff = (self.declared_parameters - ours) / ours
        return diff if abs(diff) > tolerance else None

    # --- FLOPs -------------------------------------------------------------------------------

    def layer_matmul_flops_per_token(self) -> float:
        """Forward matmul FLOPs of one layer per token: 2 per active weight."""
        return 2.0 * (self.attention_parameters() + self.router_parameters()
                      + self.experts_per_token * self.expert_parameters())

    def attention_flops_per_token(self) -> float:
        """Forward QKᵀ and AV of one layer per token: 2 matmuls × 2·s·h, causal mask ignored
        (the PaLM / Megatron convention; the time model uses the causal half)."""
        return 4.0 * self.sequence_length * self.hidden_size

    def head_flops_per_token(self) -> float:
        """Forward logits matmul per token (counted even when tied: the matmul still runs)."""
        return 2.0 * self.vocab_size * self.hidden_size

    def model_flops_per_token(self) -> float:
        """Training FLOPs per token, the MFU numerator: 3 × forward (backward = 2 × forward).

        = 6·N + 12·L·h·s with N the active non-embedding matmul parameters (output head
        included): PaLM's definition, which torchtitan and Megatron (72·B·s·l·h²·(1 + s/6h)
        + 6·B·s·V·h per iteration) also use.
        """
        forward = (self.num_layers * (self.layer_matmul_flops_per_token()
                                      + self.attention_flops_per_token())
                   + self.head_flops_per_token())
        return 3.0 * forward

    def recompute_flops_per_token(self, recompute: str, *, attention_recomputed: bool) -> float:
        """Extra forward FLOPs per token that recomputation performs (for HFU).

        full: the whole layer forward again; selective: only the attention core when the
        policy recomputes it (eager attention, or Megatron's core-attention policy), else
        elementwise work that we do not count as FLOPs.
        """
        if recompute == "full":
            return self.num_layers * (self.layer_matmul_flops_per_token()
                                      + self.attention_flops_per_token())
        if recompute == "selective" and attention_recomputed:
            return self.num_layers * self.attention_flops_per_token()
        return 0.0
