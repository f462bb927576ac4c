"""What `trainyard --help` and each command's `--help` promise a new user: a version, exit
codes, help for every option, no references to documents they do not have; ages in one format;
an unknown job is an error."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.cli.main import build_parser, main, version
from trainyard.cli.output import format_age

ROOT = Path(__file__).resolve().parents[3]


def parsers(parser: argparse.ArgumentParser, path: str = "trainyard") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


ALL = list(parsers(build_parser()))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainyard {version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", version())


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[p for p, _ in ALL])
def test_every_help_lists_exit_codes_and_every_option_has_help(
    path: str, parser: argparse.ArgumentParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = parser.format_help()
    assert "exit codes:\n  0 " in text and "\n  2    usage error" in text, text
    assert "§" not in text and "seed" not in text.lower(), text  # users do not have the design notes
    undocumented = [a.option_strings or a.dest for a in parser._actions
                    if not a.help and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
    assert not undocumented, f"{path}: options without help: {undocumented}"
    assert max(map(len, text.splitlines())) <= 80, f"{path} --help is wider than 80 columns:\n{text}"


def test_launch_documents_the_codes_it_returns() -> None:
    (launch,) = [p for path, p in ALL if path == "trainyard launch"]
    text = launch.format_help()
    for code in ("42", "43", "44", "124", "130", "137"):
        assert f"\n  {code}" in text, text


def test_the_readme_lists_the_exit_codes_of_every_command() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for path, _ in ALL:
        if path.count(" ") == 1:  # top-level commands
            assert f"`{path}`" in section, f"README's exit codes do not mention {path}"


def test_launch_no_longer_needs_local() -> None:
    args = build_parser().parse_args(["launch", "job.yaml"])
    assert args.spec == Path("job.yaml")


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0, "0s"), (59.9, "59s"), (117, "1m57s"), (120, "2m00s"), (3599, "59m59s"),
    (3600 + 5 * 60, "1h05m"), (2 * 86400 + 4 * 3600 + 59, "2d04h"), (-3, "0s")])
def test_ages_have_one_format(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


def test_checkpoints_of_an_unknown_job_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from trainyard.config.settings import get_settings

    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        assert main(["checkpoints", "list", "no-such-job"]) == 1
        err = capsys.readouterr().err
        assert "no job named 'no-such-job'" in err and "demo-tiny-lm" in err  # names the known ones
        # A job with a spec but no checkpoint yet is not an error: it has not saved one.
        assert main(["checkpoints", "list", "demo-tiny-lm"]) == 0
        assert "no committed checkpoints" in capsys.readouterr().out
    finally:
        get_settings.cache_clear()
