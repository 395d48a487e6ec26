"""Ledger URLs as a careless or hostile user writes them: a password in any parameter whose key
ends in ``password`` (repeated, percent-encoded, capitalised, ``sslpassword``) or in the user
info (with unencoded ``@``) never shows in ``repr``, ``str``, ``Ledger.path``, logs or errors;
parameters reach libpq exactly as the user percent-encoded them; a refused login and a missing
database have reasons of their own."""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from pg_fixtures import PG_BASE
from task_state_guard import InvalidInput, Ledger, StorageError
from task_state_guard.cli.commands import main as tsg
from task_state_guard.integration import AdapterRuntime, resolve_settings
from task_state_guard.store.backends import redact

REAL, DECOY = "R3al-S3cret-4k9", "D3coy-S3cret-7p2"


def _chain_text(exc: BaseException) -> str:
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), *map(repr, seen.args)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join([*parts, *traceback.format_exception(exc)])


def _variants(url: str) -> list[str]:
    """Where a secret can sit in a URL libpq accepts (the trust-auth server takes any)."""
    user = url.replace("postgresql://postgres@", f"postgresql://postgres:{REAL}@", 1)
    return [
        f"{url}&password={DECOY}&password={REAL}",  # libpq takes the last one
        f"{url}&%70assword={REAL}",  # a percent-encoded key
        f"{url}&sslpassword={REAL}&password={DECOY}",
        f"{user}&password={DECOY}",
        url.replace("postgresql://postgres@", f"postgresql://postgres:{REAL}%40x@", 1),
    ]


# Forms libpq itself refuses, or that never reach it: shown only through settings and errors.
def _unparsable(url: str) -> list[str]:
    return [
        f"{url}&PASSWORD={REAL}",
        f"{url}&Pass%77ord={REAL}",
        url.replace("postgresql://postgres@", f"postgresql://postgres:{REAL}@x@", 1),
        url.replace("postgresql://postgres@", "postgresql://postgres:R3al?S3cret@", 1),
        f"{url}#password={REAL}",
    ]


def _clean(text: str) -> bool:
    return REAL not in text and DECOY not in text and "R3al?S3cret" not in text


