"""docs/deploy.md's fleet snippet, run as written against a fresh PostgreSQL schema: the real
``tsg`` on PATH, the worker's start command replaced by a stand-in that says it was reached."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from deploy_helpers import ENTRYPOINT, REPO, base_env, json_lines
from pg_fixtures import fresh_pg_url

DOC = REPO / "docs" / "deploy.md"
WORKER = "exec celery -A app worker"
#: the stand-in for the worker: it only says that its start command was reached
REACHED = "worker reached"
STAND_IN = f"exec {sys.executable} -c \"print('{REACHED}')\""


def _snippet() -> list[str]:
    """The lines of the first shell block of the "Fleets" section, as the doc shows them."""
    section = DOC.read_text().split("\n## Fleets", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the Fleets section shows its commands in a bash block"
    return block.group(1).splitlines()


def _run(lines: list[str], url: str) -> subprocess.CompletedProcess[str]:
    """The snippet with the test's schema in its URL and the stand-in for the worker."""
    exports = [ln for ln in lines if ln.startswith("export TSG_DB=")]
    assert len(exports) == 1, "the snippet names its ledger once"
    assert lines[-1] == WORKER, "the snippet ends by starting the worker"
    script = "\n".join(
        f"export TSG_DB='{url}'" if ln in exports else STAND_IN if ln == WORKER else ln
        for ln in lines
    )
    return subprocess.run(["sh", "-c", script], env=base_env(TSG_EXPLAIN="1"),
                          capture_output=True, text=True, timeout=120, check=False)


def test_fleet_snippet_starts_the_worker_on_a_fresh_schema(pg_url: str) -> None:
    lines = _snippet()
    done = _run(lines, pg_url)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json_lines(done.stdout)
    assert [sorted(o) for o in out] == [["ok", "storage"], ["ok", "reconcile"], ["ok", "reconcile"]]
    assert out[0]["storage"]["backend"] == "postgresql"
    assert out[1]["reconcile"]["dry_run"] is True and out[2]["reconcile"]["applied"] is True
    assert done.stdout.splitlines()[-1] == REACHED
    # the step the snippet needs: without `tsg init`, the preview refuses the fresh schema and
    # the worker is never started
    without_init = [ln for ln in lines if not ln.startswith("tsg init")]
    assert len(without_init) == len(lines) - 1
    with fresh_pg_url() as url:
        refused = _run(without_init, url)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert json_lines(refused.stdout) == [
        {"error": "InvalidInput", "ok": False, "reason": "database_missing"}]
    assert REACHED not in refused.stdout


def test_entrypoint_starts_the_worker_on_a_fresh_schema(pg_url: str, tmp_path: Path) -> None:
    """The shipped entrypoint runs the same steps with a URL in TSG_DB."""
    done = subprocess.run(
        ["sh", str(ENTRYPOINT), sys.executable, "-c", f"print('{REACHED}')"],
        env=base_env(TSG_DB=pg_url), capture_output=True, text=True, timeout=120,
        cwd=tmp_path, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [sorted(o) for o in json_lines(done.stdout)]
    assert steps == [["ok", "reconcile"], ["ok", "reconcile"]]  # init is quiet unless it fails
    assert done.stdout.splitlines()[-1] == REACHED
