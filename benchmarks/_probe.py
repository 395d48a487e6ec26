"""Count what a ledger sends to its database, from outside the ledger's code.

:class:`Probe` wraps ``sqlite3.connect`` (connections to one ledger file), psycopg's cursor
``execute`` and the PostgreSQL backend's statement entry point ``Conn.fetch_named`` (which sends
its prepared statements straight through libpq, past any cursor; a statement it runs is counted
once, whether or not it goes through a cursor) while it is installed, so it counts the same
things whatever the ledger's internals look like (today's code or a refactored one), and it is
never installed while CPU is timed:

- ``statements``: SQL statements other than transaction control (``BEGIN``, ``COMMIT``,
  ``ROLLBACK``, savepoints) and ``PRAGMA``; a trigger's program is not a statement;
- ``transactions``: finished transactions (an explicit block, or one statement run outside
  one); ``commits``: those that wrote (SQLite: the connection's change count moved; PostgreSQL:
  an ``INSERT``/``UPDATE``/``DELETE``, also inside ``WITH``, or a call of a ``tsg_`` function);
- ``rows`` (SQLite): rows inserted, updated or deleted, trigger rows included
  (``total_changes``).

On SQLite the probe also holds the WAL: a ledger's ``PRAGMA wal_autocheckpoint=N`` becomes 0 on
a probed connection, so the WAL file's growth is the pages a job writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
from typing import Any

_CONTROL = frozenset({"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA"})
_WRITE_TEXT = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)
_TSG_CALL = re.compile(r"^\s*SELECT\s+(\w+\.)?\"?tsg_\w+\"?\s*\(", re.IGNORECASE)
_LITERAL = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")
_AUTOCHECKPOINT = re.compile(r"^\s*PRAGMA\s+wal_autocheckpoint\s*=\s*\d+\s*$", re.IGNORECASE)


def _word(sql: str) -> str:
    text = sql.lstrip()
    while text.startswith("--") or text.startswith("/*"):
        end = text.find("\n") if text.startswith("--") else text.find("*/") + 1
        if end <= 0:
            return ""
        text = text[end + 1 :].lstrip()
    return text.split(None, 1)[0].upper().rstrip(";") if text else ""


def shape(sql: str) -> str:
    """A statement's text with its literals as ``?`` (SQLite traces values inlined)."""
    return " ".join(_LITERAL.sub("?", sql).split())


