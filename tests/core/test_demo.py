"""The specification's restart demo: run twice, byte-identical output, and the three reconcile
lines exactly as the specification prints them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from core_helpers import cli_env

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "restart_reconciliation_demo.py"

SPEC_LINES = [
    '[preview] output: {"ok":true,"reconcile":{"active_examined":2,"applied":false,'
    '"deliveries_failed":1,"deliveries_not_applicable":1,"dry_run":true,'
    '"fresh_active_retained":1,"pending_delivery_examined":3,"pending_delivery_retained":1,'
    '"tasks_timed_out":1}}',
    '[apply] output: {"ok":true,"reconcile":{"active_examined":2,"applied":true,'
    '"deliveries_failed":1,"deliveries_not_applicable":1,"dry_run":false,'
    '"fresh_active_retained":1,"pending_delivery_examined":3,"pending_delivery_retained":1,'
    '"tasks_timed_out":1}}',
    '[idempotent-recheck] output: {"ok":true,"reconcile":{"active_examined":1,"applied":true,'
    '"deliveries_failed":0,"deliveries_not_applicable":0,"dry_run":false,'
    '"fresh_active_retained":1,"pending_delivery_examined":1,"pending_delivery_retained":1,'
    '"tasks_timed_out":0}}',
]


def run_demo(tmpdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli_env({"TMPDIR": str(tmpdir)})
    return subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=120, check=False)


@pytest.mark.sqlite_only(reason="the demo makes its own SQLite ledger in a temporary directory")
def test_demo_twice_identical_and_matches_specification(tmp_path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    first = run_demo(scratch)
    second = run_demo(scratch)
    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 0
    assert first.stderr == "" and second.stderr == ""
    assert first.stdout == second.stdout
    lines = first.stdout.splitlines()
    outputs = [line for line in lines if " output: " in line]
    assert outputs[:3] == SPEC_LINES
    doctor = [line for line in outputs if line.startswith("[doctor] output: ")]
    assert len(doctor) == 1
    assert '"healthy":true' in doctor[0]
    assert '"task_count":4' in doctor[0] and '"event_count":10' in doctor[0]
    commands = [line for line in lines if " command: " in line]
    assert [c.split("]")[0] for c in commands] == [
        "[preview", "[apply", "[idempotent-recheck", "[doctor"]
    assert all("<temporary-demo>" in c for c in commands)
    assert str(scratch) not in first.stdout
    assert os.listdir(scratch) == []  # the temporary ledger is removed


@pytest.mark.sqlite_only(reason="the demo makes its own SQLite ledger in a temporary directory")
def test_demo_as_the_specification_runs_it(tmp_path) -> None:
    """``PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=src python3 examples/...`` from the repository
    root (this repository keeps the core's source under packages/core/src; the demo finds it),
    and the Windows form with ``--allow-external-acl``: the same three reconcile lines."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    env = cli_env({"TMPDIR": str(scratch), "PYTHONPATH": "src", "PYTHONDONTWRITEBYTECODE": "1"})
    for args in ([], ["--allow-external-acl"]):
        proc = subprocess.run([sys.executable, "examples/restart_reconciliation_demo.py", *args],
                              capture_output=True, text=True, env=env, cwd=str(REPO),
                              timeout=120, check=False)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        outputs = [line for line in proc.stdout.splitlines() if " output: " in line]
        assert outputs[:3] == SPEC_LINES
    bad = run_demo(scratch, "--bogus")
    assert bad.returncode == 2 and bad.stdout == ""
    assert os.listdir(scratch) == []
