"""``guard()``: wrap a compiled LangGraph graph so its runs are recorded in the ledger."""

from __future__ import annotations

import os
from typing import Any, Unpack

from task_state_guard import Ledger
from task_state_guard.integration import AdapterRuntime, LostHook, SettingArgs, resolve_settings

from ._guard import FRAMEWORK, GuardedGraph
from ._recorder import Recorder
from ._recovery_types import RecoveredHook
from .callbacks import logger


def guard(
    graph: Any,
    db: str | os.PathLike[str] | None = None,
    *,
    ledger: Ledger | None = None,
    owner: bool = True,
    name: str | None = None,
    record_nodes: bool = True,
    on_lost: LostHook | None = None,
    on_recovered: RecoveredHook | None = None,
    **settings: Unpack[SettingArgs],
) -> GuardedGraph:
    """Wrap a compiled LangGraph graph so its runs are recorded in a TaskStateGuard ledger.

    ``db`` is the ledger path (or pass an open ``ledger``, which you keep closing). Each
    setting comes from the argument, then the ``TSG_<NAME>`` environment variable, then the
    default shared by every adapter; a bad value raises ``ConfigurationError``. With
    ``reconcile_on_boot`` (the default) the ledger is reconciled here, which closes the tasks
    of a dead process ``timed_out/owner_lost`` at once. ``owner=True`` records this process as
    owner of the tasks it starts. ``record_nodes=False`` records only invocations (no callback
    handler, far less overhead). ``name`` overrides the graph name used as the invocation's
    label. Ledger errors are logged once per kind and counted (:meth:`GuardedGraph.stats`);
    ``strict=True`` raises them. ``on_lost`` is called with a
    :class:`~task_state_guard.integration.LostTask` for each lost thread a recovery pass
    reports; ``on_recovered`` with the :class:`Recovery` of each run it resumed, once that run
    ended (its ``output`` is the result the run owes: deliver it and mark it).

    ``reconcile_interval_seconds`` > 0 reconciles the ledger that often in a daemon thread of
    this process; :meth:`GuardedGraph.start_recovery` then runs a whole recovery pass (reconcile,
    report, resume) at that interval instead. A ledger that cannot be used is logged once at
    ERROR (and shows in :meth:`GuardedGraph.stats`); with ``require_ledger`` (setting or
    ``TSG_REQUIRE_LEDGER``) ``guard`` raises its error instead of running unrecorded.
    """
    if on_recovered is not None and not callable(on_recovered):
        raise TypeError("on_recovered must be callable")
    resolved = resolve_settings(db_required=ledger is None, db=db, **settings)
    runtime = AdapterRuntime(
        resolved, logger=logger, subject="graph", ledger=ledger, on_lost=on_lost,
        adapter=GuardedGraph.adapter_name, framework=FRAMEWORK,
    )
    # Lost-run verdicts are published by recovery passes (they know the threads), never by a
    # plain reconcile.
    runtime.drain_after_reconcile = False
    app = GuardedGraph(graph, Recorder(runtime, owner=owner), name=name, record_nodes=record_nodes)
    app.on_recovered = on_recovered
    # An unusable ledger is logged at ERROR once, here; with require_ledger, guard() raises.
    runtime.boot("reconcile")
    runtime.start_periodic_reconcile("periodic_reconcile")
    return app


__all__ = ["guard"]
