"""The agent example runs as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_example_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "examples/langgraph_agent/run.py", "--dir", str(tmp_path / "demo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "approve [attempt] cancelled/interrupted" in out
    assert "refund [attempt] timed_out/owner_lost" in out
    assert "recovered thread order-77: succeeded" in out
    assert '"healthy": true' in out
    assert "ledger errors: {}" in out
    assert "child process exit status: -9" in out
