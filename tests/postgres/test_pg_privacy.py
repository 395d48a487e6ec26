"""The URL's password never appears in any output, log, repr or exception text; a missing
backend package is a fixed error."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import traceback

import pytest
from task_state_guard import InvalidInput, Ledger, StorageError
from task_state_guard.cli.commands import main as tsg
from task_state_guard.integration import AdapterRuntime, resolve_settings
from task_state_guard.store.backends import MISSING_BACKEND, redact

SECRET = "S3cr3t-pw-7Q9x"  # the server trusts 127.0.0.1, so any password connects


def _with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def _chain_text(exc: BaseException) -> str:
    """Every text an exception carries: str, repr, the formatted traceback and any context."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), *map(repr, seen.args)]
        seen = seen.__cause__ or seen.__context__
    parts += traceback.format_exception(exc)
    return "\n".join(parts)


def test_no_password_in_the_ledgers_outputs(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = _with_password(pg_url) + "&password=" + SECRET + "2"
    with Ledger(url) as ledger:
        task = ledger.create_task(name="private.job")
        ledger.start_task(task.id)
        texts = [
            ledger.path, repr(ledger), repr(ledger._db), str(ledger.get_task(task.id)),
            json.dumps(ledger.storage_info()), json.dumps(ledger.status()),
            json.dumps(ledger.doctor()), json.dumps(ledger.reconcile(dry_run=True)),
            json.dumps(ledger.prune(0, dry_run=True)),
        ]
        assert ledger.path.startswith("postgresql://postgres@127.0.0.1")
    texts.append(caplog.text)
    assert not any(SECRET in text for text in texts)
    assert redact(url) == ledger.path


def test_no_password_when_the_server_cannot_be_reached() -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:1/test?schema=tsgt_unreachable"
    with pytest.raises(StorageError) as err:
        Ledger(url)
    assert str(err.value) == "cannot connect to the PostgreSQL ledger"
    assert SECRET not in _chain_text(err.value)


def test_no_password_in_a_url_that_does_not_parse() -> None:
    for url in (
        f"postgresql://postgres:{SECRET}@127.0.0.1:notaport/test",
        f"postgresql://postgres:{SECRET}@127.0.0.1/test?schema=Bad-Name",
        f"postgresql://postgres:{SECRET}@127.0.0.1/test?sslmode=nonsense{SECRET}&schema=x",
    ):
        with pytest.raises((InvalidInput, StorageError)) as err:
            Ledger(url)
        assert SECRET not in _chain_text(err.value)


def test_no_password_from_the_cli(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = _with_password(pg_url)
    commands = [
        ["create", "--name", "cli.job"], ["status"], ["status", "--format", "prometheus"],
        ["doctor"], ["reconcile", "--dry-run"], ["reconcile"], ["prune", "--older-than", "0"],
    ]
    for args in commands:
        tsg(["--db", url, *args])
    tsg(["--db", url.replace("127.0.0.1:5432", "127.0.0.1:1"), "status"])
    out = capsys.readouterr()
    assert '"ok":true' in out.out
    assert SECRET not in out.out + out.err


def test_no_password_in_adapter_settings_and_logs(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    unreachable = f"postgresql://postgres:{SECRET}@127.0.0.1:1/test?schema=tsgt_x"
    for url in (_with_password(pg_url), unreachable):
        settings = resolve_settings(db=url)
        assert SECRET not in repr(settings) and SECRET not in str(settings)
        runtime = AdapterRuntime(settings, logger=logging.getLogger("tsg-test"))
        runtime.boot_reconcile()  # fails for the unreachable one: counted and logged
        stats = json.dumps(runtime.stats(), default=str)
        runtime.close()
        assert SECRET not in stats
    assert SECRET not in caplog.text


def test_missing_backend_package_is_a_fixed_error(pg_url: str) -> None:
    code = (
        "import sys; sys.modules['task_state_guard_postgres'] = None\n"
        "from task_state_guard import Ledger, StorageError\n"
        "try:\n"
        f"    Ledger({pg_url!r})\n"
        "except StorageError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == MISSING_BACKEND
    assert "pip install task-state-guard-postgres" in MISSING_BACKEND
