"""Schema DDL, exact fingerprints, and the guarded migrations to the current schema
(:data:`CURRENT`).

Every earlier layout is recognised by its exact schema fingerprint and metadata: our v1 to v5
(never released) and the layout of the published 0.1.0 (tables ``tasks``, ``task_events`` and
``schema_meta``). A writable open migrates any of them to the current one in one transaction,
step by step (:data:`MIGRATIONS`); a read-only open leaves the file as it is and reads it
through temporary views that present the v4 tables (the outbox v5 adds is read only from a
layout that has it, :data:`OUTBOX_LAYOUTS`: an older file has no verdicts and no redelivery
bounds). Anything else fails closed.

v4 adds ``tsg_totals``: monotonic outcome counters (task closes by kind, state and code;
delivery closes by obligation, state and code), kept by triggers in the same statement as each
transition, never touched by prune, so metrics read a handful of rows however large the ledger.

v5 adds the verdict outbox: ``tsg_tasks.framework`` (which adapter opened a logical task, a
closed set of labels), ``tsg_tasks.redelivery_seconds`` (how long after an attempt's last sign
of life its broker may still hand the job to another worker) and ``tsg_verdicts`` (one row per
logical task closed as lost, ``pending`` until an adapter of its framework published it),
written by a trigger in the same statement as the close, whoever makes it.

v6 counts a close under the kind a person calls the task (``model.TASK_KIND_SQL``: a child
that owes its own delivery, such as a LangGraph resume or recovery run, is a ``task``, not an
``attempt``); the totals counted before the upgrade keep their kind (a counter never goes down).

v7 inserts rows already running: *begin attempt* writes a new logical task and its attempt
each in one INSERT of a running row, and an INSERT trigger rendered from
``rules.EventRule.inserted`` writes the started event beside the created one, so the chain, the
version and the times are those of a create followed by a start at the same instant. The
tables are v6's (a read-only open of a v6 file reads it in place).

v8 writes every check and trigger condition that tested a value against a list of three or more
constants as a chain of equalities (:func:`_one_of`, rendered from the same rules as v7's
lists): SQLite builds a temporary B-tree for such a list each time a statement runs it, which
had cost a guarded job about half of all the instructions it executes. What the conditions
accept is unchanged, and so are the tables' columns and rows: the upgrade from v7 replaces the
three tables' stored definitions in place with the text a v8 file stores
(``PRAGMA writable_schema``, no row is copied) and recreates the three triggers. A SQLite that
refuses to rewrite its own schema keeps the file at v7, which this release reads and writes
as it is (without thread ids: the v9 step follows v8's).

v9 adds ``tsg_tasks.thread_id``, the framework's thread of a logical task (a LangGraph thread
id), and a partial index that finds a thread's tasks; NULL for every task recorded before.
Task rows are read without it (``store.transitions.TASK_COLUMNS``): only a thread's lookups
and the verdicts' claim read it, on a layout that has it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterable
from functools import cache

from .. import reasons as r
from .. import rules
from ..model import (
    DELIVERY_CODES,
    FRAMEWORK_LABELS,
    LOST_CODES,
    TASK_CODES,
    TASK_KIND_SQL,
    StorageError,
)
from ..store.backends import SQLITE_SCHEMA_VERSION

#: The layout this release writes (the registry states it, so the facade knows it too).
SCHEMA_VERSION = SQLITE_SCHEMA_VERSION
APPLICATION = "task-state-guard"

EMPTY = "empty"
V1 = "v1"
V2 = "v2"
V3 = "v3"
V4 = "v4"
V5 = "v5"
V6 = "v6"
V7 = "v7"
V8 = "v8"
V9 = "v9"
#: The layout this release writes.
CURRENT = V9
#: The layouts that have the verdict outbox (v5 and later).
OUTBOX_LAYOUTS = frozenset({"v5", "v6", "v7", "v8", "v9"})
RELEASE_010 = "0.1.0"  # the layout written by the published task-state-guard 0.1.0
#: A ledger written by a later release (its own metadata says so): ``schema_newer``, never
#: "foreign".
NEWER = "newer"
#: The schema version each layout stores about itself (0.1.0 called its layout version 2).
STORED_VERSION = {V1: 1, V2: 2, V3: 3, V4: 4, V5: 5, V6: 6, V7: 7, V8: 8, V9: 9,
                  RELEASE_010: 2}
KNOWN = frozenset(STORED_VERSION)

_TERMINAL = rules.TERMINAL_SQL

# ----------------------------------------------------------------------------- v3 (and v4's base)

_TASK_COLUMNS_V3 = rules.task_table_columns("sqlite")

#: The columns of ``tsg_tasks`` in v3, in table order.
V3_COLUMNS = ", ".join(c.name for c in rules.TASK_COLUMNS_BASE)

_META = "CREATE TABLE tsg_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
# Events are clustered by task: one B-tree page per transition, read in chain order.
# No foreign key (it costs every transition a lookup); doctor counts orphan events.


def _events_table(step: str, kind: str) -> str:
    """``tsg_events`` with the checks ``step`` and ``kind`` (conditions on those columns)."""
    return f"""CREATE TABLE tsg_events (
    task_seq INTEGER NOT NULL,
    step INTEGER NOT NULL CHECK ({step}),
    kind TEXT NOT NULL CHECK ({kind}),
    state TEXT NOT NULL,
    code TEXT,
    at REAL NOT NULL,
    PRIMARY KEY (task_seq, step)
) WITHOUT ROWID"""


_EVENTS = _events_table(f"step IN {rules.EVENT_STEPS_SQL}", f"kind IN {rules.EVENT_KINDS_SQL}")

_TABLES_V3 = [_META, f"CREATE TABLE tsg_tasks ({_TASK_COLUMNS_V3}\n)", _EVENTS]


def _rule_when(rule: rules.EventRule) -> str:
    """A transition's condition as the rules write it (v3 to v7)."""
    return rule.when()


