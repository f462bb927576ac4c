"""Data quality: Great Expectations checks on a dataset's shards, before any accelerator is placed.

A broken dataset must stop a job before it burns GPU-hours (issue 8). `check_data_quality`
samples rows from every shard (`spec.dataset.quality.sampleRows`, spread over the shards),
builds a pandas DataFrame and runs GX Core expectations in an ephemeral context (nothing is
written to disk, no GX project folder):

| check | GX expectation | spec setting |
|---|---|---|
| each line is a JSON object | (computed while reading) | — |
| required fields present, not null | `expect_column_to_exist`, `expect_column_values_to_not_be_null` | `requiredFields` |
| text is a string | `expect_column_values_to_be_of_type` (str) | `textField` |
| text is not blank | `expect_column_values_to_not_match_regex` (`^\\s*$`) | `textField` |
| length bounds | `expect_column_value_lengths_to_be_between` | `minLength`, `maxLength` |
| duplicate rate | `expect_column_proportion_of_unique_values_to_be_between` | `maxDuplicateFraction` |

The duplicate check uses the proportion of unique values, because the spec's limit is "the
fraction of rows whose text repeats another row's" = 1 − unique/rows; GX's
`expect_column_values_to_be_unique` would count both copies of a pair as failing.

The report says, for each failed check, how many rows failed and shows examples as
`shard:line: row`, so the person reading a failed DAG run knows which file to open.
`report_problems` turns a failed report into `Problem`s with code `DATA_QUALITY` for the dry run
(`trainyard validate --data`, the DAG's `validate_data` task).

GX is imported lazily (seconds), with its loggers quietened: imported after Airflow's logging
is configured, it logs one "Skipping registering function" line per public function.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from trainyard.config.problems import Code, Problem

if TYPE_CHECKING:
    import pandas as pd

    from trainyard.config.settings import Settings
    from trainyard.config.spec import DataQuality, TrainingJob
    from trainyard.plugins.data.datasets import RowSample
    from trainyard.plugins.storage.store import ObjectStore

log = logging.getLogger(__name__)

_GX_LOGGERS = ("great_expectations", "great_expectations._docs_decorators")
MAX_EXAMPLES = 5
EXAMPLE_CHARS = 100


def _quiet_gx_logs() -> None:
    """WARNING for GX's loggers — the known ones before import, and after import every one GX
    created, since some modules set their own logger to INFO (`data_context/types/base.py`)."""
    names = set(_GX_LOGGERS) | {n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")}
    for name in names:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


_quiet_gx_logs()


class CheckOutcome(BaseModel):
    """One check on the sample."""

    model_config = ConfigDict(frozen=True)

    check: str
    """What was checked, in words: `field 'text' is not blank`."""
    expectation: str
    """The GX expectation type (or `rows_are_json_objects` / `dataset_has_rows`, computed)."""
    column: str | None = None
    setting: str
    """The spec setting behind the check, in the spec's spelling (`spec.dataset.quality.minLength`)."""
    success: bool
    rows_checked: int
    failing_rows: int = 0
    observed: str = ""
    """A one-line explanation of what was found (`duplicate fraction 0.125 > limit 0.01`)."""
    examples: list[str] = []
    """Up to five failing rows as `shard:line: row`."""

    @property
    def failing_fraction(self) -> float:
        return self.failing_rows / self.rows_checked if self.rows_checked else 0.0

    def describe(self) -> str:
        head = f"{self.check}: {self.failing_rows} of {self.rows_checked} rows fail"
        if self.rows_checked:
            head += f" ({self.failing_fraction:.1%})"
        if self.observed:
            head += f"; {self.observed}"
        return head


