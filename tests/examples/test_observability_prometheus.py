"""The shipped dashboard and alert rules in a real Prometheus (Debian's package, see
scripts/dev.py): it scrapes `tsg metrics --serve` on a ledger with real work and a metrics
directory with real adapter counters, loads examples/observability/prometheus-rules.yml, and
every dashboard query and every rule is evaluated by Prometheus itself: each query answers
series (so no metric, label or label value is misspelt), "Lost jobs per hour" shows exactly the
lost codes (a framework time limit is not lost work), and the alerts fire on what they say:
among them the adapters' ledger errors on the very first error ever counted, after workers
started (their counters at 0) and Prometheus scraped them.

Grafana itself is not in the package registries this project installs from (not in Debian, not
on PyPI or npm), so the dashboard is checked at the level Grafana hands to its data source: the
PromQL of every panel, with the `$instance` variable at its "All" value.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from task_state_guard import Ledger, ReconcilePolicy
from task_state_guard.integration import AdapterRuntime, resolve_settings

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "core"))
from core_helpers import cli_env  # noqa: E402

OBSERVABILITY = REPO / "examples" / "observability"
LOST = {"owner_lost", "restart_stale", "deadline_exceeded"}


def _binary(name: str) -> str:
    found = shutil.which(name) or str(REPO / ".tools" / "prometheus" / name)
    if not os.access(found, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: scripts/dev.py puts it into .tools/prometheus")
        pytest.skip(f"{name} is missing: run python3 scripts/dev.py setup")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


class Prometheus:
    """A Prometheus server on 127.0.0.1 scraping one target every second, with the bearer
    token in ``credentials_file`` (docs/metrics.md's scrape configuration)."""

    def __init__(self, work: Path, target: str, credentials_file: str) -> None:
        self.port = _free_port()
        config = work / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(OBSERVABILITY / "prometheus-rules.yml")],
            "scrape_configs": [{
                "job_name": "tsg", "static_configs": [{"targets": [target]}],
                "authorization": {"type": "Bearer", "credentials_file": credentials_file},
            }],
        }))
        self.log = open(work / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        _wait(self._ready, "Prometheus to start")

    def _get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def _ready(self) -> bool:
        assert self.proc.poll() is None, "Prometheus exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` (a PromQL error fails the test with its message)."""
        answer = self._get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        return list(answer["data"]["result"])

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._get("/api/v1/rules")["data"]["groups"]
                for rule in group["rules"]]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """A ledger, a metrics directory and `tsg metrics --serve` on both: (db, dir, address)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db, metrics_dir = str(data / "tasks.sqlite"), tmp_path / "metrics"
    Ledger(db).close()
    env = cli_env({"TSG_METRICS_DIR": str(metrics_dir)})
    server = subprocess.Popen(
        [sys.executable, "-m", "task_state_guard", "--db", db, "metrics", "--serve",
         "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert server.stdout is not None
        listen = json.loads(server.stdout.readline())["listen"]
        yield db, metrics_dir, listen
    finally:
        server.terminate()
        server.wait(30)


def _workers_start(metrics_dir: Path, db: str) -> None:
    """What a worker does when it starts (its boot), here with a usable ledger: its counters
    appear at 0 in the directory, and nothing is counted."""
    settings = resolve_settings(db=db, metrics_dir=str(metrics_dir), reconcile_on_boot=False)
    runtime = AdapterRuntime(settings, logger=logging.getLogger("tsg-dashboard-test"),
                             adapter="celery", framework="celery")
    runtime.boot()
    assert runtime.stats()["errors"] == {}
    runtime.close()


def _adapter_counters(metrics_dir: Path, errors: int) -> None:
    """Real adapter counting into the directory: a runtime whose ledger path cannot be opened
    (its directory is a file) fails its reconciles, and counts a refused rewrite."""
    blocker = metrics_dir.parent / "not-a-directory"
    blocker.write_text("")
    settings = resolve_settings(db=str(blocker / "tasks.sqlite"), metrics_dir=str(metrics_dir))
    runtime = AdapterRuntime(settings, logger=logging.getLogger("tsg-dashboard-test"),
                             adapter="celery")
    for _ in range(errors):
        assert runtime.guarded_reconcile("reconcile_on_boot") is None
    runtime.policy.conflict("logical_close")


def _owned_by_a_dead_process(db: str) -> str:
    """A running job whose owner process has exited (tsg_running_owner_dead, owner_lost)."""
    code = ("import sys; from task_state_guard import Ledger\n"
            "with Ledger(sys.argv[1]) as led:\n"
            "    t = led.create_task(name='app.fetch'); led.start_task(t.id); print(t.id)\n")
    out = subprocess.run([sys.executable, "-c", code, db], capture_output=True, text=True,
                         check=True, env=cli_env())
    return out.stdout.strip()


def test_every_dashboard_query_and_rule_in_a_real_prometheus(
    served: tuple[str, Path, str], tmp_path: Path
) -> None:
    db, metrics_dir, target = served
    promtool = subprocess.run([_binary("promtool"), "check", "rules",
                               str(OBSERVABILITY / "prometheus-rules.yml")],
                              capture_output=True, text=True, check=False)
    assert promtool.returncode == 0, promtool.stdout + promtool.stderr

    with Ledger(db) as led:  # work as the adapters record it: jobs and their attempts
        for state, code in (("succeeded", "worker_completed"), ("failed", "worker_failed")):
            job = led.create_task(name="app.add")
            led.start_task(job.id, owner=False)
            attempt = led.create_task(parent_id=job.id, delivery_required=False, name="app.add")
            led.start_task(attempt.id, owner=False)
            led.close_task_settled(attempt.id, state, code=code)
            led.close_task(job.id, state, code=code)
        led.create_task(name="app.render")  # queued
        deadline = led.create_task(name="app.fetch", timeout_seconds=0)
        led.start_task(deadline.id, owner=False)
        stale = led.create_task(name="app.fetch")
        led.start_task(stale.id, owner=False)
        limited = led.create_task(name="app.fetch")
        led.start_task(limited.id, owner=False)
    _owned_by_a_dead_process(db)
    _workers_start(metrics_dir, db)  # no error counted yet: the counters read 0

    prometheus = Prometheus(tmp_path, target, db + ".serve-token")  # made by the first start
    try:
        _wait(lambda: prometheus.query('count_over_time(tsg_tasks{kind="task"}[5m]) >= 3'
                                       ' and on() count_over_time('
                                       'tsg_adapter_ledger_errors_all_total[5m]) >= 3'),
              "three scrapes before the jobs are lost and the first error")
        # Now the work is lost (and one job hits its framework's time limit), and an adapter
        # counts its first ledger error ever: the closes and the error land between scrapes,
        # as they would in production.
        with Ledger(db) as led:
            led.close_task(limited.id, "timed_out", code="time_limit_exceeded")
            led.reconcile(ReconcilePolicy(active_grace_seconds=0, delivery_grace_seconds=600))
        _adapter_counters(metrics_dir, errors=1)
        _wait(lambda: prometheus.query(
            'increase(tsg_outcomes_total{kind="task",code="owner_lost"}[1h]) > 0'
            ' and count_over_time(tsg_outcomes_total{kind="task",code="owner_lost"}[1m]) > 3'),
            "the lost closes in three more scrapes")

        dashboard = json.loads((OBSERVABILITY / "grafana-dashboard.json").read_text())
        answers: dict[str, list[dict[str, Any]]] = {}
        for panel in dashboard["panels"]:
            for target_ in panel["targets"]:
                expr = target_["expr"].replace("$instance", ".*")
                result = prometheus.query(expr)
                assert result, f"panel {panel['title']!r}: {expr} answers no series"
                answers.setdefault(panel["title"], []).extend(result)

        lost = {r["metric"]["code"]: float(r["value"][1]) for r in answers["Lost jobs per hour"]}
        assert set(lost) == LOST and all(v > 0 for v in lost.values()), lost
        outcomes = {(r["metric"]["status"], r["metric"]["code"])
                    for r in answers["Job outcomes per minute"]}
        assert ("timed_out", "time_limit_exceeded") in outcomes  # counted, just not as lost
        errors = answers["Adapter ledger errors per minute"]
        per_adapter = {r["metric"]["adapter"]: float(r["value"][1])
                       for r in errors if "kind" not in r["metric"]}
        assert set(per_adapter) == {"celery"} and per_adapter["celery"] > 0  # the first error
        assert {r["metric"]["kind"] for r in errors if "kind" in r["metric"]} == {
            "attempt_close", "logical_close", "delivery_mark_dropped"}
        detail = answers["Adapter ledger errors by hook and error (counted so far)"]
        assert {(r["metric"]["adapter"], r["metric"]["hook"], r["metric"]["error"]):
                float(r["value"][1]) for r in detail} == {
            ("celery", "reconcile_on_boot", "StorageError"): 1.0}
        owed = answers["Lost-job verdicts waiting to be published"]
        assert {r["metric"]["framework"] for r in owed} == {"celery", "dramatiq", "langgraph"}

        def alerts() -> dict[str, list[dict[str, Any]]]:
            found: dict[str, list[dict[str, Any]]] = {}
            for rule in prometheus.rules():
                assert rule["health"] == "ok" and not rule.get("lastError"), rule
                if rule["type"] == "alerting":
                    found[rule["name"]] = [a for a in rule["alerts"] if a["state"] == "firing"]
            return found

        firing = _wait(lambda: (a := alerts())["TsgWorkLost"] and a["TsgAdapterLedgerErrors"]
                       and a, "the lost-work and adapter-error alerts")
        assert {a["labels"]["code"] for a in firing["TsgWorkLost"]} == LOST
        # The first error ever counted fires it: its series was there, at 0, before.
        assert {a["labels"]["adapter"] for a in firing["TsgAdapterLedgerErrors"]} == {"celery"}
        assert firing["TsgMetricsAbsent"] == []
        pending = [a for rule in prometheus.rules() if rule["name"] == "TsgRunningOwnerDead"
                   for a in rule["alerts"]]
        assert pending == []  # the dead owner's job was closed by the reconcile
    finally:
        prometheus.stop()
