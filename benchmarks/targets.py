"""Every row of the guarded-job targets table, measured in one run, optionally before and after.

Runs the project's benchmark scripts (this tree's copies) once per round and per code variant,
rounds alternating between the variants (order flipped every other round), and prints one JSON
object: per measurement the per-round figures and their medians for each variant, side by side,
with the target beside them, and the load average at start and end.

Variants: ``current`` is this tree (the interpreter running this script, normally this tree's
``.venv``). ``--baseline REF`` adds ``baseline``: the git ref exported (``git archive``) to
``/work/bench-baseline-<sha>`` (``--scratch`` to change the parent folder), outside the
repository, with its own ``.venv`` built by ``uv sync --all-packages --frozen`` (reused when it
exists). Each measurement runs as a subprocess of the variant's interpreter, so it imports that
variant's packages; the scripts themselves drive the adapters only through the frameworks' hooks
and public entry points, and count statements from outside the ledger (``_probe.py``), so one
script measures both.

Measurements (``--only`` / ``--skip`` take these names):

- ``job_cost``: per guarded job, first delivery succeeding (Celery, Dramatiq; SQLite and
  PostgreSQL): statements, transactions, commits, rows, events, WAL pages (SQLite), ledger CPU
  per job in one process (client, and server on PostgreSQL);
- ``dramatiq_sqlite`` / ``dramatiq_postgresql``: a real worker (2 processes x 2 threads),
  guarded / plain, the ledger's CPU per message and the CPU ratio;
- ``celery_sqlite`` / ``celery_postgresql``: a real prefork worker, no-op and 10 ms tasks, the
  adapter against bare and against Celery's own result-backend tracking;
- ``transitions_postgresql``: 1 and 8 processes, the ledger against raw single-row commits;
- ``transitions_sqlite``: ``transitions.py`` single process;
- ``langgraph_saver``: LangGraph against the same ``SqliteSaver``, no-op and 1 ms nodes;
- ``langgraph_server``: a uvicorn LangGraph server on PostgreSQL, 20 concurrent ``ainvoke``;
- ``reconcile_1m``: reconcile apply on a 1,000,000-task SQLite ledger (built once in today's
  layout by ``scale.build_sql``, copied per round; a newer variant migrates its copy before the
  timed apply); the fixture's live owner is held by this process, as in ``scale.py``;
- ``code_shape``: ``scripts/code_shape.py`` per variant tree (static): the store protocol's
  members and, with its sub-protocols, the callables a backend provides; ``Ledger``'s code
  (statements, docstrings not counted); import circles in the five packages; private names
  used outside their module; SQL text edited by ``replace``/``sub``/``%``.

    .venv/bin/python benchmarks/targets.py [--rounds 5] [--baseline REF] [--only NAME ...]
        [--skip NAME ...] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "scripts"))  # the shape checker the tests use
import _bench  # noqa: E402
import code_shape  # noqa: E402

ROOT = HERE.parent

# The targets, by measurement and metric (compare the medians of the variant rows).
TARGETS: dict[str, dict[str, str]] = {
    "job_cost": {"statements": "2 (PostgreSQL)", "transactions": "2 (SQLite)",
                 "commits": "2", "rows": "", "events": "", "wal_pages": "",
                 "ledger_cpu_ms_per_job": "Celery on PostgreSQL <= 1.2 (client + server)"},
    "dramatiq_sqlite": {"ledger_cpu_ms": "<= 0.4", "cpu_ratio": ">= 0.45"},
    "celery_sqlite": {"noop.ratio_with_over_tracking": ">= 1.0",
                      "noop.ratio_with_over_without": ">= 0.8",
                      "noop.cpu_ratio_tracking_over_with": "",
                      "noop.cpu_ratio_without_over_with": "",
                      "noop.ledger_cpu_ms": ""},
    "celery_postgresql": {"sleep10ms.ratio_with_over_without": ">= 0.8",
                          "noop.ratio_with_over_without": ">= 0.6",
                          "noop.ledger_cpu_ms": "<= 1.2 (client + server)",
                          "noop.ledger_server_cpu_ms": "", "sleep10ms.ledger_cpu_ms": "",
                          "noop.cpu_ratio_without_over_with": ""},
    "dramatiq_postgresql": {"ratio": ">= 0.5", "cpu_ratio": "", "ledger_cpu_ms": ""},
    "transitions_postgresql": {"ratio_8_processes": ">= 0.7",
                               "ledger_cpu_us_per_transition": ""},
    "langgraph_saver": {"ratio_saver_noop_nodes": ">= 0.9", "ratio_saver_1ms_nodes": ">= 0.95",
                        "cpu_ratio_saver_noop_nodes": "", "cpu_ratio_saver_1ms_nodes": ""},
    "langgraph_server": {"p50_ratio_guarded_over_plain": "<= 1.25",
                         "ledger_cpu_ms_per_request": "", "cpu_ratio": ""},
    "transitions_sqlite": {"ledger_transitions_per_s": "not lower than before (14,128/s idle)",
                           "ledger_cpu_us_per_transition": "not higher than before"},
    "reconcile_1m": {"seconds": "<= 10", "cpu_seconds": ""},
    "code_shape": {"store_protocol_members": "<= 12", "store_protocol_callables": "<= 43",
                   "ledger_statements": "<= 80", "import_cycles": "0",
                   "private_names_outside_module": "0", "sql_text_edits": "0"},
}


# ----------------------------------------------------------------------------- variants


def baseline_python(ref: str, scratch: str) -> tuple[str, str, str]:
    """Export ``ref`` outside the repository and build its venv (reused if present):
    (python, tree, sha)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    tree = Path(scratch) / f"bench-baseline-{sha[:12]}"
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
        archive.wait()
        subprocess.run(["uv", "sync", "--all-packages", "--frozen", "--quiet"], cwd=str(tree),
                       check=True)
    return str(python), str(tree), sha


