"""The torchrun agent's correction to its rendezvous: event names from a frame walk, the same
names torch's `inspect.stack()` lookup gave."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from trainyard.plugins.launch import agent


def _name_at(get_name: Callable[[int], str], depth: int) -> str:
    return get_name(depth)


def _record_like(get_name: Callable[[], str]) -> str:
    """Stands in for `DynamicRendezvousHandler._record`: names the function that called it."""
    return get_name()


def _caller(get_name: Callable[[], str]) -> str:
    return _record_like(get_name)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_each_depth_names_the_frame_torch_named(depth: int) -> None:
    assert _name_at(agent._method_name, depth) == _name_at(dynamic_rendezvous.get_method_name, depth)


def test_depth_0_is_the_function_itself_and_too_deep_is_said_as_torch_says_it() -> None:
    assert agent._method_name(0) == "_method_name"
    assert agent._method_name(10_000) == dynamic_rendezvous.get_method_name(10_000) == "no_method_name"


def test_the_rendezvous_names_its_events_through_the_frame_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    original = dynamic_rendezvous.get_method_name
    assert _caller(original) == "_caller"  # what torch's own lookup names: _record's caller
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", original)  # put back after the test
    agent.name_rendezvous_events_cheaply()
    assert dynamic_rendezvous.get_method_name is agent._method_name
    assert _caller(dynamic_rendezvous.get_method_name) == "_caller"
