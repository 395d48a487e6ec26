"""Privacy: the source audit, and no trace of private text after a run with canaries (the core
run, the adapters' runs and the leak finder's own check on each ledger backend: ``[sqlite]``
scans the file, its sidecars and owner lock files, ``[postgresql]`` every row of the ledger's
schema)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import ledger_backends
from task_state_guard import (
    InvalidInput,
    Ledger,
    LedgerError,
    ReconcilePolicy,
    payload_fingerprint,
)

from .conftest import REPO, cli_env, private_dir, run_cli
from .privacy_hooks import find_leaks, host_markers, ledger_files, load_adapter_runs

CANARY = "Cq9-privacy-canary prompt: my password is hunter2!"


def _audit(*args: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "privacy_audit.py"), *args],
                          capture_output=True, text=True, timeout=120, env=cli_env(),
                          check=False)
    assert proc.stderr == ""
    return proc.returncode, json.loads(proc.stdout)


def test_privacy_audit_of_all_packages_is_clean() -> None:
    code, report = _audit()
    assert report["packages"] == 5 and report["files_scanned"] > 4  # type: ignore[operator]
    assert code == 0 and report["ok"], report["findings"]


def test_privacy_audit_self_test() -> None:
    code, report = _audit("--self-test")
    assert code == 0 and report["ok"], report


def test_privacy_audit_reports_findings_without_text(tmp_path: Path) -> None:
    pkg = tmp_path / "packages" / "core" / "src" / "leaky"
    pkg.mkdir(parents=True)
    secret = "AKIA" + "Z" * 16
    (pkg / "mod.py").write_text(f"import socket\nKEY = {secret!r}\n")
    code, report = _audit("--root", str(tmp_path))
    assert code == 1 and report["ok"] is False
    assert secret not in json.dumps(report)
    assert {(f["path"], f["category"]) for f in report["findings"]} == {  # type: ignore[union-attr]
        ("packages/core/src/leaky/mod.py", "network-import"),
        ("packages/core/src/leaky/mod.py", "secret")}


def _free_text_is_rejected(ledger: Ledger, tid: str) -> int:
    """Offer the canary to every API argument that takes a string; none may accept it."""
    offers = [
        lambda: ledger.create_task(name=CANARY),
        lambda: ledger.create_task(task_id=CANARY),
        lambda: ledger.create_task(parent_id=CANARY),
        lambda: ledger.create_task(payload_hash=CANARY),
        lambda: ledger.create_task(framework_id=CANARY),
        lambda: ledger.start_task(CANARY),
        lambda: ledger.heartbeat(CANARY),
        lambda: ledger.heartbeat_many([CANARY]),
        lambda: ledger.close_task(tid, CANARY),
        lambda: ledger.close_task(tid, "failed", code=CANARY),
        lambda: ledger.set_delivery(tid, CANARY),
        lambda: ledger.set_delivery(tid, "failed", code=CANARY),
        lambda: ledger.find_task_ids(CANARY),
        lambda: ledger.get_task(CANARY),
        lambda: ledger.children_of(CANARY),
        lambda: ledger.prune(CANARY),  # type: ignore[arg-type]
        lambda: ledger.status(active_grace_seconds=CANARY),  # type: ignore[arg-type]
        lambda: ReconcilePolicy(active_grace_seconds=CANARY),  # type: ignore[arg-type]
        lambda: payload_fingerprint([CANARY]),  # type: ignore[arg-type]
    ]
    rejected = 0
    for offer in offers:
        try:
            offer()
        except LedgerError as exc:  # InvalidInput, or a state check that comes first
            assert CANARY not in str(exc) and "hunter2" not in repr(exc.args)
            rejected += isinstance(exc, InvalidInput)
        else:
            raise AssertionError("the API accepted free text")
    return rejected


def test_core_run_with_canaries_leaves_no_trace(backend: str) -> None:
    """On each backend: the SQLite file, its sidecars and owner lock files, or every row of the
    PostgreSQL schema, and every output."""
    marker = "pathmark" + uuid.uuid4().hex[:10]
    base = private_dir()
    (base / marker).mkdir(mode=0o700)
    with ledger_backends.ledger_target(backend, base / marker) as db:
        _canary_run(backend, db, marker, base)


def _canary_run(backend: str, db: str, marker: str, base: Path) -> None:
    outputs: list[str] = []
    with Ledger(db) as ledger:
        parent = ledger.create_task(name="agent.run", timeout_seconds=60,
                                    payload_hash=payload_fingerprint(CANARY.encode()))
        child = ledger.create_task(parent_id=parent.id, delivery_required=False,
                                   name="agent.step")
        ledger.start_task(parent.id)
        ledger.start_task(child.id)
        ledger.heartbeat(child.id)
        assert _free_text_is_rejected(ledger, child.id) >= 17
        ledger.close_task(child.id, "failed", code="worker_failed")
        ledger.close_task(parent.id, "succeeded", code="worker_completed")
        ledger.set_delivery(parent.id, "delivered", code="transport_acknowledged")
        outputs.append(json.dumps(ledger.reconcile(ReconcilePolicy(0, 0))))
        outputs.append(json.dumps(ledger.status()))
        outputs.append(json.dumps(ledger.doctor()))
        outputs.append(repr(ledger.get_task(parent.id)))
    cli_args = [
        ["create", "--name", CANARY], ["create", "--payload-sha256", CANARY],
        ["create", "--id", CANARY], ["close", child.id, "--status", "failed", "--code", CANARY],
        ["delivery", child.id, "--status", CANARY], ["tasks", "--status", CANARY],
        ["reconcile", "--active-grace-seconds", CANARY], ["get", parent.id],
        ["children", parent.id], ["status"], ["status", "--format", "text"], ["metrics"],
        ["doctor"], ["reconcile", "--dry-run"], ["prune", "--older-than", "0", "--dry-run"],
        ["tasks", "--status", "succeeded"],
    ]
    for args in cli_args:
        code, out, err = run_cli("--db", str(db), *args,
                                 env=cli_env(TSG_DELIVERY_GRACE_SECONDS="5"))
        assert err == "" and code in (0, 2)
        outputs.append(out)
    if backend == "sqlite":
        assert len(ledger_files(Path(db))) >= 1
    secrets = [CANARY, "hunter2", "privacy-canary", marker, str(base), *host_markers()]
    assert find_leaks(db, secrets, outputs) == []


def test_leak_finder_is_not_vacuous(ledger_target: str) -> None:
    db = ledger_target
    with Ledger(db) as ledger:
        ledger.create_task(name="visible.label")
    assert find_leaks(db, ["visible.label"]) != []
    assert find_leaks(db, ["absent-word"], [f"out {CANARY}"]) == []
    assert find_leaks(db, [CANARY], [f"out {CANARY}"]) == ["output#0:Cq9..."]


def test_adapter_runs_leave_no_trace(backend: str) -> None:
    """Hook: every registered adapter privacy run (see privacy_hooks.py) must leave no trace, on
    each backend: the SQLite file, its sidecars and owner lock files, or every row of the
    PostgreSQL schema the adapters wrote, and every output."""
    runs = load_adapter_runs()
    assert set(runs) == {"celery", "dramatiq", "langgraph"}
    for name, run in sorted(runs.items()):
        with ledger_backends.ledger_target(backend, private_dir() / f"{name}-ledger") as db:
            outputs = run(db, CANARY)
            with Ledger(db, read_only=True) as ledger:
                assert ledger.doctor()["task_count"] > 0, f"{name}: the run did not use the ledger"
            leaks = find_leaks(db, [CANARY, "hunter2", *host_markers()], outputs)
            assert leaks == [], f"{name}: {leaks}"
