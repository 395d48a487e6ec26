"""Only the commands that create a ledger ever create one, on either backend: a task command
given a mistyped PostgreSQL schema leaves it missing (a mistyped SQLite path:
``tests/sqlite/test_storage_hardening.py``), ``Ledger(..., create=False)`` never creates, and an
invalid open option is refused before anything is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from core_helpers import NEVER_CREATE, Clock, assert_cli_error, assert_json_line, is_sqlite, run_cli
from ledger_backends import pg_schema_exists
from task_state_guard import InvalidInput, Ledger


@pytest.mark.postgresql_only
@pytest.mark.parametrize("args", NEVER_CREATE, ids=lambda a: a[0])
def test_a_mistyped_postgresql_schema_is_never_created(db: str, args: list[str]) -> None:
    assert_cli_error(run_cli("--explain", "--db", db, *args), "InvalidInput",
                     reason="database_missing")
    assert not pg_schema_exists(db)


def test_the_creating_commands_and_create_false(db: str, tmp_path: Path) -> None:
    """init, create and reconcile (whose apply mode the specification keeps on the normal,
    creating open) make a missing ledger; ``Ledger(path, create=False)`` never does."""
    with pytest.raises(InvalidInput) as info:
        Ledger(db, create=False)
    assert info.value.reason in ("database_missing", "directory_missing")
    if is_sqlite(db):
        assert not os.path.exists(db)
    else:
        assert not pg_schema_exists(db)
    assert_json_line(run_cli("--db", db, "reconcile"))
    with Ledger(db, create=False, clock=Clock()) as led:  # an existing one opens as usual
        led.create_task()
    if is_sqlite(db):
        for command in ("init", "create"):
            fresh = str(tmp_path / command / "tasks.sqlite")
            assert_json_line(run_cli("--db", fresh, command))
            assert os.path.exists(fresh)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("clock", 5, "clock must be callable"),
    ("clock", 0, "clock must be callable"),
    ("busy_timeout_ms", 1.5, "busy_timeout_ms must be an integer"),
    ("busy_timeout_ms", True, "busy_timeout_ms must be an integer"),
    ("busy_timeout_ms", -1, "busy_timeout_ms is out of range"),
    ("busy_timeout_ms", 600_001, "busy_timeout_ms is out of range"),
    ("read_only", 1, "flags must be booleans"),
    ("create", "yes", "flags must be booleans"),
    ("transient_sidecars", None, "flags must be booleans"),
    ("allow_external_acl", 0, "flags must be booleans"),
])
def test_an_invalid_open_option_is_refused_before_anything_is_made(
    db: str, option: str, value: object, message: str
) -> None:
    """Every backend refuses the same invalid options with the same fixed error, before it
    connects or creates anything."""
    with pytest.raises(InvalidInput) as info:
        Ledger(db, **{option: value})  # type: ignore[arg-type]
    assert str(info.value) == message
    if is_sqlite(db):
        assert not os.path.exists(db)
    else:
        assert not pg_schema_exists(db)
