"""The operator's own metrics, read back from the exposition text a scrape gets."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slotune import models
from slotune.opmetrics import OperatorMetrics

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = models.LLMDeploymentSpec.model_validate(
    {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
        "replicas": 2,
        "slo": {"ttft": {"percentile": 99, "maxSeconds": 2}, "tpot": {"maxSeconds": 0.05}},
        "tuning": {"enabled": True, "maxTrials": 12},
    }
)
Labels = frozenset[tuple[str, str]]


def condition(type_: str, status: str, reason: str = "Because") -> models.Condition:
    return models.Condition.model_validate(
        {"type": type_, "status": status, "reason": reason, "lastTransitionTime": T0}
    )


def status(**fields: Any) -> models.LLMDeploymentStatus:
    base: dict[str, Any] = {
        "phase": "Ready",
        "readyReplicas": 2,
        "conditions": [
            condition("Ready", "True"),
            condition("SLOMet", "False"),
            condition("GPUThrottled", "True"),
        ],
        "slo": {
            "ttftP95Seconds": 2.5,
            "tpotP95Seconds": 0.03,
            "met": False,
            "targets": [
                {
                    "name": "ttft",
                    "percentile": 99,
                    "maxSeconds": 2,
                    "observedSeconds": 2.7,
                    "met": False,
                },
                {
                    "name": "tpot",
                    "percentile": 95,
                    "maxSeconds": 0.05,
                    "observedSeconds": 0.03,
                    "met": True,
                },
            ],
        },
        "tuning": {
            "state": "Tuning",
            "study": 2,
            "trialsCompleted": 5,
            "trialsFailed": 1,
            "maxTrials": 12,
            "best": {"number": 3, "score": 7.5, "feasible": True},
        },
        "gpu": {"smClockMHz": 1410, "maxSmClockMHz": 1980, "memoryUsedMiB": 1024},
    }
    return models.LLMDeploymentStatus.model_validate({**base, **fields})


def samples(metrics: OperatorMetrics) -> dict[str, dict[Labels, float]]:
    """Sample name -> {label set: value}, parsed from the exposition."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(metrics.exposition()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def of(
    metrics: OperatorMetrics, name: str, namespace: str = "prod", obj: str = "chat", **extra: str
) -> float | None:
    """The value of one per-object series, None when it is absent."""
    labels = frozenset({"namespace": namespace, "name": obj, **extra}.items())
    return samples(metrics).get(f"slotune_llmdeployment_{name}", {}).get(labels)


def test_observe_publishes_the_status_and_the_targets() -> None:
    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", status(), SPEC)

    assert of(metrics, "info", model="meta-llama/Llama-3.1-8B-Instruct", model_name="llama-8b")
    assert of(metrics, "phase", phase="Ready") == 1
    assert of(metrics, "phase", phase="Degraded") == 0
    assert of(metrics, "condition", type="Ready", status="True") == 1
    assert of(metrics, "condition", type="Ready", status="False") == 0
    assert of(metrics, "replicas_desired") == 2
    assert of(metrics, "replicas_ready") == 2
    assert of(metrics, "slo_met") == 0
    assert of(metrics, "slo_observed_seconds", target="ttft") == 2.7
    assert of(metrics, "slo_observed_seconds", target="tpot") == 0.03
    assert of(metrics, "slo_target_met", target="ttft") == 0
    assert of(metrics, "slo_target_met", target="tpot") == 1
    assert of(metrics, "slo_target_seconds", target="ttft") == 2
    assert of(metrics, "slo_target_percentile", target="ttft") == 99
    assert of(metrics, "slo_target_seconds", target="tpot") == 0.05
    assert of(metrics, "slo_target_seconds", target="itl") is None  # not in the spec
    assert of(metrics, "tuning_enabled") == 1
    assert of(metrics, "tuning_state", state="Tuning") == 1
    assert of(metrics, "tuning_state", state="Completed") == 0
    assert of(metrics, "tuning_study") == 2
    assert of(metrics, "trials_completed") == 5
    assert of(metrics, "trials_failed") == 1
    assert of(metrics, "trials_max") == 12
    assert of(metrics, "best_score") == 7.5
    assert of(metrics, "best_trial") == 3
    assert of(metrics, "gpu_throttled") == 1
    assert of(metrics, "gpu_sm_clock_hertz") == 1410e6
    assert of(metrics, "gpu_max_sm_clock_hertz") == 1980e6
    assert of(metrics, "gpu_memory_used_bytes") == 1024 * 2**20
    assert of(metrics, "gpu_temperature_celsius") is None  # not in status


