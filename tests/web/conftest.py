"""Fixtures of the browser tests: headless Chromium (Debian's ``chromium`` package, which
``scripts/dev.py test`` installs; missing, it fails the tests, never skips them) and a ledger
that real Celery, Dramatiq and LangGraph work wrote, with a Celery worker SIGKILLed mid-job.

The ledger is built once per module by the adapters' own test harnesses (real ``celery
worker`` and ``dramatiq`` processes on Redis at 127.0.0.1:6379, a guarded LangGraph graph in
this process).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
for folder in ("web", "core", "celery", "dramatiq"):
    sys.path.insert(0, str(TESTS / folder))

import task_state_guard_celery  # noqa: E402
from cdp_client import Chromium, chromium_path  # noqa: E402
from celery_harness import Scenario  # noqa: E402
from mixed_ledger import MixedLedger, dramatiq_job, langgraph_job, require_redis  # noqa: E402


@pytest.fixture(scope="session")
def chromium_installed() -> str:
    found = chromium_path()
    if found is None:  # required (scripts/dev.py test installs it): a failure, never a skip
        pytest.fail("headless Chromium is required for tests/web: run scripts/dev.py test "
                    "(as root it installs Debian's chromium and chromium-driver)")
    return found


@pytest.fixture
def browser(chromium_installed: str, tmp_path: Path) -> Iterator[Chromium]:
    chrome = Chromium(tmp_path)
    try:
        yield chrome
    finally:
        chrome.close()


@pytest.fixture(scope="module")
def mixed_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixedLedger]:
    """Dramatiq and LangGraph first (each reconciles when it boots), then Celery: one job
    that succeeds and one whose worker is SIGKILLed while it runs (its attempt's owner is
    dead; nothing has closed it yet)."""
    require_redis()
    tmp = tmp_path_factory.mktemp("mixed")
    folder = tmp / "ledger"
    folder.mkdir(mode=0o700)
    db = folder / "tasks.sqlite"
    dramatiq_id = dramatiq_job(db, tmp / "dramatiq")
    langgraph_id = langgraph_job(db)
    (tmp / "celery").mkdir()
    scenario = Scenario(tmp / "celery", db=str(db))
    try:
        worker = scenario.start_worker(concurrency=1)
        ok = scenario.send("tsgt.ok")
        assert ok.get(timeout=30) == "ok"
        scenario.wait_parent(ok.id, "succeeded")
        lost = scenario.send("tsgt.sleep", 120, "lost")
        scenario.marker("lost")
        scenario.wait_attempts(lost.id, lambda attempts: any(
            str(a.status) == "running" for a in attempts))
        worker.sigkill()
        yield MixedLedger(str(db), ok.id, lost.id, dramatiq_id, langgraph_id,
                          task_state_guard_celery.logical_task_id(lost.id))
    finally:
        scenario.close()
