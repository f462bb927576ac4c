"""Activation memory: the formula against what a real Llama-style block saves for backward
(counted with `torch.autograd.graph.saved_tensors_hooks`), and against Korthikanti et al.'s
closed forms for the GPT layer they analyse.

Convention measured: bytes of the tensors autograd keeps for one layer and one micro-batch,
each storage counted once (q is saved by attention and its view by nothing else; the SDPA
output and wo's input share a storage), excluding parameters and the RoPE tables (constants
shared by all layers and micro-batches). The block is written here as the worker writes its
own (nn.RMSNorm, RoPE, K/V repeated for GQA, SDPA, SwiGLU, no biases, no dropout).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainyard.plugins.advisor.layout import MEGATRON, PYTORCH, TORCHTITAN_2024
from trainyard.plugins.advisor.memory import layer_activation_bytes, layer_activation_items
from trainyard.plugins.advisor.model import ModelProfile

TOLERANCE = 0.10


class ReferenceRMSNorm(nn.Module):
    """The Llama reference RMSNorm (torchtitan's `rmsnorm` in 2024): cast back, then weight."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


class Block(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int,
                 norm: type[nn.Module] = nn.RMSNorm) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, h // heads
        kv = kv_heads * self.head_dim
        self.attention_norm, self.ffn_norm = norm(h), norm(h)
        self.wq, self.wk = nn.Linear(h, h, bias=False), nn.Linear(h, kv, bias=False)
        self.wv, self.wo = nn.Linear(h, kv, bias=False), nn.Linear(h, h, bias=False)
        self.w1, self.w3 = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = self.attention_norm(x)
        q = self.wq(y).view(b, s, -1, self.head_dim)
        k = self.wk(y).view(b, s, -1, self.head_dim)
        v = self.wv(y).view(b, s, -1, self.head_dim)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, s, h))
        z = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(z)) * self.w3(z))


def saved_bytes(s: int, b: int, h: int, heads: int, kv_heads: int, ffn: int,
                dtype: torch.dtype, norm: type[nn.Module] = nn.RMSNorm) -> int:
    torch.manual_seed(0)
    block = Block(h, heads, kv_heads, ffn, norm).to(dtype)
    hd = h // heads
    angles = torch.outer(torch.arange(s, dtype=torch.float32),
                         1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    cos = angles.cos().view(1, s, 1, -1).to(dtype)
    sin = angles.sin().view(1, s, 1, -1).to(dtype)
    excluded = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x, cos, sin)
    out.sum().backward()  # the graph is real: backward runs on what was kept
    return sum(kept.values())


def profile(s: int, b: int, h: int, heads: int, kv_heads: int, ffn: int, precision: str) -> ModelProfile:
    return ModelProfile(hidden_size=h, num_layers=1, num_heads=heads, num_kv_heads=kv_heads,
                        ffn_hidden_size=ffn, vocab_size=256, sequence_length=s,
                        global_batch_size=b, precision=precision)  # type: ignore[arg-type]


SHAPES = [  # s, b, h, heads, kv heads, ffn
    (128, 2, 128, 4, 2, 352),
    (256, 1, 256, 8, 2, 688),
    (64, 4, 192, 6, 6, 512),
    (512, 1, 128, 2, 1, 344),
    (96, 3, 256, 16, 4, 704),
]


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda t: "s{}-b{}-h{}-a{}-kv{}".format(*t[:5]))
def test_formula_matches_what_a_block_saves_for_backward(shape: tuple, precision: str,
                                                         dtype: torch.dtype) -> None:
    s, b, h, heads, kv_heads, ffn = shape
    measured = saved_bytes(s, b, h, heads, kv_heads, ffn, dtype)
    model = profile(s, b, h, heads, kv_heads, ffn, precision)
    predicted, transient = layer_activation_bytes(model, PYTORCH, b, 1, 1, False, "none")
    assert transient == 0
    assert predicted == pytest.approx(measured, rel=TOLERANCE), (
        f"formula {predicted:,.0f} B vs measured {measured:,} B ({predicted / measured - 1:+.1%})")


