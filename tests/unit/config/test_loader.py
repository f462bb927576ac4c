"""Whatever file a user hands us, the answer is a clear problem, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.config.loader import MAX_SPEC_BYTES, read_spec_file
from trainyard.config.problems import Code

DEMO = Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml"


def _problems(tmp_path: Path, content: bytes) -> list:
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    job, problems = read_spec_file(path)
    assert job is None
    assert problems, "a bad file must produce at least one problem"
    return problems


@pytest.mark.parametrize(("content", "code", "words"), [
    (b"", Code.NOT_A_MAPPING, "empty"),
    (b"   \n\n", Code.NOT_A_MAPPING, "empty"),
    (b"- a\n- b\n", Code.NOT_A_MAPPING, "list"),
    (b"just a string\n", Code.NOT_A_MAPPING, "str"),
    (b"apiVersion: training.platform/v1\nspec:\n\thardware: {}\n", Code.NOT_YAML, "tab"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", Code.NOT_YAML, "binary"),
    (b"caf\xe9: 1\n", Code.NOT_YAML, "UTF-8"),
    (b"a: [1, 2\n", Code.NOT_YAML, "not valid YAML"),
    (b"kind: TrainingJob\nkind: Other\n", Code.DUPLICATE_KEY, "duplicate key 'kind'"),
    (b"a: 1\n---\nb: 2\n", Code.NOT_A_MAPPING, "2 YAML documents"),
])
def test_bad_files(tmp_path: Path, content: bytes, code: Code, words: str) -> None:
    problems = _problems(tmp_path, content)
    assert problems[0].code == code
    assert words in problems[0].message
    assert problems[0].path.startswith(str(tmp_path / "spec.yaml"))


def test_self_referencing_and_exploding_aliases_do_not_hang(tmp_path: Path) -> None:
    laughs = b"apiVersion: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"k{i}: &a{i} [{', '.join(['*a' if i == 0 else f'*a{i - 1}'] * 9)}]\n".encode() for i in range(9)
    )
    for content, words in ((b"a: &x [*x]\n", "recursive alias"), (laughs, "expands to more than")):
        (problem,) = _problems(tmp_path, content)
        assert problem.code == Code.NOT_YAML and words in problem.message, problem


def test_tab_problem_names_the_line(tmp_path: Path) -> None:
    (p,) = _problems(tmp_path, b"a: 1\nb:\n\tc: 2\n")
    assert p.path.endswith("spec.yaml:3")


def test_a_50_mb_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(50 * 1024 * 1024)
    job, (p,) = read_spec_file(path)
    assert job is None and p.code == Code.FILE_TOO_LARGE
    assert "52.4 MB" in p.message and str(MAX_SPEC_BYTES // 1_000_000) in p.message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for path in (tmp_path / "nope.yaml", tmp_path):
        job, (p,) = read_spec_file(path)
        assert job is None and p.code == Code.FILE_UNREADABLE


def test_valid_file(tmp_path: Path) -> None:
    job, problems = read_spec_file(DEMO)
    assert problems == [] and job is not None and job.name == "demo-tiny-lm"