def _triggers(code: str, ended: str, delivered: str,
              transition: Callable[[rules.EventRule], str] = _rule_when) -> list[str]:
    """Every state change writes its event in the same statement, enforced by the database
    (``rules.EVENT_RULES``; ``code``, ``ended``, ``delivered``: the layout's names of the
    close's code and time and of the delivery's time; ``transition``: the layout's form of a
    transition's condition)."""
    renames = {"terminal_code": code, "ended_at": ended, "delivery_updated_at": delivered}
    out = []
    for rule in rules.EVENT_RULES:
        on = "INSERT" if rule.before is None else f"UPDATE OF {rule.before.column}"
        when = f" WHEN {transition(rule)}" if rule.when() else ""
        out.append(f"CREATE TRIGGER tsg_event_{rule.kind} AFTER {on} ON tsg_tasks{when} BEGIN "
                   f"{rules.event_insert(rule, renames=renames)}; END")
    return out


_INDEXES = [
    # Open work: every task whose delivery is still pending (active or awaiting delivery).
    # start/close never touch this index; only creation and the delivery close do.
    "CREATE INDEX tsg_tasks_open ON tsg_tasks(seq) WHERE delivery_status = 'pending'",
    "CREATE INDEX tsg_tasks_parent ON tsg_tasks(parent_id) WHERE parent_id IS NOT NULL",
    # Prune candidates: closed roots by their last change (the delivery close).
    """CREATE INDEX tsg_tasks_prunable ON tsg_tasks(delivery_updated_at)
    WHERE parent_id IS NULL AND delivery_status != 'pending'""",
]
_INDEXES_V3 = [*_INDEXES, *_triggers("terminal_code", "ended_at", "delivery_updated_at")]

DDL_V3 = [*_TABLES_V3, *_INDEXES_V3]

# ----------------------------------------------------------------------------- v4

# Outcome totals. ``event`` 'closed': ``kind`` 'task' (a root, the logical task) or 'attempt'
# (a child); ``event`` 'delivery': ``kind`` 'owed' (delivery_required) or 'internal'. ``code``
# is '' when the transition gave none. Only ever incremented (by the triggers below).
_TOTAL_KINDS = ("task", "attempt", "owed", "internal")


def _totals_table(kind: str) -> str:
    """``tsg_totals`` with the check ``kind`` (a condition on that column)."""
    return f"""CREATE TABLE tsg_totals (
    event TEXT NOT NULL CHECK (event IN ('closed','delivery')),
    kind TEXT NOT NULL CHECK ({kind}),
    state TEXT NOT NULL,
    code TEXT NOT NULL,
    total INTEGER NOT NULL CHECK (total >= 0),
    PRIMARY KEY (event, kind, state, code)
) WITHOUT ROWID"""


_TOTALS = _totals_table(f"kind IN {rules.sql_list(_TOTAL_KINDS)}")

#: v4 and v5's kind of a close in the totals: a root or a child.
_TASK_KIND_V4 = "CASE WHEN NEW.parent_id IS NULL THEN 'task' ELSE 'attempt' END"
_DELIVERY_KIND = rules.DELIVERY_KIND_SQL
_CLOSED = rules.EVENTS_BY_KIND["closed"]
_DELIVERED = rules.EVENTS_BY_KIND["delivery"]


def _total_trigger(name: str, rule: rules.EventRule, event: str, kind: str,
                   transition: Callable[[rules.EventRule], str] = _rule_when) -> str:
    """The trigger that counts ``rule``'s transition in the outcome totals (``transition``:
    the layout's form of its condition)."""
    assert rule.before is not None
    state, code, _at = rule.values("NEW.")
    return (
        f"CREATE TRIGGER {name} AFTER UPDATE OF {rule.before.column} ON tsg_tasks "
        f"WHEN {transition(rule)} BEGIN "
        "INSERT INTO tsg_totals(event, kind, state, code, total) "
        f"VALUES ('{event}', {kind}, {state}, coalesce({code}, ''), 1) "
        "ON CONFLICT(event, kind, state, code) DO UPDATE SET total = total + 1; END"
    )


def _closed_total_trigger(task_kind: str,
                          transition: Callable[[rules.EventRule], str] = _rule_when) -> str:
    """The trigger that counts closes under ``task_kind`` (of the ``NEW`` row)."""
    return _total_trigger("tsg_total_closed", _CLOSED, "closed", task_kind, transition)


