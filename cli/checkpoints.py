"""`trainyard checkpoints list|verify|prune|export JOB`: a job's checkpoints, for people.

The checkpoint root is one training run's: `--run R`, or the job's latest run (run ids sort by
start time), under the spec's `checkpoint.storage` when the spec is found (`--spec`, or a spec
named JOB under the jobs folder), else under `<object store>/jobs/JOB/runs/`; `--uri` overrides
all of them. `prune` takes the retention policy from the spec, flags override it, and
`--dry-run` shows what would be deleted and why.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.checkpoint.catalog import CheckpointRecord


EXIT_CODES: dict[int, str] = {
    1: "a checkpoint does not verify or a manifest is invalid (it claims another job or run than its "
       "folder), nothing to export, or no job has this name (no spec and nothing under its checkpoint root)"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("checkpoints", help="list, verify, prune and export a job's checkpoints",
                       description=__doc__.split("\n\n")[0])
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(name: str, help_: str) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help_, description=help_)
        a.add_argument("job", metavar="JOB", help="job name (metadata.name of its spec)")
        a.add_argument("--spec", type=Path, help="the job's spec file (default: look for JOB "
                                                 "under the jobs folder)")
        a.add_argument("--run", help="the training run (default: the job's latest run)")
        a.add_argument("--uri", help="checkpoint root URI (overrides the spec, the run and the default)")
        a.add_argument("--endpoint-url", help="S3 endpoint (default: TRAINYARD_S3_ENDPOINT_URL)")
        a.add_argument("--json", action="store_true", help="machine-readable output")
        a.set_defaults(func=run)
        return a

    ls = common("list", "committed checkpoints, newest last (plus folders without a manifest)")
    ls.add_argument("--wide", action="store_true", help="every column, whatever the terminal's width")
    v = common("verify", "check every file's size and digest (BLAKE3, or SHA-256 in older manifests) against the manifest")
    v.add_argument("--step", type=int, help="only this step (default: every checkpoint)")
    v.add_argument("--no-hashes", action="store_true", help="sizes only (no reading of data)")
    pr = common("prune", "apply the retention policy (keep last N, best K, every M, min age)")
    pr.add_argument("--dry-run", action="store_true", help="show what would be deleted and why")
    pr.add_argument("--keep-last", type=int, metavar="N", help="keep the N newest checkpoints "
                    "(default: the spec's checkpoint.maxKeep)")
    pr.add_argument("--best-metric", metavar="NAME", help="metric that ranks checkpoints for "
                    "--keep-best, lower is better (default: the spec's checkpoint.keepBestMetric)")
    pr.add_argument("--keep-best", type=int, metavar="K", help="keep the K best by --best-metric "
                    "(default: the spec's checkpoint.keepBestCount)")
    pr.add_argument("--keep-every", type=int, metavar="M", help="keep steps that are multiples of M")
    pr.add_argument("--min-age-minutes", type=float, metavar="MIN",
                    help="never delete a checkpoint younger than this")
    pr.add_argument("--protect", type=int, action="append", default=[], metavar="STEP",
                    help="never delete this step (e.g. one being restored); repeatable")
    pr.add_argument("--orphan-grace-minutes", type=float, default=360.0,
                    help="delete folders without a manifest once untouched this long (default 360)")
    ex = common("export", "write a checkpoint's model weights to one .safetensors file")
    ex.add_argument("--step", type=int, help="the step to export (default: newest valid)")
    ex.add_argument("--out", type=Path, required=True, help="destination .safetensors file")


def run(args: argparse.Namespace) -> int:
    from trainyard.config.settings import get_settings

    settings = get_settings()
    try:
        spec = _find_spec(args, settings.jobs_dir)
        root = _checkpoint_root(args, spec, settings.object_store, args.endpoint_url or settings.s3_endpoint_url)
    except (FileNotFoundError, ValueError) as e:
        _error(str(e))
        return 2
    endpoint = args.endpoint_url or settings.s3_endpoint_url
    if spec is None and not args.uri and _is_empty(root, endpoint):
        known = sorted(_spec_names(settings.jobs_dir))
        where = root or f"{settings.object_store}/jobs/{args.job}/runs"
        _error(f"no job named {args.job!r}: no spec for it under {settings.jobs_dir} and nothing under {where}"
               + (f"; jobs with a spec: {', '.join(known[:10])}" if known else "")
               + " (give --spec or --uri for a job stored elsewhere)")
        return 1
    if root is None:  # a known job that has not saved anything yet: nothing to show, not an error
        from trainyard.cli.output import console

        console.print(f"no committed checkpoints: job {args.job} has no training run with checkpoints "
                      f"yet (under {settings.object_store}/jobs/{args.job}/runs/)")
        return 0 if args.action == "list" else 1
    handler = {"list": _list, "verify": _verify, "prune": _prune, "export": _export}[args.action]
    return handler(args, root, endpoint, spec)


def _find_spec(args: argparse.Namespace, jobs_dir: Path) -> TrainingJob | None:
    from trainyard.config.loader import load_spec_file, read_spec_file

    if args.spec:
        job = load_spec_file(args.spec)
        if job.metadata.name != args.job:
            raise ValueError(f"spec {args.spec} is for job {job.metadata.name!r}, not {args.job!r}")
        return job
    for path in sorted(Path(jobs_dir).glob("*.y*ml")):
        job, _ = read_spec_file(path)
        if job is not None and job.metadata.name == args.job:
            return job
    return None


def _spec_names(jobs_dir: Path) -> list[str]:
    from trainyard.config.loader import read_spec_file

    return [job.metadata.name for path in sorted(Path(jobs_dir).glob("*.y*ml"))
            if (job := read_spec_file(path)[0]) is not None]


def _is_empty(root: str | None, endpoint: str | None) -> bool:
    """Nothing at all under the root: no checkpoint, no save in flight, no broken manifest."""
    from trainyard.plugins.checkpoint.catalog import scan

    if root is None:
        return True
    found = scan(root, endpoint_url=endpoint)
    return not (found.committed or found.uncommitted or found.invalid)


def _checkpoint_root(args: argparse.Namespace, spec: TrainingJob | None, object_store: str,
                     endpoint: str | None) -> str | None:
    """The run's checkpoint root; None when the job has no run that stored anything."""
    from trainyard.plugins.checkpoint.catalog import list_runs
    from trainyard.plugins.checkpoint.uris import checkpoint_root, require_job_prefix

    storage = (spec.spec.checkpoint.storage or "") if spec is not None else ""
    if args.uri:  # inside the spec's area when the spec is known, else the area it claims
        return require_job_prefix(args.uri.rstrip("/"), args.job,
                                  area=_area(args.job, spec, object_store) if spec else None)
    run = args.run
    if not run:
        runs = list_runs(object_store, args.job, storage=storage, endpoint_url=endpoint)
        if not runs:
            return None
        run = runs[-1]
    return require_job_prefix(checkpoint_root(object_store, args.job, run, storage=storage), args.job,
                              area=_area(args.job, spec, object_store))


