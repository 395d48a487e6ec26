"""Recovery's half of node history: a lost run's node attempts, written from its checkpoints.

A run's node attempts are buffered in its process (``_node_buffer``); when the process dies,
those not yet committed are gone with it. The thread's checkpoints still tell what the run
did: every checkpoint it wrote names it (``METADATA_KEY``), the tasks of each checkpoint but
its last ran to the end (their writes made the next checkpoint), and the tasks of its last
checkpoint were running when it died, unless their writes were saved (finished) or carry an
error (failed). A node that runs a subgraph, running or finished, gets the attempts it made
inside it, read the same way from the subgraph's own checkpoints (``_subgraph_replay``). A
recovery pass that holds a lost run's verdict writes those attempts under the lost
invocation, the inner ones under the attempt of the node running their subgraph, with the ids
the live run gives them (each namespace's first attempt, or the newest one the run
committed), so an attempt the run committed itself (a heartbeat's flush) is never written
twice. A run that wrote no checkpoint (``durability="exit"``) leaves nothing to replay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from task_state_guard.integration import AdapterRuntime, Closing, name_label
from task_state_guard.integration import codes as c

from ._ids import AttemptIds
from ._lineage import EDIT_SOURCES, Head
from ._node_buffer import Start, write_history
from ._subgraph_replay import MAX_SNAPSHOTS, LostNode, anest, attempts_of, named, nest
from ._verdicts import Claimed

#: Attempt numbers checked for a node attempt the run committed itself.
_ATTEMPTS_CHECKED = 8


class _Collect:
    """Sorts a thread's checkpoints, newest first, into the lost runs' node attempts.

    ``wanted``: the lost runs' invocation ids; ``path``: every invocation of the lineage (no
    checkpoint older than the first one not on it can be theirs); ``head``: the lineage's last
    invocation when it is lost (it may have died before writing a checkpoint of its own: a
    continuation's running nodes are then the tasks of the thread's latest checkpoint)."""

    def __init__(self, wanted: dict[str, str], path: Iterable[str], head: str | None) -> None:
        self.wanted = wanted  # invocation id -> ledger task id
        self.path = set(path)
        self.head = head
        self.runs: dict[str, list[Any]] = {}  # invocation -> its checkpoints, newest first
        self.parents: dict[str | None, Any] = {}  # invocation -> the checkpoint before its first
        self.latest: Any = None
        self._last: str | None = None
        self.seen = 0

    def add(self, snapshot: Any) -> bool:
        """Take the next (older) checkpoint; False once nothing older can matter."""
        meta = snapshot.metadata or {}
        name = named(snapshot)
        if self.seen and name != self._last and self._last not in self.parents:
            self.parents[self._last] = snapshot
        if self.latest is None:
            self.latest = snapshot
        self.seen += 1
        if name in self.wanted and meta.get("source") not in EDIT_SOURCES:
            self.runs.setdefault(name, []).append(snapshot)
        self._last = name
        outside = name is not None and name not in self.path
        return not outside and self.seen < MAX_SNAPSHOTS

    def result(self) -> dict[str, list[LostNode]]:
        """The node attempts of each lost run, by ledger task id."""
        out: dict[str, list[LostNode]] = {}
        for invocation, snapshots in self.runs.items():
            nodes: list[LostNode] = []
            oldest = snapshots[-1]
            parent = self.parents.get(invocation)
            if parent is not None and (oldest.metadata or {}).get("source") == "loop":
                nodes += attempts_of(parent, False)  # a continuation ran its parent's tasks first
            for i, snapshot in enumerate(reversed(snapshots)):
                nodes += attempts_of(snapshot, i == len(snapshots) - 1)
            out[self.wanted[invocation]] = nodes
        head = self.head
        if head is not None and head not in out and self.latest is not None:
            # Died before writing a checkpoint: what it was running is what the thread's
            # latest checkpoint still has to run.
            out[head] = [n for n in attempts_of(self.latest, True) if n.running]
        return out


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def read(graph: Any, thread_id: str, head: Head) -> dict[str, list[LostNode]]:
    """The node attempts of the lost runs on the thread's lineage ``head``, by invocation id,
    with those their nodes made inside subgraphs (``_subgraph_replay``)."""
    collect = _collect(head)
    if collect.wanted or collect.head is not None:
        history: Iterator[Any] = iter(graph.get_state_history(_config(thread_id)))
        for snapshot in history:
            if not collect.add(snapshot):
                break
    invocations, path = _lineage(head)
    return {
        key: nest(graph, nodes, invocations.get(key), path)
        for key, nodes in collect.result().items()
    }


async def aread(graph: Any, thread_id: str, head: Head) -> dict[str, list[LostNode]]:
    """:func:`read` for async checkpointers."""
    collect = _collect(head)
    if collect.wanted or collect.head is not None:
        history: AsyncIterator[Any] = graph.aget_state_history(_config(thread_id))
        async for snapshot in history:
            if not collect.add(snapshot):
                break
    invocations, path = _lineage(head)
    return {
        key: await anest(graph, nodes, invocations.get(key), path)
        for key, nodes in collect.result().items()
    }


def _lineage(head: Head) -> tuple[dict[str, str | None], list[str]]:
    """Each invocation's id by its ledger task id, and the known ids in lineage order."""
    invocations = {link.task.id: link.invocation_id for link in head.path}
    path = [link.invocation_id for link in head.path if link.invocation_id is not None]
    return invocations, path


