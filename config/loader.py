"""Read a spec file into a `TrainingJob`, turning every kind of bad input into `Problem`s.

Users hand us anything: binary files, 50 MB logs, YAML with tabs, a list instead of a
mapping, duplicate keys (which PyYAML silently resolves to the last one). None of it may
produce a traceback; each gets one clear `Problem`. Schema errors from pydantic are rewritten
into the spec's own spelling with a did-you-mean for unknown keys.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import itertools
import stat
import textwrap
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trainyard.config.problems import Code, Problem, SpecError
from trainyard.config.safe_yaml import YamlLimitError, load_documents, preview_value
from trainyard.config.spec import API_VERSION, KIND, TrainingJob

MAX_SPEC_BYTES = 1_000_000
"""A spec is a page of YAML; anything over 1 MB is a wrong file, not a big spec."""


def load_spec_file(path: str | Path) -> TrainingJob:
    """Load and validate one spec file; raise `SpecError` with every problem found."""
    job, problems = read_spec_file(path)
    if job is None:
        raise SpecError(problems)
    return job


def read_spec_file(path: str | Path) -> tuple[TrainingJob | None, list[Problem]]:
    """Load one spec file; never raises for bad input. Returns the job (if the schema holds)
    and the schema-level problems."""
    path = Path(path)
    where = str(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a folder, a FIFO (open would block), a device
            return None, [Problem(code=Code.FILE_UNREADABLE, path=where,
                                  message=f"not a regular file ({_file_kind(st.st_mode)})",
                                  hint="pass the spec's YAML file")]
        size = st.st_size
        if size > MAX_SPEC_BYTES:
            return None, [Problem(
                code=Code.FILE_TOO_LARGE, path=where,
                message=f"the file is {size / 1e6:.1f} MB; a spec is at most {MAX_SPEC_BYTES // 1_000_000} MB",
                hint="is this the right file? A TrainingJob spec is a short YAML document",
            )]
        with path.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)  # the file may grow between the stat and the read
    except OSError as e:
        return None, [Problem(code=Code.FILE_UNREADABLE, path=where,
                              message=f"cannot read the file: {e.strerror or e}",
                              hint="check the path and its permissions")]
    return parse_spec_text(raw, where=where)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file")


def parse_spec_text(raw: bytes | str, *, where: str = "<spec>") -> tuple[TrainingJob | None, list[Problem]]:
    """Parse YAML text into a `TrainingJob`; every failure becomes a `Problem`."""
    data, problems = _parse_yaml(raw, where)
    if problems:
        return None, problems
    return validate_document(data, where=where)


def validate_document(data: Any, *, where: str = "<spec>") -> tuple[TrainingJob | None, list[Problem]]:
    """Validate an already-parsed document (a dict) against the schema."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        return None, [Problem(
            code=Code.NOT_A_MAPPING, path=where,
            message=f"the document is {kind}, not a mapping",
            hint=f"a spec starts with 'apiVersion: {API_VERSION}' and 'kind: {KIND}'",
        )]
    try:
        return TrainingJob.model_validate(data), []
    except ValidationError as e:
        return None, schema_problems(e, TrainingJob)
    except (TypeError, ValueError, RecursionError) as e:  # pragma: no cover - defensive
        return None, [Problem(code=Code.INVALID_VALUE, path=where, message=str(e))]


def _parse_yaml(raw: bytes | str, where: str) -> tuple[Any, list[Problem]]:
    if isinstance(raw, bytes):
        if len(raw) > MAX_SPEC_BYTES:
            return None, [Problem(code=Code.FILE_TOO_LARGE, path=where,
                                  message=f"the text is {len(raw) / 1e6:.1f} MB; a spec is at most 1 MB")]
        if b"\x00" in raw:
            return None, [Problem(code=Code.NOT_YAML, path=where,
                                  message="the file is binary (it contains NUL bytes), not YAML",
                                  hint="pass the YAML spec, not an archive or a checkpoint")]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, [Problem(code=Code.NOT_YAML, path=where,
                                  message=f"the file is not UTF-8 text (bad byte at offset {e.start})",
                                  hint="save the spec as UTF-8")]
    else:
        text = raw
    if not text.strip():
        return None, [Problem(code=Code.NOT_A_MAPPING, path=where, message="the file is empty",
                              hint=f"a spec starts with 'apiVersion: {API_VERSION}' and 'kind: {KIND}'")]
    for number, line in enumerate(text.splitlines(), start=1):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent:
            return None, [Problem(code=Code.NOT_YAML, path=f"{where}:{number}",
                                  message="a tab is used for indentation; YAML allows only spaces",
                                  hint="replace the tabs at the start of the line with spaces")]
    try:
        documents = load_documents(text)
    except YamlLimitError as e:
        return None, [Problem(code=Code.NOT_YAML, path=where, message=f"refused: {e}",
                              hint="write the values out; anchors and aliases are for a few "
                                   "repeated blocks, not for generating large documents")]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        code = Code.DUPLICATE_KEY if "duplicate key" in str(e) else Code.NOT_YAML
        detail = getattr(e, "problem", None) or str(e)
        return None, [Problem(code=code, path=f"{where}{line}", message=f"not valid YAML: {detail}",
                              hint="fix the YAML syntax at that line")]
    except RecursionError:
        return None, [Problem(code=Code.NOT_YAML, path=where, message="the YAML nests too deeply")]
    except (ValueError, TypeError, OverflowError) as e:  # a constructor refusing a value
        return None, [Problem(code=Code.NOT_YAML, path=where,
                              message=f"a value cannot be read: {preview_value(str(e), 200)}")]
    documents = [d for d in documents if d is not None]
    if len(documents) > 1:
        return None, [Problem(code=Code.NOT_A_MAPPING, path=where,
                              message=f"the file holds {len(documents)} YAML documents; a spec is one",
                              hint="put each TrainingJob in its own file")]
    return (documents[0] if documents else None), []


