"""Cost and MFU arithmetic, checked against the seed's worked examples (§7, §10, §11)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import pytest

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.config.cluster import load_cluster
from trainyard.plugins.advisor import flops
from trainyard.plugins.tracking import cost
from trainyard.plugins.tracking.rates import Rates, load_rates

T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
H = 3600.0


def acct(job: str = "j", *, team: str = "nlp", project: str = "sft", gpu_type: str = "H100", gpus: int = 8,
         training_h: float = 10, waiting_h: float = 0, recovery_h: float = 0, **kw: object) -> cost.RunAccounting:
    ended = T0 + dt.timedelta(hours=training_h + waiting_h + recovery_h)
    return cost.RunAccounting(job=job, team=team, project=project, gpu_type=gpu_type, gpu_count=gpus,
                              submitted_at=T0, started_at=T0, ended_at=ended, training_s=training_h * H,
                              waiting_s=waiting_h * H, recovery_s=recovery_h * H, **kw)


# -- seed §11 "Cost of Idle/Wasted Compute", 1000-GPU 7-day run at the on-prem $1.91 ------------

def test_on_prem_rate_is_1_62_raw_and_1_91_per_useful_gpu_hour() -> None:
    assert cost.amortized_gpu_hour_usd(113_760, 8) == pytest.approx(1.623, abs=5e-4)
    assert cost.amortized_gpu_hour_usd(113_760, 8, utilization=0.85) == pytest.approx(1.91, abs=5e-3)


def test_recovery_cost_84_failures_of_60_s_on_1000_gpus() -> None:
    failures = cost.expected_failures(1000, 168, mtbf_hours=2000)
    assert failures == 84
    hours = cost.recovery_gpu_hours(failures, 60, 1000)
    assert hours == pytest.approx(1400)
    assert hours * 1.91 == pytest.approx(2674)
    assert hours / cost.gpu_hours(1000, 168 * H) == pytest.approx(0.0083, abs=5e-5)  # "0.83% overhead"


def test_pipeline_bubble_9_4_percent_of_168000_gpu_hours() -> None:
    bubble = cost.pipeline_bubble_fraction(4, 32)
    assert bubble == 3 / 32 and round(bubble * 100, 1) == 9.4
    plan = make_plan(pp=4, dp=1, micro_batch_size=1, num_micro_batches=32)
    wasted = cost.bubble_gpu_hours(plan, 168_000)
    assert wasted == pytest.approx(15_750)
    # The seed multiplies by the rounded 9.4 %: 15,792 GPU-hours = $30,163; same within rounding.
    assert wasted == pytest.approx(15_792, rel=3e-3)
    assert wasted * 1.91 == pytest.approx(30_163, rel=3e-3)
    assert cost.pipeline_bubble_fraction(4, 32, vpp=2) == 3 / 64  # interleaving halves it


def test_the_same_recovery_through_a_job_record_and_the_cluster_rate(tmp_path: Path) -> None:
    # A 1000-GPU H100 job on a cluster priced at the on-prem $1.91 (overriding rates.yaml's 3.50).
    cluster_file = tmp_path / "onprem.yaml"
    cluster_file.write_text((Path("config/clusters/h100-fleet.yaml").resolve().read_text())
                            .replace("hourlyRateUsd: 3.50", "hourlyRateUsd: 1.91"))
    onprem = load_cluster(str(cluster_file))
    job = acct("big", gpus=1000, training_h=168 - 1.4, recovery_h=84 * 60 / H)
    c = cost.job_cost(job, load_rates(), cluster=onprem)
    assert c.rate_usd_per_gpu_hour == 1.91
    assert c.recovery_gpu_hours == pytest.approx(1400)
    assert c.recovery_cost_usd == pytest.approx(2674)
    assert c.total_gpu_hours == pytest.approx(168_000)
    assert c.idle_pct == pytest.approx(1400 / 168_000 * 100)


# -- seed §10 scenario 1 and §13: $3.50 rates ------------------------------------------------------

def test_lost_compute_of_a_gpu_failure_costs_33_60() -> None:
    lost = cost.gpu_hours(256, 135)
    assert lost == pytest.approx(9.6)
    c = cost.job_cost(acct(gpus=256, training_h=1, recovery_h=135 / H), load_rates())
    assert c.rate_usd_per_gpu_hour == 3.50
    assert c.recovery_cost_usd == pytest.approx(33.60)
    assert cost.gpu_hours(256, 1) * 3.50 == pytest.approx(0.25, abs=0.005)  # "$0.25 per second"


# -- seed §7 MFU -------------------------------------------------------------------------------------

def test_mfu_of_a_200b_model_on_256_h100_is_47_4_percent() -> None:
    fpt = flops.flops_per_token_6n(200e9)
    assert fpt == 1.2e12
    peak = flops.peak_flops_per_device("H100")
    assert peak == 989e12
    assert flops.mfu(100_000, fpt, 256, peak) == pytest.approx(0.474, abs=5e-4)
    assert flops.mfu(1_200, fpt, 256, peak) == pytest.approx(0.0057, abs=5e-5)  # the seed's "0.57 %"


def with_precision(job, precision: str):  # type: ignore[no-untyped-def]
    par = job.spec.parallelism
    hints = par.hints.model_copy(update={"mixed_precision": precision})
    spec = job.spec.model_copy(update={"parallelism": par.model_copy(update={"hints": hints})})
    return job.model_copy(update={"spec": spec})


def test_an_fp32_jobs_cost_mfu_uses_the_fp32_peak_as_the_streamed_metric_does() -> None:
    # One denominator for the report and the worker's metric (plugins/advisor/flops.py).
    fp32 = with_precision(make_job(gpu_type="H100", gpu_count=8), "fp32")
    bf16 = with_precision(fp32, "bf16")
    fpt = cost.job_flops_per_token(fp32)
    assert fpt is not None
    streamed = flops.mfu(1e6, fpt, 8, flops.peak_flops_per_device("H100", "fp32"))
    assert cost.run_mfu(fp32, 1e6) == pytest.approx(streamed)
    assert streamed == pytest.approx(2 * cost.run_mfu(bf16, 1e6))  # the TF32 peak is half the bf16 one
    billed = cost.job_cost(acct(gpus=8, training_h=1, tokens=int(1e6 * H), precision="fp32"),
                           load_rates(), flops_per_token=fpt)
    assert billed.mfu == pytest.approx(streamed)


def test_mfu_is_computed_from_tokens_when_the_run_did_not_report_it() -> None:
    job = acct(gpus=256, training_h=1, tokens=int(100_000 * H))
    c = cost.job_cost(job, load_rates(), flops_per_token=flops.flops_per_token_6n(200e9))
    assert c.mfu == pytest.approx(0.474, abs=5e-4)
    assert cost.job_cost(acct(mfu=0.41), load_rates()).mfu == 0.41


def test_flops_per_token_from_hints_adds_the_attention_term() -> None:
    hints = make_job().spec.parallelism.hints
    assert hints is not None
    h, layers, s, v = hints.hidden_size, hints.num_layers, hints.sequence_length, hints.vocab_size
    shape = hints.shape()
    kv = h * shape.num_kv_heads // hints.num_attention_heads
    n = layers * (2 * h * h + 2 * h * kv + 3 * h * shape.ffn_hidden_size) + v * h
    assert flops.flops_per_token(hints) == pytest.approx(6 * n + 12 * layers * h * s)


# -- rates -------------------------------------------------------------------------------------------

def test_rates_file_and_errors(tmp_path: Path) -> None:
    rates = load_rates()
    assert rates.gpu_hour_usd == {"H100": 3.50, "H200": 4.50, "A100_80GB": 2.50, "cpu": 0.05}
    assert rates.rate_for("cpu", load_cluster("local")) == 0.05
    with pytest.raises(ValueError, match="no hourly rate for accelerator type 'TPUv5'"):
        rates.rate_for("TPUv5")
    bad = tmp_path / "r.yaml"
    bad.write_text("gpuHourUsd: {H100: -1}\n")
    with pytest.raises(ValueError, match="greater than 0"):
        load_rates(bad)


def test_accounting_refuses_time_running_backwards() -> None:
    with pytest.raises(ValueError, match="before started_at"):
        cost.RunAccounting(job="j", team="t", gpu_type="H100", gpu_count=1, submitted_at=T0,
                           started_at=T0, ended_at=T0 - dt.timedelta(seconds=1))


# -- chargeback --------------------------------------------------------------------------------------

def fleet() -> list[cost.RunAccounting]:
    return [
        acct("a1", team="nlp", project="sft", gpus=64, training_h=10, waiting_h=0.5, recovery_h=0.5, mfu=0.40),
        acct("a2", team="nlp", project="sft", gpus=8, training_h=20, mfu=0.50),
        acct("b1", team="vision", project="det", gpu_type="A100_80GB", gpus=16, training_h=5, recovery_h=1),
        acct("c1", team="demo", project="tiny", gpu_type="cpu", gpus=2, training_h=1),
    ]


def test_chargeback_groups_by_team_and_project_most_expensive_first() -> None:
    rows = cost.chargeback(fleet(), load_rates())
    assert [(r.team, r.project, r.num_jobs) for r in rows] == [("nlp", "sft", 2), ("vision", "det", 1), ("demo", "tiny", 1)]
    nlp = rows[0]
    assert nlp.total_gpu_hours == pytest.approx(64 * 11 + 8 * 20)
    assert (nlp.waiting_gpu_hours, nlp.recovery_gpu_hours) == (pytest.approx(32), pytest.approx(32))
    assert nlp.total_cost_usd == pytest.approx((64 * 11 + 160) * 3.50)
    assert nlp.idle_pct == pytest.approx(64 / 864 * 100)
    # MFU weighted by training GPU-hours: (640·0.40 + 160·0.50) / 800
    assert nlp.avg_mfu_pct == pytest.approx(42.0)
    vision = rows[1]
    assert vision.recovery_cost_usd == pytest.approx(16 * 2.50) and vision.avg_mfu_pct is None


def test_chargeback_period_filters_by_end_time() -> None:
    jobs = fleet()
    rows = cost.chargeback(jobs, load_rates(), since=T0 + dt.timedelta(hours=12), until=T0 + dt.timedelta(days=1))
    assert {(r.team, r.num_jobs) for r in rows} == {("nlp", 1)}  # only a2 ended (at 20 h) in the window


def test_chargeback_csv_and_html() -> None:
    rows = cost.chargeback(fleet(), Rates(gpu_hour_usd={"H100": 3.5, "A100_80GB": 2.5, "cpu": 0.05}))
    parsed = list(csv.DictReader(io.StringIO(cost.chargeback_csv(rows))))
    assert [r["team"] for r in parsed] == ["nlp", "vision", "demo"]
    assert float(parsed[0]["total_cost_usd"]) == pytest.approx(864 * 3.5)
    assert parsed[1]["avg_mfu_pct"] == ""
    page = cost.chargeback_html(rows, title="November <2026>", period="2026-11")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page
    assert "November &lt;2026&gt;" in page and "3,024.00" in page  # nlp cost, formatted
    assert "<tfoot><tr><td>Total</td>" in page
    empty = cost.chargeback_html([])
    assert "<tbody>\n\n</tbody>" in empty


def test_run_mfu_uses_the_jobs_hints_and_devices() -> None:
    job = make_job(gpu_type="H100", gpu_count=8)
    fpt = cost.job_flops_per_token(job)
    assert fpt == flops.flops_per_token(job.spec.parallelism.hints)  # type: ignore[arg-type]
    assert cost.run_mfu(with_precision(job, "bf16"), 1e6) == pytest.approx(1e6 * fpt / (8 * 989e12))  # type: ignore[operator]
    local = load_cluster("local")  # the cluster sets no peak for cpu: the advisor's catalog does
    assert cost.run_mfu(make_job(), 1e4, cluster=local) == pytest.approx(
        1e4 * fpt / (2 * flops.peak_flops_per_device("cpu")))  # type: ignore[operator]
