"""Helpers for tests/examples: run the shipped entrypoint, tsg and example processes for real."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DEPLOY = EXAMPLES / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
#: the interpreter's bin directory: tsg, celery and uvicorn as a container would have on PATH
BIN = str(Path(sys.executable).parent)


@dataclass
class Ledgers:
    data: Path
    #: a PostgreSQL ledger URL (a schema of the test's own) instead of the volume's file
    url: str | None = None

    @property
    def db(self) -> str:
        """The ledger: on SQLite one directory below the volume, as the manifests place it."""
        return self.url or str(self.data / "tsg" / "tasks.sqlite")


def base_env(**extra: str) -> dict[str, str]:
    """The test's environment with the interpreter's scripts first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSG_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def tsg(db: str, *args: str, check: bool = True) -> dict[str, Any]:
    """Run the real CLI; return its one JSON line."""
    proc = subprocess.run(
        [os.path.join(BIN, "tsg"), "--db", db, *args],
        capture_output=True, text=True, timeout=120, env=base_env(),
    )
    assert proc.stderr == "", proc.stderr
    if check:
        assert proc.returncode == 0, proc.stdout
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines of an output (tsg's), skipping the worker's own lines."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # e.g. the ledger or the server is not there yet
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or predicate!r}; last={last!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """A long-running process started through the shipped entrypoint (its own session)."""

    def __init__(
        self, command: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path,
        entrypoint: bool = True,
    ) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115
        argv = ["sh", str(ENTRYPOINT), *command] if entrypoint else list(command)
        self.proc = subprocess.Popen(
            argv, env=env, cwd=str(cwd), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 90.0) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited early ({self.proc.returncode}):\n{self.log()}")
            return needle in self.log()

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if seen():
                return
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} not logged:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL the whole process group, as a container runtime kills a container."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(30)
        self._log.close()
