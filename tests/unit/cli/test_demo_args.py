"""`make demo`'s arguments: a shorter run must still crash where asked, or say why it cannot."""

from __future__ import annotations

import pytest

from trainyard.cli.demo import parse_args


def test_the_default_is_the_specs_length_with_the_crash_at_step_120() -> None:
    args = parse_args([])
    assert (args.max_steps, args.crash_at_step, args.no_crash) == (None, 120, False)


def test_a_shorter_run_keeps_a_crash_that_lies_inside_it() -> None:
    args = parse_args(["--max-steps", "80", "--crash-at-step", "60"])
    assert (args.max_steps, args.crash_at_step) == (80, 60)


@pytest.mark.parametrize("argv", [["--max-steps", "80"], ["--max-steps", "80", "--crash-at-step", "1"]])
def test_a_crash_the_shorter_run_would_never_reach_is_refused_with_the_fix(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err
    assert "must lie in 2..--max-steps (80)" in err and "--no-crash" in err, err


def test_without_the_crash_any_length_goes() -> None:
    assert parse_args(["--max-steps", "10", "--no-crash"]).max_steps == 10
