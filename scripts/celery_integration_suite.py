#!/usr/bin/env python3
"""Acceptance check: Celery's own integration suite without and with the adapter, then every task
the worker handled, the ledger's outcome against Celery's stored state.

Not part of CI. About 45 minutes on 2 cores (two runs of about 20 minutes each, plus a few
minutes to build the throwaway virtualenv the first time). Run it from the repository root:

    .venv/bin/python scripts/celery_integration_suite.py [--celery 5.7.0] [--work DIR] [--fresh]
        [--redis HOST:PORT [--flush]] [--no-lock] [--no-known-differences] [-- PYTEST-ARGS]
    .venv/bin/python scripts/celery_integration_suite.py --reanalyse   # the last run, again

Prerequisites: ``python3 scripts/dev.py setup`` (``./.venv``, and ``uv`` on PATH or in
``./.tools``), the package index (only to build the throwaway virtualenv) and ``redis-server``
on PATH. Do not wrap the script in ``flock /tmp/tsg-tests.lock``: it takes that lock itself
around each suite run (``--no-lock`` when the caller already holds it).

Redis: each suite run gets a private ``redis-server`` on a free port of 127.0.0.1 (no
persistence; stopped after the run). Celery's tests need database 0 of the Redis their helpers
reach (``REDIS_HOST``/``REDIS_PORT``) to be the result backend's (``test_chord_on_error`` reads
the chord's keys there) and count the server's pub/sub channels, so the shared Redis on 6379
(whose database 0 other programs may use) is not fit for them. ``--redis HOST:PORT`` runs them
on an existing server instead: its database 0 must be empty (``--flush`` empties it first), and
is emptied after each run.

What it does:

1. **Throwaway virtualenv** in ``--work`` (default ``./.venv-celery-suite``, git-ignored; reused
   while the Celery version is the same, ``--fresh`` rebuilds it): Celery's sdist of the tested
   version (default: the one installed in the interpreter running this script, which is
   uv.lock's) is downloaded with ``pip download --no-deps --no-binary :all:``, and only its
   ``t/`` package and ``pyproject.toml`` (Celery's pytest settings) are extracted. Installed
   there: that Celery with the ``redis`` and ``pydantic`` extras its tests import, constrained
   to uv.lock's versions of its dependencies; the pytest plugins pinned by the sdist's
   ``requirements/test.txt`` (pytest, pytest-rerunfailures, pytest-subtests, pytest-timeout);
   this checkout's core and Celery adapter (editable). None of it touches ``./.venv`` or the
   project's dependencies.
2. **Two runs** of ``t/integration/test_tasks.py`` and ``t/integration/test_canvas.py`` against
   the suite's own worker (``celery_session_worker``: a prefork pool, concurrency 1, started in
   the pytest process), broker and result backend ``redis://127.0.0.1:PORT/0``: first WITHOUT the
   adapter, then WITH ``task_state_guard_celery.install(celery_session_app, db=...)`` on that
   worker's app (before the pool forks, so every pool child records). Celery's files are not
   changed: a small pytest plugin this script writes beside them does the install (second run
   only) and, in both runs, records each test's outcome and time window and the task events of
   every process (publish, receipt, run, revoke; pool children included). After each run the
   script reads Celery's stored states from the result backend. ``--timeout 900`` guards every
   test against a hang (Celery's flaky tests keep their own 300 s).
3. **Checks**, each printed with its figures:

   * ``same_pytest_outcomes``: every test id has the same outcome (passed, failed, error,
     skipped...) with and without the adapter. A test whose outcome differs is run alone
     ``--recheck`` times (20) each way, alternating, each in its own pytest session: the
     difference is put down to a flaky test (``flaky_both_ways``, the check holds) only when
     each run's outcome also came on the other side (a test that failed with the adapter failed
     at least once without it, and the other way round); else the check fails;
   * ``no_unexpected_disagreement``: for every Celery id the worker handled (received or revoked by
     its main process, or run in a pool child) and every logical task in the ledger, the ledger's
     final state agrees with Celery's stored state (``AGREEMENT`` below is the one definition). Not
     compared, only counted by why: tasks a test ran eagerly in its own process on its own app
     (``apply()``: not the worker's, not the guarded app's), messages the tests purged before the
     worker took them, ids Celery stored for tasks never sent (the rest of a failed chain) or the
     tests stored themselves. A disagreement is a *kind* (``celery=STATE ledger=OUTCOME``;
     ``ledger=missing`` when the ledger has no logical task for it, ``ledger=queued``/``running``
     when it is still open) attributed to the test that published the task (its own publish, else
     its root's or parent's, else the test running when the worker first saw it).
     ``KNOWN_DIFFERENCES`` lists the few documented kinds, each for one test, that are accepted; any
     other disagreement fails the check, and a known difference that no longer occurs is reported
     (not a failure) so the list can shrink;
   * ``doctor_healthy``: ``tsg doctor`` on the ledger;
   * ``tests_ran``: both runs collected and ran tests (pytest exit status 0 or 1).

Prints one JSON object on stdout (also kept as ``summary.json``): counts, test names and pytest
summaries, never a task id. Task ids are only in ``details.json`` (each disagreement with
Celery's state, the ledger's logical task, attempts and events, and the worker events of that
id; and the ids not compared, with why), kept in ``WORK/last/`` until the next run with the
pytest logs, the event logs, the ledger and Celery's stored states (``celery_states.json``:
state, parent id and time per task id; no result). ``--reanalyse`` compares those again without
running anything (e.g. after editing ``KNOWN_DIFFERENCES``). Exits 0 when every check holds,
1 otherwise, 2 when the run itself could not be made (no ``redis-server``, an
existing Redis unreachable or not empty, no ledger written...).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODULES = ("t/integration/test_tasks.py", "t/integration/test_canvas.py")
PLUGINS = ("pytest", "pytest-rerunfailures", "pytest-subtests", "pytest-timeout")
LOCK = "/tmp/tsg-tests.lock"
TEST_TIMEOUT = 900

# Celery's final state of a task id (its result backend) -> the ledger outcomes of the id's logical
# task that agree with it: a state ("failed") or a state/code ("cancelled/revoked"). Celery's other
# states (PENDING: nothing stored, e.g. ignore_result; RECEIVED, STARTED, RETRY) are no final
# state: any terminal ledger outcome is accepted there, an open one (queued, running) is not.
AGREEMENT: dict[str, tuple[str, ...]] = {
    "SUCCESS": ("succeeded",),
    "FAILURE": ("failed", "timed_out"),
    "REVOKED": ("cancelled/revoked",),
}
OPEN = ("queued", "running")
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")


@dataclasses.dataclass(frozen=True)
class KnownDifference:
    kind: str  # as disagreement() names it
    test: str  # the test's node id, without parameters
    why: str


# The documented differences between Celery's stored state and the ledger that this check
# accepts: each one kind in one test. Anything else is a failure.
KNOWN_DIFFERENCES: tuple[KnownDifference, ...] = (
    KnownDifference(
        "celery=FAILURE ledger=cancelled/rejected",
        "t/integration/test_tasks.py::test_tasks::test_reject_without_requeue_stores_failure",
        "raise Reject(requeue=False): Celery 5.7 stores FAILURE; the adapter records the "
        "rejection as cancelled/rejected (the Celery adapter's README, 'What the ledger shows')",
    ),
    KnownDifference(
        "celery=SUCCESS ledger=cancelled/revoked",
        "t/integration/test_tasks.py::test_tasks::test_revoked_by_headers_complex_canvas",
        "the test freezes one stamped signature (one task id) into eleven canvases and revokes "
        "it by its stamped header: the worker discards it at receipt in some canvases (REVOKED, "
        "what the test asserts) and runs it under the same id in others, and Celery overwrites "
        "its stored REVOKED with SUCCESS; the ledger never rewrites a closed logical task and "
        "keeps cancelled/revoked, each later run an attempt of its own (succeeded)",
    ),
)


def disagreement(celery_state: str, ledger: str | None) -> str | None:
    """The kind of disagreement between Celery's stored state and the ledger's outcome
    (``state`` or ``state/code``; None: no logical task), or None when they agree."""
    if ledger is None:
        return f"celery={celery_state} ledger=missing"
    status = ledger.split("/", 1)[0]
    if status in OPEN:
        return f"celery={celery_state} ledger={status}"
    accepted = AGREEMENT.get(celery_state)
    if accepted is None or status in accepted or ledger in accepted:
        return None
    return f"celery={celery_state} ledger={ledger}"


def known(kind: str, test: str, enabled: bool) -> KnownDifference | None:
    if not enabled:
        return None
    bare = test.split("[", 1)[0]
    return next((k for k in KNOWN_DIFFERENCES if k.kind == kind and k.test == bare), None)


# ----------------------------------------------------------------------------- the pytest plugin
PLUGIN = '''\
"""Written by scripts/celery_integration_suite.py beside Celery's tests (which it leaves as they
are): records each test's outcome and time window and the task events of every process (pool
children included) as JSON lines in $TSG_SUITE_EVENTS; with $TSG_SUITE_DB set, installs
task_state_guard_celery on the session worker's app."""
import json
import os
import threading
import time

