"""Build one job's DAG from its spec (DESIGN §4); `training_jobs.job_dags` calls it for each
valid spec of the jobs folder.

```
validate_spec ─ validate_data ─ plan_parallelism ─ place_gang(setup) ─ launch_training
   ─ [watch_training, watch_checkpoints, watch_health] ─ classify_outcome(all_done)
   ─ release_gang(teardown) ─ choose_action ─┬─ register_model
                                             ├─ finish_run (completed; no checkpoint to register)
                                             ├─ restart | replace_node | rollback | fall_back
                                             │  | replan | requeue ─ resume_next_attempt
                                             ├─ give_up
                                             └─ cancelled
```

With `retrain.promote: manual`, `register_model ─ evaluate ─ approve_promotion ─ promote_model`
follows (`operators/retrain.py`); `schedule:` / `retrain.onAsset:` become the DAG's schedule.

One deviation from the seed's picture: the gang is released *before* the branch, so the
attempt that `resume_next_attempt` starts can place on the devices this one held.
Cheap to call: it imports the operators (which import nothing heavy at module level) and reads
only the spec it is given.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, ParamsDict

from trainyard.operators.common import task_defaults
from trainyard.operators.launch import LaunchTrainingOperator
from trainyard.operators.outcome import (
    RECOVERY_ACTIONS,
    AttemptFailedOperator,
    CancelledOperator,
    ChooseActionOperator,
    ClassifyOutcomeOperator,
    FinishRunOperator,
    GiveUpOperator,
    RecoveryActionOperator,
    RegisterModelOperator,
    ResumeNextAttemptOperator,
)
from trainyard.operators.placement import (
    PlaceGangOperator,
    PlanParallelismOperator,
    ReleaseGangOperator,
)
from trainyard.operators.validate import ValidateDataOperator, ValidateSpecOperator
from trainyard.sensors.watch import WatchCheckpointsSensor, WatchHealthSensor, WatchTrainingSensor

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.problems import Problem
    from trainyard.config.spec import TrainingJob

START = datetime(2026, 1, 1)
FAULTS = "Fault injection (tests and game days; off by default, attempt 0 only)"


def read_specs(folder: Path, *, only: str | None = None
               ) -> Iterator[tuple[Path, TrainingJob | None, list[Problem]]]:
    """Every spec of the folder, sorted, with its offline problems (schema, rules, cluster) —
    or, with `only`, just the spec of that job (a task's parse builds one DAG).

    With `only`, the specs whose text names the job (`_naming`) are the only ones parsed: with
    1,000 specs, validating all of them to build one DAG took most of a task's parse. A spec that
    spells its name with YAML escapes is still found, by the full scan, when no file names the
    job literally."""
    from trainyard.config.cluster import cluster_for
    from trainyard.config.loader import read_spec_file
    from trainyard.config.rules import check_against_cluster, check_spec
    from trainyard.config.settings import get_settings

    clusters: dict[str, Cluster] = {}
    paths = sorted(folder.glob("*.y*ml"))
    if only is not None:
        paths = _naming(paths, only) or paths
    for path in paths:
        job, problems = read_spec_file(path)
        if only is not None and (job is None or job.name != only):
            continue
        if job is not None:
            gpu = job.spec.hardware.gpu_type
            if gpu not in clusters:
                clusters[gpu] = cluster_for(gpu, get_settings().cluster)
            problems = check_spec(job) + check_against_cluster(job, clusters[gpu])
        yield path, job, problems


def _naming(paths: list[Path], name: str) -> list[Path]:
    """The files whose bytes hold `name` (a spec's `metadata.name` appears in its text, unless
    escaped). Only regular files of a spec's size are opened (a FIFO would block the parse);
    the others are left to `read_spec_file` to report."""
    from trainyard.config.loader import MAX_SPEC_BYTES

    needle = name.encode()
    out = []
    for path in paths:
        try:
            st = path.stat()
            if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_SPEC_BYTES and needle in path.read_bytes():
                out.append(path)
        except OSError:
            continue
    return out


def params(job: TrainingJob) -> dict[str, Param]:
    """The trigger form: overrides of the spec, where to start, dry run, fault injection. Every
    optional Param is null-able with a null default (the spec's value then holds, and says so in
    its description): Airflow's form treats a string Param defaulting to "" as required, and
    the Trigger button stayed disabled until something bogus was typed."""
    t = job.spec.training
    fault = {"section": FAULTS}
    return {
        "max_steps": Param(None, type=["null", "integer"], minimum=1, title="Max steps",
                           description=f"Override training.maxSteps (spec: {t.max_steps or 'not set'}; "
                                       "a managed script or Trainyard's worker only)"),
        "learning_rate": Param(None, type=["null", "number"], exclusiveMinimum=0, title="Learning rate",
                               description=f"Override training.learningRate (spec: {t.learning_rate})"),
        "start_from": Param(None, type=["null", "string"], title="Start from",
                            description="A checkpoint manifest URI of this job or models:/<name>@<alias>; "
                                        "empty: from scratch"
                                        + (f" (spec: the model's '{job.spec.retrain.start_from_alias}' version)"
                                           if job.spec.retrain is not None and job.spec.retrain.start_from_alias
                                           else "")),
        # a switch showing the spec's own setting: a null default would show "off" and still register
        "register_model": Param(job.spec.registration.enabled, type="boolean", title="Register the model",
                                description="Register a model version when the run completes (spec: "
                                            f"registration.enabled: {str(job.spec.registration.enabled).lower()}); "
                                            "'candidate' moves to it only under spec.registration.candidate"),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Validate, plan and place, then release without launching"),
        "fault_kill_rank": Param(None, type=["null", "integer"], minimum=0, title="Kill rank", **fault),
        "fault_kill_at_step": Param(None, type=["null", "integer"], minimum=1, title="…at step", **fault),
        "fault_hang_rank": Param(None, type=["null", "integer"], minimum=0, title="Hang rank", **fault),
        "fault_hang_at_step": Param(None, type=["null", "integer"], minimum=1, title="…at step", **fault),
        "fault_nan_at_step": Param(None, type=["null", "integer"], minimum=1, title="NaN loss at step", **fault),
        "fault_oom_at_step": Param(None, type=["null", "integer"], minimum=1, title="Out of memory at step",
                                   **fault),
        "fault_corrupt_newest_checkpoint": Param(
            False, type="boolean", title="Corrupt the newest checkpoint",
            description="When attempt 0 ends (with another fault), before it is classified", **fault),
        "fault_fail_gpu_node": Param(
            None, type=["null", "string"], title="Fail a GPU of node",
            description="Right after the launch, through the node's agent (started with "
                        "--enable-fault-injection); 'gang' = the attempt's first node", **fault),
    }


def dag_schedule(job: TrainingJob) -> str | Asset | AssetOrTimeSchedule | None:
    """`schedule:` (cron or preset) and/or `retrain.onAsset:` → the DAG's schedule: the cron, the
    Asset, or both (a run on either, Airflow's `AssetOrTimeSchedule`)."""
    cron = job.spec.schedule
    on_asset = job.spec.retrain.on_asset if job.spec.retrain is not None else None
    if on_asset is None:
        return cron
    from trainyard.plugins.data.assets import dataset_asset_uri

    asset = Asset(dataset_asset_uri(on_asset))
    if cron is None:
        return asset
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=asset)


def promotion_gate(job: TrainingJob, register: RegisterModelOperator) -> None:
    """`retrain.promote: manual`: register_model ─ evaluate ─ approve_promotion ─ promote_model."""
    from trainyard.operators.retrain import EvaluateModelOperator, PromoteModelOperator, approval

    register >> EvaluateModelOperator(task_id="evaluate") >> approval(job.name) >> \
        PromoteModelOperator(task_id="promote_model")


def build_dag(job: TrainingJob, spec_path: Path) -> DAG:
    meta = job.metadata
    doc = (f"**{job.name}** — team `{meta.team}`, project `{meta.project}`, priority `{meta.priority}`.\n\n"
           f"{job.spec.hardware.gpu_count} × {job.spec.hardware.gpu_type}, "
           f"{f'{job.spec.training.max_steps} steps' if job.spec.training.max_steps else 'steps as the script decides'}, "
           f"up to {job.spec.fault_tolerance.max_restarts} restarts.\n\n"
           f"Spec: `{spec_path}`. Each attempt of a training run is one DAG run; "
           "`resume_next_attempt` hands the run to the next one.")
    with DAG(
        dag_id=job.name, schedule=dag_schedule(job), start_date=START, catchup=False, max_active_runs=16,
        tags=[f"team:{meta.team}", f"project:{meta.project}", "trainyard"],
        default_args=task_defaults(meta.team), doc_md=doc, render_template_as_native_obj=False,
        dagrun_timeout=None,
    ) as dag:
        validate = ValidateSpecOperator(task_id="validate_spec", spec_path=str(spec_path))
        data = ValidateDataOperator(task_id="validate_data")
        plan = PlanParallelismOperator(task_id="plan_parallelism")
        place = PlaceGangOperator(task_id="place_gang")
        launch = LaunchTrainingOperator(task_id="launch_training")
        watchers = [
            WatchTrainingSensor(task_id="watch_training"),
            WatchCheckpointsSensor(task_id="watch_checkpoints"),
            WatchHealthSensor(task_id="watch_health"),
        ]
        classify = ClassifyOutcomeOperator(task_id="classify_outcome", trigger_rule="all_done")
        release = ReleaseGangOperator(task_id="release_gang")
        choose = ChooseActionOperator(task_id="choose_action")
        resume = ResumeNextAttemptOperator(task_id="resume_next_attempt", trigger_rule="none_failed_min_one_success")
        resume >> AttemptFailedOperator(task_id="attempt_failed", retries=0)  # the run is red: it failed
        validate >> data >> plan >> place >> launch >> watchers >> classify
        classify >> release.as_teardown(setups=place) >> choose
        classify >> choose  # a failed classification fails the run (not only the teardown's path)
        for action in RECOVERY_ACTIONS:
            choose >> RecoveryActionOperator(task_id=action, action=action) >> resume
        register = RegisterModelOperator(task_id="register_model")
        choose >> [register, FinishRunOperator(task_id="finish_run"), GiveUpOperator(task_id="give_up", retries=0),
                   CancelledOperator(task_id="cancelled", retries=0)]
        if job.spec.retrain is not None and job.spec.retrain.promote == "manual":
            promotion_gate(job, register)
    # The trigger form's Params, set once the tasks exist: every operator built inside the DAG
    # deep-copies the DAG's params (Airflow's `get_merged_defaults`), which was 40 % of the parse
    # of 100 specs. The tasks do not need them — `validate_spec` reads the run's conf, where the
    # form puts every value, and `AttemptConf`'s defaults are the Params' defaults.
    dag.params = ParamsDict(params(job))
    return dag