def test_unknown_is_absent_not_zero() -> None:
    metrics = OperatorMetrics()
    unmeasured = status(
        conditions=[condition("SLOMet", "Unknown", "NotMeasured")],
        slo=None,
        tuning={"trialsCompleted": 4, "best": {"number": 2, "score": 1.0, "feasible": False}},
        gpu=None,
    )
    metrics.observe("prod", "chat", unmeasured, SPEC)

    assert of(metrics, "slo_met") is None
    assert of(metrics, "condition", type="SLOMet", status="Unknown") == 1
    assert of(metrics, "gpu_throttled") is None
    assert of(metrics, "slo_observed_seconds", target="ttft") is None
    # A best trial that missed the SLO is no best score; no study state before one ran.
    assert of(metrics, "best_score") is None
    assert of(metrics, "tuning_state", state="Tuning") is None
    assert of(metrics, "trials_completed") == 4


def test_an_older_status_shape_still_publishes_the_slo() -> None:
    # No SLOMet condition and no per-target figures: the flag and the p95 fields stand in.
    metrics = OperatorMetrics()
    older = {"met": True, "ttftP95Seconds": 1.5, "tpotP95Seconds": 0.02}
    metrics.observe("prod", "chat", status(conditions=[], slo=older), SPEC)
    assert of(metrics, "slo_met") == 1
    assert of(metrics, "slo_observed_seconds", target="ttft") == 1.5
    assert of(metrics, "slo_observed_seconds", target="tpot") == 0.02
    assert of(metrics, "slo_target_met", target="ttft") is None


def test_a_new_status_replaces_the_old_series() -> None:
    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", status(), SPEC)
    no_tpot = SPEC.model_copy(
        update={"slo": models.SloSpec(ttft=models.SloTarget(percentile=95, max_seconds=3))}
    )
    later = status(
        phase="Degraded", tuning={"trialsCompleted": 0, "study": 3}, conditions=[], gpu=None
    )
    metrics.observe("prod", "chat", later, no_tpot)

    assert of(metrics, "phase", phase="Degraded") == 1
    assert of(metrics, "phase", phase="Ready") == 0
    assert of(metrics, "slo_target_seconds", target="ttft") == 3
    assert of(metrics, "slo_target_seconds", target="tpot") is None  # removed from the spec
    assert of(metrics, "condition", type="Ready", status="True") is None
    # A new study counts from zero: a gauge may go down, a counter could not.
    assert of(metrics, "trials_completed") == 0
    assert of(metrics, "best_score") is None
    assert of(metrics, "gpu_sm_clock_hertz") is None


def test_forget_drops_one_object_and_keeps_the_others() -> None:
    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", status(), SPEC)
    metrics.observe("prod", "code", status(), SPEC)
    metrics.forget("prod", "chat")
    metrics.forget("prod", "never-seen")  # a delete the operator never observed

    text = metrics.exposition()
    assert 'name="chat"' not in text
    assert of(metrics, "phase", obj="code", phase="Ready") == 1
    # The families stay described, so a dashboard sees the metric names even when empty.
    metrics.forget("prod", "code")
    assert "# TYPE slotune_llmdeployment_slo_met gauge" in metrics.exposition()
    assert 'name="code"' not in metrics.exposition()


