"""What `parallelize` can check and build without processes: plan checks that fail before any
collective, the pipeline split, activation checkpointing's exactness, the checkpoint view."""

from __future__ import annotations

import copy

import pytest
import torch

from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.worker.distributed.activation_checkpoint import apply_ac
from trainyard.worker.distributed.mesh import default_plan, mesh_shape
from trainyard.worker.distributed.parallelize import StagesView, check_plan
from trainyard.worker.distributed.pipeline_parallel import (
    split_stage,
    stage_indices,
    stage_layer_ranges,
)
from trainyard.worker.models.llama import Llama, LlamaConfig, cross_entropy_loss

CONFIG = LlamaConfig(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
                     max_seq_len=16)


@pytest.fixture
def model() -> Llama:
    torch.manual_seed(0)
    return Llama(CONFIG)


@pytest.mark.parametrize(("plan", "match"), [
    (Plan(layout=RankLayout(cp=2)), r"context parallelism cp\(2\) is not supported by the worker runtime"),
    (Plan(layout=RankLayout(tp=8)), r"tp\(8\) does not divide num_heads\(4\)"),
    (Plan(layout=RankLayout(tp=4)), r"tp\(4\) does not divide num_kv_heads\(2\)"),
    (Plan(layout=RankLayout(pp=8), num_micro_batches=8), r"pipeline stages \(8 = pp·vpp\) exceed the model's num_layers \(4\)"),
    (Plan(layout=RankLayout(pp=2), vpp=4, num_micro_batches=2), r"pipeline stages \(8 = pp·vpp\)"),
    (Plan(layout=RankLayout(pp=4), num_micro_batches=2), r"needs num_micro_batches \(2\) >= pp \(4\)"),
    (Plan(layout=RankLayout(pp=2), vpp=2, num_micro_batches=3), r"multiple of pp \(2\)"),
    (Plan(layout=RankLayout(tp=2), sequence_parallel=True, sequence_length=15), r"sequence_length \(15\) divisible by tp \(2\)"),
])
def test_plans_that_cannot_apply_are_refused_up_front(model: Llama, plan: Plan, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_plan(plan, model)


def test_tied_embeddings_refuse_tp_and_pp() -> None:
    tied = Llama(LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             ffn_hidden_size=64, tie_embeddings=True))
    with pytest.raises(ValueError, match="tied embeddings"):
        check_plan(Plan(layout=RankLayout(tp=2)), tied)
    with pytest.raises(ValueError, match="tied embeddings cannot span pipeline stages"):
        check_plan(Plan(layout=RankLayout(pp=2), num_micro_batches=2), tied)


def test_layer_ranges_cover_every_layer_once() -> None:
    assert stage_layer_ranges(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layer_ranges(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert stage_layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    # Llama 3 405B: 126 layers on 16 stages, the first and last one layer lighter.
    sizes = [len(r) for r in stage_layer_ranges(126, 16)]
    assert sizes == [7] + [8] * 14 + [7] and stage_layer_ranges(126, 16)[-1].stop == 126
    assert stage_indices(1, pp=2, vpp=3) == [1, 3, 5]


def test_stages_keep_their_names_and_the_view_rebuilds_the_model(model: Llama) -> None:
    ranges = stage_layer_ranges(4, 4)
    stages = [split_stage(model, ranges[i], first=i == 0, last=i == 3) for i in range(4)]
    assert list(stages[1].layers.keys()) == ["1"] and stages[1].tok_embeddings is None
    assert stages[3].output is not None and stages[0].output is None
    # Rank 0 of an interleaved pp=2, vpp=2 pipeline holds stages 0 and 2.
    view = StagesView([stages[0], stages[2]])
    keys = set(view.state_dict())
    assert keys == {k for k in model.state_dict() if k.startswith(("tok_embeddings", "layers.0.", "layers.2."))}
    everything = StagesView(stages)
    assert set(everything.state_dict()) == set(model.state_dict())
    for name, tensor in everything.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name])


def test_a_split_model_computes_what_the_whole_does(model: Llama) -> None:
    ranges = stage_layer_ranges(4, 2)
    first, last = (split_stage(model, ranges[i], first=i == 0, last=i == 1) for i in range(2))
    tokens = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_is_exact(model: Llama, mode: str) -> None:
    recomputing = copy.deepcopy(model)
    apply_ac(recomputing, mode)  # type: ignore[arg-type]
    assert set(recomputing.state_dict()) == set(model.state_dict())  # wrapper adds no names
    tokens = torch.randint(0, 256, (2, 17))
    for m in (model, recomputing):
        cross_entropy_loss(m(tokens[:, :-1]), tokens[:, 1:]).backward()
    grads = dict(model.named_parameters())
    for name, p in recomputing.named_parameters():
        name = name.replace("._checkpoint_wrapped_module", "")
        assert torch.equal(p.grad, grads[name].grad), name


def test_unknown_recompute_mode_is_refused(model: Llama) -> None:
    with pytest.raises(ValueError, match="activation_checkpointing"):
        apply_ac(model, "some")  # type: ignore[arg-type]


def test_default_plan_is_data_parallel_over_the_world() -> None:
    plan = default_plan(4, global_batch_size=16, sequence_length=128)
    assert (plan.layout.dp, plan.layout.tp, plan.layout.pp, plan.zero_stage, plan.micro_batch_size) == (4, 1, 1, 0, 4)
    assert mesh_shape(plan) == (1, 4, 1, 1)
    with pytest.raises(ValueError, match=r"global batch size \(10\) is not divisible by the world size \(4\)"):
        default_plan(4, global_batch_size=10)