def _delivery_total_trigger(
        transition: Callable[[rules.EventRule], str] = _rule_when) -> str:
    return _total_trigger("tsg_total_delivery", _DELIVERED, "delivery",
                          _DELIVERY_KIND.format(row="NEW."), transition)


_TOTAL_TRIGGERS = [_closed_total_trigger(_TASK_KIND_V4), _delivery_total_trigger()]

# The totals of the tasks a file holds (seeds a migrated file; what a read-only open of an
# older layout reads). History pruned before the upgrade is not in it.
_TOTALS_SELECT = rules.TOTALS_SELECT

DDL_V4 = [*DDL_V3, _TOTALS, *_TOTAL_TRIGGERS]

# ----------------------------------------------------------------------------- v5


sql_list = rules.sql_set


#: Which adapter opened a logical task (NULL: a plain ledger task, an attempt, or a logical
#: task opened before v5) and, on an attempt, how long after its last sign of life the broker
#: may still redeliver its job (NULL: it will not).
_TASK_COLUMNS_V5 = rules.add_outbox_columns("sqlite")
# The verdict outbox: a logical task closed as lost is owed to its framework's adapters. One row
# per task (``task_seq``); ``lease_until``/``claim``: a publisher's lease (NULL: unclaimed).
_VERDICTS = """CREATE TABLE tsg_verdicts (
    task_seq INTEGER PRIMARY KEY,
    framework TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending','published')),
    recorded_at REAL NOT NULL,
    lease_until REAL,
    claim TEXT,
    published_at REAL
)"""
_VERDICTS_PENDING = (
    "CREATE INDEX tsg_verdicts_pending ON tsg_verdicts(framework, task_seq) "
    "WHERE state = 'pending'"
)
VERDICT_OWED = rules.VERDICT_OWED


def _verdict_trigger(owed: str) -> str:
    """The trigger that writes the verdict a close owes when ``owed`` holds."""
    return (
        f"CREATE TRIGGER tsg_verdict_owed AFTER UPDATE OF status ON tsg_tasks WHEN {owed} "
        "BEGIN INSERT INTO tsg_verdicts(task_seq, framework, state, recorded_at) "
        "VALUES (NEW.seq, NEW.framework, 'pending', NEW.ended_at) "
        "ON CONFLICT(task_seq) DO NOTHING; END"
    )


_VERDICT_TRIGGER = _verdict_trigger(VERDICT_OWED)
_V5_ADDITIONS = [*_TASK_COLUMNS_V5, _VERDICTS, _VERDICTS_PENDING, _VERDICT_TRIGGER]

DDL_V5 = [*DDL_V4, *_V5_ADDITIONS]

# ----------------------------------------------------------------------------- v6

#: v6's close trigger: the kind a person calls the task (``model.TASK_KIND_SQL``).
_CLOSED_TOTAL_TRIGGER_V6 = _closed_total_trigger(TASK_KIND_SQL.format(row="NEW."))
DDL_V6 = [_CLOSED_TOTAL_TRIGGER_V6 if s == _TOTAL_TRIGGERS[0] else s for s in DDL_V5]

# ----------------------------------------------------------------------------- v7


def _inserted_triggers() -> list[str]:
    """A row inserted already past a transition (``rules.EventRule.inserted``: a task inserted
    running) gets that transition's event from the insert too, in the same statement."""
    out = []
    for rule in rules.EVENT_RULES:
        if rule.inserted is not None:
            out.append(f"CREATE TRIGGER tsg_event_{rule.kind}_inserted AFTER INSERT ON tsg_tasks "
                       f"WHEN {rule.inserted.sql('NEW.')} BEGIN {rules.event_insert(rule)}; END")
    return out


_V7_ADDITIONS = _inserted_triggers()
DDL_V7 = [*DDL_V6, *_V7_ADDITIONS]

# ----------------------------------------------------------------------------- v8 (current)

# The same layout as v7, every test of a value against a list of three or more constants
# rendered from the same rules as a chain of equalities (shorter lists SQLite already compares
# one by one, and they stay as v7 writes them).


def _one_of(column: str, literals: Iterable[str]) -> str:
    """``column`` equal to one of ``literals`` (SQL constants) as a chain of equalities: the
    truth value of ``column IN (literals)``, NULL included."""
    return "(" + " OR ".join(f"{column} = {literal}" for literal in literals) + ")"


def _quoted(labels: Iterable[str]) -> list[str]:
    return [f"'{label}'" for label in labels]


def _test_v8(condition: rules.Condition, row: str) -> str:
    """v8's form of a rule's condition on a row prefixed ``row``: where the rule writes a list
    of three or more values (``rules.Condition.sql`` writes one value as ``=`` and all of a
    column's states but one as ``!=``), a chain of equalities."""
    values = condition.values
    rest = [v for v in condition.domain if values is not None and v not in values]
    if values is None or len(values) < 3 or len(rest) == 1:
        return condition.sql(row)
    return _one_of(row + condition.column, _quoted(values))


def _when_v8(rule: rules.EventRule) -> str:
    """v8's form of a transition's condition (``rules.EventRule.when``)."""
    assert rule.before is not None and rule.after is not None
    return f"{_test_v8(rule.before, 'OLD.')} AND {_test_v8(rule.after, 'NEW.')}"


