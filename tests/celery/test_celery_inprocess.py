"""Rows without a worker (eager mode) and the adapter's own guarantees: install/uninstall
symmetry, error counting, strict mode, fork safety, name labels, ids."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import task_state_guard_celery as tsgc
from celery import Celery, signals  # type: ignore[import-untyped]
from celery.exceptions import Ignore  # type: ignore[import-untyped]
from task_state_guard import Ledger
from task_state_guard_celery._guard import _WIRING


def _eager_app(name: str = "eager") -> Celery:
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(name=f"{name}.ok", tsg_delivery=True)
    def ok() -> int:
        return 1

    @app.task(name=f"{name}.fail")
    def fail() -> None:
        raise ValueError("private text")

    @app.task(name=f"{name}.retry", bind=True, max_retries=3)
    def retry(self: Any) -> str:
        if self.request.retries < 2:
            raise self.retry(countdown=100)
        return "done"

    @app.task(name=f"{name}.ignore")
    def ignore() -> None:
        raise Ignore()

    return app


@pytest.fixture
def ledger_path(ledger_target: str, backend: str) -> str:
    """The test's ledger on its backend (``[sqlite]``: a path in a private directory,
    ``[postgresql]``: a URL naming a schema of its own)."""
    if backend == "sqlite":
        Path(ledger_target).parent.mkdir(mode=0o700)
    return ledger_target


def _outcome(guard: tsgc.CeleryGuard, celery_id: str) -> tuple[Any, list[Any]]:
    parent = guard.ledger.get_task(guard.logical_task_id(celery_id))
    children = sorted(guard.ledger.children_of(parent.id), key=lambda t: (t.created_at, t.id))
    return (str(parent.status), parent.terminal_code), [
        (str(c.status), c.terminal_code) for c in children]


def test_eager_mode_is_recorded_without_a_worker(ledger_path: str) -> None:
    app = _eager_app()
    guard = tsgc.install(app, db=ledger_path, heartbeat_seconds=0.1)
    try:
        ok = app.tasks[f"{app.main}.ok"].delay()
        bad = app.tasks[f"{app.main}.fail"].delay()
        retried = app.tasks[f"{app.main}.retry"].delay()
        ignored = app.tasks[f"{app.main}.ignore"].delay()
        assert ok.get() == 1 and retried.get() == "done"
        assert _outcome(guard, ok.id) == (
            ("succeeded", "worker_completed"),
            [("succeeded", "worker_completed")],
        )
        assert _outcome(guard, bad.id) == (
            ("failed", "worker_failed"),
            [("failed", "worker_failed")],
        )
        parent, attempts = _outcome(guard, retried.id)
        assert parent == ("succeeded", "worker_completed")
        assert sorted(attempts) == sorted(
            [("failed", "retry_scheduled")] * 2 + [("succeeded", "worker_completed")]
        )
        assert _outcome(guard, ignored.id) == (
            ("cancelled", "ignored"),
            [("cancelled", "ignored")],
        )
        parent_task = guard.ledger.get_task(guard.logical_task_id(ok.id))
        assert parent_task.delivery_required and parent_task.name == "eager.ok"
        assert guard.ledger.doctor()["healthy"]
        assert guard.stats() == {
            "errors": {}, "conflicts": {}, "reconciles": 0, "heartbeating": 0,
            "verdicts_published": 0, "ledger_usable": True, "ledger_reason": None,
        }
        # Attempts, and logical tasks that owe no delivery, closed their delivery at once.
        retried_parent = guard.ledger.get_task(guard.logical_task_id(retried.id))
        assert (retried_parent.delivery_status, retried_parent.delivery_code) == (
            "not_applicable", "internal_task"
        )
        assert all(
            a.delivery_status == "not_applicable"
            for a in guard.ledger.children_of(retried_parent.id)
        )
    finally:
        guard.uninstall()


def test_install_is_idempotent_and_uninstall_symmetric(ledger_path: str) -> None:
    app = _eager_app("sym")
    before = {label: len(sig.receivers) for sig, _m, label in _WIRING}
    guard = tsgc.install(app, db=ledger_path)
    assert tsgc.install(app, db=ledger_path) is guard
    assert tsgc.guard_for(app) is guard
    assert tsgc.ReconcileOnBoot in app.steps["worker"]
    during = {label: len(sig.receivers) for sig, _m, label in _WIRING}
    assert all(during[k] == before[k] + 1 for k in before)
    guard.uninstall()
    guard.uninstall()
    tsgc.uninstall(app)
    after = {label: len(sig.receivers) for sig, _m, label in _WIRING}
    assert after == before
    assert tsgc.ReconcileOnBoot not in app.steps["worker"]
    assert tsgc.guard_for(app) is None
    # Uninstalled: tasks run and nothing is recorded.
    result = app.tasks[f"{app.main}.ok"].delay()
    assert result.get() == 1
    with Ledger(ledger_path) as ledger:
        assert ledger.status()["tasks"]["succeeded"] == 0
    # Installing again works.
    again = tsgc.install(app, db=ledger_path)
    try:
        assert again is not guard
        app.tasks[f"{app.main}.ok"].delay()
        assert again.ledger.status()["tasks"]["succeeded"] == 2
    finally:
        again.uninstall()


def test_settings_from_app_conf_then_env(ledger_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _eager_app("conf")
    monkeypatch.setenv("TSG_DB", "/nonexistent/env.sqlite")
    monkeypatch.setenv("TSG_ACTIVE_GRACE_SECONDS", "42")
    app.conf.tsg_db = ledger_path
    app.conf.tsg_heartbeat_seconds = 2
    guard = tsgc.install(app)
    try:
        assert guard.settings.db == ledger_path
        assert guard.settings.active_grace_seconds == 42
        assert guard.settings.heartbeat_seconds == 2
        assert guard.settings.reconcile_on_boot is True
    finally:
        guard.uninstall()
    with pytest.raises(ValueError):
        tsgc.install(_eager_app("nodb"), db=None, active_grace_seconds=-1)


def test_unwritable_ledger_is_logged_once_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    app = _eager_app("broken")
    guard = tsgc.install(app, db=str(blocker / "tasks.sqlite"))
    try:
        with caplog.at_level(logging.WARNING, logger="task_state_guard_celery"):
            for _ in range(3):
                assert app.tasks[f"{app.main}.ok"].delay().get() == 1
        stats = guard.stats()["errors"]
        assert stats == {"task_prerun:StorageError": 3}
        messages = [r.getMessage() for r in caplog.records if "ledger error" in r.getMessage()]
        assert len(messages) == 1
        # mark_delivered is the application's own write: it raises like the core.
        from task_state_guard import StorageError

        with pytest.raises(StorageError):
            guard.mark_delivered(str(uuid.uuid4()))
    finally:
        guard.uninstall()


def test_strict_mode_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    app = _eager_app("strict")
    guard = tsgc.install(app, db=str(blocker / "tasks.sqlite"), strict=True)
    raised: list[BaseException] = []

    def spy(**kwargs: Any) -> None:
        raised.append(kwargs["exception"]) if "exception" in kwargs else None

    try:
        from task_state_guard import StorageError

        with pytest.raises(StorageError):
            guard.mark_delivered(str(uuid.uuid4()))
        # Inside a Celery signal the raise reaches Celery's dispatcher, which logs it.
        receivers = signals.task_prerun._live_receivers(app.tasks[f"{app.main}.ok"])
        assert receivers
    finally:
        guard.uninstall()


def test_no_connection_crosses_fork(ledger_path: str) -> None:
    app = _eager_app("fork")
    guard = tsgc.install(app, db=ledger_path, heartbeat_seconds=0.1)
    try:
        first = app.tasks[f"{app.main}.ok"].delay()  # opens the connection and starts a heartbeater
        parent_conn = guard.ledger._db.conn()  # type: ignore[attr-defined]
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                child_conn = guard.ledger._db.conn()  # type: ignore[attr-defined]
                result = app.tasks[f"{app.main}.ok"].delay()
                parent = guard.ledger.get_task(guard.logical_task_id(result.id))
                ok = child_conn is not parent_conn and str(parent.status) == "succeeded"
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert guard.ledger._db.conn() is parent_conn  # type: ignore[attr-defined]
        assert str(guard.ledger.get_task(guard.logical_task_id(first.id)).status) == "succeeded"
        assert guard.ledger.doctor()["healthy"]
    finally:
        guard.uninstall()


def test_name_labels_and_ids() -> None:
    assert tsgc.name_label("proj.tasks.add") == "proj.tasks.add"
    assert tsgc.name_label("bad name") == "bad_name"
    assert tsgc.name_label("x" * 201) == "x" * 200
    assert tsgc.name_label("") is None
    assert tsgc.name_label(None) is None
    assert tsgc.name_label("<lambda>") == "<lambda>"
    celery_id = str(uuid.uuid4())
    assert tsgc.logical_task_id(celery_id) == str(
        uuid.uuid5(tsgc.NAMESPACE, f"celery-task:{celery_id}")
    )
    assert tsgc.logical_task_id(celery_id) == tsgc.logical_task_id(celery_id)
