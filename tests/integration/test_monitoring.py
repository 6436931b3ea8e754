"""The chart's monitoring: the operator's metrics port and Service, the PodMonitors, the alert
rules and the Grafana dashboard, checked by the real tools.

`promtool check rules` reads the rule groups `helm template` renders. A real Prometheus then
scrapes the operator's own metrics (`slotune.opmetrics`, served over HTTP as in the pod) and a
recorded vLLM exposition, loads the same rules with their `for` set to zero, and must (1)
accept every dashboard and alert expression, (2) join vLLM's series to their LLMDeployment the
way the dashboard does, and (3) fire exactly the alerts the published statuses call for, with
their annotations filled in.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.specs import llm_spec

from slotune import metrics, models, render, scaling
from slotune.opmetrics import OperatorMetrics
from support.cluster import ROOT
from support.controlplane import bin_dir_from_env
from support.prometheus import PrometheusServer, prometheus_binary

pytestmark = pytest.mark.integration

CHART = ROOT / "charts" / "slotune"
NAMESPACE = "slotune-system"
VLLM_EXPOSITION = ROOT / "tests" / "unit" / "data" / "vllm-0.32-cpu-metrics.txt"
SERVED_NAME = "tiny"  # the model_name in the recorded exposition
ALL_ON = [
    "monitoring.operatorPodMonitor.enabled=true",
    "monitoring.vllmPodMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
]
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$name": ".*"}


@pytest.fixture(scope="module")
def helm() -> Path:
    return bin_dir_from_env() / "helm"


def template(helm: Path, *sets: str) -> list[dict[str, Any]]:
    args = [str(helm), "template", "slotune", str(CHART), "-n", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


@pytest.fixture(scope="module")
def everything(helm: Path) -> list[dict[str, Any]]:
    return template(helm, *ALL_ON)


def alert_names() -> list[str]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return list(values["monitoring"]["prometheusRule"]["alerts"])


def rule_groups(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = one(docs, "PrometheusRule")["spec"]["groups"]
    return groups


def dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = one(docs, "ConfigMap", "slotune-dashboard")
    board: dict[str, Any] = json.loads(config_map["data"]["slotune.json"])
    return board


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    """Every panel query, and each variable's series selector, as Prometheus will get them."""
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        found = re.fullmatch(r"label_values\((.+), \w+\)", variable.get("definition", ""))
        if found:
            queries.append(found.group(1))
    return [substitute(q) for q in queries]


