"""Helpers for the PostgreSQL backend tests: worker processes and direct SQL inspection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg

WORKER = str(Path(__file__).with_name("pg_worker.py"))


def schema_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["schema"][0]


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement in the URL's schema on a connection of its own (autocommit)."""
    base = url.split("?", 1)[0]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema_of(url)}"')
        cur = conn.execute(statement, params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


class Workers:
    """Worker processes started by one test (all killed at its end)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, mode: str, url: str, *args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, WORKER, mode, url, *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ),
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def line(proc: subprocess.Popen[str], timeout: float = 60.0) -> Any:
        """The worker's next JSON line (fails the test if it ends or stalls first)."""
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = proc.stdout.readline()
            if text:
                return json.loads(text)
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr else ""
                raise AssertionError(f"worker ended early: {err[-2000:]}")
        raise AssertionError("worker stalled")

    def finish(self, proc: subprocess.Popen[str], timeout: float = 120.0) -> Any:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
