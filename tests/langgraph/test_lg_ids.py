"""Deterministic ids and name labels."""

from __future__ import annotations

import re
import uuid

import pytest
from task_state_guard import InvalidInput
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
    assert a == _documented("req-1", "node:abc", 1)


def _documented(invocation: str, ns: str, n: int) -> str:
    """The README's formula: uuid5 of the attempt's key, its first 13 characters those of the
    invocation's ledger id."""
    full = str(uuid.uuid5(NAMESPACE, f"attempt|{invocation}|{ns}|{n}"))
    return str(uuid.uuid5(NAMESPACE, invocation))[:13] + full[13:]


def test_precomputed_attempt_ids_match_the_documented_scheme() -> None:
    for invocation in ["req-1", "naïve|id", "x" * 300]:
        derive = AttemptIds(invocation)
        for ns in ["node:abc", "sub:1|inner:2", "日本", ""]:
            for n in (1, 2, 10, 12345):
                expected = _documented(invocation, ns, n)
                assert derive(ns, n) == expected == attempt_task_id(invocation, ns, n)
                parsed = uuid.UUID(expected)
                assert str(parsed) == expected and parsed.version == 5
                assert parsed.variant == uuid.RFC_4122


def test_an_invocation_s_attempts_sort_next_to_it() -> None:
    """Every node attempt of an invocation shares the invocation's id prefix, so they sort
    together in the ledger's id index; another invocation's attempts sort apart."""
    parent = logical_task_id("req-1")
    ids = sorted({parent, *(attempt_task_id("req-1", f"node_{i}:t", 1) for i in range(50))})
    assert len(ids) == 51 and all(i[:13] == parent[:13] for i in ids)
    other = attempt_task_id("req-2", "node_0:t", 1)
    assert other[:13] == logical_task_id("req-2")[:13] != parent[:13]


def test_an_empty_invocation_id_is_refused() -> None:
    with pytest.raises(InvalidInput):
        attempt_task_id("", "node:abc", 1)


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