#: The columns of ``tsg_tasks`` whose check lists three or more labels, and those labels (the
#: ones the rules' checks list, in the same order).
_LABELS_V8 = {
    "status": rules.TASK_ORDER,
    "delivery_status": rules.DELIVERY_ORDER,
    "framework": tuple(sorted(FRAMEWORK_LABELS)),
}


def _declare_v8(column: rules.Column) -> str:
    """A column of ``tsg_tasks`` as v8 declares it."""
    labels = _LABELS_V8.get(column.name)
    if labels is not None:
        check = f"CHECK ({_one_of(column.name, _quoted(labels))})"
        column = dataclasses.replace(column, constraint=check)
    return column.declare("sqlite")


_TASKS_V8 = ("CREATE TABLE tsg_tasks (\n    "
             + ",\n    ".join(_declare_v8(c) for c in rules.TASK_COLUMNS_BASE) + "\n)")
_EVENTS_V8 = _events_table(_one_of("step", (str(rule.step) for rule in rules.EVENT_RULES)),
                           _one_of("kind", _quoted(rule.kind for rule in rules.EVENT_RULES)))
_VERDICT_OWED_V8 = (  # rules.VERDICT_OWED
    f"NEW.framework IS NOT NULL AND OLD.status IN {rules.ACTIVE_SQL} "
    f"AND NEW.status = 'timed_out' "
    f"AND {_one_of('NEW.terminal_code', _quoted(sorted(LOST_CODES)))}"
)

DDL_V8 = [
    _META,
    _TASKS_V8,
    _EVENTS_V8,
    *_INDEXES,
    *_triggers("terminal_code", "ended_at", "delivery_updated_at", _when_v8),
    _totals_table(_one_of("kind", _quoted(_TOTAL_KINDS))),
    _closed_total_trigger(TASK_KIND_SQL.format(row="NEW."), _when_v8),
    _delivery_total_trigger(_when_v8),
    *[f"ALTER TABLE tsg_tasks ADD COLUMN {_declare_v8(c)}" for c in rules.TASK_COLUMNS_OUTBOX],
    _VERDICTS,
    _VERDICTS_PENDING,
    _verdict_trigger(_VERDICT_OWED_V8),
    *_V7_ADDITIONS,
]

# ----------------------------------------------------------------------------- v9

_V9_ADDITIONS = rules.add_thread_column("sqlite")
DDL_V9 = [*DDL_V8, *_V9_ADDITIONS]

# ----------------------------------------------------------------------------- v1 and v2

_TASK_COLUMNS_V1 = """
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    parent_id TEXT REFERENCES tsg_tasks(id),
    status TEXT NOT NULL CHECK (status IN
        ('queued','running','succeeded','failed','timed_out','cancelled')),
    code TEXT,
    delivery_required INTEGER NOT NULL CHECK (delivery_required IN (0, 1)),
    delivery_status TEXT NOT NULL CHECK (delivery_status IN
        ('pending','delivered','failed','not_applicable')),
    delivery_code TEXT,
    payload_hash TEXT,
    timeout_seconds REAL,
    deadline_at REAL,
    created_at REAL NOT NULL,
    started_at REAL,
    heartbeat_at REAL,
    closed_at REAL,
    delivery_closed_at REAL,
    updated_at REAL NOT NULL"""

DDL_V1 = [
    f"CREATE TABLE tsg_tasks ({_TASK_COLUMNS_V1}\n)",
    _META,
    _EVENTS,
    "CREATE INDEX tsg_tasks_open ON tsg_tasks(seq) WHERE delivery_closed_at IS NULL",
    "CREATE INDEX tsg_tasks_parent ON tsg_tasks(parent_id) WHERE parent_id IS NOT NULL",
]
DDL_V2 = [
    *DDL_V1,
    "ALTER TABLE tsg_tasks ADD COLUMN name TEXT",
    "ALTER TABLE tsg_tasks ADD COLUMN owner TEXT",
    """CREATE INDEX tsg_tasks_prunable ON tsg_tasks(updated_at)
    WHERE parent_id IS NULL AND delivery_closed_at IS NOT NULL""",
    *_triggers("code", "closed_at", "delivery_closed_at"),
]

# ----------------------------------------------------------------------------- 0.1.0

