"""Page loads of `tsg serve` on a large ledger, beside the read commands they correspond to.

Builds a ledger with :mod:`scale`'s SQL loader (its task mix: per block of 20, 3 running, 1
queued, 8 closed roots each with one closed child), starts ``tsg serve`` on it (cleanly
closed, so each request opens it in place), and requests each page a few times; the server's
peak RSS (VmHWM) is read at the end, and its CPU time per page from /proc (steadier than wall
time on a loaded machine). ``tsg status`` and ``tsg tasks`` run beside, in fresh processes, so
the ratios compare a page with the command it shows. Each page's first request is timed on
its own (``first_seconds``: the read itself), then the median of the next ones
(``median_seconds``: what the server's few-second reuse of an expensive page serves).
``--core-src DIR`` serves another tree's core package (e.g. a ``git archive`` of an earlier
commit) for a before/after comparison on the same ledger build. Prints one JSON object.

    python benchmarks/serve_pages.py                    # 1,000,000 tasks
    python benchmarks/serve_pages.py --sizes 100000
    python benchmarks/serve_pages.py --core-src /tmp/base/packages/core/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from scale import CORE_SRC, _root_with_child, build_sql, measure_cli  # noqa: E402

REPEATS = 3


def _pages(root_id: str) -> dict[str, str]:
    return {
        "overview": "/",
        "overview_7d": "/?window=7d",
        "stuck_first_page": "/stuck",
        "stuck_by_idle": "/stuck?sort=activity",
        "stuck_running_named": "/stuck?status=running&name=agent.plan",
        "stuck_name_search": "/stuck?q=plan",
        "stuck_name_search_closed": "/stuck?q=plan&status=succeeded",
        "stuck_by_code": "/stuck?code=worker_completed",
        "stuck_by_rare_code": "/stuck?code=owner_lost",
        "stuck_owed_results": "/stuck?flag=awaiting_delivery",
        "stuck_past_deadline": "/stuck?flag=past_deadline",
        "stuck_owner_dead": "/stuck?flag=owner_dead",
        "stuck_verdicts_pending": "/stuck?flag=verdict_pending",
        "job": f"/job?id={root_id}&kind=ledger",
        "metrics": "/metrics",
    }


def _get(url: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:  # the server on loopback
        body = response.read()
        status = response.status
    return time.perf_counter() - started, status, len(body)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_size(base: str, size: int, core_src: str = CORE_SRC) -> dict[str, object]:
    db = os.path.join(base, f"ledger-{size}", "tasks.sqlite")
    started = time.perf_counter()
    build_sql(db, size)
    results: dict[str, object] = {"tasks": size, "load_seconds": round(
        time.perf_counter() - started, 1), "db_file_mb": round(os.path.getsize(db) / 2**20, 1)}
    root_id = _root_with_child(db)
    env = dict(os.environ, PYTHONPATH=core_src, PYTHONDONTWRITEBYTECODE="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "task_state_guard", "--db", db, "serve", "--listen",
         "127.0.0.1:0", "--refresh", "0", "--no-token"],  # a benchmark's own loopback server
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert server.stdout is not None
        base_url = "http://" + json.loads(server.stdout.readline())["listen"]
        pages: dict[str, object] = {}
        for name, path in _pages(root_id).items():
            cpu = _cpu_seconds(server.pid)
            first = _get(base_url + path)
            first_cpu = _cpu_seconds(server.pid) - cpu
            runs = [_get(base_url + path) for _ in range(REPEATS)]
            pages[name] = {"first_seconds": round(first[0], 3),
                           "first_server_cpu_seconds": round(first_cpu, 3),
                           "median_seconds": round(statistics.median(r[0] for r in runs), 3),
                           "status": first[1], "bytes": first[2]}
        results["pages"] = pages
        results["server_peak_rss_mb"] = round(_peak_rss_mb(server.pid), 1)
    finally:
        server.terminate()
        server.wait(60)
    status = measure_cli(db, ["status"])
    tasks = measure_cli(db, ["tasks", "--details", "--limit", "50"])
    results["cli"] = {"status": status, "tasks_50": tasks}
    overview = pages["overview"]["first_seconds"]  # type: ignore[index]
    stuck = pages["stuck_first_page"]["first_seconds"]  # type: ignore[index]
    overview_cpu = pages["overview"]["first_server_cpu_seconds"]  # type: ignore[index]
    results["ratios"] = {
        "overview_vs_status": round(overview / max(float(status["seconds"]), 1e-3), 2),
        "overview_vs_status_cpu": round(overview_cpu / max(float(status["cpu_seconds"]), 1e-3),
                                        2),
        "stuck_vs_tasks_50": round(stuck / max(float(tasks["seconds"]), 1e-3), 2),
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--core-src", default=CORE_SRC,
                        help="the core package's source tree the server runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsg-serve-") as base:
        runs = [run_size(base, size, os.path.abspath(args.core_src)) for size in args.sizes]
    print(json.dumps({"benchmark": "serve_pages", "runs": runs}, sort_keys=True))


if __name__ == "__main__":
    main()
