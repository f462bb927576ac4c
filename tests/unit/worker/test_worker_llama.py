"""The example model: its parameter count is exactly what the docstring's formula (and the
advisor) say, it is causal, and its config refuses shapes it cannot build."""

from __future__ import annotations

import pytest
import torch

from tests.support.procs import REPO_ROOT
from trainyard.config.loader import load_spec_file
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.worker.models.llama import Llama, LlamaConfig, num_params, param_breakdown

SHAPES = [
    LlamaConfig(),
    LlamaConfig(vocab_size=300, hidden_size=96, num_layers=3, num_heads=6, num_kv_heads=3,
                ffn_hidden_size=200, max_seq_len=16),
    LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, ffn_hidden_size=128,
                tie_embeddings=True),
    LlamaConfig(hidden_size=64, num_layers=1, num_heads=8, num_kv_heads=1, ffn_hidden_size=64),
]


def numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight counts once


@pytest.mark.parametrize("config", SHAPES, ids=lambda c: f"h{c.hidden_size}-kv{c.num_kv_heads}-tied{c.tie_embeddings}")
def test_parameter_count_is_exact(config: LlamaConfig) -> None:
    model = Llama(config)
    assert num_params(config) == numel(model)
    assert sum(param_breakdown(config).values()) == numel(model)


def test_breakdown_matches_each_module() -> None:
    config = SHAPES[1]
    model = Llama(config)
    measured: dict[str, int] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        key = "/".join(["layers", *parts[2:-1]]) if parts[0] == "layers" else parts[0]
        measured[key] = measured.get(key, 0) + p.numel()
    assert {k: v for k, v in param_breakdown(config).items() if v} == measured


def test_demo_model_is_the_documented_size_and_the_advisors() -> None:
    hints = load_spec_file(REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").spec.parallelism.hints
    config = LlamaConfig.from_hints(hints)
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
            config.ffn_hidden_size, config.vocab_size, config.max_seq_len) == (128, 4, 4, 2, 352, 256, 128)
    assert num_params(config) == numel(Llama(config)) == 803_968
    assert ModelProfile.from_hints(hints).parameter_count() == 803_968


def test_logits_shape_and_causality() -> None:
    torch.manual_seed(0)
    model = Llama(SHAPES[1]).eval()
    tokens = torch.randint(0, 300, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 300
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 16, 300)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_same_seed_same_weights() -> None:
    torch.manual_seed(3)
    a = Llama(SHAPES[0])
    torch.manual_seed(3)
    b = Llama(SHAPES[0])
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"hidden_size": 100, "num_heads": 3}, "hidden_size(100) is not divisible by num_heads(3)"),
    ({"num_heads": 4, "num_kv_heads": 3}, "num_heads(4) is not divisible by num_kv_heads(3)"),
    ({"vocab_size": 0}, "vocab_size must be positive"),
])
def test_bad_shapes_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LlamaConfig(**kwargs)