# The exact schema of a 0.1.0 ledger (whitespace-normalised), as read from such a file.
_RELEASE_010_FINGERPRINT = (
    ("index", "tasks_delivery_idx", "tasks",
     "CREATE INDEX tasks_delivery_idx ON tasks(delivery_status, ended_at)"),
    ("index", "tasks_parent_idx", "tasks", "CREATE INDEX tasks_parent_idx ON tasks(parent_id)"),
    ("index", "tasks_status_idx", "tasks",
     "CREATE INDEX tasks_status_idx ON tasks(status, updated_at)"),
    ("table", "schema_meta", "schema_meta",
     "CREATE TABLE schema_meta ( key TEXT PRIMARY KEY, value TEXT NOT NULL )"),
    ("table", "task_events", "task_events",
     "CREATE TABLE task_events ( sequence INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT "
     "NULL REFERENCES tasks(id), event_kind TEXT NOT NULL CHECK ( event_kind IN ('created',"
     "'task_transition','delivery_transition') ), from_value TEXT, to_value TEXT NOT NULL, "
     "occurred_at REAL NOT NULL, code TEXT )"),
    ("table", "tasks", "tasks",
     "CREATE TABLE tasks ( id TEXT PRIMARY KEY, parent_id TEXT REFERENCES tasks(id), status "
     "TEXT NOT NULL CHECK ( status IN ('queued','running','succeeded','failed','timed_out',"
     "'cancelled') ), delivery_status TEXT NOT NULL CHECK ( delivery_status IN ('pending',"
     "'delivered','failed','not_applicable') ), delivery_required INTEGER NOT NULL CHECK "
     "(delivery_required IN (0,1)), payload_hash TEXT CHECK ( payload_hash IS NULL OR ( "
     "length(payload_hash) = 64 AND payload_hash NOT GLOB '*[^0-9a-f]*' ) ), timeout_seconds "
     "REAL CHECK (timeout_seconds IS NULL OR timeout_seconds >= 0), created_at REAL NOT NULL, "
     "started_at REAL, updated_at REAL NOT NULL, ended_at REAL, deadline_at REAL, "
     "delivery_updated_at REAL NOT NULL, terminal_code TEXT, delivery_code TEXT, version "
     "INTEGER NOT NULL DEFAULT 0 CHECK (version >= 0), CHECK (parent_id IS NULL OR parent_id "
     "<> id), CHECK (deadline_at IS NULL OR started_at IS NOT NULL), CHECK ( (status IN "
     "('queued','running') AND ended_at IS NULL) OR (status IN ('succeeded','failed',"
     "'timed_out','cancelled') AND ended_at IS NOT NULL) ) )"),
)
# 0.1.0 stores its schema version and a digest of its own schema, the same in every file.
_RELEASE_010_META = {
    "schema_version": "2",
    "schema_fingerprint": "50ae209ec97afb360e142cfae85767f575acc2a065103f5b642bfd0c141e08f6",
}

# ----------------------------------------------------------------------------- v3 views of old data


def _tasks_select(fmt: str, source: str) -> str:
    """A SELECT presenting the task rows of an older layout as v3 columns."""
    if fmt == RELEASE_010:
        # 0.1.0 folded heartbeats into updated_at: a running task whose updated_at is later
        # than its start has had one (nothing else changes a running task).
        return (
            "SELECT rowid AS seq, id, parent_id, status, terminal_code, delivery_required, "
            "delivery_status, delivery_code, payload_hash, timeout_seconds, deadline_at, "
            "created_at, started_at, CASE WHEN status = 'running' AND updated_at > started_at "
            "THEN updated_at END AS heartbeat_at, ended_at, delivery_updated_at, updated_at, "
            f"NULL AS name, NULL AS owner, version, NULL AS framework_id FROM {source}"
        )
    extra = "name, owner" if fmt == V2 else "NULL AS name, NULL AS owner"
    return (
        "SELECT seq, id, parent_id, status, code AS terminal_code, delivery_required, "
        "delivery_status, delivery_code, payload_hash, timeout_seconds, deadline_at, "
        "created_at, started_at, heartbeat_at, closed_at AS ended_at, "
        "coalesce(delivery_closed_at, created_at) AS delivery_updated_at, "
        "max(created_at, coalesce(started_at, created_at), coalesce(heartbeat_at, created_at), "
        "coalesce(closed_at, created_at)) AS updated_at, "
        f"{extra}, (started_at IS NOT NULL) + (status IN {_TERMINAL}) "
        f"+ (delivery_status != 'pending') AS version, NULL AS framework_id FROM {source}"
    )


def _events_select_010(events: str, tasks: str) -> str:
    """0.1.0's events as v3 event rows; an event v3 cannot carry gets a NULL step."""
    step = (
        "CASE WHEN e.event_kind = 'created' AND e.from_value IS NULL "
        "AND e.to_value = 'queued' AND e.code = 'created' THEN 1 "
        "WHEN e.event_kind = 'task_transition' AND e.from_value = 'queued' "
        "AND e.to_value = 'running' AND e.code = 'started' THEN 2 "
        "WHEN e.event_kind = 'task_transition' AND e.from_value IN ('queued','running') "
        f"AND e.to_value IN {_TERMINAL} THEN 3 "
        "WHEN e.event_kind = 'delivery_transition' AND e.from_value = 'pending' "
        "AND e.to_value IN ('delivered','failed','not_applicable') THEN 4 END"
    )
    return (
        "SELECT task_seq, step, CASE step WHEN 1 THEN 'created' WHEN 2 THEN 'started' "
        "WHEN 3 THEN 'closed' WHEN 4 THEN 'delivery' END AS kind, state, code, at FROM ("
        f"SELECT t.rowid AS task_seq, {step} AS step, e.to_value AS state, e.code AS code, "
        f"e.occurred_at AS at FROM {events} e LEFT JOIN {tasks} t ON t.id = e.task_id)"
    )