def _area(job: str, spec: TrainingJob | None, object_store: str) -> str:
    from trainyard.plugins.checkpoint.uris import job_area_uri

    return job_area_uri(object_store, job, storage=(spec.spec.checkpoint.storage or "") if spec else "")


def _list(args: argparse.Namespace, root: str, endpoint: str | None, spec: Any) -> int:
    from trainyard.plugins.checkpoint.catalog import scan
    from trainyard.plugins.checkpoint.manifest import utc_now

    found = scan(root, endpoint_url=endpoint)
    if args.json:
        from trainyard.cli.output import print_json

        print_json({
            "root": root,
            "checkpoints": [_record_json(r) for r in found.committed],
            "uncommitted": {f: sum(o.size for o in objs) for f, objs in found.uncommitted.items()},
            "invalid": found.invalid,
        })
        return 0
    from trainyard.cli.output import console, format_age, print_table, row, table

    now = utc_now()
    t, shown = table(f"checkpoints of {args.job}\n{root}", [
        ("step", "right"), ("created (UTC)", "left"), ("age", "right"), ("size", "right"), ("files", "right"),
        ("ranks", "right"), ("metrics", "left")], wide=args.wide, wide_only=("created (UTC)", "files"))
    for r in found.committed:
        m = r.manifest
        t.add_row(*row(shown, {
            "step": str(m.step), "created (UTC)": m.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "age": format_age((now - m.created_at).total_seconds()), "size": _size(m.stored_bytes),
            "files": str(len(m.files)), "ranks": str(m.world_size),
            "metrics": " ".join(f"{k}={v:g}" for k, v in m.metrics.items())}))
    print_table(t, wide=args.wide)
    for folder, objs in found.uncommitted.items():
        console.print(f"[yellow]{folder}[/]: no manifest ({len(objs)} objects) — a save in "
                      "flight or one that never committed; not a checkpoint")
    for folder, why in found.invalid.items():
        console.print(f"[red]{folder}[/]: invalid manifest — {why}")
    if not found.committed:
        console.print("no committed checkpoints")
    return 0


