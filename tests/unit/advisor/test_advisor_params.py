"""The advisor's parameter count equals `sum(p.numel())` of real models: the worker's Llama
(when `trainyard.worker.models.llama` is importable) and an independent reference written here, so the
check never silently skips everything."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainyard.config.spec import ModelHints
from trainyard.plugins.advisor.model import ModelProfile

CONFIGS = [
    # hidden, layers, heads, kv heads, ffn, vocab, tied, activation
    dict(hidden_size=128, num_layers=4, num_attention_heads=4, num_key_value_heads=2,
         ffn_hidden_size=352, vocab_size=256),  # the demo
    dict(hidden_size=96, num_layers=3, num_attention_heads=6, num_key_value_heads=6,
         ffn_hidden_size=256, vocab_size=300),  # plain multi-head attention
    dict(hidden_size=64, num_layers=2, num_attention_heads=8, num_key_value_heads=1,
         ffn_hidden_size=None, vocab_size=1000, tie_embeddings=True),  # MQA, tied, default FFN
    dict(hidden_size=80, num_layers=5, num_attention_heads=4, num_key_value_heads=2,
         ffn_hidden_size=200, vocab_size=77, activation="gelu"),
]


def hints(**kw: object) -> ModelHints:
    base = dict(sequence_length=32, global_batch_size=4)
    return ModelHints(**{**base, **{k: v for k, v in kw.items() if v is not None}})


class RefBlock(nn.Module):
    """Llama-style block written from the architecture description, not from the worker."""

    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int, activation: str) -> None:
        super().__init__()
        kv = kv_heads * (h // heads)
        self.norms = nn.ModuleList([nn.RMSNorm(h), nn.RMSNorm(h)])
        self.attn = nn.ModuleList([nn.Linear(h, h, bias=False), nn.Linear(h, kv, bias=False),
                                   nn.Linear(h, kv, bias=False), nn.Linear(h, h, bias=False)])
        mats = 3 if activation == "swiglu" else 2
        self.mlp = nn.ModuleList([nn.Linear(h, ffn, bias=False) for _ in range(mats - 1)]
                                 + [nn.Linear(ffn, h, bias=False)])


class RefModel(nn.Module):
    def __init__(self, hints: ModelHints) -> None:
        super().__init__()
        h, v = hints.hidden_size, hints.vocab_size
        self.embed = nn.Embedding(v, h)
        self.blocks = nn.ModuleList(RefBlock(h, hints.num_attention_heads, hints.shape().num_kv_heads,
                                             hints.shape().ffn_hidden_size, hints.activation)
                                    for _ in range(hints.num_layers))
        self.norm = nn.RMSNorm(h)
        self.head = nn.Linear(h, v, bias=False)
        if hints.tie_embeddings:
            self.head.weight = self.embed.weight


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() dedups tied weights


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"h{c['hidden_size']}-L{c['num_layers']}")
def test_count_matches_reference_torch_model(cfg: dict) -> None:
    h = hints(**cfg)
    profile = ModelProfile.from_hints(h)
    assert profile.parameter_count() == numel(RefModel(h))
    assert sum(profile.parameter_breakdown().values()) == profile.parameter_count()


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.get("activation", "swiglu") == "swiglu"],
                         ids=lambda c: f"h{c['hidden_size']}-L{c['num_layers']}")
def test_count_matches_the_workers_llama(cfg: dict) -> None:
    from trainyard.worker.models import llama

    h = hints(**cfg)
    torch.manual_seed(0)
    model = llama.Llama(llama.LlamaConfig.from_hints(h))
    profile = ModelProfile.from_hints(h)
    assert profile.parameter_count() == numel(model)
    # Same paths, item by item (the worker itemises its own count the same way).
    assert profile.parameter_breakdown() == {k: v for k, v in llama.param_breakdown(model.config).items()}


def test_demo_count_is_the_documented_number() -> None:
    h = hints(**CONFIGS[0])
    assert ModelProfile.from_hints(h).parameter_count() == 803_968


def test_moe_counts_every_expert_and_the_router() -> None:
    dense = ModelProfile.from_hints(hints(**CONFIGS[0]))
    moe = ModelProfile.from_hints(hints(**CONFIGS[0], num_experts=8, expert_top_k=2))
    per_layer_extra = 7 * dense.expert_parameters() + dense.hidden_size * 8
    assert moe.parameter_count() - dense.parameter_count() == dense.num_layers * per_layer_extra
    assert moe.active_parameters() == dense.parameter_count() + dense.num_layers * (
        dense.expert_parameters() + dense.hidden_size * 8)


def test_declared_size_mismatch_is_reported_only_past_five_percent() -> None:
    exact = ModelProfile.from_hints(hints(**CONFIGS[0])).parameter_count()
    close = ModelProfile.from_hints(hints(**CONFIGS[0], model_parameters=int(exact * 1.049)))
    far = ModelProfile.from_hints(hints(**CONFIGS[0], model_parameters=int(exact * 1.06)))
    assert close.parameter_mismatch() is None
    assert far.parameter_mismatch() == pytest.approx(0.06, abs=1e-4)


def test_llama2_7b_shape_has_its_published_size() -> None:
    profile = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                           ffn_hidden_size=11008, vocab_size=32000, sequence_length=4096,
                           global_batch_size=1)
    assert profile.parameter_count() == 6_738_415_616  # Llama 2 7B, as Hugging Face reports it


@pytest.mark.parametrize("config", [*CONFIGS[:3], dict(CONFIGS[0], num_key_value_heads=None, num_experts=1)])
def test_the_advisor_and_the_worker_read_one_shape_of_the_hints(config: dict) -> None:
    """`ModelHints.shape` interprets the hints once (default KV heads and FFN width, one expert
    meaning dense); the advisor's profile and the worker's model are both built from it."""
    from trainyard.worker.models.llama import LlamaConfig

    h = hints(**config)
    shape = h.shape()
    profile = ModelProfile.from_hints(h)
    assert profile.shape == shape and not profile.is_moe
    assert LlamaConfig.from_hints(h) == LlamaConfig.from_shape(profile.shape, max_seq_len=h.sequence_length)


def test_only_the_spec_interprets_the_hints_head_counts() -> None:
    """`numAttentionHeads`/`numKeyValueHeads` are spelt `num_heads`/`num_kv_heads` once derived:
    an engine or the worker reading the hints' own names is deriving the shape a second time."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    readers = sorted(
        f"{path.relative_to(root)}:{node.lineno}"
        for package in ("plugins", "worker", "cli", "operators", "node_agent")
        for path in (root / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in {"num_attention_heads", "num_key_value_heads"})
    assert readers == []