def compat_views(fmt: str) -> list[str]:
    """Temporary views that let a read-only connection read an older layout as v4."""
    views: list[str] = []
    if fmt in (V1, V2):
        views.append(f"CREATE TEMP VIEW tsg_tasks AS {_tasks_select(fmt, 'main.tsg_tasks')}")
    elif fmt == RELEASE_010:
        views += [
            f"CREATE TEMP VIEW tsg_tasks AS {_tasks_select(fmt, 'main.tasks')}",
            "CREATE TEMP VIEW tsg_events AS "
            + _events_select_010("main.task_events", "main.tasks"),
        ]
    if fmt in (V1, V2, V3, RELEASE_010):
        source = "main.tsg_tasks" if fmt == V3 else "temp.tsg_tasks"
        views.append(
            f"CREATE TEMP VIEW tsg_totals AS {_TOTALS_SELECT.format(tasks=source)}")
    return views


# ----------------------------------------------------------------------------- fingerprints

META_KEYS = frozenset({"application", "schema_version"})

Fingerprint = tuple[tuple[str, str, str, str], ...]


#: The objects SQLite itself makes, left out of a fingerprint: matched exactly (``GLOB`` is
#: case-sensitive and has no single-character ``_`` wildcard), by type and name: the
#: automatic indexes of UNIQUE and PRIMARY KEY constraints (no SQL text), ``sqlite_sequence``
#: (AUTOINCREMENT) and ANALYZE's statistics tables. Anything else is the file's own schema,
#: whatever its name: a trigger called ``SQLITEXtrigger`` or ``sqlite_x`` (only possible
#: through ``writable_schema``) is an unknown object.
_INTERNAL = (
    "(type = 'index' AND name GLOB 'sqlite_autoindex_*' AND sql IS NULL)"
    " OR (type = 'table' AND name = 'sqlite_sequence' AND tbl_name = 'sqlite_sequence')"
    " OR (type = 'table' AND name GLOB 'sqlite_stat[1-4]' AND tbl_name = name)"
)


def read_fingerprint(conn: sqlite3.Connection, schema: str = "main") -> Fingerprint:
    """Return the ordered (type, name, table, sql) rows of the user schema: every object
    but SQLite's own (:data:`_INTERNAL`)."""
    rows = conn.execute(
        f"SELECT type, name, tbl_name, coalesce(sql, '') FROM {schema}.sqlite_master "
        f"WHERE NOT ({_INTERNAL}) ORDER BY type, name"
    ).fetchall()
    return tuple((str(a), str(b), str(c), " ".join(str(d).split())) for a, b, c, d in rows)


def _built(fmt: str) -> sqlite3.Connection:
    """An in-memory database built from the DDL of layout ``fmt`` (the caller closes it)."""
    ddl = {V1: DDL_V1, V2: DDL_V2, V3: DDL_V3, V4: DDL_V4, V5: DDL_V5, V6: DDL_V6,
           V7: DDL_V7, V8: DDL_V8, V9: DDL_V9}[fmt]
    conn = sqlite3.connect(":memory:")
    for statement in ddl:
        conn.execute(statement)
    return conn


@cache
def expected_fingerprint(fmt: str) -> Fingerprint:
    """Fingerprint of a database built from the DDL of layout ``fmt``."""
    if fmt == RELEASE_010:
        return _RELEASE_010_FINGERPRINT
    conn = _built(fmt)
    try:
        return read_fingerprint(conn)
    finally:
        conn.close()


@cache
def _stored_texts(fmt: str) -> dict[tuple[str, str], str]:
    """The text a file of layout ``fmt`` stores for each of its objects, by (type, name), as
    SQLite writes it from the layout's statements (a table's from its CREATE and ADD COLUMN
    statements)."""
    conn = _built(fmt)
    try:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {(str(kind), str(name)): str(sql) for kind, name, sql in rows}
    finally:
        conn.close()


def _changed_by(fmt: str, before: str) -> dict[tuple[str, str], str]:
    """The objects whose stored text layout ``fmt`` changed from layout ``before`` (both have
    the same objects), with ``fmt``'s text."""
    old, new = _stored_texts(before), _stored_texts(fmt)
    assert old.keys() == new.keys()
    return {key: sql for key, sql in new.items() if old[key] != sql}


def detect_format(conn: sqlite3.Connection, schema: str = "main") -> str | None:
    """Return EMPTY, V1 to V9 or RELEASE_010 for an exact known schema; NEWER for a layout
    this release does not know whose metadata says it is a ledger of a later release; else
    None (foreign, or tampered: a known layout whose metadata says otherwise)."""
    found = read_fingerprint(conn, schema)
    if not found:
        return EMPTY
    if not any(found == expected_fingerprint(fmt) for fmt in KNOWN):
        has_meta = any(row[:2] == ("table", "tsg_meta") for row in found)
        return NEWER if has_meta and _is_newer(conn, schema) else None
    for fmt in (V9, V8, V7, V6, V5, V4, V3, V2, V1, RELEASE_010):
        if found != expected_fingerprint(fmt):
            continue
        if fmt == RELEASE_010:
            meta = dict(conn.execute(f"SELECT key, value FROM {schema}.schema_meta").fetchall())
            return fmt if meta == _RELEASE_010_META else None
        meta = dict(conn.execute(f"SELECT key, value FROM {schema}.tsg_meta").fetchall())
        expected = {"application": APPLICATION, "schema_version": str(STORED_VERSION[fmt])}
        return fmt if meta == expected else None
    return None


