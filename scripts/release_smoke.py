#!/usr/bin/env python3
"""Install each built wheel into a fresh virtual environment and run it for real.

Core (``task-state-guard``): a new venv, ``pip install --no-index --find-links DIST`` (fully
offline, from the built files only), then a real lifecycle through the INSTALLED console scripts
(``task-state-guard`` and ``tsg``): init, create, start, heartbeat, child, close, delivery,
reconcile preview and apply, doctor, status, metrics, get, children, tasks, prune. Every output
must be exactly one JSON line (the text formats excepted), nothing on stderr, the expected exit
code; the package must be imported from the venv, never from the checkout.

Adapters: the adapter wheel and the core wheel come from DIST (given as files, so nothing of
ours is taken from an index), but their frameworks (celery[redis], dramatiq, langgraph) are
third-party and are resolved from the package index by pip - there is no offline copy of them
here. Then the adapter is imported in that venv and its documented entry points are checked.
``--offline`` restricts the run to the core.

    python scripts/release_smoke.py [--dist dist] [--packages core adapter-celery ...] [--offline]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ADAPTERS = {
    "adapter-celery": ("task_state_guard_celery", "task-state-guard-celery"),
    "adapter-dramatiq": ("task_state_guard_dramatiq", "task-state-guard-dramatiq"),
    "adapter-langgraph": ("task_state_guard_langgraph", "task-state-guard-langgraph"),
}
# The entry points each adapter documents in its README: module-level names, and
# "Class.method" for delivery marks that live on the installed object.
ADAPTER_EXPORTS = {
    "adapter-celery": ("install", "logical_task_id", "mark_delivered", "mark_delivery_failed"),
    "adapter-dramatiq": ("install", "logical_task_id", "TaskStateGuardMiddleware.mark_delivered",
                         "TaskStateGuardMiddleware.mark_delivery_failed"),
    "adapter-langgraph": ("guard", "logical_task_id", "GuardedGraph.mark_delivered",
                          "GuardedGraph.mark_delivery_failed"),
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TSG_", "PIP_", "UV_"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONNOUSERSITE="1")
    env.update(extra)
    return env


def make_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True,
                   env=clean_env(), capture_output=True)
    return where / "bin" / "python"


def wheel(dist: Path, dist_name: str) -> Path:
    stem = dist_name.replace("-", "_") + "-"
    found = sorted(p for p in dist.glob("*.whl") if p.name.startswith(stem)
                   and p.name[len(stem):len(stem) + 1].isdigit())
    if len(found) != 1:
        raise SystemExit(f"expected one wheel for {dist_name} in the dist directory")
    return found[0]


def pip_install(python: Path, args: list[str]) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args],
                          capture_output=True, text=True, env=clean_env(), check=False)
    if proc.returncode != 0:
        raise RuntimeError("pip install failed: " + proc.stderr[-3000:])


def _cli(exe: Path, db: Path | str, *args: str, expect: int = 0, json_out: bool = True) -> Any:
    proc = subprocess.run([str(exe), "--db", str(db), *args], capture_output=True, text=True,
                          env=clean_env(), timeout=60, check=False, stdin=subprocess.DEVNULL)
    if proc.stderr or proc.returncode != expect:
        raise AssertionError(f"{args[0]}: exit {proc.returncode}, stderr {bool(proc.stderr)}")
    if not json_out:
        return proc.stdout
    lines = proc.stdout.split("\n")
    if len(lines) != 2 or lines[1] != "":
        raise AssertionError(f"{args[0]}: not exactly one line")
    return json.loads(lines[0])


def smoke_core(dist: Path, work: Path) -> dict[str, Any]:
    python = make_venv(work / "venv-core")
    pip_install(python, ["--no-index", "--find-links", str(dist), "task-state-guard"])
    bindir = python.parent
    where = subprocess.run(
        [str(python), "-c", "import task_state_guard as t, sys; "
                            "print(t.__file__); print(t.__version__)"],
        capture_output=True, text=True, env=clean_env(), check=True, cwd=work).stdout.split()
    if not where[0].startswith(str(work / "venv-core")):
        raise AssertionError("task_state_guard was not imported from the fresh venv")
    ledger_dir = work / "state"
    ledger_dir.mkdir(mode=0o700)
    db = ledger_dir / "tasks.sqlite"
    tsg, long_name = bindir / "tsg", bindir / "task-state-guard"
    version = subprocess.run([str(long_name), "--version"], capture_output=True, text=True,
                             env=clean_env(), check=True).stdout.strip()
    steps = 0

    def cli(*args: str, **kw: Any) -> Any:
        nonlocal steps
        steps += 1
        return _cli(tsg if steps % 2 else long_name, db, *args, **kw)

    init = cli("init")["storage"]
    assert init["schema_version"] == 9 and init["permission_model"] == "posix_mode"
    parent = cli("create", "--timeout-seconds", "600", "--name", "smoke.parent")["task"]
    assert cli("start", parent["id"])["task"]["status"] == "running"
    assert cli("heartbeat", parent["id"])["task"]["version"] == 1  # a heartbeat does not count
    assert cli("get", parent["id"], "--extras")["task"]["heartbeat_at"] is not None
    child = cli("create", "--parent", parent["id"], "--internal", "--name", "smoke.child")["task"]
    cli("start", child["id"])
    assert cli("close", child["id"], "--status", "succeeded", "--code", "worker_completed")["ok"]
    closed = cli("close", parent["id"], "--status", "succeeded", "--code", "completed")["task"]
    assert closed["terminal_code"] == "completed" and closed["version"] == 2
    assert cli("close", parent["id"], "--status", "failed", expect=2)["error"] == "StateConflict"
    assert cli("delivery", parent["id"], "--status", "delivered",
               "--code", "transport_acknowledged")["ok"]
    preview = cli("reconcile", "--delivery-grace-seconds", "0", "--dry-run")["reconcile"]
    applied = cli("reconcile", "--delivery-grace-seconds", "0")["reconcile"]
    assert preview["dry_run"] and applied["applied"]
    assert {k: v for k, v in preview.items() if k not in ("dry_run", "applied")} == {
        k: v for k, v in applied.items() if k not in ("dry_run", "applied")}
    assert applied["deliveries_not_applicable"] == 1
    doctor = cli("doctor")
    assert doctor["healthy"] and doctor["task_count"] == 2
    status = cli("status")["status"]
    assert status["tasks"]["succeeded"] == 2 and status["deliveries"]["delivered"] == 1
    assert "tsg_tasks" in cli("metrics", json_out=False)
    assert cli("get", parent["id"])["task"]["delivery_status"] == "delivered"
    assert [c["id"] for c in cli("children", parent["id"])["children"]] == [child["id"]]
    assert set(cli("tasks", "--status", "succeeded")["task_ids"]) == {parent["id"], child["id"]}
    assert cli("prune", "--older-than", "0")["prune"]["tasks_deleted"] == 2
    assert cli("doctor")["task_count"] == 0
    return {"package": "core", "ok": True, "version": version, "cli_steps": steps,
            "installed_from": "dist (offline)"}


def smoke_adapter(dist: Path, work: Path, key: str) -> dict[str, Any]:
    module, dist_name = ADAPTERS[key]
    python = make_venv(work / f"venv-{key}")
    pip_install(python, [str(wheel(dist, "task-state-guard")), str(wheel(dist, dist_name))])
    code = (
        "import importlib, json, sys\n"
        f"m = importlib.import_module({module!r})\n"
        "import task_state_guard as core\n"
        "def has(path):\n"
        "    obj = m\n"
        "    for part in path.split('.'):\n"
        "        if not hasattr(obj, part):\n"
        "            return False\n"
        "        obj = getattr(obj, part)\n"
        "    return callable(obj)\n"
        f"missing = [n for n in {ADAPTER_EXPORTS[key]!r} if not has(n)]\n"
        "tid = m.logical_task_id('smoke-framework-id')\n"
        "import uuid; uuid.UUID(str(tid))\n"
        "print(json.dumps({'module': m.__file__, 'core': core.__file__, 'missing': missing}))\n"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          env=clean_env(), check=False, cwd=work)
    if proc.returncode != 0:
        raise AssertionError(f"{key}: import failed: {proc.stderr[-1500:]}")
    info = json.loads(proc.stdout)
    venv = str(work / f"venv-{key}")
    if not (info["module"].startswith(venv) and info["core"].startswith(venv)):
        raise AssertionError(f"{key}: not imported from the fresh venv")
    if info["missing"]:
        raise AssertionError(f"{key}: missing exports {info['missing']}")
    return {"package": key, "ok": True, "installed_from": "dist (ours) + index (framework)"}


#: The PostgreSQL server the backend's smoke uses (a schema of its own, dropped afterwards).
SMOKE_PG = os.environ.get("TSG_SMOKE_PG", "postgresql://postgres@127.0.0.1:5432/test")


def smoke_postgres(dist: Path, work: Path) -> dict[str, Any]:
    """The backend's wheel with the core's, psycopg from the index: a lifecycle through the
    installed CLI against a fresh schema, and the fixed error without the backend."""
    python = make_venv(work / "venv-backend-postgres")
    pip_install(python, [str(wheel(dist, "task-state-guard")),
                         str(wheel(dist, "task-state-guard-postgres"))])
    tsg = python.parent / "tsg"
    schema = "tsg_smoke_" + uuid.uuid4().hex[:16]
    url = f"{SMOKE_PG}{'&' if '?' in SMOKE_PG else '?'}schema={schema}"
    try:
        init = _cli(tsg, url, "init")["storage"]
        assert init["backend"] == "postgresql" and init["schema_version"] == 8
        task = _cli(tsg, url, "create", "--name", "smoke.pg")["task"]
        _cli(tsg, url, "start", task["id"])
        closed = _cli(tsg, url, "close", task["id"], "--status", "succeeded")
        assert closed["task"]["status"] == "succeeded"
        assert _cli(tsg, url, "doctor")["healthy"]
        assert _cli(tsg, url, "status")["status"]["tasks"]["succeeded"] == 1
    finally:
        subprocess.run([str(python), "-c", "import sys, task_state_guard_postgres as p; "
                        "p.drop_schema(sys.argv[1])", url], env=clean_env(), check=False,
                       capture_output=True, timeout=60)
    return {"package": "backend-postgres", "ok": True,
            "installed_from": "dist (ours) + index (psycopg)"}


def run(dist: Path, packages: list[str], keep: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    results = []
    work = Path(tempfile.mkdtemp(prefix="tsg-smoke-"))
    os.chmod(work, 0o700)
    try:
        for key in packages:
            try:
                if key == "core":
                    results.append(smoke_core(dist, work))
                elif key == "backend-postgres":
                    results.append(smoke_postgres(dist, work))
                else:
                    results.append(smoke_adapter(dist, work, key))
            except (AssertionError, RuntimeError, subprocess.CalledProcessError) as exc:
                results.append({"package": key, "ok": False, "error": str(exc)[:2000]})
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return {"ok": all(r["ok"] for r in results) and len(results) == len(packages),
            "results": results, "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install built wheels and run them.")
    parser.add_argument("--dist", default=str(REPO / "dist"))
    parser.add_argument("--packages", nargs="*", default=["core", *ADAPTERS, "backend-postgres"],
                        choices=["core", *ADAPTERS, "backend-postgres"])
    parser.add_argument("--offline", action="store_true", help="core only, no package index")
    args = parser.parse_args(argv)
    packages = ["core"] if args.offline else args.packages
    result = run(Path(args.dist), packages)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