import pytest
from celery import signals

_DIR = os.environ["TSG_SUITE_EVENTS"]
_state = {"fd": None, "pid": None, "test": None, "lock": threading.Lock()}
_PYTEST_PID = os.getpid()


def _after_fork():
    _state["fd"] = None
    _state["pid"] = None
    _state["lock"] = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _write(record):
    record["t"] = time.time()
    line = (json.dumps(record) + "\\n").encode()
    with _state["lock"]:
        if _state["pid"] != os.getpid():
            _state["pid"] = os.getpid()
            _state["fd"] = os.open(os.path.join(_DIR, f"events-{os.getpid()}.jsonl"),
                                   os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(_state["fd"], line)


def _publish(sender=None, headers=None, **kw):
    headers = headers or {}
    main = os.getpid() == _PYTEST_PID and threading.current_thread() is threading.main_thread()
    _write({"e": "publish", "id": headers.get("id"), "root": headers.get("root_id"),
            "parent": headers.get("parent_id"), "task": headers.get("task"),
            "test": _state["test"] if main else None})


def _received(request=None, **kw):
    _write({"e": "received", "id": request.id})


def _prerun(task_id=None, **kw):
    _write({"e": "prerun", "id": task_id})


def _postrun(task_id=None, state=None, **kw):
    _write({"e": "postrun", "id": task_id, "state": state})


def _revoked(request=None, terminated=None, expired=None, **kw):
    _write({"e": "revoked", "id": request.id, "terminated": bool(terminated),
            "expired": bool(expired)})


def _retry(request=None, **kw):
    _write({"e": "retry", "id": getattr(request, "id", None)})


def _failure(task_id=None, exception=None, **kw):
    _write({"e": "failure", "id": task_id, "exception": type(exception).__name__})


for _signal, _receiver in ((signals.before_task_publish, _publish),
                           (signals.task_received, _received), (signals.task_prerun, _prerun),
                           (signals.task_postrun, _postrun), (signals.task_revoked, _revoked),
                           (signals.task_retry, _retry), (signals.task_failure, _failure)):
    _signal.connect(_receiver, weak=False)


def pytest_runtest_logstart(nodeid, location):
    _state["test"] = nodeid
    _write({"e": "test_start", "test": nodeid})


def pytest_runtest_logfinish(nodeid, location):
    _write({"e": "test_end", "test": nodeid})
    _state["test"] = None


def pytest_runtest_logreport(report):
    _write({"e": "report", "test": report.nodeid, "when": report.when,
            "outcome": report.outcome, "xfail": hasattr(report, "wasxfail"),
            "sub": type(report).__name__.lower().startswith("subtest")})


@pytest.fixture(scope="session", autouse=True)
def _task_state_guard(celery_session_app):
    # In both runs (the app is created at the same point); autouse, so before the session worker
    # forks its pool: every child inherits the receivers.
    db = os.environ.get("TSG_SUITE_DB")
    if not db:
        yield None
        return
    from task_state_guard_celery import install

    guard = install(celery_session_app, db=db, metrics_dir=os.environ["TSG_SUITE_METRICS"])
    yield guard
    guard.uninstall()
'''


# ----------------------------------------------------------------------------- preparation
def log(message: str) -> None:
    print(f"[celery-suite {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if proc.returncode != 0:
        raise Failure(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n"
                      f"{(proc.stdout + proc.stderr)[-3000:]}")
    return proc


class Failure(Exception):
    """The run itself could not be made (exit status 2)."""


def find_uv() -> str:
    found = shutil.which("uv")
    local = REPO / ".tools" / "bin" / "uv"
    if found:
        return found
    if local.exists():
        return str(local)
    raise Failure("uv is required: on PATH, or run python3 scripts/dev.py setup (./.tools/bin/uv)")


def installed_celery() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("celery")
    except PackageNotFoundError:
        return None


def constraints(uv: str, celery: str) -> str:
    """uv.lock's versions of Celery, of what Celery itself requires and of redis, as
    constraints, when the tested Celery is the installed one (uv.lock's); else none. (The extras
    and pytest's plugins follow the sdist's pins.)"""
    from importlib.metadata import requires

    if celery != installed_celery():
        return ""
    names = {"celery", "redis"} | {
        re.split(r"[^A-Za-z0-9_.-]", req, maxsplit=1)[0].lower()
        for req in requires("celery") or [] if "extra ==" not in req
    }
    text = run([uv, "export", "--frozen", "--all-packages", "--no-hashes", "--no-emit-workspace",
                "--format", "requirements.txt"], cwd=REPO).stdout
    pins = [line for line in text.splitlines()
            if re.split(r"[=<>;\s\[]", line, maxsplit=1)[0].lower() in names]
    return "\n".join(pins) + "\n"


def prepare(work: Path, celery: str, fresh: bool) -> tuple[Path, Path]:
    """The throwaway virtualenv and the run folder holding Celery's ``t/`` package."""
    uv = find_uv()
    venv, run_dir, marker = work / "venv", work / "run", work / "prepared.json"
    cons = constraints(uv, celery)
    stamp = {"celery": celery, "python": sys.version, "plugin": PLUGIN,
             "constraints": hashlib.sha256(cons.encode()).hexdigest()}
    python = venv / "bin" / "python"
    if not fresh and marker.exists() and json.loads(marker.read_text()) == stamp:
        return python, run_dir
    log(f"building the throwaway virtualenv in {venv} (Celery {celery})")
    for path in (venv, run_dir, work / "sdist", marker):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    work.mkdir(parents=True, exist_ok=True)
    run([uv, "venv", "--seed", "--python", sys.executable, str(venv)])
    sdist_dir = work / "sdist"
    run([str(python), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "-d", str(sdist_dir), f"celery=={celery}"])
    sdist = next(sdist_dir.glob("celery-*.tar.gz"))
    run_dir.mkdir()
    pins: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers()
                   if m.name.startswith(f"{root}/t/") or m.name == f"{root}/pyproject.toml"]
        for member in members:
            member.name = member.name[len(root) + 1:]
        tar.extractall(run_dir, members=members, filter="data")
        reqs = tar.extractfile(f"{root}/requirements/test.txt")
        for line in (reqs.read().decode() if reqs else "").splitlines():
            match = re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)", line.strip())
            if match and match.group(1) in PLUGINS:
                pins[match.group(1)] = match.group(2)
    plugins = [f"{name}=={pins[name]}" if name in pins else name for name in PLUGINS]
    cons_args: list[str] = []
    if cons:
        (work / "constraints.txt").write_text(cons)
        cons_args = ["--constraint", str(work / "constraints.txt")]
    run([uv, "pip", "install", "--python", str(python), *cons_args,
         f"celery[redis,pydantic]=={celery}", *plugins,
         "-e", str(REPO / "packages" / "core"), "-e", str(REPO / "packages" / "adapter-celery")])
    (run_dir / "tsg_suite_plugin.py").write_text(PLUGIN)
    marker.write_text(json.dumps(stamp))
    return python, run_dir


# ----------------------------------------------------------------------------- Redis
def redis_client(address: str) -> Any:
    import redis

    host, _, port = address.rpartition(":")
    return redis.Redis(host=host, port=int(port), db=0, socket_connect_timeout=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_for_run(existing: str | None, flush: bool, folder: Path) -> Iterator[tuple[str, Any]]:
    """HOST:PORT and a client (database 0, empty) for one suite run: a private redis-server on a
    free port, stopped afterwards; or ``existing``, whose database 0 is emptied afterwards."""
    if existing is not None:
        client = redis_client(existing)
        try:
            client.ping()
        except Exception as exc:
            raise Failure(f"Redis {existing} unreachable: {type(exc).__name__}") from None
        if client.dbsize():
            if not flush:
                raise Failure(f"database 0 of Redis {existing} is not empty: pass --flush to "
                              "empty it, or leave --redis out (a private redis-server)")
            client.flushdb()
        try:
            yield existing, client
        finally:
            client.flushdb()
            client.close()
        return
    server = shutil.which("redis-server")
    if server is None:
        raise Failure("redis-server is required on PATH (or pass --redis HOST:PORT)")
    folder.mkdir(mode=0o700)
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [server, "--port", address.rpartition(":")[2], "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis_client(address)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise Failure("the private redis-server did not start") from None
                time.sleep(0.1)
        yield address, client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclasses.dataclass(frozen=True)
class Stored:
    """What the result backend holds for a task id (its result and arguments are not kept)."""

    state: str
    parent: str | None  # the id of the task that sent it, when Celery stored one
    done_at: float | None  # when a final state was stored (epoch seconds)


def celery_states(client: Any) -> dict[str, Stored]:
    """Every task id the result backend holds."""
    keys = [k.decode() for k in client.scan_iter(match="celery-task-meta-*", count=1000)]
    states: dict[str, Stored] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start:start + 500]
        for key, raw in zip(chunk, client.mget(chunk), strict=True):
            if raw is None:
                continue
            meta = json.loads(raw)
            done = meta.get("date_done")
            try:
                done_at = datetime.fromisoformat(done).timestamp() if done else None
            except (TypeError, ValueError):
                done_at = None
            states[key[len("celery-task-meta-"):]] = Stored(
                str(meta["status"]), meta.get("parent_id"), done_at)
    return states


def save_states(path: Path, states: dict[str, Stored]) -> None:
    path.write_text(json.dumps({cid: dataclasses.asdict(v) for cid, v in states.items()}))


def load_states(path: Path) -> dict[str, Stored]:
    return {cid: Stored(**v) for cid, v in json.loads(path.read_text()).items()}


# ----------------------------------------------------------------------------- one suite run
@contextlib.contextmanager
def test_lock(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    with open(LOCK, "a") as handle:
        log(f"waiting for {LOCK}")
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_suite(python: Path, run_dir: Path, out: Path, redis_address: str,
              with_adapter: bool, lock: bool, pytest_args: list[str], timeout: float,
              targets: tuple[str, ...] = MODULES) -> dict[str, Any]:
    """One pytest run of the two modules (or ``targets``): its exit status, summary line and
    wall time; the event logs in ``out/events``, the ledger in ``out/ledger`` (with the
    adapter)."""
    events = out / "events"
    events.mkdir(parents=True)
    host, _, port = redis_address.rpartition(":")
    url = f"redis://{redis_address}/0"
    env = dict(os.environ)
    for name in ("TSG_SUITE_DB", "TSG_DB", "TSG_METRICS_DIR"):
        env.pop(name, None)
    env.update({"TEST_BROKER": url, "TEST_BACKEND": url, "REDIS_HOST": host, "REDIS_PORT": port,
                "PYTHONPATH": str(run_dir), "PYTHONDONTWRITEBYTECODE": "1",
                "TSG_SUITE_EVENTS": str(events)})
    if with_adapter:
        ledger_dir = out / "ledger"
        ledger_dir.mkdir(mode=0o700)
        (ledger_dir / "metrics").mkdir(mode=0o700)
        env.update({"TSG_SUITE_DB": str(ledger_dir / "tasks.sqlite"),
                    "TSG_SUITE_METRICS": str(ledger_dir / "metrics")})
    # celery.contrib.pytest: Celery's fixtures (the pytest-celery package would register them).
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p", "celery.contrib.pytest",
           "-p", "tsg_suite_plugin", "-rfE", "--timeout", str(TEST_TIMEOUT),
           *targets, *pytest_args]
    log_path = out / "pytest.log"
    with test_lock(lock):
        log(f"pytest {'WITH' if with_adapter else 'without'} the adapter (log: {log_path})")
        started = time.monotonic()
        with log_path.open("w") as handle:
            proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=handle,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                status = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                status = -1
            except BaseException:  # interrupted: take the run down with this script
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            if status == -1:
                os.killpg(proc.pid, signal.SIGKILL)  # pytest and its pool children
                proc.wait()
        seconds = round(time.monotonic() - started, 1)
    text = log_path.read_text(errors="replace")
    tail = [line for line in text.splitlines()
            if re.search(r"\d+ (passed|failed|error|errors|skipped)\b", line)]
    last_line = tail[-1] if tail else ""
    summary = {what: int(count)
               for count, what in re.findall(r"(\d+) ((?:subtests )?[a-z]+)", last_line)}
    return {"exit_status": status, "timed_out": status == -1, "pytest_summary": summary,
            "seconds": seconds, "extra_pytest_args": pytest_args}


def recheck(python: Path, run_dir: Path, folder: Path, tests: list[str], rounds: int,
            args: argparse.Namespace) -> dict[str, dict[str, dict[str, int]]]:
    """Each test alone, ``rounds`` times without and with the adapter (alternating, one pytest
    session each): how often each outcome came, per test and side."""
    counts = {t: {"without_adapter": Counter[str](), "with_adapter": Counter[str]()}
              for t in tests}
    folder.mkdir()
    with test_lock(not args.no_lock):
        for index in range(rounds):
            for name, with_adapter in (("without_adapter", False), ("with_adapter", True)):
                out = folder / f"{index:02d}-{name}"
                with redis_for_run(args.redis, args.flush, folder / f"redis-{index:02d}-{name}") \
                        as (address, _):
                    run_suite(python, run_dir, out, address, with_adapter, False, [],
                              args.suite_timeout, tuple(tests))
                found, _ = test_outcomes(read_events(out / "events"))
                for test in tests:
                    counts[test][name][found.get(test, "absent")] += 1
    return {t: {side: dict(c) for side, c in sides.items()} for t, sides in counts.items()}


def read_events(events: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted(events.glob("events-*.jsonl")):
        pid = int(path.stem.split("-", 1)[1])
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                record["pid"] = pid
                records.append(record)
    records.sort(key=lambda r: float(r["t"]))
    return records


def test_outcomes(records: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, int]]:
    """Each test id's final outcome (``passed``, ``failed``, ``error``, ``skipped``,
    ``xfailed``, ``xpassed``), and how often a test was rerun (pytest-rerunfailures)."""
    phases: dict[str, dict[str, Any]] = {}
    reruns: Counter[str] = Counter()
    for r in records:
        if r["e"] != "report":
            continue
        test = str(r["test"])
        if r["outcome"] == "rerun":
            reruns[test] += 1
            phases.pop(test, None)
            continue
        state = phases.setdefault(test, {"sub_failed": False, "xfail": False})
        if r["sub"]:
            state["sub_failed"] |= r["outcome"] == "failed"
        else:
            state[r["when"]] = r["outcome"]
            state["xfail"] |= bool(r["xfail"])
    out: dict[str, str] = {}
    for test, state in phases.items():
        setup, call, teardown = state.get("setup"), state.get("call"), state.get("teardown")
        if setup == "failed":
            out[test] = "error"
        elif call == "failed" or state["sub_failed"]:
            out[test] = "failed"
        elif teardown == "failed":
            out[test] = "error"
        elif "skipped" in (setup, call):
            out[test] = "xfailed" if state["xfail"] else "skipped"
        else:
            out[test] = "xpassed" if state["xfail"] else "passed"
    return out, dict(reruns)


def pytest_pids(records: list[dict[str, Any]]) -> set[int]:
    """The pytest process: the tests' own thread and the session worker's main process."""
    return {int(r["pid"]) for r in records if r["e"] == "test_start"}


def handled_ids(records: list[dict[str, Any]]) -> set[str]:
    """The Celery ids the worker handled: received or revoked by its main process, or run in a
    pool child (eagerly run tasks there included). A task a test runs eagerly in its own
    process (``apply()``, on the test's app) is not the worker's."""
    main = pytest_pids(records)
    return {str(r["id"]) for r in records if r.get("id") and (
        r["e"] in ("received", "revoked") or (r["e"] == "prerun" and r["pid"] not in main))}


class Attribution:
    """Which test a Celery id belongs to: the test that published it from its own thread, else
    the one of its root or of a parent, else the test running when the worker first saw it."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.direct: dict[str, str] = {}
        self.root: dict[str, str] = {}
        self.parent: dict[str, str] = {}
        self.first_seen: dict[str, float] = {}
        starts: list[tuple[float, float, str]] = []
        open_test: dict[str, float] = {}
        for r in records:
            if r["e"] == "test_start":
                open_test[r["test"]] = float(r["t"])
            elif r["e"] == "test_end" and r["test"] in open_test:
                starts.append((open_test.pop(r["test"]), float(r["t"]), str(r["test"])))
            cid = r.get("id")
            if not cid or r["e"] in ("report", "test_start", "test_end"):
                continue
            self.first_seen.setdefault(cid, float(r["t"]))
            if r["e"] == "publish":
                if r.get("test"):
                    self.direct.setdefault(cid, str(r["test"]))
                if r.get("root") and r["root"] != cid:
                    self.root.setdefault(cid, str(r["root"]))
                if r.get("parent") and r["parent"] != cid:
                    self.parent.setdefault(cid, str(r["parent"]))
        starts.sort()
        self.windows = starts
        self.window_starts = [s[0] for s in starts]

    def test_of(self, cid: str, stored: Stored | None = None) -> str:
        """``stored``: what the backend holds for it, for an id the worker never saw (its
        parent, else when it was stored)."""
        seen: set[str] = set()
        current: str | None = cid
        while current and current not in seen:
            seen.add(current)
            if current in self.direct:
                return self.direct[current]
            root = self.root.get(current)
            if root in self.direct:
                return self.direct[root]
            parent = self.parent.get(current)
            if parent is None and current == cid and stored is not None:
                parent = stored.parent
            current = parent
        at = self.first_seen.get(cid, stored.done_at if stored is not None else None)
        if at is not None:
            index = bisect.bisect_right(self.window_starts, at) - 1
            if index >= 0 and at <= self.windows[index][1]:
                return self.windows[index][2]
        return "(outside any test)"


# ----------------------------------------------------------------------------- the ledger
def outcome(task: Any) -> str:
    return f"{task.status}/{task.terminal_code}" if task.terminal_code else str(task.status)


def tsg(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("tsg")
    return subprocess.run([str(exe), "--db", str(db), *args], text=True, capture_output=True)


def compare(db: Path, states: dict[str, Stored], records: list[dict[str, Any]],
            use_known: bool) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Every Celery id the worker handled and every logical task of the ledger: Celery's state
    against the ledger's outcome. Aggregates (no ids), and the detail rows (with ids)."""
    from task_state_guard import Ledger
    from task_state_guard.integration import job_task_id

    attribution = Attribution(records)
    handled = handled_ids(records)
    with Ledger(str(db), read_only=True) as ledger:
        jobs = {}
        attempts: dict[str, list[Any]] = defaultdict(list)
        framework_ids: set[str] = set()  # the Celery ids the ledger stores (canonical UUIDs)
        for status in (*OPEN, *TERMINAL):
            for row in ledger.list_tasks(status=status, limit=10**6).tasks:
                jobs[str(row.task.id)] = row.task
                if row.to_dict().get("framework_id"):
                    framework_ids.add(str(row.to_dict()["framework_id"]))
            for row in ledger.list_tasks(status=status, attempts=True, limit=10**6).tasks:
                attempts[str(row.task.parent_id)].append(row)
        for rows in attempts.values():
            rows.sort(key=lambda row: row.task.created_at)
        compared = handled | framework_ids
        matched: set[str] = set()
        pairs: Counter[str] = Counter()
        no_final: Counter[str] = Counter()
        kinds: dict[str, Counter[str]] = defaultdict(Counter)
        details: list[dict[str, Any]] = []
        by_test: Counter[str] = Counter()
        for cid in sorted(compared):
            lid = str(job_task_id("celery", cid))
            task = jobs.get(lid)
            if task is not None:
                matched.add(lid)
            stored = states.get(cid)
            state = stored.state if stored is not None else "PENDING"
            ledger_outcome = outcome(task) if task is not None else None
            pairs[f"celery={state} ledger={ledger_outcome or 'missing'}"] += 1
            if state not in AGREEMENT and ledger_outcome is not None:
                no_final[ledger_outcome] += 1
            kind = disagreement(state, ledger_outcome)
            test = attribution.test_of(cid, stored)
            by_test[test] += 1
            if kind is None:
                continue
            accepted = known(kind, test, use_known)
            kinds[kind][test] += 1
            details.append({
                "test": test, "kind": kind, "known": accepted is not None, "celery_id": cid,
                "celery_state": state, "handled_by_worker": cid in handled,
                "ledger_task": None if task is None else {
                    "id": lid, "outcome": ledger_outcome,
                    "events": [e.to_dict() for e in ledger.events_of(lid)],
                },
                "attempts": [
                    {"id": str(row.task.id), "outcome": outcome(row.task),
                     "events": [e.to_dict() for e in ledger.events_of(str(row.task.id))]}
                    for row in attempts.get(lid, [])
                ],
                "worker_events": [
                    {k: v for k, v in r.items() if k not in ("id", "root", "parent")}
                    for r in records if r.get("id") == cid
                ],
            })
        # Ids Celery published, ran or stored that the worker never handled and the ledger
        # does not hold: not compared, counted by why (run by a test in its own process;
        # published and purged by the tests before the worker took it; stored by Celery for a
        # task never sent, such as the rest of a chain whose task failed, or by a test).
        published = {str(r["id"]) for r in records if r["e"] == "publish" and r.get("id")}
        in_tests = {str(r["id"]) for r in records if r["e"] == "prerun" and r.get("id")}
        not_handled = sorted((published | in_tests | set(states)) - compared)
        not_handled_pairs: Counter[str] = Counter()
        skipped: list[dict[str, Any]] = []
        for cid in not_handled:
            stored = states.get(cid)
            state = stored.state if stored is not None else "PENDING"
            why = ("ran in the test process" if cid in in_tests
                   else "published, never received" if cid in published else "never published")
            not_handled_pairs[f"{why}, celery={state}"] += 1
            skipped.append({
                "test": attribution.test_of(cid, stored), "why": why,
                "celery_id": cid, "celery_state": state,
                "worker_events": [
                    {k: v for k, v in r.items() if k not in ("id", "root", "parent")}
                    for r in records if r.get("id") == cid
                ],
            })
        all_attempts = [row for rows in attempts.values() for row in rows]
        replaced = sum(
            1 for rows in attempts.values()
            if any(outcome(row.task) == "cancelled/ignored" for row in rows[:-1])
        )
    unmatched = [task for lid, task in jobs.items() if lid not in matched]
    known_seen = {(d["kind"], d["test"].split("[", 1)[0]) for d in details if d["known"]}
    summary_kinds = {
        kind: {"count": sum(tests.values()),
               "tests": dict(tests.most_common()),
               "known": all(known(kind, t, use_known) is not None for t in tests)}
        for kind, tests in sorted(kinds.items())
    }
    unexpected = sum(1 for d in details if not d["known"])
    aggregate = {
        "compared": len(compared),
        "handled_by_worker": len(handled),
        "stored_by_celery": len(states),
        "agree": len(compared) - len(details),
        "not_compared": dict(not_handled_pairs.most_common()),
        "celery_state_vs_ledger": dict(pairs.most_common()),
        "no_final_celery_state_by_ledger_outcome": dict(no_final.most_common()),
        "disagreements": {
            "total": len(details), "unexpected": unexpected,
            "known": len(details) - unexpected,
            "by_kind": summary_kinds,
        },
        "known_differences_not_seen": [
            {"kind": k.kind, "test": k.test} for k in KNOWN_DIFFERENCES
            if use_known and (k.kind, k.test) not in known_seen
        ],
        "ledger": {
            "logical_tasks": len(jobs),
            "attempts": len(all_attempts),
            "logical_by_outcome": dict(Counter(outcome(t) for t in jobs.values()).most_common()),
            "attempts_by_outcome": dict(
                Counter(outcome(row.task) for row in all_attempts).most_common()),
            "replaced_tasks": replaced,
            "logical_tasks_not_compared": len(unmatched),  # no Celery id known for them
        },
        "tests_with_tasks": len(by_test),
    }
    return aggregate, {"disagreements": details, "not_handled": skipped}


def doctor(db: Path) -> dict[str, Any]:
    proc = tsg(db, "doctor")
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return {"healthy": False, "exit_status": proc.returncode, "error": proc.stderr[-500:]}
    findings = {k: v for k, v in report.items() if k.endswith("_count") and v}
    return {"healthy": bool(report.get("healthy")) and proc.returncode == 0,
            "exit_status": proc.returncode, "quick_check": report.get("quick_check"),
            "task_count": report.get("task_count"), "event_count": report.get("event_count"),
            "non_zero_findings": {k: v for k, v in findings.items()
                                  if k not in ("task_count", "event_count")}}


def adapter_counters(db: Path) -> dict[str, float]:
    """The adapter's counters summed over every process, pool children included (``tsg metrics
    --metrics-dir``)."""
    proc = tsg(db, "metrics", "--metrics-dir", str(db.parent / "metrics"))
    found: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("tsg_adapter_"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--celery", help="Celery version to test (default: the installed one)")
    parser.add_argument("--redis", metavar="HOST:PORT",
                        help="an existing Redis (its database 0) instead of a private "
                             "redis-server per run")
    parser.add_argument("--flush", action="store_true",
                        help="with --redis: empty its database 0 first when it is not empty")
    parser.add_argument("--work", default=str(REPO / ".venv-celery-suite"),
                        help="the throwaway virtualenv and the last run's files")
    parser.add_argument("--fresh", action="store_true", help="rebuild the throwaway virtualenv")
    parser.add_argument("--recheck", type=int, default=20, metavar="N",
                        help="a test whose outcome differs: run it alone N times each way "
                             "(0: any difference fails)")
    parser.add_argument("--reanalyse", action="store_true",
                        help="run nothing: compare again what the last run kept in WORK/last")
    parser.add_argument("--no-lock", action="store_true",
                        help=f"do not take {LOCK} (the caller holds it)")
    parser.add_argument("--no-known-differences", action="store_true",
                        help="count the documented known differences as failures too")
    parser.add_argument("--suite-timeout", type=float, default=3600.0,
                        help="seconds one pytest run may take before it is killed")
    parser.add_argument("pytest_args", nargs="*",
                        help="after --: extra pytest arguments for both runs (e.g. -k NAME)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = Path(args.work).resolve()
    celery = args.celery or installed_celery()
    if celery is None:
        parser.error("celery is not installed in this interpreter: pass --celery VERSION")
    report: dict[str, Any] = {
        "celery": celery, "modules": list(MODULES),
        "broker_and_backend": f"redis://{args.redis}/0" if args.redis
        else "a private redis-server per run (database 0)",
        "worker": "celery_session_worker, prefork, concurrency 1",
    }
    last = work / "last"
    try:
        if not args.reanalyse:
            python, run_dir = prepare(work, celery, args.fresh)
            if last.exists():
                shutil.rmtree(last)
            last.mkdir(mode=0o700)
        elif not (last / "with_adapter" / "run.json").exists():
            raise Failure(f"nothing to analyse again in {last}")
        runs: dict[str, Any] = {}
        outcomes: dict[str, dict[str, str]] = {}
        for name, with_adapter in (("without_adapter", False), ("with_adapter", True)):
            out = last / name
            if not args.reanalyse:
                with redis_for_run(args.redis, args.flush, last / f"redis-{name}") as (
                        address, client):
                    result = run_suite(python, run_dir, out, address, with_adapter,
                                       not args.no_lock, args.pytest_args, args.suite_timeout)
                    save_states(out / "celery_states.json", celery_states(client))
                (out / "run.json").write_text(json.dumps(result))
            result = json.loads((out / "run.json").read_text())
            states = load_states(out / "celery_states.json")
            records = read_events(out / "events")
            outcomes[name], reruns = test_outcomes(records)
            result.update({
                "tests": len(outcomes[name]),
                "by_outcome": dict(Counter(outcomes[name].values()).most_common()),
                "not_passed": {t: o for t, o in sorted(outcomes[name].items())
                               if o not in ("passed", "skipped", "xfailed")},
                "reruns": reruns,
                "celery_ids_handled_by_worker": len(handled_ids(records)),
                "celery_ids_stored": len(states),
            })
            runs[name] = result
            if with_adapter:
                db = out / "ledger" / "tasks.sqlite"
                if not db.exists():
                    raise Failure(f"no ledger was written (see {out / 'pytest.log'})")
                aggregate, details = compare(db, states, records,
                                             not args.no_known_differences)
                report["tasks"] = aggregate
                report["doctor"] = doctor(db)
                report["adapter_counters"] = adapter_counters(db)
                detail_file = last / "details.json"
                detail_file.write_text(json.dumps({
                    **details,
                    "known_differences": [dataclasses.asdict(k) for k in KNOWN_DIFFERENCES],
                    "outcomes": outcomes,
                }, indent=1))
                report["detail_file"] = str(detail_file)
        report.update(runs)
        without, with_ = outcomes["without_adapter"], outcomes["with_adapter"]
        differ: list[dict[str, Any]] = [{"test": t, "without_adapter": without.get(t, "absent"),
                   "with_adapter": with_.get(t, "absent")}
                  for t in sorted(set(without) | set(with_)) if without.get(t) != with_.get(t)]
        recheck_file = last / "recheck.json"
        if differ and args.recheck > 0 and not args.reanalyse:
            log(f"{len(differ)} test(s) differ: each alone, {args.recheck} times each way")
            recheck_file.write_text(json.dumps(recheck(
                python, run_dir, last / "recheck", [d["test"] for d in differ], args.recheck,
                args)))
        rechecked = json.loads(recheck_file.read_text()) if recheck_file.exists() else {}
        for d in differ:
            if d["test"] in rechecked:
                sides = rechecked[d["test"]]
                d["recheck"] = sides
                # Flaky, not the adapter's: each run's outcome also came on the other side.
                d["flaky_both_ways"] = (d["with_adapter"] in sides["without_adapter"]
                                        and d["without_adapter"] in sides["with_adapter"])
        report["pytest_outcomes_differ"] = differ
    except Failure as exc:
        report["error"] = str(exc)
        report["ok"] = False
        report["wall_seconds"] = round(time.monotonic() - started, 1)
        print(json.dumps(report, indent=1))
        return 2
    checks = {
        "tests_ran": all(runs[n]["exit_status"] in (0, 1) and runs[n]["tests"] > 0
                         for n in runs),
        "same_pytest_outcomes": all(d.get("flaky_both_ways") for d in differ),
        "no_unexpected_disagreement": report["tasks"]["disagreements"]["unexpected"] == 0,
        "doctor_healthy": report["doctor"]["healthy"],
    }
    report["checks"] = checks
    report["ok"] = all(checks.values())
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    (work / "last" / "summary.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
