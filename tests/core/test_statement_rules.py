"""Each backend runs the statements the rules compose, not a copy of its own.

The active and terminal sets, the clock guard, the outcome-totals rule and the statements both
backends share are written once (``task_state_guard.rules``, ``store.transitions``,
``store.queries``) and rendered per dialect. Here every backend's statement texts are compared
with the shared ones rendered in that backend's placeholders, the transitions' guards with the
rules, and the backends' statement modules are read for a rule spelled out by hand: a backend
whose statement drifts from a rule fails here (``test_event_rules`` checks the events they
write by running them).
"""

from __future__ import annotations

import inspect
import re
from types import ModuleType

import pytest
import task_state_guard_postgres.attempts as pg_attempts
import task_state_guard_postgres.queries as pg_queries
import task_state_guard_postgres.transitions as pg_transitions
import task_state_guard_postgres.writes as pg_writes
from task_state_guard import model, rules
from task_state_guard.integration import codes
from task_state_guard.ops import doctor
from task_state_guard.sqlite import attempts as sqlite_attempts
from task_state_guard.sqlite import queries as sqlite_queries
from task_state_guard.sqlite import schema as sqlite_schema
from task_state_guard.sqlite import transitions as sqlite_transitions
from task_state_guard.store import backends, queries, transitions

#: (backend, its placeholder, its transitions module, its queries module, its query dialect)
BACKENDS = {
    "sqlite": (sqlite_transitions.mark, sqlite_transitions, sqlite_queries,
               sqlite_queries._DIALECT),
    "postgresql": (pg_transitions.mark, pg_transitions, pg_queries, pg_queries.DIALECT),
}


@pytest.mark.parametrize("which", sorted(BACKENDS))
def test_transition_statements_are_the_shared_ones(which: str) -> None:
    mark, module, _, _ = BACKENDS[which]
    shared = transitions.statements(mark)
    assert set(shared) == set(transitions.STATEMENTS)
    if which == "postgresql":  # prepared: each composed on its own with the server's ``$n``
        assert set(module._STATEMENTS) == set(shared)
        for name, prepared in module._STATEMENTS.items():
            used: list[str] = []
            transitions.statement(lambda n, used=used: used.append(n) or "", name)
            assert sorted(prepared.names) == sorted(set(used)), name

            def numbered(n: str, names: tuple[str, ...] = prepared.names) -> str:
                return f"${names.index(n) + 1}::{module.TYPES[n]}"

            # the shared statement's change, as a sub-statement beside what its rows owe
            assert module._writing(numbered, name) == prepared.text, name
            change = transitions.guarded_statement(
                numbered, "start" if name == "start_seq" else name)
            assert change.removesuffix(" RETURNING seq") in prepared.text, name
            for kind in module.OWES.get(name, ()):
                assert rules.event_select(rules.EVENTS_BY_KIND[kind], "w") in prepared.text
    else:
        assert shared == module._STATEMENTS
    assert transitions.guarded(mark)["heartbeat"] == module._HEARTBEAT


@pytest.mark.parametrize("which", sorted(BACKENDS))
def test_transition_guards_follow_the_rules(which: str) -> None:
    mark = BACKENDS[which][0]
    guarded = transitions.guarded(mark)
    for name, stamps in rules.CLOCK_GUARDS.items():
        guard = " AND ".join(f"{mark('now')} >= {stamp}" for stamp in stamps)
        assert guard in guarded[name], name
    order = rules.TASK_ORDER
    active = f"status IN {rules.sql_list(s for s in order if s in model.ACTIVE_STATES)}"
    for name in ("close", "close_settled"):
        assert active in guarded[name]
    # A delivery closes only on a terminal task: one that is not active (the CHECK admits no
    # other state; a short list keeps SQLite from building a lookup table per run).
    assert f"status NOT {active[len('status '):]}" in guarded["deliver"]
    assert set(model.TaskStatus) - model.ACTIVE_STATES == model.TERMINAL_STATES
    assert "status = 'queued'" in guarded["start"]


def test_sqlite_attempts_reuse_the_one_task_statements() -> None:
    guarded = transitions.guarded(sqlite_transitions.mark)
    assert guarded["start"] == sqlite_attempts._START
    assert guarded["close_settled"] == sqlite_attempts._CLOSE[False]
    assert transitions.close_guard(sqlite_transitions.mark, settle=True) in (
        sqlite_attempts._CLOSE_MARKED[False])
    # The queued-only closes differ from them by their source state alone.
    active = f"status IN {rules.ACTIVE_SQL}"
    for ordinary, queued in ((sqlite_attempts._CLOSE[False], sqlite_attempts._CLOSE[True]),
                             (sqlite_attempts._CLOSE_MARKED[False],
                              sqlite_attempts._CLOSE_MARKED[True])):
        assert active in ordinary
        assert queued == ordinary.replace(active, "status = 'queued'")


