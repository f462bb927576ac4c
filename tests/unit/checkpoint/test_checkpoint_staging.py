"""The reusing stager: the same buffers every save, always holding this save's values."""

from __future__ import annotations

import torch

from trainyard.plugins.checkpoint.staging import ReusingStager


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "note": {"epoch": 1}}


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()


def test_later_saves_copy_into_the_first_buffers_and_hold_the_new_values() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer)
    stager = ReusingStager()
    first = stager.stage(_state(model, optimizer))
    pointer = first["model"]["weight"].data_ptr()
    _step(model, optimizer)
    optimizer.param_groups[0]["lr"] = 0.05
    state = _state(model, optimizer)
    state["note"]["epoch"] = 2
    second = stager.stage(state)
    assert second["model"]["weight"].data_ptr() == pointer  # no new buffer
    assert second["model"]["weight"].data_ptr() != model.weight.data_ptr()  # a copy, not the live one
    assert torch.equal(second["model"]["weight"], model.weight.detach())
    assert torch.equal(second["optim"]["state"][0]["exp_avg"], optimizer.state[model.weight]["exp_avg"])
    assert second["optim"]["param_groups"][0]["lr"] == 0.05 and second["note"] == {"epoch": 2}
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on: the staged copy does not move
    assert not torch.equal(second["model"]["weight"], model.weight.detach())
    stager.close()


def test_a_changed_structure_is_staged_afresh() -> None:
    stager = ReusingStager()
    first = stager.stage({"w": torch.ones(3), "b": torch.zeros(2)})
    grown = stager.stage({"w": torch.full((5,), 2.0), "b": torch.zeros(2)})
    assert torch.equal(grown["w"], torch.full((5,), 2.0))
    assert grown["w"].data_ptr() != first["w"].data_ptr()
    other_dtype = stager.stage({"w": torch.ones(5, dtype=torch.float64), "b": torch.zeros(2)})
    assert other_dtype["w"].dtype == torch.float64
    fewer = stager.stage({"w": torch.ones(5, dtype=torch.float64)})
    assert fewer.keys() == {"w"}
    stager.close()


def test_none_values_are_values_not_a_changed_structure() -> None:
    stager = ReusingStager()
    first = stager.stage({"w": torch.ones(3), "group": {"foreach": None, "betas": (0.9, 0.99)}})
    second = stager.stage({"w": torch.full((3,), 4.0), "group": {"foreach": None, "betas": (0.5, 0.9)}})
    assert second["w"].data_ptr() == first["w"].data_ptr()
    assert torch.equal(second["w"], torch.full((3,), 4.0))
    assert second["group"] == {"foreach": None, "betas": (0.5, 0.9)}
    stager.close()
