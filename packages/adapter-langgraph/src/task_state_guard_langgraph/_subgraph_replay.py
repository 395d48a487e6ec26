"""Recovery's node history inside subgraphs: the attempts a lost run's node attempts made in
the subgraphs they run, read from the subgraphs' own checkpoints.

A node that is a compiled subgraph (one the graph declares: LangGraph's ``get_subgraphs``
finds it) sharing the graph's checkpointer keeps the subgraph's checkpoints under a namespace
of its own, the node's ``langgraph_checkpoint_ns`` (``outer:<task id>``; nested,
``outer:<task id>|inner:<task id>``), and every one of them names the invocation that wrote
it (``METADATA_KEY``), as the graph's own do. A history snapshot's task that runs such a
subgraph carries that namespace (``task.state``: a config naming it), whether it was running
when its run was lost or had finished: each such node attempt costs one read of its
subgraph's checkpoints (at most ``MAX_SNAPSHOTS`` of them, ``MAX_DEPTH`` subgraphs deep);
other node attempts cost none.

The subgraph's checkpoints tell the attempts inside it by the rule of the top level
(:func:`attempts_of`): the tasks of each checkpoint the run wrote there but its last ran to
the end, those of its last were running (unless their writes were saved or carry an error; a
subgraph that ran to its end has no task left there); a run that resumed the subgraph ran the
tasks of the checkpoint before its first one first; a run that wrote none there while its node
was running (it died in the first step it resumed) was running what the newest checkpoint not
written by a later run had to run. An inner node that runs a subgraph of its own is read the
same way. Each inner attempt's namespace is the live run's (the outer node's, ``|``, its own
``name:<task id>``), so it gets the id the live run gave it.

A subgraph invoked inside a node function (not a node itself: ``get_subgraphs`` does not
find it) leaves no trace in the node's task, and is not read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from task_state_guard.integration import codes as c

from ._lineage import EDIT_SOURCES, METADATA_KEY

#: Checkpoints read per thread, and per subgraph namespace, at most, newest first.
MAX_SNAPSHOTS = 256
#: Subgraphs read inside one another at most.
MAX_DEPTH = 8


@dataclass(frozen=True)
class LostNode:
    """One node attempt of a lost run as its checkpoints tell it, with the attempts it made
    inside the subgraph it runs (``inner``)."""

    ns: str
    name: str
    status: str
    code: str | None
    inner: tuple[LostNode, ...] = ()
    #: The config naming the subgraph's checkpoints when the node runs a declared subgraph.
    sub: Any = field(default=None, compare=False, repr=False)

    @property
    def running(self) -> bool:
        """Running when its run was lost (closed with the run's own code)."""
        return self.status == c.TIMED_OUT and self.code is None


def _outcome(task: Any, last: bool) -> tuple[str, str | None] | None:
    if task.error is not None:
        return c.FAILED, c.WORKER_FAILED
    if not last or task.result is not None:
        return c.SUCCEEDED, c.WORKER_COMPLETED
    if task.interrupts:
        return None  # waiting for a human: nothing ran to report
    return c.TIMED_OUT, None  # lost with its run (the run's own code, see _node_replay)


def attempts_of(snapshot: Any, last: bool, prefix: str = "") -> list[LostNode]:
    """The node attempts of one checkpoint's tasks (``last``: the run's last checkpoint, whose
    tasks without a result were running); ``prefix``: the namespace of the subgraph's node."""
    found = []
    for task in snapshot.tasks:
        name = str(task.name)
        outcome = None if name.startswith("__") else _outcome(task, last)
        if outcome is not None:
            own = f"{name}:{task.id}"
            sub = task.state if isinstance(task.state, dict) else None
            found.append(LostNode(f"{prefix}|{own}" if prefix else own, name, *outcome, sub=sub))
    return found


def named(snapshot: Any) -> str | None:
    """The invocation a checkpoint names."""
    value = (snapshot.metadata or {}).get(METADATA_KEY)
    return None if value is None else str(value)


class _Inner:
    """Sorts one subgraph namespace's checkpoints, newest first, into what the run
    ``invocation`` did there (``path``: the lineage's invocation ids, oldest first)."""

    def __init__(self, invocation: str | None, path: Sequence[str]) -> None:
        self.invocation = invocation
        self.path = set(path)
        later = path.index(invocation) + 1 if invocation in path else len(path)
        self.later = set(path[later:])
        self.mine: list[Any] = []  # the run's own checkpoints, newest first
        self.before: Any = None  # the checkpoint before its first
        self.base: Any = None  # the newest checkpoint no later run wrote
        self.seen = 0

    def add(self, snapshot: Any) -> bool:
        """Take the next (older) checkpoint; False once nothing older can matter."""
        self.seen += 1
        name = named(snapshot)
        if self.invocation is not None and name == self.invocation:
            if (snapshot.metadata or {}).get("source") not in EDIT_SOURCES:
                self.mine.append(snapshot)
        elif self.mine:
            self.before = snapshot  # a run's checkpoints in one namespace follow one another
            return False
        elif self.base is None and name not in self.later:
            self.base = snapshot
        outside = name is not None and name not in self.path
        return not outside and self.seen < MAX_SNAPSHOTS

    def result(self, prefix: str, running: bool) -> list[LostNode]:
        """The attempts inside the subgraph of the node ``prefix`` (``running``: when the
        run was lost)."""
        if not self.mine:
            base = self.base if running else None  # a finished node that wrote none ran none
            return [] if base is None else [n for n in attempts_of(base, True, prefix) if n.running]
        nodes: list[LostNode] = []
        if self.before is not None and (self.mine[-1].metadata or {}).get("source") == "loop":
            nodes += attempts_of(self.before, False, prefix)  # resumed: its tasks ran first
        for i, snapshot in enumerate(reversed(self.mine)):
            nodes += attempts_of(snapshot, i == len(self.mine) - 1, prefix)
        return nodes


def _reads(nodes: Iterable[LostNode], depth: int) -> bool:
    return depth < MAX_DEPTH and any(n.sub is not None for n in nodes)


def nest(
    graph: Any, nodes: list[LostNode], invocation: str | None, path: Sequence[str], depth: int = 0
) -> list[LostNode]:
    """``nodes`` (of the run ``invocation``) with the attempts each one that runs a subgraph
    (running or finished) made inside it, read from the subgraph's checkpoints."""
    if not _reads(nodes, depth):
        return nodes
    out = []
    for node in nodes:
        if node.sub is not None:
            inner = _Inner(invocation, path)
            history: Iterator[Any] = iter(graph.get_state_history(node.sub, limit=MAX_SNAPSHOTS))
            for snapshot in history:
                if not inner.add(snapshot):
                    break
            lost = inner.result(node.ns, node.running)
            found = nest(graph, lost, invocation, path, depth + 1)
            node = replace(node, inner=tuple(found))
        out.append(node)
    return out


async def anest(
    graph: Any, nodes: list[LostNode], invocation: str | None, path: Sequence[str], depth: int = 0
) -> list[LostNode]:
    """:func:`nest` for async checkpointers."""
    if not _reads(nodes, depth):
        return nodes
    out = []
    for node in nodes:
        if node.sub is not None:
            inner = _Inner(invocation, path)
            history: AsyncIterator[Any] = graph.aget_state_history(node.sub, limit=MAX_SNAPSHOTS)
            async for snapshot in history:
                if not inner.add(snapshot):
                    break
            lost = inner.result(node.ns, node.running)
            found = await anest(graph, lost, invocation, path, depth + 1)
            node = replace(node, inner=tuple(found))
        out.append(node)
    return out


__all__ = ["MAX_SNAPSHOTS", "LostNode", "anest", "attempts_of", "named", "nest"]
