#!/usr/bin/env python3
"""Celery's own integration tests with the adapter installed, then an audit of the ledger.

What it does, all inside one temporary folder (removed at the end unless ``--keep DIR``):

1. builds a throwaway virtualenv (``uv venv --seed``) and downloads Celery's sdist into it
   (``pip download --no-deps --no-binary :all: celery==VERSION``; default: the Celery version
   of the interpreter running this script, else 5.7.0), extracting only its ``t/`` test package;
2. installs that Celery (with the ``redis`` and ``pydantic`` extras its tests import), the pytest
   plugins pinned in the sdist's ``requirements/test.txt`` (pytest, pytest-rerunfailures,
   pytest-subtests, pytest-timeout) and this checkout's core and Celery adapter;
3. starts a private ``redis-server`` on a free port of 127.0.0.1: the suite's broker, result
   backend and its own Redis keys (it deletes keys such as ``redis-echo``), so no shared Redis is
   touched;
4. runs ``t/integration/test_tasks.py`` and ``t/integration/test_canvas.py`` against the suite's
   session worker (a real prefork pool in the pytest process) with
   ``task_state_guard_celery.install(app, db=...)`` on the suite's app (a small pytest plugin
   this script writes; Celery's files are not changed). ``--baseline`` first runs the same
   modules without the adapter, so the two Celery outcomes can be compared;
5. audits the ledger, reading the Celery results from the same Redis before stopping it:

   * ``doctor`` healthy;
   * a *replaced* task is a logical task with an attempt closed ``cancelled/ignored`` followed by
     further attempts (the replacement's stages or its last task). None of them may end
     ``cancelled/ignored``; and no logical task may end ``cancelled/ignored`` while Celery
     stored ``SUCCESS`` or ``FAILURE`` for its id (its replacement ran);
   * every replaced task's outcome against Celery's state for its id: ``succeeded`` with
     ``SUCCESS``, ``failed`` with ``FAILURE``, ``cancelled/revoked`` with ``REVOKED`` agree;
   * counts of logical tasks and of attempts by outcome (work left open included), and the
     adapter's counters (ledger errors, refused closes, reconciles) summed over every process,
     pool children included (the adapter's ``metrics_dir``, as ``tsg metrics --metrics-dir``
     exposes them).

Prints one JSON object (counts and pytest summaries; no task ids); exits 1 when a check fails.
It takes about a quarter of an hour and needs the package index, ``uv`` and ``redis-server``;
it is not part of CI (see benchmarks/README.md).

    .venv/bin/python scripts/celery_upstream_suite.py [--celery 5.7.0] [--baseline] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODULES = ("t/integration/test_tasks.py", "t/integration/test_canvas.py")
PLUGINS = ("pytest", "pytest-rerunfailures", "pytest-subtests", "pytest-timeout")
AGREE = {
    ("succeeded", "SUCCESS"), ("failed", "FAILURE"), ("cancelled", "REVOKED"),
}

PLUGIN = '''\
"""Installs task_state_guard_celery on the app of Celery's session worker (written by
scripts/celery_upstream_suite.py; the settings come from TSG_* variables)."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _task_state_guard(celery_session_app):
    # Autouse: created before the session worker forks its pool, so every child records.
    from task_state_guard_celery import install

    guard = install(celery_session_app, db=os.environ["TSG_UPSTREAM_DB"])
    yield guard
    guard.uninstall()
