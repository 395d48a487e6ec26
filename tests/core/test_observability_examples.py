"""examples/observability: the Grafana dashboard and the Prometheus rules parse, and every
metric, label and label value they use is one the real `tsg metrics` output prints (the ledger's
families, and the adapters' counters from a metrics directory written by a real runtime); every
reason code they select belongs to the state they select, and the dashboard's lost-work panel
and the lost-work alert select the same codes; every adapter counter they take a rate or an
increase of is exported at 0 from a worker's start (else the first error of a kind would not
count). tests/examples/test_observability_prometheus.py evaluates them in a real Prometheus."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from core_helpers import run_cli
from prom_text import Family, parse
from task_state_guard import Ledger
from task_state_guard.integration import AdapterRuntime, resolve_settings
from task_state_guard.model import TASK_CODES

HERE = Path(__file__).resolve().parents[2] / "examples" / "observability"
SELECTOR = re.compile(r"\b(tsg_[a-z_]+)\b(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
EXTERNAL_LABELS = {"instance", "job"}  # added by Prometheus, not by the exposition
DURATION = re.compile(r"\d+[smhd]\Z")
RATED = re.compile(r"\b(?:rate|irate|increase)\(\s*(tsg_adapter_[a-z_]+)\b(\{[^}]*\})?")


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Family]:
    """Every family one `tsg metrics --metrics-dir` prints: a ledger with work in it, and the
    counters a real adapter runtime added to the directory (a ledger error, a conflict)."""
    work = tmp_path_factory.mktemp("obs")
    db = str(work / "d" / "tasks.sqlite")
    with Ledger(db) as led:
        root = led.create_task(name="app.add")
        led.start_task(root.id, owner=False)
        attempt = led.create_task(parent_id=root.id, delivery_required=False, name="app.add")
        led.close_task_settled(attempt.id, "succeeded", code="worker_completed")
        led.close_task_settled(root.id, "succeeded", code="worker_completed")
    blocker = work / "not-a-directory"
    blocker.write_text("")
    runtime = AdapterRuntime(
        resolve_settings(db=str(blocker / "tasks.sqlite"), metrics_dir=str(work / "m")),
        logger=logging.getLogger("t"), adapter="celery")
    assert runtime.guarded_reconcile("reconcile_on_boot") is None
    runtime.policy.conflict("logical_close")
    result = run_cli("--db", db, "metrics", "--metrics-dir", str(work / "m"))
    assert result.code == 0
    return parse(result.stdout)


def _check_expr(expr: str, families: dict[str, Family]) -> set[str]:
    names = set()
    for name, selector in SELECTOR.findall(expr):
        assert name in families, f"{name} is not a metric tsg prints"
        names.add(name)
        labels: dict[str, set[str]] = {}
        for sample_labels, _value in families[name].samples:
            for key, value in sample_labels.items():
                labels.setdefault(key, set()).add(value)
        matchers = MATCHER.findall(selector or "")
        states = [value for key, op, value in matchers if key == "status" and op == "="]
        for key, op, value in matchers:
            if key == "code" and states:  # a code must belong to the state it is selected with
                assert set(value.split("|")) <= TASK_CODES[states[0]], (name, value)
            if key in EXTERNAL_LABELS:
                continue
            assert key in labels, f"{name} has no label {key}"
            if op == "=" and "$" not in value:
                assert value in labels[key], f"{name}{{{key}={value!r}}} never appears"
            elif op == "=~" and "$" not in value:
                for alternative in value.split("|"):
                    assert alternative in labels[key], f"{name}: {key}={alternative!r}"
    return names


@pytest.mark.sqlite_only(reason="the module's families come from one SQLite ledger (not ported)")
def test_the_dashboard_parses_and_uses_real_metrics(families: dict[str, Family]) -> None:
    dashboard = json.loads((HERE / "grafana-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["panels"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    used: set[str] = set()
    used |= _check_expr(variables["instance"]["definition"], families)
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["datasource"] == {"type": "prometheus",
                                                          "uid": "${datasource}"}
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        assert panel["targets"]
        for target in panel["targets"]:
            used |= _check_expr(target["expr"], families)
    for name in ("tsg_outcomes_total", "tsg_deliveries_awaiting", "tsg_running_owner_dead",
                 "tsg_adapter_ledger_errors_total"):
        assert name in used


def test_lost_work_means_the_same_codes_in_the_dashboard_and_the_alert() -> None:
    """Lost work is a job a reconcile timed out: its worker died, went stale or passed its
    deadline; a framework's own time limit stopped a job that ran, and is not lost."""
    dashboard = json.loads((HERE / "grafana-dashboard.json").read_text())
    (lost_panel,) = [p for p in dashboard["panels"] if p["title"] == "Lost jobs per hour"]
    rules: Any = yaml.safe_load((HERE / "prometheus-rules.yml").read_text())
    (alert,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "TsgWorkLost"]

    def codes(expr: str) -> set[str]:
        (value,) = [v for key, op, v in MATCHER.findall(expr) if key == "code" and op == "=~"]
        return set(value.split("|"))

    lost = {"owner_lost", "restart_stale", "deadline_exceeded"}
    assert codes(lost_panel["targets"][0]["expr"]) == codes(alert["expr"]) == lost
    assert lost < TASK_CODES["timed_out"] and "time_limit_exceeded" in TASK_CODES["timed_out"]


