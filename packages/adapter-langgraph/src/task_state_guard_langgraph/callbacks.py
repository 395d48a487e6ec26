"""LangChain/LangGraph callback handler that records node attempts in the ledger.

The wrapper returned by :func:`task_state_guard_langgraph.guard` installs one of these per
invocation. It can also be used on its own (``config["callbacks"]``) to record a graph run
without the wrapper.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from langgraph.callbacks import GraphCallbackHandler, GraphInterruptEvent
from task_state_guard.integration import AdapterRuntime, Closing, name_label, resolve_settings
from task_state_guard.integration import codes as c

from ._ids import AttemptIds, logical_task_id
from ._node_buffer import NodeHistory
from ._recorder import Lane, Recorder
from ._retries import RetryOracle, classify_error

logger = logging.getLogger("task_state_guard_langgraph")


_STEP_TAG = "graph:step:"


def _is_node_run(tags: list[str] | None, metadata: dict[str, Any] | None) -> bool:
    if not tags or not metadata or "langgraph_node" not in metadata:
        return False
    step = False
    for tag in tags:
        if tag == "langsmith:hidden":
            return False
        if not step and tag.startswith(_STEP_TAG):
            step = True
    return step


@dataclass(slots=True)
class _Run:
    parent: uuid.UUID | None
    invocation: str
    # Ledger task ids from this run's own attempt (if any) up to the invocation task.
    chain: tuple[str, ...]
    task: str | None = None
    ns: str | None = None
    attempt: int = 0
    root: bool = False


class GuardCallbackHandler(GraphCallbackHandler):
    """Records every LangGraph node attempt as an internal child task.

    Stand-alone use (without :func:`guard`)::

        handler = GuardCallbackHandler(Ledger("tasks.sqlite"), invocation_id="req-42",
                                       graph=compiled)
        compiled.invoke(inputs, {"configurable": {...}, "callbacks": [handler]})

    The graph's root run becomes the invocation task (``logical_task_id(invocation_id)``,
    delivering) and each node attempt an internal child; nodes of subgraphs are nested under
    the attempt of the node that runs the subgraph. ``graph`` (optional) lets the handler tell
    a failure LangGraph will retry (``failed/retry_scheduled``) from a final one
    (``failed/worker_failed``). Use one handler per invocation, or omit ``invocation_id`` to
    use the root callback run id as invocation id.
    """

    run_inline = True
    # Only chain runs (graph roots and nodes) matter: skip model, tool-agent, retriever,
    # retry and custom events (e.g. one call per streamed token) at the callback manager.
    ignore_llm = True
    ignore_chat_model = True
    ignore_retriever = True
    ignore_agent = True
    ignore_retry = True
    ignore_custom_event = True

    def __init__(
        self,
        ledger: Any,
        *,
        invocation_id: str | None = None,
        graph: Any = None,
        strict: bool | None = None,
        heartbeat_seconds: float | None = None,
        owner: bool = True,
    ) -> None:
        super().__init__()
        settings = resolve_settings(
            db_required=False, strict=strict, heartbeat_seconds=heartbeat_seconds
        )
        runtime = AdapterRuntime(settings, logger=logger, subject="graph", ledger=ledger,
                                 adapter="langgraph")
        self._init(
            Recorder(runtime, owner=owner),
            invocation_id=invocation_id,
            invocation_task=None,
            oracle=RetryOracle(graph) if graph is not None else None,
            owns_root=True,
        )

    def _init(
        self,
        recorder: Recorder,
        *,
        invocation_id: str | None,
        invocation_task: str | None,
        oracle: RetryOracle | None,
        owns_root: bool,
        lane: Lane | None = None,
    ) -> None:
        self._rec = recorder
        # Where the async variant's writes go, in event order (one lane per invocation).
        self._lane = lane if lane is not None else recorder.lane()
        self.raise_error = recorder.strict
        self._invocation_id = invocation_id
        self._invocation_task = invocation_task
        self._oracle = oracle
        self._owns_root = owns_root
        self._lock = threading.Lock()
        self._runs: dict[uuid.UUID, _Run] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._attempt_ids: dict[str, AttemptIds] = {}
        # Node attempts are history: buffered, committed with the invocation's end, the
        # flusher's next tick or a heartbeat() call (see ``_node_buffer``).
        self._history = NodeHistory(recorder.rt, owner=recorder.owner, flusher=recorder.history)
        self.interrupted = False

    # -- public helpers ---------------------------------------------------------------------

    @property
    def runtime(self) -> AdapterRuntime:
        """The adapter runtime this handler records through."""
        return self._rec.rt

    def stats(self) -> dict[str, Any]:
        """This process's counters: ``errors``, ``conflicts``, ``reconciles``, ``heartbeating``."""
        return self._rec.rt.stats()

    def open_task_ids(self) -> list[str]:
        """Ledger ids of node attempts started and not yet closed by this handler."""
        with self._lock:
            return [r.task for r in self._runs.values() if r.task is not None]

    def beat_run(self, run_id: uuid.UUID | None) -> int:
        """Commit the buffered node history, then heartbeat the attempt of callback run
        ``run_id`` and its ancestors."""
        self._history.flush()
        with self._lock:
            run = self._runs.get(run_id) if run_id is not None else None
            chain = run.chain if run is not None else ()
        return self._rec.beat(chain)

    @property
    def history(self) -> NodeHistory:
        """The buffered node history of the invocation."""
        return self._history

    def take_open(self, status: str, code: str | None) -> list[Closing]:
        """Forget every attempt still open (the run ended without telling us about them) and
        return their closes, innermost first so a parent never closes before its child."""
        with self._lock:
            open_runs = [r for r in self._runs.values() if r.task is not None]
            self._runs.clear()
        open_runs.sort(key=lambda r: len(r.chain), reverse=True)
        return [(r.task, status, code, True) for r in open_runs if r.task is not None]

    def finish(self, closings: list[Closing]) -> None:
        """Commit the buffered node history (attempts, their closes) and then ``closings``
        (innermost first: leftovers, then the invocation) in one ledger write."""
        self._history.finish(closings)

    def close_open(self, status: str, code: str | None) -> None:
        """Close every attempt still open, with the buffered history (one ledger write)."""
        self.finish(self.take_open(status, code))

    # -- callbacks --------------------------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: uuid.UUID,
        parent_run_id: uuid.UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        is_node = _is_node_run(tags, metadata)
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            if parent is None:
                if is_node:
                    return  # a node of a graph whose root we never saw: not ours
                self._start_root(run_id, parent_run_id, kwargs.get("name"))
                return
            if not is_node or not parent.chain:
                # Not a node (routing function, subgraph root...), or a node of an
                # invocation that is not recorded: track it for nesting, record nothing.
                self._runs[run_id] = _Run(parent_run_id, parent.invocation, parent.chain)
                return
            assert metadata is not None
            node = metadata["langgraph_node"]
            ns = str(metadata.get("langgraph_checkpoint_ns") or node)
            invocation = parent.invocation
            key = (invocation, ns)
            attempt = self._counts.get(key, 0) + 1
            self._counts[key] = attempt
            ids = self._attempt_ids.get(invocation)
            if ids is None:
                ids = self._attempt_ids[invocation] = AttemptIds(invocation)
            task = ids(ns, attempt)
            parent_task = parent.chain[0]
            self._runs[run_id] = _Run(
                parent_run_id, invocation, (task, *parent.chain), task, ns, attempt
            )
        self._history.start(task, parent_task, name_label(node))

    def _start_root(self, run_id: uuid.UUID, parent_run_id: uuid.UUID | None, name: object) -> None:
        # Called with the lock held.
        if self._owns_root:
            invocation = self._invocation_id or str(run_id)
            task = logical_task_id(invocation)
            run = _Run(parent_run_id, invocation, (task,), task=None, root=True)
            self._runs[run_id] = run
            self._lock.release()
            try:
                opened = self._rec.open(task, parent_id=None, name=name)
            finally:
                self._lock.acquire()
            if not opened:
                run.chain = ()
            return
        assert self._invocation_id is not None
        chain = (self._invocation_task,) if self._invocation_task else ()
        self._runs[run_id] = _Run(parent_run_id, self._invocation_id, chain, root=True)

    def on_chain_end(self, outputs: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is None:
            return
        if run.task is not None:
            self._history.end((run.task, c.SUCCEEDED, c.WORKER_COMPLETED, True))
        elif run.root:
            self._end_root(run, c.SUCCEEDED, c.COMPLETED)

    def on_chain_error(self, error: BaseException, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is None:
            return
        status, code = classify_error(error)
        if run.task is not None:
            if (
                status == c.FAILED
                and run.ns is not None
                and self._oracle is not None
                and self._oracle.will_retry(run.ns, run.attempt, error)
            ):
                code = c.RETRY_SCHEDULED
            self._history.end((run.task, status, code, True))
        elif run.root:
            self._end_root(run, status, code)

    def _end_root(self, run: _Run, status: str, code: str) -> None:
        if not self._owns_root:
            return
        with self._lock:
            leftovers = [
                r
                for r in self._runs.values()
                if r.task is not None and r.invocation == run.invocation
            ]
            for key in [k for k in self._counts if k[0] == run.invocation]:
                del self._counts[key]
            self._attempt_ids.pop(run.invocation, None)
        leftovers.sort(key=lambda r: len(r.chain), reverse=True)
        closings: list[Closing] = [
            (left.task, c.CANCELLED, c.CALLER_CANCELLED, True)
            for left in leftovers
            if left.task is not None
        ]
        if run.chain:
            closings.append((run.chain[0], status, code, False))
        # The history, the leftovers and the invocation close at once: one transaction.
        self._history.finish(closings)

    def on_interrupt(self, event: GraphInterruptEvent) -> None:
        self.interrupted = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def invocation_handler(
    cls: type[GuardCallbackHandler],
    recorder: Recorder,
    invocation_id: str,
    invocation_task: str | None,
    oracle: RetryOracle | None,
    lane: Lane | None = None,
) -> GuardCallbackHandler:
    """A handler of class ``cls`` for one wrapper invocation (the wrapper records the
    invocation itself): the guarded graph's own, not made through the public constructor."""
    handler = cls.__new__(cls)
    GraphCallbackHandler.__init__(handler)
    handler._init(
        recorder,
        invocation_id=invocation_id,
        invocation_task=invocation_task,
        oracle=oracle,
        owns_root=False,
        lane=lane,
    )
    return handler


class AsyncGuardCallbackHandler(GuardCallbackHandler):
    """:class:`GuardCallbackHandler` for async runs (``ainvoke``, ``astream``,
    ``astream_events``): every ledger write runs on one of the recorder's writer threads, in the
    invocation's own lane, and is awaited, so the event loop never waits for the ledger (not
    even while another process holds it locked) and events keep their order. Events that
    write nothing (node attempts, buffered as history; routing functions) are handled inline.
    """

    def _writes_on_end(self, run_id: uuid.UUID) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
        return run is not None and run.root and self._owns_root

    async def on_chain_start(  # type: ignore[override]
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: uuid.UUID,
        parent_run_id: uuid.UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        start = partial(
            GuardCallbackHandler.on_chain_start,
            self,
            serialized,
            inputs,
            run_id=run_id,
            parent_run_id=parent_run_id,
            tags=tags,
            metadata=metadata,
            **kwargs,
        )
        with self._lock:
            tracked = parent_run_id is not None and parent_run_id in self._runs
        if not tracked and self._owns_root and not _is_node_run(tags, metadata):
            await self._lane.call(start)  # writes: a stand-alone handler's root
        else:
            start()  # writes nothing (the wrapper writes its invocation's start itself)

    async def on_chain_end(  # type: ignore[override]
        self, outputs: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        end = partial(GuardCallbackHandler.on_chain_end, self, outputs, run_id=run_id, **kwargs)
        if self._writes_on_end(run_id):
            await self._lane.call(end)
        else:
            end()

    async def on_chain_error(  # type: ignore[override]
        self, error: BaseException, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        fail = partial(GuardCallbackHandler.on_chain_error, self, error, run_id=run_id, **kwargs)
        if self._writes_on_end(run_id):
            await self._lane.call(fail)
        else:
            fail()
