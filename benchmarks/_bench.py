"""What the benchmark scripts share: CPU readings from /proc, the PostgreSQL server's share of
a client's work, scratch PostgreSQL schemas, medians, and running a script for its JSON.

Server CPU: every process a benchmark starts gets its own ``PGAPPNAME`` (libpq's default
``application_name``), so the PostgreSQL backends serving it can be found in
``pg_stat_activity`` and their CPU read from ``/proc/<pid>/stat`` (the server runs on this
machine). A backend that ends inside a measured interval takes its CPU with it: the ledger's
connections live as long as their process, so none does.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PG_BASE = "postgresql://postgres@127.0.0.1:5432/test"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def is_postgres(db: str | None) -> bool:
    """True for a ``postgresql://`` ledger URL."""
    return bool(db) and str(db).startswith(("postgresql:", "postgres:"))


def loadavg() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def median(values: Iterable[float], digits: int = 3) -> float | None:
    """The median, rounded (None for no values)."""
    got = [v for v in values if v is not None]
    return round(statistics.median(got), digits) if got else None


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            data = stat.read()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()


def pid_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) used so far by these live processes."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / _TICK


def session_cpu_seconds(sid: int) -> float | None:
    """CPU seconds (user + system) used so far by the live processes of session ``sid``."""
    if not os.path.isdir("/proc"):
        return None
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is not None and int(fields[3]) == sid:  # field 6: session id
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICK


# ----------------------------------------------------------------------------- PostgreSQL


def split_url(url: str) -> tuple[str, str | None]:
    """(the URL without the ledger's own parameters, the schema)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    schema = next((v for k, v in query if k == "schema"), None)
    own = ("schema", "owner_reconnect_seconds", "connections")
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k not in own])
    return urllib.parse.urlunsplit(parts._replace(query=rest)), schema


def pg_url(base: str = PG_BASE, prefix: str = "tsgb") -> str:
    """A ledger URL in a fresh, unused schema of ``base``'s database."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema={prefix}_{uuid.uuid4().hex[:12]}"


def drop_pg_schema(url: str) -> None:
    """Drop the (benchmark's own) schema named in ``url``."""
    import psycopg

    base, schema = split_url(url)
    if not schema:
        return
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def app_name() -> str:
    """A fresh ``application_name`` for one measured process (set it as ``PGAPPNAME``)."""
    return f"tsg-bench-{uuid.uuid4().hex[:10]}"


class ServerCpu:
    """The CPU the PostgreSQL backends of one ``application_name`` used between two readings."""

    def __init__(self, base: str, name: str) -> None:
        import psycopg

        self.name = name
        self._conn = psycopg.connect(split_url(base)[0], autocommit=True)
        self._start: dict[int, float] = {}

    def pids(self) -> list[int]:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.name,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def start(self) -> None:
        self._start = {pid: pid_cpu_seconds([pid]) for pid in self.pids()}

    def seconds(self) -> float:
        """Server CPU seconds since :meth:`start` (a backend born since then counts whole; one
        gone meanwhile is not counted: read this before the client disconnects)."""
        total = 0.0
        for pid in self.pids():
            if _stat_fields(pid) is not None:
                total += pid_cpu_seconds([pid]) - self._start.get(pid, 0.0)
        return total

    def close(self) -> None:
        self._conn.close()


# ----------------------------------------------------------------------------- subprocesses


def stop_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process started with ``start_new_session=True`` and its group; SIGKILL after
    30 s."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def run_json(cmd: Sequence[str], env: dict[str, str] | None = None,
             timeout: float | None = None) -> dict[str, Any]:
    """Run a benchmark script and return the JSON object on its last line of output."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}
    try:
        data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except ValueError:
        return {"error": "no JSON", "stdout_tail": proc.stdout[-2000:]}
    return data


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``extra``, the benchmarks folder on ``PYTHONPATH``."""
    env = dict(os.environ)
    env.update(extra or {})
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != HERE]
    env["PYTHONPATH"] = os.pathsep.join([HERE, *paths])
    return env


def stamp() -> dict[str, Any]:
    """What every report carries: interpreter, cores and the load average now."""
    return {"python": sys.version.split()[0], "cpus": os.cpu_count(), "loadavg_1m": loadavg(),
            "unix_time": round(time.time())}


__all__ = [
    "PG_BASE", "ServerCpu", "app_name", "drop_pg_schema", "is_postgres", "loadavg", "median",
    "pg_url", "pid_cpu_seconds", "python_env", "run_json", "session_cpu_seconds", "split_url",
    "stamp", "stop_session",
]
