"""State edits through the guarded graph keep the thread's lineage.

``update_state`` writes a checkpoint of its own. Made on the guarded graph, that checkpoint
names (``METADATA_KEY``) the invocation whose state it edits, so the run that continues from
it (``invoke(None)``, ``Command(resume=...)``) is recorded as that invocation's child, and a
crash of that run is found and resumed by recovery. Edits made on the raw graph name nothing;
recovery then reads back over them to the checkpoint they edited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph.types import Command

from ._ids import logical_task_id
from ._invocation import thread_config
from ._lineage import METADATA_KEY, acheckpoint_invocation, aget_tuple, checkpoint_invocation

if TYPE_CHECKING:
    from ._recorder import Recorder


class Lineage:
    """The lineage reads of one guarded graph: the invocation a thread's checkpoint belongs
    to, read for the runs that continue a thread (their ledger parent) and for the checkpoints
    ``update_state``/``bulk_update_state`` and their async twins write (see the module
    docstring)."""

    def __init__(self, graph: Any, recorder: Recorder) -> None:
        self._graph = graph
        self._rec = recorder

    def _saver(self) -> Any:
        saver = getattr(self._graph, "checkpointer", None)
        return None if saver is None or isinstance(saver, bool) else saver

    @staticmethod
    def _naming(config: dict[str, Any], invocation: str | None) -> dict[str, Any]:
        if invocation is None:
            return config
        return {**config, "metadata": {**(config.get("metadata") or {}),
                                       METADATA_KEY: invocation}}

    def thread_invocation(self, config: dict[str, Any] | None) -> str | None:
        """The invocation the checkpoint ``config`` points at (the thread's latest, or its
        ``checkpoint_id``) belongs to; ``None`` when unknown (errors counted as ``link``)."""
        saver, lookup = self._saver(), thread_config(config)
        if saver is None or lookup is None:
            return None
        named: str | None = self._rec.rt.policy.call(
            "link", lambda: checkpoint_invocation(saver, saver.get_tuple(lookup))
        )
        return named

    async def athread_invocation(self, config: dict[str, Any] | None) -> str | None:
        """:meth:`thread_invocation` with the saver's async reads."""
        saver, lookup = self._saver(), thread_config(config)
        if saver is None or lookup is None:
            return None
        try:
            return await acheckpoint_invocation(saver, await aget_tuple(saver, lookup))
        except Exception as exc:
            self._rec.rt.policy.error("link", exc)
            return None

    def edit_config(self, merged: dict[str, Any] | None) -> dict[str, Any]:
        """The config of a state edit (``merged``: the caller's with the graph's defaults):
        its checkpoint names the invocation whose state it edits."""
        merged = merged or {}
        return self._naming(merged, self.thread_invocation(merged))

    async def aedit_config(self, merged: dict[str, Any] | None) -> dict[str, Any]:
        """:meth:`edit_config` with the saver's async reads."""
        merged = merged or {}
        return self._naming(merged, await self.athread_invocation(merged))

    @staticmethod
    def continues(input: Any, kwargs: dict[str, Any]) -> bool:
        """Whether a run continues its thread's lineage: input ``None`` or a ``Command``
        (resume, goto), or ``durability="exit"`` (it writes no checkpoint before it ends, so
        the ledger link is the only way recovery finds its thread)."""
        return input is None or isinstance(input, Command) or kwargs.get("durability") == "exit"

    def previous(
        self, input: Any, config: dict[str, Any] | None, kwargs: dict[str, Any]
    ) -> str | None:
        """Ledger id of the invocation a continuing run follows (see :meth:`continues`)."""
        if not self.continues(input, kwargs):
            return None
        named = self.thread_invocation(config)
        return None if named is None else logical_task_id(named)

    async def aprevious(
        self, input: Any, config: dict[str, Any] | None, kwargs: dict[str, Any]
    ) -> str | None:
        """:meth:`previous` with the saver's async reads."""
        if not self.continues(input, kwargs):
            return None
        named = await self.athread_invocation(config)
        return None if named is None else logical_task_id(named)