# ----------------------------------------------------------------------------- measurements


def _script(python: str, name: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 3600) -> dict[str, Any]:
    return _bench.run_json([python, str(HERE / name), *args],
                           env=_bench.python_env(env), timeout=timeout)


def _flat(prefix: str, data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
    return {f"{prefix}{k}": data[k] for k in keys if isinstance(data.get(k), int | float)}


class Run:
    """Settings of one targets run and the measurement functions (one round each)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        q = args.quick
        self.jobs = "300" if q else "1000"
        self.messages = "300" if q else "1000"
        self.tasks, self.sleep_tasks = ("200", "60") if q else ("1000", "200")
        self.seconds = "1" if q else "3"
        self.requests = "60" if q else "200"
        self.fixture: dict[str, Any] | None = None
        self.fixture_dir = ""

    # Each returns the metrics of one round (flat name -> number), or {"error": ...}.
    def job_cost(self, python: str) -> dict[str, Any]:
        data = _script(python, "job_cost.py", "--backends", "sqlite", "postgresql",
                       "--rounds", "1", "--jobs", self.jobs, "--pg", self.args.pg)
        if "error" in data:
            return data
        keys = ("statements", "transactions", "commits", "rows", "events", "wal_pages",
                "ledger_client_cpu_ms_per_job", "ledger_server_cpu_ms_per_job",
                "ledger_cpu_ms_per_job")
        out: dict[str, Any] = {}
        for backend in ("sqlite", "postgresql"):
            for flow in ("celery", "dramatiq"):
                out.update(_flat(f"{backend}.{flow}.", data[backend][flow], keys))
        return out

    def _dramatiq(self, python: str, db: str | None) -> dict[str, Any]:
        extra = ["--db", db] if db else []
        data = _script(python, "dramatiq_overhead.py", "--rounds", "1", "--messages",
                       self.messages, *extra)
        if "error" in data:
            return data
        return dict(data["per_round"][0])

    def dramatiq_sqlite(self, python: str) -> dict[str, Any]:
        return self._dramatiq(python, None)

    def dramatiq_postgresql(self, python: str) -> dict[str, Any]:
        url = _bench.pg_url(self.args.pg)
        try:
            return self._dramatiq(python, url)
        finally:
            _bench.drop_pg_schema(url)

    def _celery(self, python: str, db: str | None) -> dict[str, Any]:
        extra = ["--db", db] if db else []
        data = _script(python, "celery_overhead.py", "--rounds", "1", "--tasks", self.tasks,
                       "--sleep-tasks", self.sleep_tasks, *extra)
        if "error" in data:
            return data
        out: dict[str, Any] = {}
        for task, label in (("bench.noop", "noop"), ("bench.sleep10ms", "sleep10ms")):
            out.update({f"{label}.{k}": v for k, v in data["results"][task]["per_round"][0]
                        .items()})
        return out

    def celery_sqlite(self, python: str) -> dict[str, Any]:
        return self._celery(python, None)

    def celery_postgresql(self, python: str) -> dict[str, Any]:
        url = _bench.pg_url(self.args.pg)
        try:
            return self._celery(python, url)
        finally:
            _bench.drop_pg_schema(url)

    def transitions_postgresql(self, python: str) -> dict[str, Any]:
        data = _script(python, "transitions.py", "--db", self.args.pg, "--rounds", "1",
                       "--seconds", self.seconds, "--processes", "8")
        return data if "error" in data else dict(data["per_round"][0])

    def transitions_sqlite(self, python: str) -> dict[str, Any]:
        data = _script(python, "transitions.py", "--rounds", "1", "--seconds", self.seconds,
                       "--processes", "4")
        if "error" in data:
            return data
        out = dict(data["per_round"][0])
        out["multiprocess_4_per_s"] = data["multiprocess"]["transitions_per_s"]
        return out

    def langgraph_saver(self, python: str) -> dict[str, Any]:
        data = _script(python, "langgraph_overhead.py", "--rounds", "3", "--per-round",
                       "20" if self.args.quick else "50")
        if "error" in data:
            return data
        keys = ("ratio_saver_noop_nodes", "ratio_saver_1ms_nodes", "cpu_ratio_saver_noop_nodes",
                "cpu_ratio_saver_1ms_nodes", "extra_wall_ms_saver_noop_nodes",
                "extra_wall_ms_saver_1ms_nodes")
        return _flat("", data, keys)

    def langgraph_server(self, python: str) -> dict[str, Any]:
        data = _script(python, "langgraph_server.py", "--rounds", "1", "--requests",
                       self.requests, "--pg", self.args.pg)
        if "error" in data:
            return data
        row = data["per_round"][0]
        out = {k: v for k, v in row.items() if isinstance(v, int | float)}
        for side in ("plain", "guarded"):
            out.update({f"{side}.{k}": v for k, v in row[side].items()})
        return out

    def reconcile_1m(self, python: str) -> dict[str, Any]:
        if self.fixture is None:
            return {"error": "no fixture"}
        with tempfile.TemporaryDirectory(prefix="tsg-targets-apply-", dir=self.fixture_dir) as tmp:
            db = os.path.join(tmp, "tasks.sqlite")
            shutil.copyfile(self.fixture["db"], db)
            shutil.copytree(self.fixture["db"] + "-owners", db + "-owners")
            lock = os.open(os.path.join(db + "-owners", self.fixture["live"] + ".lock"),
                           os.O_RDWR)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the live owner, as scale.py
                opened = _bench.run_json([python, "-c", _OPEN, db], env=_bench.python_env())
                if "error" in opened:
                    return opened
                data = _bench.run_json([python, "-c", _APPLY, db, str(self.fixture["now"])],
                                       env=_bench.python_env(), timeout=3600)
            finally:
                os.close(lock)
        if "error" in data:
            return data
        out = {k: data[k] for k in ("seconds", "cpu_seconds", "peak_rss_mb")}
        out["open_seconds"] = opened["seconds"]
        out["tasks_timed_out"] = data["result"].get("tasks_timed_out")
        return out

    def build_fixture(self, pythons: dict[str, str], size: int) -> dict[str, Any]:
        """The 1M-task ledger, built by the first variant whose code writes today's layout."""
        self.fixture_dir = tempfile.mkdtemp(prefix="tsg-targets-")
        db = os.path.join(self.fixture_dir, "fixture", "tasks.sqlite")
        errors = {}
        for name in ("baseline", "current"):
            if name not in pythons:
                continue
            data = _bench.run_json([pythons[name], "-c", _BUILD, db, str(size), str(HERE)],
                                   env=_bench.python_env(), timeout=3600)
            if "error" not in data:
                data["db"] = db
                data["built_by"] = name
                self.fixture = data
                return data
            errors[name] = data
            shutil.rmtree(os.path.dirname(db), ignore_errors=True)
        return {"error": "fixture not built", "by_variant": errors}


# The fixture: scale.py's SQL builder (today's layout), its live and dead owner tokens.
_BUILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
import scale
try:
    from task_state_guard.sqlite import owners
except ImportError:  # a tree from before the SQLite backend's own package
    from task_state_guard import owners
db, size = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
now = scale.build_sql(db, size)
live = owners.own_token(db)
print(json.dumps({"now": now, "live": live, "tasks": size,
                  "build_seconds": round(time.perf_counter() - start, 1)}))
"""

# Opening the copy once (a newer variant migrates it here, outside the timed apply).
_OPEN = r"""
import json, sys, time
from task_state_guard import Ledger
start = time.perf_counter()
Ledger(sys.argv[1]).close()
print(json.dumps({"seconds": round(time.perf_counter() - start, 3)}))
"""

_APPLY = r"""
import json, sys, time
from task_state_guard import Ledger, ReconcilePolicy
db, now = sys.argv[1], float(sys.argv[2])
start = time.perf_counter()
cpu = time.process_time()
ledger = Ledger(db, clock=lambda: now + 1)
result = ledger.reconcile(ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=86400))
ledger.close()
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
print(json.dumps({"seconds": round(elapsed, 3), "cpu_seconds": round(cpu, 3),
                  "peak_rss_mb": round(rss, 1), "result": result}))