def _verify(args: argparse.Namespace, root: str, endpoint: str | None, spec: Any) -> int:
    from trainyard.plugins.checkpoint.catalog import VerifyReport, as_store, scan, verify
    from trainyard.plugins.checkpoint.manifest import parse_step_dir

    store = as_store(root, endpoint_url=endpoint)
    found = scan(store)
    records = found.committed
    # An invalid manifest (unreadable, unsafe, or claiming another job or run than its folder)
    # is a failed check, named — not a log line beside an exit status of 0.
    invalid = [VerifyReport(parse_step_dir(folder) or 0, folder, (f"invalid manifest: {why}",))
               for folder, why in found.invalid.items()]
    if args.step is not None:
        records = [r for r in records if r.step == args.step]
        invalid = [r for r in invalid if r.step == args.step]
        if not records and not invalid:
            _error(f"no committed checkpoint at step {args.step} under {root}")
            return 1
    reports = sorted([verify(store, r, hashes=not args.no_hashes) for r in records] + invalid,
                     key=lambda r: r.step)
    if args.json:
        from trainyard.cli.output import print_json

        print_json([{"step": r.step, "folder": r.folder, "ok": r.ok, "problems": list(r.problems),
                     "hashed_bytes": r.hashed_bytes} for r in reports])
    else:
        from rich.markup import escape

        from trainyard.cli.output import console

        for rep in reports:
            mark = "[green]✓[/]" if rep.ok else "[red]✗[/]"
            console.print(f"{mark} step {rep.step} ({rep.folder}): {escape(rep.reason)}")
        if not reports:
            console.print("no committed checkpoints")
    return 0 if all(r.ok for r in reports) else 1


