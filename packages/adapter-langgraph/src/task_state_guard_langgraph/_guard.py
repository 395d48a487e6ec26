"""``guard()``: a compiled LangGraph graph whose invocations are recorded in the ledger."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from functools import partial
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langgraph.types import Command
from task_state_guard import Ledger, Task
from task_state_guard.integration import AdapterRuntime, Closing, Settings, resolve_settings
from task_state_guard.integration import codes as c

from ._ids import logical_task_id, recovery_invocation_id
from ._recorder import Recorder
from .callbacks import GuardCallbackHandler, RetryOracle, classify_error, logger

#: Key under ``config["metadata"]`` (and so in every checkpoint's metadata) that holds the
#: invocation id. Deliberately not ``run_id``: LangGraph treats a repeated metadata
#: ``run_id`` as re-entry and ignores new input.
METADATA_KEY = "tsg_invocation_id"


@dataclass(frozen=True)
class Recovery:
    """One thread handled by :meth:`GuardedGraph.recover`."""

    thread_id: str
    #: Invocation id of the new (recovering) invocation.
    invocation_id: str
    #: Invocation id of the lost invocation it recovers (its ledger parent).
    recovers: str
    #: ``"succeeded"``, ``"interrupted"``, ``"failed"`` or ``"cancelled"``.
    outcome: str
    #: Exception class name when the resumed run raised (the run's error is not re-raised).
    error: str | None = None


class _Invocation:
    """Book-keeping for one running invocation."""

    def __init__(
        self,
        invocation_id: str,
        task_id: str | None,
        handler: GuardCallbackHandler | None,
        config: dict[str, Any],
        recorder: Recorder,
    ) -> None:
        self.invocation_id = invocation_id
        self.task_id = task_id
        self.handler = handler
        self.config = config
        self._rec = recorder
        self._done = False

    def finish(self, exc: BaseException | None, output: Any = None) -> str:
        """Close leftover attempts and the invocation; returns the outcome label."""
        if self._done:
            return "done"
        self._done = True
        if exc is None:
            status, code = c.SUCCEEDED, c.COMPLETED
            if self.handler is not None:
                interrupted = self.handler.interrupted
            else:
                interrupted = bool(
                    getattr(output, "interrupts", None)
                    or (isinstance(output, dict) and output.get("__interrupt__"))
                )
            outcome = "interrupted" if interrupted else "succeeded"
            leftover: c.Outcome = (c.CANCELLED, None)
        else:
            status, code = classify_error(exc)
            if status == c.SUCCEEDED:  # a stray ParentCommand at the top is a failure
                status, code = c.FAILED, c.WORKER_FAILED
            outcome = status
            leftover = (c.CANCELLED, c.CALLER_CANCELLED if status == c.CANCELLED else None)
        closings: list[Closing] = []
        if self.handler is not None:
            closings = self.handler.take_open(*leftover)
        if self.task_id is not None:
            closings.append((self.task_id, status, code, False))
        # Leftover attempts and the invocation close at the same moment: one transaction.
        self._rec.close_many(closings)
        return outcome


def _with_handler(
    config: dict[str, Any] | None, handler: GuardCallbackHandler | None, invocation_id: str
) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(config or {})
    callbacks = cfg.get("callbacks")
    if handler is None:
        pass
    elif callbacks is None:
        cfg["callbacks"] = [handler]
    elif isinstance(callbacks, list):
        cfg["callbacks"] = [*callbacks, handler]
    elif isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(handler, inherit=True)
        cfg["callbacks"] = manager
    else:
        cfg["callbacks"] = [*callbacks, handler]
    metadata = dict(cfg.get("metadata") or {})
    metadata[METADATA_KEY] = invocation_id
    cfg["metadata"] = metadata
    return cfg


def _thread_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    configurable = (config or {}).get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        return None
    inner: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if configurable.get("checkpoint_id"):
        inner["checkpoint_id"] = configurable["checkpoint_id"]
    return {"configurable": inner}


class GuardedGraph:
    """A compiled graph whose invocations and node attempts are recorded in the ledger.

    Create it with :func:`guard`. ``invoke``/``ainvoke``/``stream``/``astream`` take the same
    arguments as the compiled graph plus an optional ``invocation_id``; every other attribute
    (``get_state``, ``update_state``, ``nodes``...) is the compiled graph's.
    """

    def __init__(
        self,
        graph: Any,
        recorder: Recorder,
        *,
        name: str | None,
        record_nodes: bool = True,
    ) -> None:
        self._graph = graph
        self._record_nodes = record_nodes
        self._rec = recorder
        self._name = name if name is not None else getattr(graph, "name", None)
        self._oracle = RetryOracle(graph)
        self._local = threading.local()

    # -- pass-through -----------------------------------------------------------------------

    @property
    def graph(self) -> Any:
        """The wrapped compiled graph (calls on it are not recorded)."""
        return self._graph

    @property
    def ledger(self) -> Ledger | None:
        """The ledger (``None`` when it cannot be opened)."""
        return self._rec.rt.ledger_or_none()

    @property
    def settings(self) -> Settings:
        """The resolved settings (the same names and defaults as every adapter)."""
        return self._rec.rt.settings

    @property
    def runtime(self) -> AdapterRuntime:
        """The adapter runtime this graph records through."""
        return self._rec.rt

    @property
    def last_reconcile(self) -> dict[str, Any] | None:
        """The report of this process's last reconcile (counts only)."""
        return self._rec.rt.last_reconcile

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._graph, name)

    # -- ids, delivery, errors --------------------------------------------------------------

    @staticmethod
    def logical_task_id(invocation_id: str) -> str:
        """Ledger id of the invocation task for ``invocation_id`` (deterministic uuid5)."""
        return logical_task_id(invocation_id)

    def mark_delivered(self, invocation_id: str) -> Task | None:
        """Record that the invocation's result (or interrupt question) reached its recipient.

        Call it after your transport acknowledged. Outside the running invocation: written at
        once, returns the updated invocation task, raises the core's errors. From inside that
        invocation (a node, same process): kept and written with the invocation's close;
        returns ``None``.
        """
        return self._rec.rt.mark_delivered(logical_task_id(invocation_id))

    def mark_delivery_failed(self, invocation_id: str) -> Task | None:
        """Record that delivering the invocation's result failed (same rules as above)."""
        return self._rec.rt.mark_delivery_failed(logical_task_id(invocation_id))

    def stats(self) -> dict[str, Any]:
        """This process's counters: ``errors``, ``conflicts``, ``reconciles``, ``heartbeating``."""
        return self._rec.rt.stats()

    @property
    def last_invocation_id(self) -> str | None:
        """Invocation id of the last invocation started by the calling thread."""
        return getattr(self._local, "invocation_id", None)

    @property
    def last_outcome(self) -> str | None:
        """Outcome of the calling thread's last finished invocation: ``succeeded``,
        ``interrupted``, ``failed`` or ``cancelled``."""
        return getattr(self._local, "outcome", None)

    def reconcile(self, *, dry_run: bool = False) -> dict[str, Any]:
        """Run the core's reconcile with this guard's graces; returns the nine counts."""
        return self._rec.rt.reconcile(dry_run=dry_run)

    def close(self) -> None:
        """Stop the heartbeat thread; close the ledger if :func:`guard` opened it."""
        self._rec.rt.close()

    uninstall = close

    def __enter__(self) -> GuardedGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- invocation lifecycle ---------------------------------------------------------------

    def _begin(
        self,
        input: Any,
        config: dict[str, Any] | None,
        invocation_id: str | None,
        previous: str | None,
        *,
        claim: bool = False,
    ) -> _Invocation | None:
        inv = str(invocation_id) if invocation_id is not None else uuid.uuid4().hex
        self._local.invocation_id = inv
        own = logical_task_id(inv)
        parent: str | None = None
        if previous is not None:
            candidate = logical_task_id(previous)
            if candidate != own and self._rec.get(candidate) is not None:
                parent = candidate
        opened = self._rec.open(
            own,
            parent_id=parent,
            delivery_required=True,
            name=self._name,
            claim_errors=not claim,
        )
        if not opened and claim:
            return None
        # Not opened: run unrecorded (ledger down, or invocation id reused); no handler.
        task_id = own if opened else None
        handler: GuardCallbackHandler | None = None
        if opened and self._record_nodes:
            handler = GuardCallbackHandler._bound(self._rec, inv, own, self._oracle)
        return _Invocation(inv, task_id, handler, _with_handler(config, handler, inv), self._rec)

    def _end(self, run: _Invocation, exc: BaseException | None, output: Any = None) -> None:
        self._local.outcome = run.finish(exc, output)

    def _previous(self, input: Any, config: dict[str, Any] | None) -> str | None:
        if not (input is None or isinstance(input, Command)):
            return None
        saver = getattr(self._graph, "checkpointer", None)
        lookup = _thread_config(config)
        if lookup is None or saver is None or isinstance(saver, bool):
            return None

        def _get() -> str | None:
            tup = saver.get_tuple(lookup)
            value = (tup.metadata or {}).get(METADATA_KEY) if tup is not None else None
            return str(value) if value is not None else None

        return self._rec.rt.policy.call("link", _get)

    async def _aprevious(self, input: Any, config: dict[str, Any] | None) -> str | None:
        if not (input is None or isinstance(input, Command)):
            return None
        saver = getattr(self._graph, "checkpointer", None)
        lookup = _thread_config(config)
        if lookup is None or saver is None or isinstance(saver, bool):
            return None
        try:
            try:
                tup = await saver.aget_tuple(lookup)
            except NotImplementedError:
                tup = saver.get_tuple(lookup)
        except Exception as exc:
            self._rec.rt.policy.error("link", exc)
            return None
        value = (tup.metadata or {}).get(METADATA_KEY) if tup is not None else None
        return str(value) if value is not None else None

    # -- the four entry points --------------------------------------------------------------

    def invoke(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``graph.invoke`` recorded as one invocation (see the package README)."""
        run = self._begin(input, config, invocation_id, self._previous(input, config))
        assert run is not None
        try:
            out = self._graph.invoke(input, run.config, **kwargs)
        except BaseException as exc:
            self._end(run, exc)
            raise
        self._end(run, None, out)
        return out

    async def ainvoke(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``graph.ainvoke`` recorded as one invocation; a cancelled run ends ``cancelled``."""
        previous = await self._aprevious(input, config)
        run = self._begin(input, config, invocation_id, previous)
        assert run is not None
        try:
            out = await self._graph.ainvoke(input, run.config, **kwargs)
        except BaseException as exc:
            self._end(run, exc)
            raise
        self._end(run, None, out)
        return out

    def stream(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> Generator[Any, None, None]:
        """``graph.stream`` recorded as one invocation.

        The invocation starts at the first ``next()``; closing the iterator early ends it
        ``cancelled/caller_cancelled``.
        """
        run = self._begin(input, config, invocation_id, self._previous(input, config))
        assert run is not None
        try:
            yield from self._graph.stream(input, run.config, **kwargs)
        except BaseException as exc:
            self._end(run, exc)
            raise
        self._end(run, None)

    async def astream(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Any, None]:
        """``graph.astream`` recorded as one invocation (see :meth:`stream`)."""
        previous = await self._aprevious(input, config)
        run = self._begin(input, config, invocation_id, previous)
        assert run is not None
        try:
            async for chunk in self._graph.astream(input, run.config, **kwargs):
                yield chunk
        except BaseException as exc:
            self._end(run, exc)
            raise
        self._end(run, None)

    # -- crash recovery ---------------------------------------------------------------------

    def _thread_ids(self, saver: Any) -> list[str]:
        conn = getattr(saver, "conn", None)
        cursor = getattr(saver, "cursor", None)
        if conn is not None and callable(cursor) and type(saver).__name__ == "SqliteSaver":
            with cursor(transaction=False) as cur:
                cur.execute(
                    "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = ''"
                    " ORDER BY thread_id"
                )
                return [str(row[0]) for row in cur.fetchall()]
        seen: dict[str, None] = {}
        for tup in saver.list(None):
            cfg = tup.config.get("configurable", {})
            if cfg.get("checkpoint_ns", "") == "":
                seen.setdefault(str(cfg["thread_id"]), None)
        return list(seen)

    def _lost_from_checkpoint(self, tup: Any) -> str | None:
        """The lost invocation id recorded in a thread's latest checkpoint, if it is lost."""
        if tup is None:
            return None
        lost = (tup.metadata or {}).get(METADATA_KEY)
        if lost is None:
            return None  # never ran under the guard: no proof it is not running elsewhere
        task = self._rec.get(logical_task_id(str(lost)))
        if task is None or task.status != c.TIMED_OUT:
            return None  # unknown, or still running / closed by its own process
        return str(lost)

    @staticmethod
    def _resumable(state: Any) -> bool:
        if not state.next:
            return False  # the thread finished
        # A pending interrupt waits for a human; a failed task is not a crash.
        return not any(t.interrupts or t.error is not None for t in state.tasks)

    def _lost_invocation(self, saver: Any, thread_id: str) -> str | None:
        """Invocation id of the thread's last invocation when it is lost and resumable."""
        lookup = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        lost = self._lost_from_checkpoint(saver.get_tuple(lookup))
        if lost is None:
            return None
        state = self._graph.get_state({"configurable": {"thread_id": thread_id}})
        return lost if self._resumable(state) else None

    async def _alost_invocation(self, saver: Any, thread_id: str) -> str | None:
        lookup = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        try:
            tup = await saver.aget_tuple(lookup)
        except NotImplementedError:
            tup = saver.get_tuple(lookup)
        lost = self._lost_from_checkpoint(tup)
        if lost is None:
            return None
        state = await self._graph.aget_state({"configurable": {"thread_id": thread_id}})
        return lost if self._resumable(state) else None

    async def _athread_ids(self, saver: Any) -> list[str]:
        try:
            seen: dict[str, None] = {}
            async for tup in saver.alist(None):
                cfg = tup.config.get("configurable", {})
                if cfg.get("checkpoint_ns", "") == "":
                    seen.setdefault(str(cfg["thread_id"]), None)
            return list(seen)
        except NotImplementedError:
            return self._thread_ids(saver)

    def recover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Recovery]:
        """Resume the threads whose last invocation was lost in a crash.

        Reconciles the ledger first (a dead owner's invocation becomes
        ``timed_out/owner_lost``), then, for every checkpointer thread whose last checkpoint
        was written by an invocation the ledger shows ``timed_out`` and that still has work
        (not finished, not waiting at an interrupt, not failed), runs ``invoke(None, ...)`` as
        a new invocation with id :func:`recovery_invocation_id` (lost id), recorded as a child
        of the lost invocation. Two processes recovering at once: only one wins each thread.
        ``config`` (callbacks, tags...) and ``kwargs`` (e.g. ``durability``) are passed to
        every resumed run. Errors of a resumed run are reported in the result, not raised.
        """
        saver = getattr(self._graph, "checkpointer", None)
        if saver is None or isinstance(saver, bool) or self.ledger is None:
            return []
        self._rec.rt.guarded_reconcile("reconcile")
        ids = thread_ids
        if ids is None:
            ids = self._rec.rt.policy.call("recover", lambda: self._thread_ids(saver)) or []
        results: list[Recovery] = []
        for thread_id in ids:
            lost = self._rec.rt.policy.call(
                "recover", partial(self._lost_invocation, saver, thread_id)
            )
            if lost is None:
                continue
            base = dict(config or {})
            base["configurable"] = {**(base.get("configurable") or {}), "thread_id": thread_id}
            new_id = recovery_invocation_id(lost)
            run = self._begin(None, base, new_id, lost, claim=True)
            if run is None:
                continue  # another process claimed this recovery
            error: str | None = None
            try:
                out = self._graph.invoke(None, run.config, **kwargs)
            except Exception as exc:
                error = type(exc).__name__
                self._end(run, exc)
                logger.warning("recover(): the resumed run raised %s", error)
            else:
                self._end(run, None, out)
            results.append(Recovery(thread_id, new_id, lost, str(self.last_outcome), error))
        return results

    async def arecover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Recovery]:
        """Async :meth:`recover` (for async checkpointers such as ``AsyncSqliteSaver``):
        same selection and claims, each thread resumed with ``ainvoke(None, ...)``."""
        saver = getattr(self._graph, "checkpointer", None)
        if saver is None or isinstance(saver, bool) or self.ledger is None:
            return []
        self._rec.rt.guarded_reconcile("reconcile")
        errors = self._rec.rt.policy
        ids = thread_ids
        if ids is None:
            try:
                ids = await self._athread_ids(saver)
            except Exception as exc:
                errors.error("recover", exc)
                ids = []
        results: list[Recovery] = []
        for thread_id in ids:
            try:
                lost = await self._alost_invocation(saver, thread_id)
            except Exception as exc:
                errors.error("recover", exc)
                continue
            if lost is None:
                continue
            base = dict(config or {})
            base["configurable"] = {**(base.get("configurable") or {}), "thread_id": thread_id}
            new_id = recovery_invocation_id(lost)
            run = self._begin(None, base, new_id, lost, claim=True)
            if run is None:
                continue
            error: str | None = None
            try:
                out = await self._graph.ainvoke(None, run.config, **kwargs)
            except Exception as exc:
                error = type(exc).__name__
                self._end(run, exc)
                logger.warning("arecover(): the resumed run raised %s", error)
            else:
                self._end(run, None, out)
            results.append(Recovery(thread_id, new_id, lost, str(self.last_outcome), error))
        return results


def guard(
    graph: Any,
    db: str | os.PathLike[str] | None = None,
    *,
    ledger: Ledger | None = None,
    strict: bool | None = None,
    heartbeat_seconds: float | None = None,
    active_grace_seconds: float | None = None,
    delivery_grace_seconds: float | None = None,
    reconcile_on_boot: bool | None = None,
    busy_timeout_ms: int | None = None,
    owner: bool = True,
    name: str | None = None,
    record_nodes: bool = True,
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
    ``strict=True`` raises them.
    """
    settings = resolve_settings(
        db_required=ledger is None,
        db=db,
        strict=strict,
        heartbeat_seconds=heartbeat_seconds,
        active_grace_seconds=active_grace_seconds,
        delivery_grace_seconds=delivery_grace_seconds,
        reconcile_on_boot=reconcile_on_boot,
        busy_timeout_ms=busy_timeout_ms,
    )
    runtime = AdapterRuntime(settings, logger=logger, subject="graph", ledger=ledger)
    app = GuardedGraph(graph, Recorder(runtime, owner=owner), name=name, record_nodes=record_nodes)
    runtime.boot_reconcile("reconcile")
    return app
