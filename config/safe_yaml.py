"""YAML for untrusted files (specs, clusters): safe tags only, duplicate keys refused, and limits
on aliases, depth and expanded size checked on the node graph *before* anything is built.

A "billion laughs" document (`a: &a [x, x]`, `b: &b [*a, *a]`, … nine levels) is a few hundred
bytes that PyYAML builds cheaply — aliases share objects — but whatever walks it afterwards
(`repr` for an error message, pydantic, `json.dumps`) expands it to 10⁹ elements and hangs.
So the composed graph is measured first: each node's expanded size is computed once and
memoised (linear in the graph, not in the expansion), and a document over the limits is refused
with one message. A recursive alias (`&a [*a]`) is refused too.
"""

from __future__ import annotations

import typing
from typing import Any

import yaml

from trainyard.plugins.errors import FatalError  # a leaf module with no imports, not an engine

MAX_DEPTH = 64
"""Nesting levels; a spec uses about 6, a cluster file about 8."""
MAX_NODES = 100_000
"""Scalars, lists and mappings after alias expansion; a 10k-GPU cluster file is a few hundred."""
MAX_ALIASES = 1_000
"""Alias uses (`*name`): anchors are a convenience, not a compression scheme."""


class YamlLimitError(FatalError, ValueError):
    """A document over the alias, depth or size limits (or with a recursive alias)."""


class UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader that refuses duplicate keys instead of keeping the last one. On libyaml's C
    parser where PyYAML has it (about 8× faster: the DAG folder parses every spec), with the
    same constructors and the same error marks."""


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, typing.Hashable) and key in seen:
            first = seen[key].start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None,
                f"duplicate key {preview_value(key)} (first defined on line {first})",
                key_node.start_mark,
            )
        if isinstance(key, typing.Hashable):
            seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_documents(text: str) -> list[Any]:
    """Every document of `text`, each checked against the limits before it is constructed.
    Raises `yaml.YAMLError` (syntax, duplicate key) or `YamlLimitError`."""
    loader = UniqueKeyLoader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            check_limits(node)
            documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def check_limits(root: yaml.Node) -> int:
    """The expanded size of the graph under `root`; raise `YamlLimitError` past a limit."""
    memo: dict[int, int] = {}
    active: set[int] = set()
    aliases = [0]

    def measure(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in active:
            raise YamlLimitError(f"line {node.start_mark.line + 1}: a recursive alias "
                                 "(an anchor used inside itself)")
        if key in memo:
            aliases[0] += 1
            if aliases[0] > MAX_ALIASES:
                raise YamlLimitError(f"more than {MAX_ALIASES} alias uses (*name)")
            return memo[key]
        if depth > MAX_DEPTH:
            raise YamlLimitError(f"line {node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
        active.add(key)
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(measure(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(measure(k, depth + 1) + measure(v, depth + 1) for k, v in node.value)
        active.discard(key)
        if size > MAX_NODES:
            raise YamlLimitError(f"line {node.start_mark.line + 1}: expands to more than "
                                 f"{MAX_NODES:,} values (aliases included)")
        memo[key] = size
        return size

    return measure(root, 0)


def preview_value(value: Any, limit: int = 60) -> str:
    """A bounded `repr` for messages: never walks more than a few levels or items, so a huge
    or alias-shared value costs the same as a small one."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxtuple, r.maxset = 3, 4, 4, 4, 4
    r.maxstring, r.maxother, r.maxlong = limit, limit, 40
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