def write(
    rt: AdapterRuntime, invocation_id: str | None, task: Any, nodes: Sequence[LostNode]
) -> int:
    """Write the lost run's node attempts ``nodes`` under its ledger task ``task``, each one's
    inner attempts under it (those it committed itself are left as they are); an attempt that
    was running when the run was lost closes ``timed_out`` with the run's own code
    (``owner_lost``, ``restart_stale``...). Without the run's invocation id (not stored: not a
    canonical UUID) the ids the live run gave its attempts are unknown: they are written only
    when it committed none itself. Returns how many were written."""
    task_id = task.id
    if not nodes:
        return 0
    if invocation_id is None and _has_attempts(rt, task_id):
        return 0
    ids = AttemptIds(invocation_id if invocation_id is not None else f"task|{task_id}")
    plan = _Plan(rt, ids, task.terminal_code)
    plan.place(nodes, task_id)
    write_history(rt, plan.starts, plan.closings, where="node_replay")
    return len(plan.starts)


class _Plan:
    """The starts (a parent before its children) and closes (innermost first) of one lost
    run's attempts not in the ledger yet."""

    def __init__(self, rt: AdapterRuntime, ids: AttemptIds, code: str | None) -> None:
        self.rt = rt
        self.ids = ids
        self.code = code
        self.starts: list[Start] = []
        self.closings: list[Closing] = []
        self._known: dict[str, set[str]] = {}  # task id -> its children's ids (ledger, planned)

    def _children(self, parent_id: str) -> set[str]:
        known = self._known.get(parent_id)
        if known is None:
            known = {child.id for child in self.rt.ledger.children_of(parent_id)}
            self._known[parent_id] = known
        return known

    def place(self, nodes: Sequence[LostNode], parent_id: str) -> None:
        known = self._children(parent_id)
        for node in nodes:
            # The live run numbers the attempts of a namespace from 1: the newest it
            # committed is the one its inner attempts are under.
            there = [self.ids(node.ns, n) for n in range(_ATTEMPTS_CHECKED, 0, -1)]
            attempt = next((a for a in there if a in known), None)
            if attempt is not None:
                if node.inner:
                    self.place(node.inner, attempt)
                continue
            attempt = there[-1]
            known.add(attempt)
            self._known[attempt] = set()
            self.starts.append((attempt, parent_id, name_label(node.name)))
            self.place(node.inner, attempt)
            code = node.code if node.code is not None else self.code
            self.closings.append((attempt, node.status, code, True))


def _collect(head: Head) -> _Collect:
    lost = {
        link.invocation_id: link.task.id
        for link in head.path
        if link.task.status == c.TIMED_OUT and link.invocation_id is not None
    }
    path = [link.invocation_id for link in head.path if link.invocation_id is not None]
    last = head.task.id if head.task.status == c.TIMED_OUT else None
    return _Collect(lost, path, last)


def _has_attempts(rt: AdapterRuntime, task_id: str) -> bool:
    return any(not child.delivery_required for child in rt.ledger.children_of(task_id))


def write_claimed(
    rt: AdapterRuntime, claimed: Sequence[Claimed], lost_nodes: dict[str, list[LostNode]]
) -> int:
    """:func:`write` for each lost run whose verdict this process claimed."""
    written = 0
    for one in claimed:
        link = one.link
        nodes = lost_nodes.get(link.task.id) if link is not None else None
        if link is not None and nodes:
            written += write(rt, link.invocation_id, link.task, nodes)
    return written


__all__ = ["LostNode", "aread", "read", "write", "write_claimed"]
