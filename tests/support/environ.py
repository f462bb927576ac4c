"""This process's environment changed for a while, then put back — one home for what the test
support sets (credentials, a stack's home, a proxy into the simulated network).

urllib's global opener keeps the proxies of the environment it was built in, so it is dropped on
the way in and on the way out: one built while a Kubernetes stack's `http_proxy` was set sent the
worker's later health checks of loopback servers to that proxy, closed by then (CI: every stack
after the Kubernetes e2e tests on the same worker "not healthy", connection refused)."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` set in `os.environ` while inside; each name restored (or removed) on exit."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    urllib.request.install_opener(None)  # type: ignore[arg-type]
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        urllib.request.install_opener(None)  # type: ignore[arg-type]