def unexpected_objects(conn: sqlite3.Connection, schema: str = "main") -> tuple[str | None, int]:
    """For doctor: the number of the file's objects that the known layout closest to its
    schema does not have (added ones, or changed ones such as a trigger's rewritten text), and
    that layout when the file has every one of its objects (its rows can then be checked)."""
    found = set(read_fingerprint(conn, schema))
    if not found:
        return None, 0
    closest = min(sorted(KNOWN), key=lambda fmt: len(found ^ set(expected_fingerprint(fmt))))
    expected = set(expected_fingerprint(closest))
    return (closest if expected <= found else None), len(found - expected)


def _is_newer(conn: sqlite3.Connection, schema: str) -> bool:
    """Whether ``tsg_meta`` says this is our application's ledger at a later schema version."""
    try:
        meta = dict(conn.execute(
            f"SELECT key, value FROM {schema}.tsg_meta "
            "WHERE key IN ('application', 'schema_version')").fetchall())
    except sqlite3.Error:
        return False  # not even our metadata table's shape: foreign
    version = meta.get("schema_version")
    return (
        meta.get("application") == APPLICATION
        and isinstance(version, str)
        and version.isascii()
        and version.isdigit()
        and int(version) > SCHEMA_VERSION
    )


# ----------------------------------------------------------------------------- create / migrate


def create(conn: sqlite3.Connection) -> None:
    """Create the current schema inside the caller's transaction."""
    for statement in DDL_V9:
        conn.execute(statement)
    _write_meta(conn)


