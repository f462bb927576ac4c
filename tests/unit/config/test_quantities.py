from __future__ import annotations

from datetime import timedelta

import pytest

from trainyard.config.quantities import parse_count, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("30m", 1800), ("48h", 172800), ("90s", 90), ("2d", 172800), ("1.5h", 5400), (45, 45),
    ("250ms", 0.25), ("1w", 604800),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["soon", "-5m", "0s", "", True, None, "5 parsecs", float("inf"), "1000000000d"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(("text", "count"), [
    ("7e9", 7_000_000_000), ("6.7B", 6_700_000_000), ("70M", 70_000_000), (405e9, 405_000_000_000),
    ("1.5T", 1_500_000_000_000), (1000, 1000), ("2k", 2000),
])
def test_counts(text: object, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("bad", ["seven", "-1", "0", True, "7 bananas", float("nan")])
def test_bad_counts(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_count(bad)


@pytest.mark.parametrize(("text", "bytes_per_s"), [
    ("450GB/s", 450e9), ("3.35TB/s", 3.35e12), ("400Gb/s", 50e9), ("50GBps", 50e9), ("100 MB/s", 1e8),
    ("25Gbps", 25e9 / 8),
])
def test_bandwidths_carry_their_unit(text: str, bytes_per_s: float) -> None:
    from trainyard.config.quantities import parse_bandwidth

    assert parse_bandwidth(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize(("bad", "message"), [
    (450, "needs its unit: write 450GB/s for gigabytes or 450Gb/s for gigabits"),
    ("450", "expected a bandwidth like 450GB/s"), ("0GB/s", "must be positive"), ("fast", "expected a bandwidth"),
    (True, "expected a bandwidth"),
])
def test_bad_bandwidths(bad: object, message: str) -> None:
    from trainyard.config.quantities import parse_bandwidth

    with pytest.raises(ValueError, match=message):
        parse_bandwidth(bad)