class _HeldWal(sqlite3.Connection):
    """A connection whose automatic checkpoints stay off (the probe measures the WAL)."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if _AUTOCHECKPOINT.match(sql):
            sql = "PRAGMA wal_autocheckpoint=0"
        return super().execute(sql, *args)


class Probe:
    """Counters of one measured interval; :meth:`install` starts counting, :meth:`remove` ends."""

    def __init__(self, sqlite_path: str | None = None) -> None:
        self.sqlite_path = os.path.realpath(sqlite_path) if sqlite_path else None
        self.lock = threading.Lock()
        self.counts = {"statements": 0, "transactions": 0, "commits": 0, "rollbacks": 0}
        self.statement_texts: dict[str, int] = {}
        self._sqlite: list[tuple[sqlite3.Connection, int]] = []
        self._pg_open: dict[int, bool] = {}  # id(connection) -> the open block wrote
        self._saved: dict[str, Any] = {}
        self._inside = threading.local()  # inside the backend's ``fetch_named``
        self.capture = False

    # ----------------------------------------------------------------- install / remove
    def install(self) -> None:
        self._saved["sqlite_connect"] = sqlite3.connect
        sqlite3.connect = self._sqlite_connect  # type: ignore[assignment]
        try:
            import psycopg
        except ImportError:
            return
        self._saved["execute"] = psycopg.Cursor.execute
        probe = self
        original = psycopg.Cursor.execute

        def execute(cur: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            if getattr(probe._inside, "active", False):  # counted by ``fetch_named``
                return original(cur, query, params, **kw)
            conn = cur.connection
            before = conn.pgconn.transaction_status
            result = original(cur, query, params, **kw)
            text = query if isinstance(query, str) else query.as_string(conn)
            probe._pg(conn, text, before, conn.pgconn.transaction_status, cur.statusmessage)
            return result

        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        try:
            from task_state_guard_postgres.driver import Conn
        except ImportError:
            return
        if not hasattr(Conn, "fetch_named"):  # a tree from before the prepared statements:
            return  # every statement goes through a psycopg cursor (counted above)
        self._saved["fetch_named"] = Conn.fetch_named
        fetch_original = Conn.fetch_named
        inside = self._inside

        def fetch_named(ledger_conn: Any, statement: Any, params: Any) -> Any:
            raw = ledger_conn.raw
            before = raw.pgconn.transaction_status
            inside.active = True
            try:
                rows = fetch_original(ledger_conn, statement, params)
            finally:
                inside.active = False
            # a prepared statement's text (a tree from before them passed the text itself)
            text = statement if isinstance(statement, str) else statement.text
            probe._pg(raw, text, before, raw.pgconn.transaction_status, None)
            return rows

        Conn.fetch_named = fetch_named  # type: ignore[method-assign]

    def remove(self) -> None:
        if "sqlite_connect" in self._saved:
            sqlite3.connect = self._saved.pop("sqlite_connect")
        if "execute" in self._saved:
            import psycopg

            psycopg.Cursor.execute = self._saved.pop("execute")  # type: ignore[method-assign]
        if "fetch_named" in self._saved:
            from task_state_guard_postgres.driver import Conn

            Conn.fetch_named = self._saved.pop("fetch_named")  # type: ignore[method-assign]
        for conn, _ in self._sqlite:
            with contextlib.suppress(sqlite3.Error):
                conn.set_trace_callback(None)

    def reset(self) -> None:
        """Zero the counters (connections stay probed)."""
        with self.lock:
            for key in self.counts:
                self.counts[key] = 0
            self.statement_texts.clear()
            self._sqlite = [(c, self._changes(c)) for c, _ in self._sqlite]

    # ----------------------------------------------------------------- SQLite
    def _sqlite_connect(self, database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        connect = self._saved["sqlite_connect"]
        target = str(database)
        ours = (self.sqlite_path is not None and not target.startswith((":", "file:"))
                and os.path.realpath(target) == self.sqlite_path)
        if not ours:
            return connect(database, *args, **kwargs)  # type: ignore[no-any-return]
        kwargs.setdefault("factory", _HeldWal)
        conn: sqlite3.Connection = connect(database, *args, **kwargs)
        state = {"last": "", "base": 0}

        def trace(sql: str) -> None:
            # A trigger's program is traced again with its statement's text (or as a comment):
            # it is part of the statement, not one of its own.
            if sql == state["last"] or sql.lstrip().startswith("--"):
                return
            state["last"] = sql
            self._sqlite_statement(conn, sql, state)

        conn.set_trace_callback(trace)
        with self.lock:
            self._sqlite.append((conn, 0))
        return conn

    @staticmethod
    def _changes(conn: sqlite3.Connection) -> int:
        try:
            return conn.total_changes
        except sqlite3.Error:
            return 0

    def _sqlite_statement(self, conn: sqlite3.Connection, sql: str, state: dict[str, Any]) -> None:
        word = _word(sql)
        with self.lock:
            if word == "BEGIN":
                state["base"] = self._changes(conn)
            elif word in ("COMMIT", "END"):
                self.counts["transactions"] += 1
                # The trace runs before COMMIT itself: every write of the block is counted.
                if self._changes(conn) > state["base"]:
                    self.counts["commits"] += 1
            elif word == "ROLLBACK":
                self.counts["rollbacks"] += 1
                self.counts["transactions"] += 1
            elif word not in _CONTROL and word:
                self.counts["statements"] += 1
                if self.capture:
                    key = shape(sql)
                    self.statement_texts[key] = self.statement_texts.get(key, 0) + 1
                if not conn.in_transaction:  # runs as its own transaction
                    self.counts["transactions"] += 1
                    if word in ("INSERT", "UPDATE", "DELETE", "REPLACE", "WITH"):
                        self.counts["commits"] += 1

    def rows(self) -> int:
        """Rows changed on the probed SQLite connections since :meth:`reset`."""
        with self.lock:
            return sum(self._changes(c) - base for c, base in self._sqlite)

    # ----------------------------------------------------------------- PostgreSQL
    def _pg(self, conn: Any, text: str, before: Any, after: Any, status: str | None) -> None:
        from psycopg import pq

        idle = pq.TransactionStatus.IDLE
        word = _word(text)
        wrote = bool(
            (status or "").split(" ", 1)[0] in ("INSERT", "UPDATE", "DELETE", "MERGE")
            or (word not in _CONTROL and _WRITE_TEXT.search(text) and word != "SET")
            or _TSG_CALL.match(text)
        )
        key = id(conn)
        with self.lock:
            if word in ("BEGIN", "START"):
                self._pg_open[key] = False
                return
            if word in ("COMMIT", "END", "ROLLBACK"):
                self.counts["transactions"] += 1
                if word == "ROLLBACK":
                    self.counts["rollbacks"] += 1
                elif self._pg_open.get(key):
                    self.counts["commits"] += 1
                self._pg_open.pop(key, None)
                return
            if word in _CONTROL:
                return
            self.counts["statements"] += 1
            if self.capture:
                shown = shape(text)
                self.statement_texts[shown] = self.statement_texts.get(shown, 0) + 1
            if before == idle and after == idle:  # autocommit: its own transaction
                self.counts["transactions"] += 1
                if wrote:
                    self.counts["commits"] += 1
            elif wrote:
                self._pg_open[key] = True


__all__ = ["Probe", "shape"]