@pytest.mark.parametrize("which", sorted(BACKENDS))
def test_shared_queries_are_rendered_per_backend(which: str) -> None:
    _, _, module, dialect = BACKENDS[which]
    assert queries.statements(dialect) == module._SQL
    for text in module._SQL.values():
        # a dialect's placeholders only: no other backend's marker left in the text
        other = ":" if which == "postgresql" else "%("
        assert f"{other}now" not in text and f"{other}id" not in text


def test_pass_writes_count_totals_by_the_rule() -> None:
    for name, total in (("time_out", "closed"), ("close_delivery", "delivery")):
        # a pass's batch counts its closes grouped: a row per kind, state and code
        grouped = rules.TOTAL_RULES[total].select("u")
        assert f"{rules.TOTALS_INSERT}{grouped}" in pg_queries.PASS_WRITES[name]
    # a guarded job's end counts both closes by the same rules
    end = pg_attempts.END[False, True, True].text
    for total in ("closed", "delivery"):
        assert rules.TOTAL_RULES[total].increments("c") in end
    assert rules.TOTALS_SELECT.count("UNION ALL") == 1
    for total in rules.TOTAL_RULES.values():
        assert total.rule.present.sql() in rules.TOTALS_SELECT


#: Spellings of a rule a backend's statement module must not contain: it renders the rule.
_RULE_SPELLINGS = {
    "the active set": re.compile(r"'queued',\s*'running'"),
    "the terminal set": re.compile(r"'succeeded',\s*'failed'"),
    "the clock guard": re.compile(r">=\s*(updated_at|delivery_updated_at|coalesce\(heartbeat_at)"),
    "the outcome totals": re.compile(r"INTO tsg_totals"),
    "the contradicted close": re.compile(r"ended_at\s*>\s*\w*\.?ended_at"),
}
#: The backends' statement modules that render every rule (both layouts' stored texts are
#: kept as their layouts wrote them).
_STATEMENT_MODULES: list[ModuleType] = [
    sqlite_transitions, sqlite_attempts, sqlite_queries, pg_transitions, pg_attempts,
    pg_queries, pg_writes, transitions, queries,
]


@pytest.mark.parametrize("module", _STATEMENT_MODULES, ids=lambda m: m.__name__)
def test_no_statement_module_spells_a_rule(module: ModuleType) -> None:
    source = inspect.getsource(module)
    for rule, spelling in _RULE_SPELLINGS.items():
        assert not spelling.search(source), f"{module.__name__} spells {rule}"


@pytest.mark.parametrize("which", sorted(BACKENDS))
def test_the_contradicted_close_is_the_rules_everywhere(which: str) -> None:
    """Doctor's warning, the listing's filter of jobs and of attempts: one rule."""
    dialect = BACKENDS[which][3]
    for attempts, rule in ((False, rules.close_contradicted(queries.LISTED)),
                           (True, rules.contradicts_its_close(queries.LISTED))):
        query = queries.TaskQuery(
            attempts=attempts, job=None, open_only=False, status=None, active_only=False,
            name=None, idle_before=None, created_before=None, order="created",
            descending=False, after=None, limit=1, contradicted=True)
        assert rule in queries.listing(dialect, "id", query)[0]
    assert rules.close_contradicted("j.") in doctor._CONTRADICTED_CLOSES
    assert rules.contradicts_close("j.", "a.") in rules.close_contradicted("j.")
    assert rules.contradicts_close("j.", "x.") in rules.contradicts_its_close("x.")


def test_adapter_codes_are_the_models() -> None:
    states = {s.value for s in model.TaskStatus} | {s.value for s in model.DeliveryStatus}
    reason_codes = {c.value for c in model.TaskCode} | {c.value for c in model.DeliveryCode}
    names = [n for n in codes.__all__ if n.isupper() and isinstance(getattr(codes, n), str)]
    assert len(names) == 25
    for name in names:
        value = getattr(codes, name)
        assert type(value) is str and value in states | reason_codes, name
    assert codes.ACTIVE == model.ACTIVE_STATES
    assert codes.TERMINAL == model.TERMINAL_STATES
    assert codes.QUEUED == "queued" and codes.DELIVERY_FAILED == "failed"
    assert {c for cs in model.TASK_CODES.values() for c in cs} == {
        c.value for c in model.TaskCode}
    assert {c for cs in model.DELIVERY_CODES.values() for c in cs} == {
        c.value for c in model.DeliveryCode}


def test_facade_layout_version_is_the_sqlite_schemas() -> None:
    assert backends.SQLITE_SCHEMA_VERSION == sqlite_schema.SCHEMA_VERSION
