"""Deterministic ids and name labels."""

from __future__ import annotations

import re
import uuid

from task_state_guard.integration import name_label as sanitize_name
from task_state_guard_langgraph import (
    NAMESPACE,
    attempt_task_id,
    logical_task_id,
    recovery_invocation_id,
)
from task_state_guard_langgraph._ids import AttemptIds

LABEL = re.compile(r"^[A-Za-z0-9_<][A-Za-z0-9_.:\-/<>]{0,199}$")


def test_ids_are_deterministic_uuids() -> None:
    assert logical_task_id("req-1") == str(uuid.uuid5(NAMESPACE, "req-1"))
    a = attempt_task_id("req-1", "node:abc", 1)
    assert a == attempt_task_id("req-1", "node:abc", 1)
    assert (
        len({a, attempt_task_id("req-1", "node:abc", 2), attempt_task_id("req-2", "node:abc", 1)})
        == 3
    )
    assert recovery_invocation_id("x") == recovery_invocation_id("x") != recovery_invocation_id("y")
    assert recovery_invocation_id("x").startswith("recover-")
    # The documented scheme, exactly.
    assert a == str(uuid.uuid5(NAMESPACE, "attempt|req-1|node:abc|1"))


def test_precomputed_attempt_ids_match_the_documented_uuid5() -> None:
    for invocation in ["req-1", "", "naïve|id", "x" * 300]:
        derive = AttemptIds(invocation)
        for ns in ["node:abc", "sub:1|inner:2", "日本", ""]:
            for n in (1, 2, 10, 12345):
                expected = str(uuid.uuid5(NAMESPACE, f"attempt|{invocation}|{ns}|{n}"))
                assert derive(ns, n) == expected == attempt_task_id(invocation, ns, n)
                assert uuid.UUID(expected).version == 5


def test_sanitize_name() -> None:
    assert sanitize_name("LangGraph") == "LangGraph"
    assert sanitize_name("__start__") == "__start__"
    assert sanitize_name("a b|c") == "a_b_c"
    assert sanitize_name("-lead") == "_-lead"
    assert sanitize_name("") is None
    assert sanitize_name(None) is None
    assert sanitize_name(42) is None
    long = sanitize_name("x" * 500)
    assert long is not None and len(long) == 200
    for raw in ["naïve node", "tool:search/web", "<lambda>", ".hidden", "日本語"]:
        label = sanitize_name(raw)
        assert label is not None and LABEL.match(label), raw