class DataQualityReport(BaseModel):
    """Everything a data-quality run found; JSON-serialisable (logged to MLflow)."""

    dataset_uri: str
    success: bool
    skipped: bool = False
    rows_checked: int = 0
    shards_read: int = 0
    shards_total: int = 0
    outcomes: list[CheckOutcome] = []
    checked_at: str = ""
    engine: str = ""
    """`great_expectations <version>`."""

    @property
    def failures(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if not o.success]

    def summary(self) -> str:
        """Readable, multi-line: what failed, how many rows, examples."""
        if self.skipped:
            return f"data quality checks are disabled for {self.dataset_uri}"
        scope = (f"{self.rows_checked} rows from {self.shards_read} of {self.shards_total} shard(s) "
                 f"of {self.dataset_uri}")
        if self.success:
            return f"data quality OK: {len(self.outcomes)} checks passed on {scope}"
        lines = [f"data quality FAILED: {len(self.failures)} of {len(self.outcomes)} checks on {scope}"]
        for o in self.failures:
            lines.append(f"  ✗ {o.describe()}  [{o.expectation}]")
            lines += [f"      e.g. {ex}" for ex in o.examples]
        return "\n".join(lines)


def check_data_quality(
    job: TrainingJob,
    *,
    store: ObjectStore,
    sample_rows: int | None = None,
) -> DataQualityReport:
    """Run the spec's data-quality checks on the dataset in `store` (opened at its root).

    Logging it to a run is tracking's (`trainyard.plugins.tracking.artifacts.log_data_quality`).
    """
    from trainyard.plugins.data.datasets import sample_rows as read_sample

    quality = job.spec.dataset.quality
    uri = store.uri.rstrip("/")
    if not quality.enabled:
        report = DataQualityReport(dataset_uri=uri, success=True, skipped=True, checked_at=_now())
    else:
        limit = sample_rows or quality.sample_rows
        if limit < 1:
            raise ValueError(f"sample_rows must be >= 1, got {limit}")
        sample = read_sample(store, job.spec.dataset.format, limit, max_invalid_examples=MAX_EXAMPLES)
        outcomes = _parse_outcome(sample)
        engine = ""
        if sample.rows:
            outcomes += _run_expectations(sample, quality)
            engine = _gx_version()
        else:
            outcomes.append(CheckOutcome(
                check="the dataset has rows", expectation="dataset_has_rows", setting="spec.dataset.source",
                success=False, rows_checked=0,
                observed=f"no readable rows in {sample.shards_total} shard(s)"))
        report = DataQualityReport(
            dataset_uri=uri, success=all(o.success for o in outcomes), rows_checked=len(sample.rows),
            shards_read=sample.shards_read, shards_total=sample.shards_total, outcomes=outcomes,
            checked_at=_now(), engine=engine)
    return report


def report_problems(report: DataQualityReport) -> list[Problem]:
    """One `DATA_QUALITY` error per failed check (none for a passed or skipped report)."""
    problems = []
    for o in report.failures:
        examples = "; ".join(o.examples[:3])
        message = o.describe() + (f" — e.g. {examples}" if examples else "")
        problems.append(Problem(
            code=Code.DATA_QUALITY, path=o.setting, message=message,
            hint=f"fix the data under {report.dataset_uri} or adjust {o.setting}",
        ))
    return problems


def data_fingerprint(job: TrainingJob, settings: Settings) -> str:
    """What a passed check vouches for: the dataset's shard listing (keys, sizes and the
    store's checksums — no shard is read, unlike `describe_dataset`'s content digest of a small
    dataset) and the spec's quality settings. Raises what listing the dataset raises."""
    import hashlib

    from trainyard.plugins.data.datasets import describe_dataset, open_dataset_store

    store = open_dataset_store(job.spec.dataset.source, settings)
    listing = describe_dataset(store, job.spec.dataset, hash_contents=False).digest
    quality = job.spec.dataset.quality.model_dump_json()
    return hashlib.sha256(f"{listing}\n{job.spec.dataset.format}\n{quality}".encode()).hexdigest()


def data_quality_problems(job: TrainingJob, settings: Settings) -> list[Problem]:
    """The dry run's entry point: check the spec's dataset, return its problems."""
    return run_data_quality(job, settings)[1]