'''

PYTEST_INI = """\
[pytest]
python_classes = test_*
markers =
    flaky
    timeout
    amqp
"""


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def default_version() -> str:
    try:
        from importlib.metadata import version

        return version("celery")
    except Exception:
        return "5.7.0"


def prepare(work: Path, celery: str) -> tuple[Path, Path]:
    """The throwaway virtualenv and the run folder holding Celery's ``t/`` package."""
    venv = work / "venv"
    run(["uv", "venv", "--seed", "--python", sys.executable, str(venv)])
    python = venv / "bin" / "python"
    sdist_dir = work / "sdist"
    run([str(python), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "-d", str(sdist_dir), f"celery=={celery}"])
    sdist = next(sdist_dir.glob("celery-*.tar.gz"))
    run_dir = work / "run"
    run_dir.mkdir()
    pins: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{root}/t/")]
        for member in members:
            member.name = member.name[len(root) + 1:]
        tar.extractall(run_dir, members=members, filter="data")
        reqs = tar.extractfile(f"{root}/requirements/test.txt")
        for line in (reqs.read().decode() if reqs else "").splitlines():
            match = re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)", line.strip())
            if match and match.group(1) in PLUGINS:
                pins[match.group(1)] = match.group(2)
    plugins = [f"{name}=={pins[name]}" if name in pins else name for name in PLUGINS]
    run(["uv", "pip", "install", "--python", str(python), f"celery[redis,pydantic]=={celery}",
         *plugins, "-e", str(REPO / "packages" / "core"),
         "-e", str(REPO / "packages" / "adapter-celery")])
    (run_dir / "pytest.ini").write_text(PYTEST_INI)
    (run_dir / "tsg_upstream_plugin.py").write_text(PLUGIN)
    return python, run_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    data = work / "redis"
    data.mkdir()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("redis-server did not start")


def run_suite(python: Path, run_dir: Path, port: int, db: Path | None, log: Path) -> dict[str, Any]:
    """One pytest run of the two modules; its summary counts and failed test names."""
    env = dict(os.environ)
    url = f"redis://127.0.0.1:{port}/0"
    env.update({
        "TEST_BROKER": url, "TEST_BACKEND": url, "REDIS_HOST": "127.0.0.1",
        "REDIS_PORT": str(port), "PYTHONPATH": str(run_dir), "PYTHONDONTWRITEBYTECODE": "1",
    })
    # celery.contrib.pytest: Celery's fixtures (the pytest-celery package registers them).
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
           "-p", "celery.contrib.pytest", *MODULES]
    if db is not None:
        metrics = db.parent / "metrics"
        metrics.mkdir(mode=0o700, exist_ok=True)
        env.update({"TSG_UPSTREAM_DB": str(db), "TSG_METRICS_DIR": str(metrics)})
        cmd[3:3] = ["-p", "tsg_upstream_plugin"]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text(errors="replace")
    summary = Counter[str]()
    tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    for count, what in re.findall(r"(\d+) (\w+)", tail[-1] if tail else ""):
        summary[what] += int(count)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    return {"exit_status": proc.returncode, "summary": dict(summary), "failed": failed,
            "seconds": round(time.monotonic() - started, 1)}


def celery_states(port: int, ids: list[str]) -> dict[str, str]:
    """Celery's stored state of each id (``PENDING`` when nothing is stored)."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, db=0)
    try:
        states = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            found = client.mget([f"celery-task-meta-{i}" for i in chunk])
            for celery_id, raw in zip(chunk, found, strict=True):
                states[celery_id] = json.loads(raw)["status"] if raw else "PENDING"
        return states
    finally:
        client.close()


def counters(metrics: Path) -> dict[str, Any]:
    """The adapter's counters summed over every process (the metrics directory, as
    ``tsg metrics --metrics-dir`` exposes them)."""
    from task_state_guard.metrics import adapter_counters

    found = adapter_counters.read(str(metrics))
    out: dict[str, Any] = {}
    for family in adapter_counters.FAMILIES:
        out[family] = {
            ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "adapter"): value
            for labels, value in adapter_counters.samples(found, family)
        }
    return out


def audit(db: Path, port: int) -> dict[str, Any]:
    from task_state_guard import Ledger

    with Ledger(str(db), read_only=True) as ledger:
        doctor = ledger.doctor()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT id, parent_id, status, terminal_code, framework_id FROM tsg_tasks ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    roots = {r[0]: r for r in rows if r[1] is None}
    children: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        if row[1] is not None:
            children.setdefault(row[1], []).append(row)
    replaced = set()
    for parent, kids in children.items():
        outcomes = [(k[2], k[3]) for k in kids]
        if ("cancelled", "ignored") in outcomes[:-1]:
            replaced.add(parent)  # an ignored attempt followed by the replacement's records
    states = celery_states(port, [r[4] for r in roots.values() if r[4]])

    def outcome(row: tuple[Any, ...]) -> str:
        return f"{row[2]}/{row[3]}" if row[3] else str(row[2])

    replaced_pairs = Counter[str]()
    disagreeing = 0
    for task_id in replaced:
        row = roots.get(task_id)
        if row is None:
            continue
        state = states.get(row[4]) if row[4] else None
        replaced_pairs[f"{outcome(row)} ~ {state or 'id not stored'}"] += 1
        if state is not None and (row[2], state) not in AGREE:
            disagreeing += 1
    ignored_after_run = sum(
        1 for row in roots.values()
        if (row[2], row[3]) == ("cancelled", "ignored")
        and states.get(row[4] or "") in ("SUCCESS", "FAILURE")
    )
    replaced_ignored = sum(
        1 for task_id in replaced
        if task_id in roots and (roots[task_id][2], roots[task_id][3]) == ("cancelled", "ignored")
    )
    return {
        "doctor_healthy": bool(doctor["healthy"]),
        "records": len(rows),
        "logical_tasks": len(roots),
        "attempts": len(rows) - len(roots),
        "logical_by_outcome": dict(Counter(outcome(r) for r in roots.values()).most_common()),
        "attempts_by_outcome": dict(
            Counter(outcome(r) for r in rows if r[1] is not None).most_common()
        ),
        "replaced_tasks": len(replaced),
        "replaced_ended_ignored": replaced_ignored,
        "ignored_although_celery_stored_a_result": ignored_after_run,
        "replaced_outcome_vs_celery_state": dict(replaced_pairs.most_common()),
        "replaced_disagreeing_with_celery": disagreeing,
        "logical_vs_celery_state": dict(Counter(
            f"{outcome(r)} ~ {states.get(r[4], 'id not stored') if r[4] else 'id not stored'}"
            for r in roots.values()
        ).most_common()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--celery", default=default_version(), help="Celery version to test")
    parser.add_argument("--baseline", action="store_true",
                        help="also run the modules without the adapter first")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, ledger)")
    args = parser.parse_args()
    for tool in ("uv", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is required on PATH")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tsg-upstream-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"celery": args.celery, "modules": list(MODULES)}
    redis_proc = None
    try:
        python, run_dir = prepare(work, args.celery)
        redis_proc, port = start_redis(work)
        if args.baseline:
            report["without_adapter"] = run_suite(python, run_dir, port, None, work / "base.log")
        ledger_dir = work / "ledger"
        ledger_dir.mkdir(mode=0o700)
        db = ledger_dir / "tasks.sqlite"
        report["with_adapter"] = run_suite(python, run_dir, port, db, work / "adapter.log")
        report["ledger"] = audit(db, port)
        report["adapter_counters"] = counters(ledger_dir / "metrics")
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    ledger = report["ledger"]
    report["ok"] = bool(
        ledger["doctor_healthy"]
        and ledger["replaced_ended_ignored"] == 0
        and ledger["ignored_although_celery_stored_a_result"] == 0
        and ledger["replaced_disagreeing_with_celery"] == 0
    )
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