def substitute(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    return query


def promtool() -> Path:
    sibling = prometheus_binary(install=True).with_name("promtool")
    found = sibling if sibling.exists() else shutil.which("promtool")
    assert found, "promtool not found (Debian's prometheus package installs it)"
    return Path(found)


# --- the chart ---------------------------------------------------------------------------


def test_only_the_metrics_port_and_service_are_on_by_default(helm: Path) -> None:
    docs = template(helm)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ConfigMap"}
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "SLOTUNE_METRICS_PORT", "value": "8080"} in container["env"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 8080
    assert ports["health"] != ports["metrics"]  # Kopf's liveness server and ours must not clash
    assert any(f":{ports['health']}/healthz" in arg for arg in container["args"])

    service = one(docs, "Service", "slotune-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_chart_lints_strictly_with_every_monitoring_object_on(helm: Path) -> None:
    args = [str(helm), "lint", "--strict", str(CHART)]
    for item in ALL_ON:
        args += ["--set", item]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_metrics_can_be_switched_off(helm: Path) -> None:
    docs = template(helm, "metrics.enabled=false")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "SLOTUNE_METRICS_PORT" not in {var["name"] for var in container.get("env", [])}
    assert [p["name"] for p in container["ports"]] == ["health"]
    assert not [d for d in docs if d["kind"] == "Service"]


def test_pod_monitors_select_the_pods_and_ports_that_exist(
    everything: list[dict[str, Any]],
) -> None:
    operator_pod = one(everything, "Deployment")["spec"]["template"]
    monitor = one(everything, "PodMonitor", "slotune")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= operator_pod["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in operator_pod["spec"]["containers"][0]["ports"]}
    assert endpoint["honorLabels"] is True  # keeps each LLMDeployment's namespace label
    assert operator_pod["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "slotune"

    # The vLLM PodMonitor selects the serving pods slotune renders, on their named port.
    spec = models.LLMDeploymentSpec.model_validate({"model": {"name": "m"}})
    owner = render.Owner(name="chat", namespace="prod", uid="u")
    serving = render.render_deployment(owner, spec, annotate_for_scraping=False)
    template_ = serving["spec"]["template"]
    vllm = one(everything, "PodMonitor", "slotune-vllm")
    assert (
        vllm["spec"]["selector"]["matchLabels"].items() <= template_["metadata"]["labels"].items()
    )
    (endpoint,) = vllm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in template_["spec"]["containers"][0]["ports"]}
    assert endpoint["path"] == "/metrics"
    (relabel,) = endpoint["relabelings"]
    source = relabel["sourceLabels"][0]
    pod_label = re.sub(r"[^a-zA-Z0-9_]", "_", render.LABEL_OWNER)
    assert source == f"__meta_kubernetes_pod_label_{pod_label}"


def test_the_dashboard_ships_in_a_labelled_config_map(everything: list[dict[str, Any]]) -> None:
    config_map = one(everything, "ConfigMap", "slotune-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = dashboard(everything)
    titles = {p["title"] for p in board["panels"]}
    for wanted in (
        "SLO attainment: measured / bound",
        "TTFT p95 (vLLM histogram)",
        "TPOT p95 (vLLM histogram)",
        "KV-cache usage",
        "Trials",
        "Best score",
        "GPU SM clock vs max",
    ):
        assert wanted in titles
    # Every query names the datasource variable the dashboard declares.
    variables = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in variables
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_promtool_accepts_the_rules(everything: list[dict[str, Any]], tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(everything)}))
    result = subprocess.run(
        [str(promtool()), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(g["rules"]) for g in rule_groups(everything))
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_the_operator_down_alert_needs_a_job_to_watch(helm: Path) -> None:
    def alerts(*sets: str) -> set[str]:
        docs = template(helm, "monitoring.prometheusRule.enabled=true", *sets)
        return {r["alert"] for g in rule_groups(docs) for r in g["rules"]}

    assert "SlotuneOperatorDown" not in alerts()
    assert "SlotuneOperatorDown" in alerts("monitoring.operatorPodMonitor.enabled=true")
    assert "SlotuneOperatorDown" in alerts("monitoring.prometheusRule.operatorJob=custom")


def test_promtool_fires_operator_down_when_no_operator_is_up(
    everything: list[dict[str, Any]], tmp_path: Path
) -> None:
    groups = rule_groups(everything)
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == "SlotuneOperatorDown"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    cases = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'up{{job="slotune", namespace="{NAMESPACE}"}}',
                        "values": "1x15 0x15",
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "14m", "alertname": "SlotuneOperatorDown", "exp_alerts": []},
                    {
                        "eval_time": "28m",
                        "alertname": "SlotuneOperatorDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {**rule["labels"]},
                                "exp_annotations": rule["annotations"],
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases))
    result = subprocess.run(
        [str(promtool()), "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_peak_demand_counts_queued_arrivals_and_holds_for_the_window(tmp_path: Path) -> None:
    """Capacity scaling's demand, as Prometheus's own engine evaluates it (promtool), on vLLM's
    series: 1 request/s, then a surge of 4/s that a saturated replica finishes at 2/s while
    its queue grows by 2/s, then the queue draining. The demand is the arrivals (4/s, not the
    2/s finished), and it holds at the surge's peak until the window (5 minutes after the
    1-minute rate) has passed it: replicas up at once, down only after the window."""
    query = metrics.peak_arrival_rate("5m", metrics.model_selector(model_name="chat",
                                                                    namespace="llm"))  # fmt: skip
    labels = 'model_name="chat",namespace="llm"'
    series = {
        # 1/s to 10m; 2/s to 16m (the surge, then the drain); 1/s after.
        f'vllm:request_success_total{{{labels},finished_reason="stop"}}':
            "0+15x40 630+30x7 870+30x15 1335+15x20",
        # Empty; +2/s during the surge (10m-12m); -1/s while it drains (to 16m); empty.
        f"vllm:num_requests_waiting{{{labels}}}": "0x40 30+30x7 225-15x15 0x20",
        f"vllm:num_requests_running{{{labels}}}": "0x84",
    }  # fmt: skip
    per_replica = scaling.Capacity(rate=2.0)
    timeline = [("9m", 1, 1), ("12m", 4, 3), ("16m", 4, 3), ("17m", 4, 3), ("18m15s", 1, 1)]
    for _, demand, replicas in timeline:
        found = scaling.decide(
            models.ScalingSpec(mode="Capacity"), spec_replicas=1, current=1, demand=demand,
            capacity=per_replica, headroom=0.1,
        )  # fmt: skip
        assert found.replicas == replicas
    cases = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": at,
                        "exp_samples": [{"labels": "{}", "value": demand}],
                    }
                    for at, demand, _ in timeline
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases))
    result = subprocess.run(
        [str(promtool()), "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- a real Prometheus ----------------------------------------------------------------------

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _condition(type_: str, status: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": "Observed", "lastTransitionTime": T0}


MISSING = models.LLMDeploymentStatus.model_validate(
    {
        "phase": "Ready",
        "readyReplicas": 1,
        "conditions": [
            _condition("Ready", "True"),
            _condition("SLOMet", "False"),
            _condition("GPUThrottled", "True"),
            _condition("MetricsAvailable", "False"),
            _condition("Degraded", "False"),
        ],
        "slo": {
            "met": False,
            "targets": [
                {"name": "ttft", "percentile": 95, "maxSeconds": 2, "observedSeconds": 2.7},
                {"name": "tpot", "percentile": 95, "maxSeconds": 0.05, "observedSeconds": 0.03},
            ],
        },
        "tuning": {"state": "Tuning", "trialsCompleted": 6, "trialsFailed": 4, "maxTrials": 20},
        "gpu": {"smClockMHz": 1100, "maxSmClockMHz": 1980},
    }
)
HEALTHY = models.LLMDeploymentStatus.model_validate(
    {
        "phase": "Ready",
        "readyReplicas": 1,
        "conditions": [
            _condition("Ready", "True"),
            _condition("SLOMet", "True"),
            _condition("GPUThrottled", "False"),
            _condition("MetricsAvailable", "True"),
            _condition("Degraded", "False"),
        ],
        "slo": {"ttftP95Seconds": 1.2, "tpotP95Seconds": 0.03, "met": True},
        "tuning": {
            "state": "Completed",
            "trialsCompleted": 8,
            "trialsFailed": 1,
            "best": {"number": 5, "score": 3.5, "feasible": True},
        },
        "gpu": {"smClockMHz": 1980, "maxSmClockMHz": 1980},
    }
)


def _spec(served_name: str) -> models.LLMDeploymentSpec:
    return llm_spec(
        model={"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": served_name},
        tuning={"enabled": True, "maxTrials": 20},
    )


class _Exposition(BaseHTTPRequestHandler):
    """Serves a recorded vLLM /metrics page."""

    body = VLLM_EXPOSITION.read_bytes()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """Scrapes the operator's metrics (two LLMDeployments in namespace prod: one missing
    its SLO, one healthy) and a vLLM engine serving the first; loads the chart's rules."""
    work = tmp_path_factory.mktemp("monitoring")
    zero = [f"monitoring.prometheusRule.alerts.{name}.for=0s" for name in alert_names()]
    docs = template(helm, *ALL_ON, *zero)
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(docs)}))

    metrics = OperatorMetrics()
    metrics.observe("prod", "chat", MISSING, _spec(SERVED_NAME))
    metrics.observe("prod", "code", HEALTHY, _spec("code"))
    metrics.record_reconcile(0.05, error=False)
    operator = metrics.serve(0, addr="127.0.0.1")
    vllm = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=vllm.serve_forever, daemon=True).start()
    targets = [f"127.0.0.1:{operator.server_port}", f"127.0.0.1:{vllm.server_port}"]

    def job(name: str, target: str, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
        return {
            "job_name": name,
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": [target], "labels": labels}],
            **extra,
        }

    server = PrometheusServer(
        prometheus_binary(install=True),
        work,
        targets,
        config={
            "rule_files": [str(work / "rules.yaml")],
            "scrape_configs": [
                # As the chart's PodMonitors label them: the operator's job is "slotune" in its
                # namespace, with its own labels honoured; vLLM's carry the pod's namespace.
                job("slotune", targets[0], {"namespace": NAMESPACE}, honor_labels=True),
                job("vllm", targets[1], {"namespace": "prod"}),
            ],
        },
    )
    try:
        with server:
            server.wait_for_target_up()
            time.sleep(3)  # enough samples for rate() over the scrapes
            yield server
    finally:
        operator.shutdown()
        operator.server_close()
        vllm.shutdown()
        vllm.server_close()


def query(server: PrometheusServer, expr: str) -> tuple[int, dict[str, Any]]:
    url = f"{server.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - local server
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_prometheus_accepts_every_dashboard_and_alert_expression(
    prometheus: PrometheusServer, everything: list[dict[str, Any]]
) -> None:
    expressions = dashboard_queries(dashboard(everything)) + [
        r["expr"] for g in rule_groups(everything) for r in g["rules"]
    ]
    assert len(expressions) > 20
    rejected = {}
    for expr in expressions:
        status, body = query(prometheus, expr)
        if status != 200 or body["status"] != "success":
            rejected[expr] = body.get("error")
    assert not rejected


def test_prometheus_rejects_a_broken_expression(prometheus: PrometheusServer) -> None:
    # The check above can fail: a malformed query is answered with bad_data.
    status, body = query(prometheus, "histogram_quantile(0.95, sum by (le) (rate(x[5m]))")
    assert status == 400
    assert body["errorType"] == "bad_data"


def result_for(prometheus: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    status, body = query(prometheus, expr)
    assert status == 200, body
    found: list[dict[str, Any]] = body["data"]["result"]
    return found


def test_dashboard_queries_return_each_llmdeployment(
    prometheus: PrometheusServer, everything: list[dict[str, Any]]
) -> None:
    by_title = {
        p["title"]: [substitute(t["expr"]) for t in p.get("targets", [])]
        for p in dashboard(everything)["panels"]
    }

    # Measured over bound, per target: ttft 2.7 s of 2 s.
    attainment = result_for(prometheus, by_title["SLO attainment: measured / bound"][0])
    values = {
        (r["metric"]["name"], r["metric"]["target"]): float(r["value"][1]) for r in attainment
    }
    assert values[("chat", "ttft")] == pytest.approx(1.35)
    assert values[("code", "tpot")] == pytest.approx(0.6)

    # vLLM's series reach the LLMDeployment they serve through its served name.
    for title in ("TTFT p95 (vLLM histogram)", "TPOT p95 (vLLM histogram)", "KV-cache usage"):
        series = result_for(prometheus, by_title[title][0])
        assert {r["metric"]["name"] for r in series} == {"chat"}, title
        assert {r["metric"]["namespace"] for r in series} == {"prod"}, title

    clocks = result_for(prometheus, by_title["GPU SM clock vs max"][0])
    assert {r["metric"]["name"]: float(r["value"][1]) for r in clocks} == {
        "chat": 1100e6,
        "code": 1980e6,
    }
    assert {r["metric"]["name"] for r in result_for(prometheus, by_title["Best score"][0])} == {
        "code"
    }


def firing(prometheus: PrometheusServer) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = prometheus.api("alerts")["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def test_the_alerts_fire_for_what_the_statuses_say(prometheus: PrometheusServer) -> None:
    expected = {
        ("SlotuneSLOMissed", "chat"),
        ("SlotuneMetricsUnavailable", "chat"),
        ("SlotuneGPUThrottled", "chat"),
        ("SlotuneTrialsAllInfeasible", "chat"),
        ("SlotuneTrialsFailing", "chat"),
        # One reconcile before the scrapes began, none since: the counter stands still.
        ("SlotuneReconcileStalled", None),
    }
    deadline = time.monotonic() + 30
    seen: set[tuple[str, str | None]] = set()
    while time.monotonic() < deadline:
        alerts = firing(prometheus)
        seen = {(a["labels"]["alertname"], a["labels"].get("name")) for a in alerts}
        if seen >= expected:
            break
        time.sleep(0.5)
    # Nothing fires for the healthy LLMDeployment, nor is the scraped operator "down".
    assert seen == expected

    by_name = {a["labels"]["alertname"]: a for a in firing(prometheus)}
    slo = by_name["SlotuneSLOMissed"]
    assert slo["labels"]["severity"] == "critical"
    assert slo["labels"]["namespace"] == "prod"
    description = slo["annotations"]["description"]
    assert "prod/chat" in description
    assert "ttft 2.7s" in description
    assert "tpot 30ms" in description
    assert "ttft 2s" in description  # the bound
    assert "kubectl describe llmd -n prod chat" in slo["annotations"]["runbook"]
    gpu = by_name["SlotuneGPUThrottled"]["annotations"]["description"]
    assert "SM clock 1.1GHz" in gpu
    assert "of 1.98GHz" in gpu
    for alert in by_name.values():
        assert {"summary", "description", "runbook"} <= alert["annotations"].keys()