"""

MEASUREMENTS = ("job_cost", "dramatiq_sqlite", "celery_sqlite", "celery_postgresql",
                "dramatiq_postgresql", "transitions_postgresql", "langgraph_saver",
                "langgraph_server", "transitions_sqlite", "reconcile_1m")


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per metric per variant, and the per-round figures."""
    out: dict[str, Any] = {}
    for variant, entries in rounds.items():
        good = [e for e in entries if "error" not in e]
        keys = sorted({k for e in good for k, v in e.items() if isinstance(v, int | float)})
        out[variant] = {
            "medians": {k: _bench.median(e.get(k) for e in good) for k in keys},
            "rounds": len(good),
            "errors": [e for e in entries if "error" in e],
            "per_round": good,
        }
    return out


def side_by_side(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The targeted metrics' medians of every variant next to the target."""
    rows: dict[str, Any] = {}
    variants = {v: s for v, s in summary.items() if isinstance(s, dict) and "medians" in s}
    for metric, target in TARGETS.get(name, {}).items():
        values = {v: s["medians"].get(metric) for v, s in variants.items()}
        if name == "job_cost":
            values = {f"{v}.{key}": s["medians"][key] for v, s in variants.items()
                      for key in s["medians"] if key.endswith(f".{metric}")}
        rows[metric] = {"target": target, **values}
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="git ref measured beside this tree")
    parser.add_argument("--scratch", default="/work", help="parent folder of the baseline tree")
    parser.add_argument("--only", nargs="*", default=None, choices=(*MEASUREMENTS, "code_shape"))
    parser.add_argument("--skip", nargs="*", default=[], choices=(*MEASUREMENTS, "code_shape"))
    parser.add_argument("--scale", type=int, default=1_000_000, help="reconcile_1m's tasks")
    parser.add_argument("--quick", action="store_true", help="smaller rounds (a smoke run)")
    parser.add_argument("--pg", default=_bench.PG_BASE, help="PostgreSQL database URL")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args()
    chosen = [m for m in (*MEASUREMENTS, "code_shape")
              if (args.only is None or m in args.only) and m not in args.skip]
    report: dict[str, Any] = {"benchmark": "targets", "rounds": args.rounds,
                              "loadavg_1m_at_start": _bench.loadavg(),
                              "started_unix_time": round(time.time()), "quick": args.quick}
    pythons = {"current": sys.executable}
    trees = {"current": str(ROOT)}
    report["variants"] = {"current": {"tree": str(ROOT), "python": sys.executable,
                                      "commit": _head(ROOT)}}
    if args.baseline:
        python, tree, sha = baseline_python(args.baseline, args.scratch)
        pythons = {"baseline": python, "current": sys.executable}
        trees["baseline"] = tree
        report["variants"]["baseline"] = {"tree": tree, "python": python, "commit": sha,
                                          "ref": args.baseline}
    run = Run(args)
    results: dict[str, Any] = {}
    try:
        if "reconcile_1m" in chosen:
            report["reconcile_1m_fixture"] = run.build_fixture(pythons, args.scale)
        for name in chosen:
            if name == "code_shape":
                results[name] = {v: code_shape.measure(Path(t)) for v, t in trees.items()}
                continue
            measure: Callable[[str], dict[str, Any]] = getattr(run, name)
            rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in pythons}
            order = list(pythons)
            started = time.perf_counter()
            for i in range(args.rounds):
                for variant in order if i % 2 == 0 else list(reversed(order)):
                    rounds[variant].append(measure(pythons[variant]))
            results[name] = summarise(rounds)
            results[name]["seconds"] = round(time.perf_counter() - started, 1)
            print(f"targets: {name} done ({results[name]['seconds']} s, load "
                  f"{_bench.loadavg()})", file=sys.stderr, flush=True)
    finally:
        if run.fixture_dir:
            shutil.rmtree(run.fixture_dir, ignore_errors=True)
    report["results"] = results
    report["side_by_side"] = {
        name: (side_by_side(name, res) if name != "code_shape" else
               {m: {"target": t, **{v: res[v].get(m) for v in res}}
                for m, t in TARGETS["code_shape"].items()})
        for name, res in results.items()
    }
    report["loadavg_1m_at_end"] = _bench.loadavg()
    report.update({k: v for k, v in _bench.stamp().items() if k != "loadavg_1m"})
    text = json.dumps(report, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def _head(tree: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "packages"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (proc.stdout.strip() + ("+uncommitted" if dirty else "")) or None


if __name__ == "__main__":
    raise SystemExit(main())