def test_no_password_in_any_form_reaches_repr_str_path_logs_or_errors(
    pg_url: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    for url in _variants(pg_url):
        shown = redact(url)
        assert _clean(shown) and shown.startswith("postgresql://postgres@127.0.0.1:5432/test?")
        assert "schema=" in shown
        with Ledger(url) as ledger:
            ledger.create_task()
            texts = [ledger.path, repr(ledger._db), str(ledger._db)]
            assert ledger.path == shown
        settings = resolve_settings(db=url)
        texts += [repr(settings), str(settings)]
        runtime = AdapterRuntime(settings, logger=logging.getLogger("tsg-url-test"))
        runtime.boot_reconcile()
        runtime.close()
        assert tsg(["--explain", "--db", url, "status"]) == 0
        broken = url.replace("127.0.0.1:5432", "127.0.0.1:1")
        with pytest.raises(StorageError) as failed:
            Ledger(broken)
        texts.append(_chain_text(failed.value))
        assert tsg(["--explain", "--db", broken, "status"]) == 2
        assert all(_clean(text) for text in texts), texts
    for url in _unparsable(pg_url):
        assert _clean(redact(url)), url
        settings = resolve_settings(db=url)
        assert _clean(repr(settings)) and _clean(str(settings))
        try:
            Ledger(url).close()
        except Exception as exc:  # refused by the URL check or by libpq: a fixed error
            assert _clean(_chain_text(exc))
    out = capsys.readouterr()
    assert _clean(out.out + out.err) and _clean(caplog.text)


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(PG_BASE, autocommit=True)


def test_parameters_reach_libpq_exactly_as_percent_encoded(pg_url: str) -> None:
    """``options=-c%20statement_timeout%3D1000`` once broke (reported server_unreachable) and
    ``application_name=my%20app`` became ``my+app``."""
    name = "tsg url test+plus app"
    url = (f"{pg_url}&options=-c%20statement_timeout%3D1234"
           f"&application_name=tsg%20url%20test%2Bplus%20app")
    with Ledger(url) as ledger, _admin() as admin:
        ledger.create_task()
        rows = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
        assert rows is not None and rows[0] >= 1
        # the session really got the option (read through the ledger's own connection)
        setting = ledger._db.conn().execute("SHOW statement_timeout").fetchone()
        assert setting == ("1234ms",)
    assert tsg(["--db", url, "status"]) == 0


def _refused(url: str) -> StorageError:
    with pytest.raises(StorageError) as failed:
        Ledger(url)
    return failed.value


def test_a_missing_database_and_an_unknown_role_have_their_own_reasons() -> None:
    base = PG_BASE.rsplit("/", 1)[0]
    missing = _refused(f"{base}/tsg_no_such_database_h24?schema=tsgt_x")
    assert missing.reason == "server_database_missing"
    role = _refused(PG_BASE.replace("postgres@", "tsg_no_such_role_h24@", 1)
                    + "?schema=tsgt_x")
    assert role.reason == "authentication_failed"
    unreachable = _refused("postgresql://postgres@127.0.0.1:1/test?schema=tsgt_x")
    assert unreachable.reason == "server_unreachable"
    for exc in (missing, role):
        assert "tsg_no_such" not in _chain_text(exc)


@contextmanager
def _password_refusing_server() -> Iterator[int]:
    """A listener that answers a PostgreSQL login exactly as a server with password
    authentication does when the password is wrong: it asks for the password, then sends the
    FATAL ErrorResponse with SQLSTATE 28P01 and closes. (The shared test server trusts every
    local login, so it cannot refuse a password itself.)"""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def message(kind: bytes, body: bytes) -> bytes:
        return kind + struct.pack("!I", len(body) + 4) + body

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    while True:  # SSL or GSS encryption requests are declined, then startup
                        size = struct.unpack("!I", conn.recv(4))[0]
                        body = conn.recv(size - 4)
                        code = struct.unpack("!I", body[:4])[0]
                        if code in (80877103, 80877104):
                            conn.sendall(b"N")
                            continue
                        break
                    conn.sendall(message(b"R", struct.pack("!I", 3)))  # cleartext password
                    conn.recv(1024)
                    fields = (b"SFATAL\0VFATAL\0C28P01\0"
                              b"Mpassword authentication failed for user \"postgres\"\0\0")
                    conn.sendall(message(b"E", fields))
                except (OSError, struct.error):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def test_a_wrong_password_is_authentication_failed() -> None:
    with _password_refusing_server() as port:
        url = f"postgresql://postgres:{REAL}@127.0.0.1:{port}/test?schema=tsgt_x&sslmode=disable"
        refused = _refused(url)
        assert refused.reason == "authentication_failed"
        assert _clean(_chain_text(refused))
        assert tsg(["--explain", "--db", url, "status"]) == 2


def _tsg_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "task_state_guard", *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TSG_", "PGPASS"))}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def test_sqlalchemy_style_urls_open_postgresql_and_show_no_password(pg_url: str) -> None:
    """``postgresql+psycopg://`` (SQLAlchemy's spelling) is the same PostgreSQL ledger, never
    a SQLite path whose directory is named after the password; it is redacted everywhere."""
    for scheme in ("postgresql+psycopg", "POSTGRESQL+PSYCOPG2", "postgres+psycopg"):
        url = pg_url.replace("postgresql://postgres@", f"{scheme}://postgres:{REAL}@", 1)
        done = _tsg_process("--db", url, "create", env=_env())
        assert done.returncode == 0 and done.stderr == "", done.stdout
        with Ledger(url) as ledger:
            assert ledger.storage_info()["backend"] == "postgresql"
            assert _clean(ledger.path) and ledger.path.startswith(f"{scheme}://postgres@")
        assert _clean(repr(resolve_settings(db=url)))
    with Ledger(pg_url, read_only=True) as ledger:  # every create above went to the same ledger
        assert len(ledger.find_task_ids("queued")) == 3
    for refused in (f"postgresql+asyncpg://postgres:{REAL}@127.0.0.1/test",
                    f"mysql://postgres:{REAL}@127.0.0.1/test"):
        assert _clean(redact(refused))
        for make in (Ledger, lambda url: resolve_settings(db=url)):
            with pytest.raises(InvalidInput) as failed:
                make(refused)
            assert failed.value.reason == "unsupported_url_scheme"
            assert _clean(_chain_text(failed.value))


def test_a_password_file_libpq_skips_leaves_no_path_on_stderr(
    pg_url: str, tmp_path: Path
) -> None:
    """libpq prints a warning with the password file's path to stderr when the file is open to
    group or others (or not a regular file) and skips it; the ledger skips it quietly, and a
    server that then wants a password gives the fixed reason ``password_file_not_private``."""
    home = tmp_path / "pgpass-canary-home"
    home.mkdir()
    passfile = home / ".pgpass"
    cases: list[tuple[int | None, dict[str, str]]] = [
        (mode, env) for mode in (0o644, 0o640, 0o604)
        for env in (_env(PGPASSFILE=str(passfile)), _env(HOME=str(home)))]
    cases.append((None, _env(PGPASSFILE=str(home))))  # a directory: not a plain file
    for mode, env in cases:
        passfile.write_text(f"*:*:*:*:{REAL}\n")
        if mode is not None:
            passfile.chmod(mode)
        done = _tsg_process("--explain", "--db", pg_url, "init", env=env)
        assert (done.returncode, done.stderr) == (0, ""), done  # trust: no password needed
        with _password_refusing_server() as port:
            url = f"postgresql://postgres@127.0.0.1:{port}/test?schema=tsgt_x&sslmode=disable"
            refused = _tsg_process("--explain", "--db", url, "status", env=env)
        assert (refused.returncode, refused.stderr) == (2, ""), refused
        assert json.loads(refused.stdout) == {
            "error": "StateConflict", "ok": False, "reason": "password_file_not_private"}
    # a private password file is libpq's to use: the refusal is the server's own
    passfile.chmod(0o600)
    with _password_refusing_server() as port:
        url = f"postgresql://postgres@127.0.0.1:{port}/test?schema=tsgt_x&sslmode=disable"
        refused = _tsg_process("--explain", "--db", url, "status",
                               env=_env(PGPASSFILE=str(passfile)))
    assert json.loads(refused.stdout)["reason"] == "authentication_failed"
    assert refused.stderr == ""