@pytest.mark.sqlite_only(reason="the module's families come from one SQLite ledger (not ported)")
def test_the_alert_rules_parse_and_use_real_metrics(families: dict[str, Family]) -> None:
    document: Any = yaml.safe_load((HERE / "prometheus-rules.yml").read_text())
    assert set(document) == {"groups"} and document["groups"]
    used: set[str] = set()
    alerts = []
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", rule["alert"])
            assert isinstance(rule["expr"], str)
            if "for" in rule:
                assert DURATION.match(rule["for"])
            assert rule["labels"]["severity"] in ("info", "warning", "critical")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            alerts.append(rule["alert"])
            used |= _check_expr(rule["expr"], families)
    assert len(alerts) == len(set(alerts))
    for name in ("tsg_running_owner_dead", "tsg_outcomes_total", "tsg_delivery_outcomes_total",
                 "tsg_oldest_owed_delivery_age_seconds"):
        assert name in used


def _examples_exprs() -> list[str]:
    dashboard = json.loads((HERE / "grafana-dashboard.json").read_text())
    rules: Any = yaml.safe_load((HERE / "prometheus-rules.yml").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return exprs + [r["expr"] for g in rules["groups"] for r in g["rules"]]


@pytest.mark.sqlite_only(reason="a metrics directory beside one SQLite ledger (not ported)")
def test_every_adapter_counter_they_rate_is_there_at_zero_from_a_worker_start(
    tmp_path: Path,
) -> None:
    """`increase()` and `rate()` see an increment only when the series existed before it: each
    adapter counter the alerts and panels take them of must be exported, at 0, by workers that
    just started and counted nothing (a series that appears at 1 with the first error of its
    kind, as the detailed `tsg_adapter_ledger_errors_total` does, would never fire)."""
    db = str(tmp_path / "d" / "tasks.sqlite")
    Ledger(db).close()
    metrics_dir = str(tmp_path / "m")
    adapters = ("celery", "dramatiq", "langgraph")
    for adapter in adapters:
        runtime = AdapterRuntime(
            resolve_settings(db=db, metrics_dir=metrics_dir, reconcile_on_boot=False),
            logger=logging.getLogger("t"), adapter=adapter, framework=adapter)
        runtime.boot()  # what each adapter's worker does when it starts
        assert runtime.stats()["errors"] == {}
        runtime.close()
    result = run_cli("--db", db, "metrics", "--metrics-dir", metrics_dir)
    assert result.code == 0
    families = parse(result.stdout)
    rated = [match for expr in _examples_exprs() for match in RATED.findall(expr)]
    assert {name for name, _ in rated} >= {"tsg_adapter_ledger_errors_all_total",
                                             "tsg_adapter_conflicts_total"}
    for name, selector in rated:
        matchers = [(key, op, value) for key, op, value in MATCHER.findall(selector or "")
                    if key not in EXTERNAL_LABELS]
        assert not [m for m in matchers if m[1] != "="], (name, "only = matchers are checked")
        wanted = {key: value for key, _, value in matchers}
        for adapter in adapters:
            series = [value for labels, value in families[name].samples
                      if labels["adapter"] == adapter
                      and all(labels.get(k) == v for k, v in wanted.items())]
            assert series and all(value == 0 for value in series), (
                f"{name}{selector or ''} of {adapter} is not exported at 0 from the start")


def test_the_dashboard_shows_verdicts_pending_and_published() -> None:
    """Lost-job verdicts: the outbox by state (pending and published), the rate adapters
    publish at, and the age of the oldest pending one."""
    dashboard = json.loads((HERE / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    by_state = [e for e in exprs if "tsg_verdicts{" in e and "status" in e.split("by (")[1]
                .split(")")[0]]
    assert by_state, "no panel shows the verdicts by state (pending and published)"
    assert any(RATED.search(e) and "tsg_adapter_verdicts_published_total" in e for e in exprs)
    assert any("tsg_oldest_pending_verdict_age_seconds" in e for e in exprs)


@pytest.mark.sqlite_only(reason="the module's families come from one SQLite ledger (not ported)")
def test_the_docs_metrics_dir_table_lists_every_adapter_family_tsg_prints(
        families: dict[str, Family]) -> None:
    """docs/metrics.md's table of the metrics directory names exactly the adapter families a
    real `tsg metrics --metrics-dir` prints."""
    text = (HERE.parents[1] / "docs" / "metrics.md").read_text()
    section = text[text.index("### Every process's counters in `tsg metrics`"):]
    section = section[:section.index("**Counters from zero.**")]
    documented = set(re.findall(r"^\| `(tsg_adapter_[a-z_]+)` \|", section, re.MULTILINE))
    printed = {name for name in families if name.startswith("tsg_adapter_")}
    assert "tsg_adapter_verdicts_published_total" in printed
    assert documented == printed