def _write_meta(conn: sqlite3.Connection) -> None:
    conn.executemany(
        "INSERT INTO tsg_meta(key, value) VALUES (?, ?)",
        [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
    )


def _codes_valid(conn: sqlite3.Connection, tasks: str, code_column: str) -> bool:
    """Every stored reason belongs to the registry and to its state."""
    for column, state_column, registry in (
        (code_column, "status", TASK_CODES),
        ("delivery_code", "delivery_status", DELIVERY_CODES),
    ):
        rows = conn.execute(
            f"SELECT DISTINCT {state_column}, {column} FROM {tasks} WHERE {column} IS NOT NULL"
        )
        for state, code in rows:
            if code not in registry.get(state, frozenset()):
                return False
    return True


def _event_codes_valid(conn: sqlite3.Connection, events_select: str) -> bool:
    for step, kind, state, code in conn.execute(
        f"SELECT DISTINCT step, kind, state, code FROM ({events_select}) WHERE code IS NOT NULL "
        "OR step IS NULL"
    ):
        if step is None:
            return False
        if kind in ("created", "started"):
            if code != kind:
                return False
            continue
        registry = DELIVERY_CODES if kind == "delivery" else TASK_CODES
        if code not in registry.get(state, frozenset()):
            return False
    return True


def _to_v3(conn: sqlite3.Connection, fmt: str) -> None:
    """v1, v2 or 0.1.0 to v3. Refused when a stored reason is outside the registry or its
    state, or an event cannot be carried over exactly."""
    if fmt in (V1, V2):
        if not _codes_valid(conn, "tsg_tasks", "code") or not _event_codes_valid(
            conn, "SELECT step, kind, state, code FROM tsg_events"
        ):
            raise StorageError(
                f"schema {fmt} holds reason text outside the registry; migrate explicitly",
                reason=r.MIGRATION_REFUSED,
            )
        for (trigger,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'tsg_tasks'"
        ).fetchall():
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute("ALTER TABLE tsg_tasks RENAME TO tsg_tasks_old")
        conn.execute(_TABLES_V3[1])
        conn.execute(
            f"INSERT INTO tsg_tasks({V3_COLUMNS}) "
            f"{_tasks_select(fmt, 'tsg_tasks_old')} ORDER BY seq"
        )
        conn.execute("DROP TABLE tsg_tasks_old")  # with its indexes
        _set_version(conn, V3)
    elif fmt == RELEASE_010:
        events = _events_select_010("task_events", "tasks")
        if not _codes_valid(conn, "tasks", "terminal_code") or not _event_codes_valid(
            conn, events
        ):
            raise StorageError(
                "the 0.1.0 ledger holds reasons or events outside the registry",
                reason=r.MIGRATION_REFUSED,
            )
        for statement in _TABLES_V3:
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO tsg_tasks({V3_COLUMNS}) {_tasks_select(fmt, 'tasks')} ORDER BY rowid"
        )
        before = conn.total_changes
        conn.execute(
            "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
            f"SELECT task_seq, step, kind, state, code, at FROM ({events})"
        )
        copied = conn.total_changes - before
        if copied != conn.execute("SELECT count(*) FROM task_events").fetchone()[0]:
            raise StorageError(
                "the 0.1.0 ledger holds events this version cannot carry",
                reason=r.MIGRATION_REFUSED,
            )
        for table in ("task_events", "tasks", "schema_meta"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("DELETE FROM sqlite_sequence")
        _write_meta(conn)
        _set_version(conn, V3)
    else:
        raise StorageError(
            "the database holds a foreign or tampered schema", reason=r.FOREIGN_SCHEMA
        )
    for statement in _INDEXES_V3:
        conn.execute(statement)


def _v3_to_v4(conn: sqlite3.Connection, fmt: str) -> None:
    """v3 to v4: the totals table, seeded with the outcomes of the tasks the file holds."""
    conn.execute(_TOTALS)
    conn.execute(
        "INSERT INTO tsg_totals(event, kind, state, code, total) "
        + _TOTALS_SELECT.format(tasks="tsg_tasks")
    )
    for statement in _TOTAL_TRIGGERS:
        conn.execute(statement)
    _set_version(conn, V4)


def _v4_to_v5(conn: sqlite3.Connection, fmt: str) -> None:
    """v4 to v5: the framework label and redelivery bound columns, and the verdict outbox.

    Nothing is backfilled: which adapter opened a task was not recorded before, so a task
    closed as lost after the upgrade owes a verdict only if it was opened after it.
    """
    for statement in _V5_ADDITIONS:
        conn.execute(statement)
    _set_version(conn, V5)


def _v5_to_v6(conn: sqlite3.Connection, fmt: str) -> None:
    """v5 to v6: closes are counted under the kind a person calls the task from now on; the
    totals counted before keep their kind (a counter never goes down)."""
    conn.execute("DROP TRIGGER tsg_total_closed")
    conn.execute(_CLOSED_TOTAL_TRIGGER_V6)
    _set_version(conn, V6)


def _v6_to_v7(conn: sqlite3.Connection, fmt: str) -> None:
    """v6 to v7: inserts of rows already running write their started event too (the rows
    stored before are left as they are: their chains are already complete)."""
    for statement in _V7_ADDITIONS:
        conn.execute(statement)
    _set_version(conn, V7)


def _v7_to_v8(conn: sqlite3.Connection, fmt: str) -> None:
    """v7 to v8: the three tables' checks and the three triggers' conditions without lists.

    A table's stored definition is replaced in place by the one a v8 file stores (the same
    columns, in the same order; only the checks' form differs), as SQLite documents for a
    change that leaves every stored row valid (the conditions accept exactly what they
    accepted), with the schema cookie raised so that every connection reads the new
    definitions; nothing is copied. A SQLite that refuses (defensive mode, an authorizer)
    raises and the caller keeps v7.
    """
    changed = _changed_by(V8, V7)
    cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        for (kind, name), sql in changed.items():
            if kind == "table":
                conn.execute(
                    "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
                    (sql, name),
                )
        conn.execute(f"PRAGMA schema_version = {int(cookie) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    for (kind, name), sql in changed.items():
        if kind == "trigger":
            conn.execute(f"DROP TRIGGER {name}")
            conn.execute(sql)
    _set_version(conn, V8)


def _v8_to_v9(conn: sqlite3.Connection, fmt: str) -> None:
    """v8 to v9: the thread column (NULL for every task stored before) and its index."""
    for statement in _V9_ADDITIONS:
        conn.execute(statement)
    _set_version(conn, V9)


def _set_version(conn: sqlite3.Connection, fmt: str) -> None:
    conn.execute(
        "UPDATE tsg_meta SET value = ? WHERE key = 'schema_version'", (str(STORED_VERSION[fmt]),)
    )


#: The migration steps: from a layout to the next one, applied in order up to the current.
MIGRATIONS: dict[str, tuple[str, Callable[[sqlite3.Connection, str], None]]] = {
    V1: (V3, _to_v3),
    V2: (V3, _to_v3),
    RELEASE_010: (V3, _to_v3),
    V3: (V4, _v3_to_v4),
    V4: (V5, _v4_to_v5),
    V5: (V6, _v5_to_v6),
    V6: (V7, _v6_to_v7),
    V7: (V8, _v7_to_v8),
    V8: (V9, _v8_to_v9),
}


#: Steps whose layout only makes the file faster: when SQLite refuses one, the file stays at
#: the layout before it, which this release reads and writes as it is.
_OPTIONAL = frozenset({V8})


def migrate(conn: sqlite3.Connection, fmt: str) -> str:
    """Upgrade an exact older layout to the current one in the caller's transaction, step by
    step; fail closed (StorageError, nothing changed once the caller rolls back). Return the
    layout reached: the current one, or the one before an optional step SQLite refused.

    Each step ends with the exact fingerprint of the layout it produced.
    """
    if fmt not in MIGRATIONS:
        raise StorageError("the database holds a foreign or tampered schema",
                           reason=r.FOREIGN_SCHEMA)
    while fmt in MIGRATIONS:
        target, step = MIGRATIONS[fmt]
        if target in _OPTIONAL:
            conn.execute("SAVEPOINT tsg_optional_step")
            try:
                step(conn, fmt)
            except sqlite3.DatabaseError:
                conn.execute("ROLLBACK TO tsg_optional_step")
                conn.execute("RELEASE tsg_optional_step")
                return fmt
            conn.execute("RELEASE tsg_optional_step")
        else:
            step(conn, fmt)
        if read_fingerprint(conn) != expected_fingerprint(target):  # never a half-known layout
            raise StorageError("the migrated schema does not match the current schema",
                               reason=r.MIGRATION_REFUSED)
        fmt = target
    return fmt