def _prune(args: argparse.Namespace, root: str, endpoint: str | None, spec: Any) -> int:
    from trainyard.plugins.checkpoint.retention import RetentionPolicy, apply_retention

    policy = RetentionPolicy.from_spec(spec.spec.checkpoint) if spec else RetentionPolicy()
    overrides = {"keep_last": args.keep_last, "best_metric": args.best_metric,
                 "keep_best": args.keep_best, "keep_every_steps": args.keep_every,
                 "min_age": None if args.min_age_minutes is None
                 else timedelta(minutes=args.min_age_minutes)}
    try:
        policy = RetentionPolicy.model_validate(
            {**policy.model_dump(), **{k: v for k, v in overrides.items() if v is not None}})
    except ValueError as e:
        _error(str(e))
        return 2
    report = apply_retention(root, policy, dry_run=args.dry_run,
                             protected={s: "protected on the command line" for s in args.protect},
                             orphan_grace=timedelta(minutes=args.orphan_grace_minutes),
                             endpoint_url=endpoint)
    if args.json:
        from trainyard.cli.output import print_json

        print_json({"dry_run": report.dry_run, "policy": policy.model_dump(mode="json"),
                    "newest_valid": report.newest_valid,
                    "decisions": [{"step": d.step, "action": d.action, "reasons": list(d.reasons)}
                                  for d in report.decisions],
                    "deleted": report.deleted, "orphans": report.orphans})
        return 0
    from rich.markup import escape

    from trainyard.cli.output import console

    verb = "would delete" if args.dry_run else "deleted"
    console.print(f"policy: {escape(_policy_text(policy))}")
    for d in report.decisions:
        style = "green" if d.keep else "red"
        action = "keep" if d.keep else verb
        console.print(f"[{style}]{action:>12}[/] step {d.step}: {escape('; '.join(d.reasons))}")
    for folder, what in report.orphans.items():
        console.print(f"{'':>12} {folder}: {escape(what)}")
    if not report.decisions:
        console.print("no committed checkpoints")
    return 0


def _export(args: argparse.Namespace, root: str, endpoint: str | None, spec: Any) -> int:
    from trainyard.plugins.checkpoint.catalog import as_store, latest_valid, verify
    from trainyard.plugins.checkpoint.export import export_safetensors
    from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir

    store = as_store(root, endpoint_url=endpoint)
    if args.step is None:
        record = latest_valid(store)
        if record is None:
            _error(f"no valid checkpoint under {root}")
            return 1
        manifest_uri = record.manifest_uri
    else:
        report = verify(store, args.step, hashes=False)
        if not report.ok:
            _error(f"step {args.step}: {report.reason}")
            return 1
        manifest_uri = store.key_uri(f"{step_dir(args.step)}/{MANIFEST_NAME}")
    try:
        result = export_safetensors(manifest_uri, args.out, endpoint_url=endpoint, job=args.job,
                                    area=_area(args.job, spec, _object_store()) if spec else None)
    except Exception as e:  # an integrity failure is an answer, not a traceback
        from trainyard.plugins.errors import TrainyardError

        if not isinstance(e, TrainyardError | ValueError | KeyError):
            raise
        _error(f"export failed: {e}")
        return 1
    if args.json:
        from trainyard.cli.output import print_json

        print_json({"path": str(result.path), "step": result.step, "tensors": result.tensors,
                    "bytes": result.bytes, "sha256": result.sha256})
    else:
        from trainyard.cli.output import console

        console.print(f"exported step {result.step}: {result.tensors} tensors, "
                      f"{_size(result.bytes)} → {result.path} (sha256 {result.sha256[:16]}…)")
    return 0


def _object_store() -> str:
    from trainyard.config.settings import get_settings

    return get_settings().object_store


def _record_json(r: CheckpointRecord) -> dict[str, Any]:
    m = r.manifest
    return {"step": m.step, "manifest_uri": r.manifest_uri, "created_at": m.created_at.isoformat(),
            "world_size": m.world_size, "stored_bytes": m.stored_bytes, "files": len(m.files),
            "metrics": m.metrics}


def _policy_text(policy: Any) -> str:
    parts = [f"last {policy.keep_last}"]
    if policy.best_metric and policy.keep_best:
        parts.append(f"best {policy.keep_best} by {policy.best_metric}")
    if policy.keep_every_steps:
        parts.append(f"every {policy.keep_every_steps} steps")
    if policy.min_age:
        parts.append(f"younger than {policy.min_age}")
    return "keep " + ", ".join(parts)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"


def _error(message: str) -> None:
    from rich.markup import escape

    from trainyard.cli.output import err_console
    from trainyard.config.problems import preview

    err_console.print(f"[red]error:[/] {escape(preview(message, 2000))}")