# --- pydantic errors → Problems ---------------------------------------------------------

def schema_problems(error: ValidationError, root: type[BaseModel]) -> list[Problem]:
    """Rewrite pydantic's errors in the spec's spelling, with did-you-mean for unknown keys."""
    problems = [_problem_for(e, root) for e in error.errors(include_url=False)]
    # A typo of a required key shows up twice: `gpuCuont` unknown and `gpuCount` missing.
    # Say it once, on the key the user actually wrote.
    suggested = {p.path.rsplit(".", 1)[0] + "." + p.hint.split("'")[1]
                 for p in problems if p.code == Code.UNKNOWN_FIELD and p.hint.startswith("did you mean")}
    unique: dict[tuple[str, str], Problem] = {}
    for p in problems:
        if p.code == Code.MISSING_FIELD and p.path in suggested:
            continue
        # A union (e.g. `int | None`) can report one error per member; keep one per (path, code).
        unique.setdefault((p.path, p.code), p)
    return list(unique.values())


def _problem_for(err: Any, root: type[BaseModel]) -> Problem:
    loc = tuple(err["loc"])
    path = _dotted(loc)
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        key = str(loc[-1])[:80]  # a key is user input too: bounded, like values
        allowed = _aliases(parent) if parent else []
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean '{close[0]}'?"
        else:
            hint = f"valid keys here: {', '.join(allowed)}" if allowed else ""
        return Problem(code=Code.UNKNOWN_FIELD, path=path, message=f"unknown field '{key}'", hint=hint)
    if kind == "missing":
        return Problem(code=Code.MISSING_FIELD, path=path, message="this field is required",
                       hint=_field_doc(root, loc) or "add it")
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return Problem(code=Code.INVALID_VALUE, path=path,
                       message=f"{_show(value)} is not one of the allowed values",
                       hint=f"use one of {expected}")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    hint = _field_doc(root, loc)
    return Problem(code=Code.INVALID_VALUE, path=path, message=f"{_show(value)}: {message}",
                   hint=hint)


def _dotted(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        part = part if isinstance(part, int) else str(part)[:80]
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<root>"


def _show(value: Any) -> str:
    """A bounded preview: the input can be a huge (or alias-shared) value."""
    return preview_value(value)


def _unwrap(annotation: Any) -> Any:
    """The model class inside Optional/list/dict/Annotated, or None."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if found is not None:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _field_by_alias(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (field.alias, name):
            return field
    return None


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = root
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = _field_by_alias(current, str(part))
        if field is None:
            return None
        nested = _unwrap(field.annotation)
        if nested is None and typing.get_origin(field.annotation) is dict:
            return None
        current = nested
    return current


def _aliases(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _field_doc(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    parent = _model_at(root, tuple(p for p in loc[:-1]))
    if parent is None or not loc or isinstance(loc[-1], int):
        return ""
    key = str(loc[-1])
    name = next((n for n, f in parent.model_fields.items() if key in (f.alias, n)), None)
    if name is None:
        return ""
    doc = parent.model_fields[name].description or attribute_docs(parent).get(name, "")
    return doc.split("\n")[0].rstrip(".") if doc else ""


@functools.cache
def attribute_docs(model: type) -> dict[str, str]:
    """Field name → the docstring written under it in the class body (an attribute docstring),
    for `model` and its bases (the nearest class wins).

    Why not pydantic's `use_attribute_docstrings`: on Python < 3.13 it finds each class's source
    by walking the importing frames with `inspect.getmodule`, which resolves the path of every
    loaded module the first time — with Airflow loaded, 0.12 s of the 0.33 s a task's DAG parse
    took (`benchmarks/dag_parse.py`). A spec's field docs are read only when a problem needs a
    hint, so they are read here, then."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls.__module__ in ("builtins", "typing") or cls.__module__.startswith("pydantic"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    fields = getattr(model, "model_fields", None)
    return docs if fields is None else {name: doc for name, doc in docs.items() if name in fields}