def run_data_quality(job: TrainingJob, settings: Settings) -> tuple[DataQualityReport | None, list[Problem]]:
    """Check the spec's dataset: the report (None when the checks could not run) and its
    problems. The DAG's `validate_data` hands the report on, so the launch logs it to MLflow
    without importing Great Expectations a second time."""
    from trainyard.plugins.data.datasets import open_dataset_store

    try:
        store = open_dataset_store(job.spec.dataset.source, settings)
        report = check_data_quality(job, store=store)
    except Exception as e:
        log.debug("data quality check could not run", exc_info=True)
        return None, [Problem(code=Code.DATA_QUALITY, path="spec.dataset.source", severity="warning",
                              message=f"data quality checks could not run: {type(e).__name__}: {str(e)[:200]}",
                              hint="check that the dataset's shards are readable")]
    if report.success:
        log.info("%s", report.summary())
    return report, report_problems(report)


# -- the checks -----------------------------------------------------------------------------------

def _parse_outcome(sample: RowSample) -> list[CheckOutcome]:
    total = len(sample.rows) + sample.invalid_count
    return [CheckOutcome(
        check="each line is a JSON object", expectation="rows_are_json_objects", setting="spec.dataset.source",
        success=sample.invalid_count == 0, rows_checked=total, failing_rows=sample.invalid_count,
        examples=[f"{i.shard}:{i.line}: {i.snippet[:EXAMPLE_CHARS]!r} ({i.error})" for i in sample.invalid],
    )] if sample.invalid_count or total else []


def _run_expectations(sample: RowSample, q: DataQuality) -> list[CheckOutcome]:
    import pandas as pd

    gx, gxe = _gx()
    frame = pd.DataFrame(sample.rows)
    batch = _batch(gx, frame)
    n = len(frame)
    outcomes: list[CheckOutcome] = []
    required = list(dict.fromkeys([*q.required_fields, q.text_field]))
    present = []
    for field in required:
        setting = "spec.dataset.quality.requiredFields" if field in q.required_fields else "spec.dataset.quality.textField"
        if field not in frame.columns:
            r = batch.validate(gxe.ExpectColumnToExist(column=field))
            outcomes.append(CheckOutcome(
                check=f"field {field!r} is present", expectation="expect_column_to_exist", column=field,
                setting=setting, success=bool(r.success), rows_checked=n, failing_rows=n,
                observed=f"no row has it; fields seen: {sorted(map(str, frame.columns))[:10]}",
                examples=_examples(sample, range(min(n, MAX_EXAMPLES)))))
            continue
        present.append(field)
        outcomes.append(_column_check(batch, sample, gxe.ExpectColumnValuesToNotBeNull(column=field),
                                      f"field {field!r} is present and not null", setting, n))
    if q.text_field in present:
        t, setting = q.text_field, "spec.dataset.quality.textField"
        outcomes.append(_column_check(batch, sample, gxe.ExpectColumnValuesToBeOfType(column=t, type_="str"),
                                      f"field {t!r} is a string", setting, n))
        outcomes.append(_column_check(batch, sample, gxe.ExpectColumnValuesToNotMatchRegex(column=t, regex=r"^\s*$"),
                                      f"field {t!r} is not blank", setting, n))
        lengths = frame[t].map(lambda v: len(v) if isinstance(v, str) else None).dropna()
        too_short, too_long = int((lengths < q.min_length).sum()), int((lengths > q.max_length).sum())
        length = _column_check(
            batch, sample,
            gxe.ExpectColumnValueLengthsToBeBetween(column=t, min_value=q.min_length, max_value=q.max_length),
            f"length of {t!r} is between {q.min_length} and {q.max_length} characters",
            "spec.dataset.quality.maxLength" if too_long > too_short else "spec.dataset.quality.minLength", n)
        if not length.success and not length.observed:
            length = length.model_copy(update={
                "observed": f"{too_short} shorter than {q.min_length}, {too_long} longer than {q.max_length}"})
        outcomes.append(length)
        outcomes.append(_duplicates(batch, gxe, sample, frame, t, q.max_duplicate_fraction))
    return outcomes


