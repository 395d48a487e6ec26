"""One-step set-up and entry point for a fresh machine that only has python3 (>= 3.11).

    python3 scripts/dev.py demo    # set up, then run the Celery crash-recovery demo
    python3 scripts/dev.py test    # set up, start Redis/RabbitMQ if needed, run every check

Set-up: installs uv into ./.tools (a private virtual environment) when it is not on PATH, then
``uv sync --all-packages --frozen`` builds ./.venv from uv.lock with the four packages and the
dev tools. ``test`` runs ruff, mypy --strict on the core, and the whole pytest suite (real
Celery/Dramatiq workers against Redis and RabbitMQ on 127.0.0.1). A broker that cannot be
started is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, ".tools")


def run(cmd: list[str], **kwargs: object) -> int:
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, **kwargs)  # type: ignore[call-overload, no-any-return]


def uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    local = os.path.join(TOOLS, "bin", "uv")
    if not os.path.exists(local):
        if run([sys.executable, "-m", "venv", TOOLS]) != 0:
            sys.exit("could not create .tools (python3 -m venv)")
        if run([os.path.join(TOOLS, "bin", "python"), "-m", "pip", "install", "-q", "uv"]) != 0:
            sys.exit("could not install uv from the package index")
    return local


def sync() -> None:
    if run([uv(), "sync", "--all-packages", "--frozen", "--python", sys.executable]) != 0:
        sys.exit("uv sync failed")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ensure_services() -> None:
    """Start Redis, RabbitMQ and PostgreSQL on 127.0.0.1 when they are not running."""
    if not _listening(6379):
        run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379",
             "--save", "", "--appendonly", "no"])
        for _ in range(50):
            if _listening(6379):
                break
            time.sleep(0.2)
    if not _listening(5672):
        run(["rabbitmq-server", "-detached"])
        for _ in range(10):  # the node needs a moment before rabbitmqctl can even reach it
            if run(["rabbitmqctl", "-q", "await_startup", "--timeout", "120"],
                   stderr=subprocess.DEVNULL) == 0:
                break
            time.sleep(2)
        for _ in range(100):
            if _listening(5672):
                break
            time.sleep(0.5)
    if not _listening(5432):
        run(["pg_ctlcluster", "15", "main", "start"])
        for _ in range(50):
            if _listening(5432):
                break
            time.sleep(0.2)
    missing = [
        name
        for name, port in (("redis", 6379), ("rabbitmq", 5672), ("postgresql", 5432))
        if not _listening(port)
    ]
    if missing:
        print("brokers not reachable: " + ", ".join(missing) + " (tests will fail)", flush=True)


def main() -> int:
    command = sys.argv[1] if len(sys.argv) > 1 else "help"
    extra = sys.argv[2:]
    if command not in ("demo", "test", "setup"):
        print(__doc__)
        return 2
    sync()
    venv_bin = os.path.join(ROOT, ".venv", "bin")
    python = os.path.join(venv_bin, "python")
    if command == "setup":
        return 0
    if command == "demo":
        return run([python, "examples/celery_crash_demo.py", *extra])
    ensure_services()
    status = run([os.path.join(venv_bin, "ruff"), "check", "."])
    status |= run([os.path.join(venv_bin, "mypy"), "--strict", "packages/core/src",
                   *(f"packages/adapter-{a}/src" for a in ("celery", "dramatiq", "langgraph"))])
    status |= run([python, "-m", "pytest", "-q", *extra])
    return 1 if status else 0


if __name__ == "__main__":
    raise SystemExit(main())