@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda t: "s{}-b{}-h{}-a{}-kv{}".format(*t[:5]))
def test_reference_rmsnorm_keeps_less_than_nn_rmsnorm(shape: tuple) -> None:
    """torchtitan's 2024 norm casts back before the weight: 4 + 2e bytes per element instead of
    nn.RMSNorm's 8 + e (`Implementation.norm_keeps_fp32_normalised`), measured in bf16."""
    s, b, h, heads, kv_heads, ffn = shape
    measured = saved_bytes(s, b, h, heads, kv_heads, ffn, torch.bfloat16, ReferenceRMSNorm)
    model = profile(s, b, h, heads, kv_heads, ffn, "bf16")
    predicted, _ = layer_activation_bytes(model, TORCHTITAN_2024, b, 1, 1, False, "none")
    assert predicted == pytest.approx(measured, rel=TOLERANCE), (
        f"formula {predicted:,.0f} B vs measured {measured:,} B ({predicted / measured - 1:+.1%})")
    nn_norm, _ = layer_activation_bytes(model, PYTORCH, b, 1, 1, False, "none")
    assert nn_norm - predicted == pytest.approx(2 * 2 * s * b * h)  # 2 bytes x 2 norms per element


def test_measurement_is_sensitive_to_what_is_kept() -> None:
    """Guard against a measurement that cannot fail: a wider MLP keeps proportionally more."""
    narrow = saved_bytes(128, 2, 128, 4, 2, 256, torch.float32)
    wide = saved_bytes(128, 2, 128, 4, 2, 512, torch.float32)
    assert wide - narrow == 4 * 128 * 2 * 256 * 4  # SwiGLU keeps 4 tensors of s·b·ffn


def gpt(s: int, b: int, h: int, a: int) -> ModelProfile:
    return ModelProfile(hidden_size=h, num_layers=1, num_heads=a, num_kv_heads=a,
                        ffn_hidden_size=4 * h, vocab_size=51200, sequence_length=s,
                        global_batch_size=b, precision="fp16", activation="gelu")


KORTHIKANTI = [(2048, 1, 12288, 96), (2048, 4, 6144, 64), (4096, 2, 8192, 64)]


def _korthikanti_bytes(model: ModelProfile, *, tp: int = 1, sp: bool = False,
                       recompute: str = "none") -> float:
    items = layer_activation_items(model, MEGATRON, micro_batch=model.global_batch_size, tp=tp,
                                   sp=sp, recompute=recompute)
    items.pop("norm_stats", None)  # Korthikanti drops the 2·sb statistics of each LayerNorm
    return sum(items.values())


@pytest.mark.parametrize("s,b,h,a", KORTHIKANTI)
def test_gpt_layer_reproduces_korthikanti_table_2(s: int, b: int, h: int, a: int) -> None:
    model, sbh, t = gpt(s, b, h, a), s * b * h, 8
    scores = 5 * a * s / h
    assert _korthikanti_bytes(model) == pytest.approx(sbh * (34 + scores))  # eq. (1)
    assert _korthikanti_bytes(model, tp=t) == pytest.approx(sbh * (10 + 24 / t + scores / t))  # (2)
    assert _korthikanti_bytes(model, tp=t, sp=True) == pytest.approx(sbh * (34 + scores) / t)  # (4)
    assert _korthikanti_bytes(model, tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert _korthikanti_bytes(model, tp=t, sp=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert _korthikanti_bytes(model, tp=t, recompute="full") == pytest.approx(sbh * 2)


def test_recomputation_keeps_less_and_recomputes_the_difference() -> None:
    model = profile(1024, 2, 1024, 8, 2, 2816, "bf16")
    none = layer_activation_bytes(model, PYTORCH, 2, 1, 1, False, "none")[0]
    selective, sel_transient = layer_activation_bytes(model, PYTORCH, 2, 1, 1, False, "selective")
    full, full_transient = layer_activation_bytes(model, PYTORCH, 2, 1, 1, False, "full")
    assert full < selective < none
    assert full == 1024 * 2 * 1024 * 2  # the block input, bf16
    assert sel_transient == pytest.approx(none - selective)
    assert full_transient == pytest.approx(none - full)