def _column_check(batch: Any, sample: RowSample, expectation: Any, check: str, setting: str, n: int) -> CheckOutcome:
    r = batch.validate(expectation, result_format={"result_format": "SUMMARY",
                                                   "partial_unexpected_count": MAX_EXAMPLES})
    name = expectation.expectation_type
    column = expectation.column
    error = _exception(r)
    if error:
        return CheckOutcome(check=check, expectation=name, column=column, setting=setting, success=False,
                            rows_checked=n, failing_rows=n, observed=f"could not evaluate: {error}")
    res = r.result or {}
    return CheckOutcome(
        check=check, expectation=name, column=column, setting=setting, success=bool(r.success),
        rows_checked=n, failing_rows=int(res.get("unexpected_count") or 0),
        examples=_examples(sample, res.get("partial_unexpected_index_list") or []),
    )


def _duplicates(batch: Any, gxe: Any, sample: RowSample, frame: pd.DataFrame, column: str,
                max_fraction: float) -> CheckOutcome:
    check = f"at most {max_fraction:.2%} of {column!r} values repeat an earlier row's"
    expectation = gxe.ExpectColumnProportionOfUniqueValuesToBeBetween(column=column, min_value=1.0 - max_fraction)
    r = batch.validate(expectation)
    setting = "spec.dataset.quality.maxDuplicateFraction"
    values = frame[column].dropna().map(lambda v: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str))
    repeats = int(len(values) - values.nunique())
    error = _exception(r)
    observed_unique = (r.result or {}).get("observed_value") if not error else None
    fraction = 1.0 - float(observed_unique) if observed_unique is not None else (repeats / len(values) if len(values) else 0.0)
    examples = []
    if repeats:
        groups = values.groupby(values).groups
        repeated = sorted(((k, list(idx)) for k, idx in groups.items() if len(idx) > 1), key=lambda kv: -len(kv[1]))
        for text, idx in repeated[:MAX_EXAMPLES]:
            where = ", ".join(f"{sample.origins[i][0]}:{sample.origins[i][1]}" for i in idx[:3])
            examples.append(f"{text[:60]!r} ×{len(idx)} ({where}{', …' if len(idx) > 3 else ''})")
    return CheckOutcome(
        check=check, expectation=expectation.expectation_type, column=column, setting=setting,
        success=bool(r.success) and not error, rows_checked=len(values), failing_rows=repeats,
        observed=(f"could not evaluate: {error}" if error else
                  f"duplicate fraction {fraction:.4g} {'>' if fraction > max_fraction else '<='} limit {max_fraction:g}"),
        examples=examples)


def _examples(sample: RowSample, indices: Any) -> list[str]:
    out = []
    for i in list(indices)[:MAX_EXAMPLES]:
        shard, line = sample.origins[int(i)]
        row = json.dumps(sample.rows[int(i)], ensure_ascii=False, default=str)
        out.append(f"{shard}:{line}: {row[:EXAMPLE_CHARS]}{'…' if len(row) > EXAMPLE_CHARS else ''}")
    return out


def _exception(result: Any) -> str:
    info = result.exception_info or {}
    if isinstance(info, dict) and info.get("raised_exception"):
        return str(info.get("exception_message") or "error")[:200]
    if isinstance(info, dict):  # GX keys some results by metric
        for v in info.values():
            if isinstance(v, dict) and v.get("raised_exception"):
                return str(v.get("exception_message") or "error")[:200]
    return ""


# -- Great Expectations plumbing -------------------------------------------------------------------

def _gx() -> tuple[Any, Any]:
    _quiet_gx_logs()
    import great_expectations as gx
    import great_expectations.expectations as gxe

    _quiet_gx_logs()
    return gx, gxe


def _batch(gx: Any, frame: pd.DataFrame) -> Any:
    """A batch over `frame` in a fresh ephemeral context, with progress bars off."""
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_pandas("trainyard")
    asset = source.add_dataframe_asset("shards")
    return asset.add_batch_definition_whole_dataframe("sample").get_batch(batch_parameters={"dataframe": frame})


def _gx_version() -> str:
    from importlib.metadata import version

    return f"great_expectations {version('great_expectations')}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
