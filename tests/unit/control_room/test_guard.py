"""The Stop endpoint's check against cross-site requests: what a browser sends from this
origin passes; a form or fetch from another site, or a request naming no origin, is refused."""

from __future__ import annotations

import pytest

from trainyard.plugins.control_room.guard import cross_site_problem

HOST = {"host": "127.0.0.1:8080"}


@pytest.mark.parametrize("headers", [
    {**HOST, "origin": "http://127.0.0.1:8080", "sec-fetch-site": "same-origin"},
    {**HOST, "origin": "http://127.0.0.1:8080"},  # a browser that sends no Fetch metadata
    {"host": "airflow:8080", "x-forwarded-host": "airflow.example.com", "origin": "https://airflow.example.com"},
])
def test_a_request_from_this_origin_passes(headers: dict[str, str]) -> None:
    assert cross_site_problem(headers) == ""


@pytest.mark.parametrize(("headers", "said"), [
    ({**HOST, "origin": "http://evil.example", "sec-fetch-site": "cross-site"}, "cross-site"),
    ({**HOST, "origin": "http://127.0.0.1:8080", "sec-fetch-site": "same-site"}, "same-site"),
    ({**HOST, "origin": "http://localhost:8080"}, "is not this site"),
    ({**HOST, "origin": "null"}, "names no Origin"),  # a sandboxed page without allow-same-origin
    (HOST, "names no Origin"),
])
def test_a_request_from_elsewhere_is_refused(headers: dict[str, str], said: str) -> None:
    assert said in cross_site_problem(headers)
