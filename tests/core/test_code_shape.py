"""The code keeps the shape the refactors gave it, measured over all five packages.

``scripts/code_shape.py`` reads the tree statically and prints its counts as JSON; these tests
assert the invariants on this checkout: no import circle in any package, no SQL text edited by
``replace``/``sub``/``%``, no private name used outside its module, the core's root holding
only the domain and the facade, and bounds on the store protocol's surface (its sub-protocols
included) and on the code of ``Ledger`` (docstrings and comments never count: a bound is a
smell detector, never a reason to cut documentation); no module of the LangGraph adapter over
a bound counted in all its lines (a module outgrows it by being split by concern), and
``GuardedGraph`` one class based on the core's ``AdapterSurface`` alone (no mixins: it
delegates to the objects it holds). The last test shows the checker finds each of these in a
small tree built for it, so none of the asserts passes by measuring nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "scripts" / "code_shape.py"
#: The members of the store protocol and every member of its sub-protocols (``queries``,
#: ``owners``, ``health``) a backend provides: today's count, a ceiling that only comes down
#: (44 since owners gained ``supervise``: a process lending its liveness to the children it
#: forks is a capability each backend implements in its own way, lock files or sessions; 45
#: since queries gained ``hold_open``: where writers run beside a pass, it holds only the rows
#: it changes, so a worker never waits for a pass over rows it keeps).
STORE_CALLABLES_BOUND = 45
STORE_MEMBERS_BOUND = 12
#: Statements of ``class Ledger`` (74 when set): the facade delegates, one call a method
#: (82 since ``overview``: the status and the outcome history in one read, the web view's page).
LEDGER_STATEMENTS_BOUND = 82
#: Lines of any module of the LangGraph adapter, every line counted (docstrings, comments and
#: blank lines too): a module that outgrows it is split by concern, its documentation kept.
LANGGRAPH_MODULE_LINES_BOUND = 450
LANGGRAPH_SRC = "packages/adapter-langgraph/src/"
CORE_ROOT = ["__init__", "__main__", "durations", "heartbeat", "ledger", "model", "process",
             "reasons", "rules", "writes"]


def _shape(tree: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(CHECKER), str(tree)], capture_output=True,
                          text=True, timeout=120, check=True)
    shape: dict[str, Any] = json.loads(done.stdout)
    return shape


@pytest.fixture(scope="module")
def shape() -> dict[str, Any]:
    return _shape(ROOT)


def test_every_package_is_scanned(shape: dict[str, Any]) -> None:
    assert shape["packages"] == ["celery", "core", "dramatiq", "langgraph", "postgres"]


def test_the_store_protocol_with_its_sub_protocols_stays_within_its_bound(
        shape: dict[str, Any]) -> None:
    assert shape["store_protocol_members"] <= STORE_MEMBERS_BOUND, \
        shape["store_protocol_member_names"]
    assert shape["store_protocol_callables"] <= STORE_CALLABLES_BOUND, \
        shape["store_sub_protocols"]
    assert set(shape["store_sub_protocols"]) >= {"queries", "owners", "health"}


def test_the_ledger_facade_stays_thin(shape: dict[str, Any]) -> None:
    assert shape["ledger_statements"] <= LEDGER_STATEMENTS_BOUND


def test_the_core_root_holds_only_domain_modules(shape: dict[str, Any]) -> None:
    assert shape["core_root_modules"] == CORE_ROOT, shape["core_root_unexpected"]


# Fails on main: Dramatiq's ``_install.py`` assigns the middleware's ``_broker`` (lines 66 and
# 81), a private of ``middleware.py``'s class (the former checker took any ``obj._x = ...`` for
# the assigning module's own name).
def test_no_private_name_is_used_outside_its_module(shape: dict[str, Any]) -> None:
    assert shape["private_names_outside_module"] == 0, shape["private_name_sites"]


# Fails until the branches that remove Celery's ``_guard``<->``_install`` and Dramatiq's
# ``middleware``<->``_install`` circles are merged.
def test_no_import_circle_in_any_package(shape: dict[str, Any]) -> None:
    circles = {pkg: cycles for pkg, cycles in shape["import_cycles_by_package"].items()
               if cycles}
    assert circles == {}
    assert shape["import_cycles"] == 0


def test_every_langgraph_module_stays_within_its_line_bound(shape: dict[str, Any]) -> None:
    lengths = {path: lines for path, lines in shape["module_lines"].items()
               if path.startswith(LANGGRAPH_SRC)}
    assert "packages/adapter-langgraph/src/task_state_guard_langgraph/_guard.py" in lengths
    over = {path: lines for path, lines in lengths.items()
            if lines > LANGGRAPH_MODULE_LINES_BOUND}
    assert over == {}
    longest = shape["longest_module_by_package"]["langgraph"]
    assert longest["lines"] == max(lengths.values()) <= LANGGRAPH_MODULE_LINES_BOUND


def test_guarded_graph_is_one_class_on_the_adapter_surface_alone(shape: dict[str, Any]) -> None:
    found = shape["adapter_classes"]["langgraph"]
    assert found["class"] == "GuardedGraph"
    assert [(d["bases"], d["keywords"]) for d in found["definitions"]] == [
        (["AdapterSurface"], [])], found["definitions"]


#: Edits of SQL text kept on purpose, by file (none: every statement is composed as it runs;
#: the PostgreSQL driver's prepared statements are composed with the server's ``$n`` marks, not
#: converted from psycopg's placeholders). Any edit fails the test.
KNOWN_SQL_EDITS: dict[str, int] = {}


def test_no_sql_text_is_edited(shape: dict[str, Any]) -> None:
    by_file: dict[str, int] = {}
    for site in shape["sql_text_edit_sites"]:
        path = site.split(":", 1)[0]
        by_file[path] = by_file.get(path, 0) + 1
    assert by_file == KNOWN_SQL_EDITS, shape["sql_text_edit_sites"]


_FAKE = {
    "core/src/task_state_guard/__init__.py": "",
    "core/src/task_state_guard/extra.py": "",
    "core/src/task_state_guard/store/__init__.py": "",
    "core/src/task_state_guard/store/protocol.py": '''
        from typing import Protocol

        class Queries(Protocol):
            def one(self) -> int: ...
            def two(self) -> int: ...

        class Database(Protocol):
            @property
            def queries(self) -> Queries: ...
            def close(self) -> None: ...
        ''',
    "core/src/task_state_guard/ledger.py": '''
        class Ledger:
            """A long docstring
            on several lines
            that no bound counts."""

            def close(self) -> None:
                """Close it."""
                # a comment
                self._db = None
        ''',
    "core/src/task_state_guard/cycle_a.py": '''
        def late() -> None:
            from .cycle_b import b
        ''',
    "core/src/task_state_guard/cycle_b.py": "from . import cycle_a\nb = 1\n",
    "backend-postgres/src/task_state_guard_postgres/__init__.py": "",
    "backend-postgres/src/task_state_guard_postgres/driver.py": '''
        import re
        _Q = re.compile(r"\\?")
        _TEMPLATE = "SELECT id FROM tsg_tasks WHERE {where}"

        def prepare(sql: str, other: object, value: int) -> str:
            other._secret = 1
            text = _Q.sub("%s", sql)
            label = "a-b".replace("-", "_")
            count = "%d rows" % value
            filled = _TEMPLATE.format(where="seq = 1")
            return text.replace("%%", "%") + ("UPDATE t SET a = %s" % value) + label + count
        ''',
    "adapter-celery/src/task_state_guard_celery/__init__.py": "",
    "adapter-dramatiq/src/task_state_guard_dramatiq/__init__.py": "",
    "adapter-langgraph/src/task_state_guard_langgraph/__init__.py": "",
    "adapter-langgraph/src/task_state_guard_langgraph/_guard.py": '''
        from task_state_guard.integration import AdapterSurface

        from ._mixins import RecoveryMixin

        class GuardedGraph(RecoveryMixin, AdapterSurface):
            """A long docstring."""
        ''',
    "adapter-langgraph/src/task_state_guard_langgraph/_mixins.py": '''
        class RecoveryMixin:
            pass

        def later() -> object:
            class GuardedGraph(metaclass=type):  # a second definition, however nested
                pass
            return GuardedGraph
        ''',
    # 451 lines, most of them a docstring: every line counts.
    "adapter-langgraph/src/task_state_guard_langgraph/_long.py":
        '"""A module\n' + "documented at length.\n" * 449 + '"""\n',
}


@pytest.mark.no_ledger(reason="writes a small source tree to check, no ledger")
def test_the_checker_finds_what_it_looks_for(tmp_path: Path) -> None:
    for rel, text in _FAKE.items():
        path = tmp_path / "packages" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    shape = _shape(tmp_path)
    assert shape["store_protocol_members"] == 2
    assert shape["store_protocol_callables"] == 4  # queries, close, queries.one, queries.two
    assert shape["ledger_statements"] == 2 and shape["ledger_code_lines"] == 3
    assert shape["import_cycles_by_package"]["core"] == [
        ["task_state_guard.cycle_a", "task_state_guard.cycle_b"]]
    assert shape["private_name_sites"] == [
        "packages/backend-postgres/src/task_state_guard_postgres/driver.py:7: other._secret"]
    assert [site.split(":")[1] for site in shape["sql_text_edit_sites"]] == ["8", "12", "12"]
    assert shape["core_root_unexpected"] == ["cycle_a", "cycle_b", "extra"]
    langgraph = "packages/adapter-langgraph/src/task_state_guard_langgraph/"
    assert shape["module_lines"][langgraph + "_long.py"] == 451
    assert shape["module_lines"][langgraph + "_guard.py"] == 7
    assert shape["longest_module_by_package"]["langgraph"] == {
        "path": langgraph + "_long.py", "lines": 451}
    assert shape["longest_module_by_package"]["postgres"]["lines"] == 12
    assert shape["adapter_classes"]["langgraph"]["definitions"] == [
        {"at": langgraph + "_guard.py:6", "bases": ["RecoveryMixin", "AdapterSurface"],
         "keywords": []},
        {"at": langgraph + "_mixins.py:6", "bases": [], "keywords": ["metaclass=type"]},
    ]