def test_a_restarted_operator_publishes_the_same_values_from_status() -> None:
    before, after = OperatorMetrics(), OperatorMetrics()
    for metrics in (before, after):
        metrics.observe("prod", "chat", status(), SPEC)
    per_object = {
        name: values
        for name, values in samples(after).items()
        if name.startswith("slotune_llmdeployment_")
    }
    assert per_object == {
        name: values
        for name, values in samples(before).items()
        if name.startswith("slotune_llmdeployment_")
    }
    assert per_object["slotune_llmdeployment_trials_completed"]


def test_an_object_without_a_parsed_spec_still_reports_its_status() -> None:
    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", status(phase="Invalid"), None)
    assert of(metrics, "phase", phase="Invalid") == 1
    assert of(metrics, "trials_max") == 12  # from status when the spec is unreadable
    assert not samples(metrics).get("slotune_llmdeployment_info")


def test_record_reconcile_counts_errors_and_durations() -> None:
    metrics = OperatorMetrics()
    metrics.record_reconcile(0.02, error=False)
    metrics.record_reconcile(3.0, error=True)
    found = samples(metrics)
    none: Labels = frozenset()
    assert found["slotune_reconciles_total"][none] == 2
    assert found["slotune_reconcile_errors_total"][none] == 1
    assert found["slotune_reconcile_duration_seconds_count"][none] == 2
    assert found["slotune_reconcile_duration_seconds_sum"][none] == pytest.approx(3.02)
    buckets = found["slotune_reconcile_duration_seconds_bucket"]
    assert buckets[frozenset({("le", "0.025")})] == 1
    assert buckets[frozenset({("le", "5.0")})] == 2
    assert len(found["slotune_build_info"]) == 1


def test_record_request_counts_by_verb() -> None:
    metrics = OperatorMetrics()
    for verb in ("get", "patch", "get"):
        metrics.record_request(verb)
    found = samples(metrics)["slotune_api_requests_total"]
    assert found == {frozenset({("verb", "get")}): 2, frozenset({("verb", "patch")}): 1}


def test_the_metrics_live_in_their_own_registry() -> None:
    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", status(), SPEC)
    metrics.record_reconcile(0.1, error=False)
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "slotune_" not in default


def test_serve_exposes_the_registry_over_http() -> None:
    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", status(), SPEC)
    server = metrics.serve(0, addr="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'slotune_llmdeployment_slo_met{name="chat",namespace="prod"} 0.0' in body


def test_capacity_scaling_publishes_its_figures_for_an_autoscaler() -> None:
    """What KEDA or an HPA scales on, and what the dashboard shows beside the replicas: the
    count slotune set, the count the demand needs, the demand and the capacity per replica."""
    metrics = OperatorMetrics()
    scaled = status(
        replicas=3,
        readyReplicas=2,
        scaling={"mode": "Capacity", "desiredReplicas": 3, "neededReplicas": 3, "demand": 21.3,
                 "capacityPerReplica": 9.8, "capacityLow": 9.4, "capacityHigh": 10.1},
    )  # fmt: skip
    metrics.observe("prod", "chat", scaled, SPEC)
    assert of(metrics, "replicas_desired") == 3  # not spec.replicas (2): scaling's count
    assert of(metrics, "replicas_ready") == 2
    assert of(metrics, "replicas_needed") == 3
    assert of(metrics, "demand_requests_per_second") == 21.3
    per_replica = "capacity_per_replica_requests_per_second"
    assert of(metrics, per_replica, bound="estimate") == 9.8
    assert of(metrics, per_replica, bound="low") == 9.4
    assert of(metrics, per_replica, bound="high") == 10.1
    # Fixed scaling publishes none of them.
    metrics.observe("prod", "chat", status(), SPEC)
    assert of(metrics, "replicas_needed") is None
    assert of(metrics, per_replica, bound="estimate") is None
