"""State edits through the guarded graph keep the thread's lineage.

``update_state`` writes a checkpoint of its own. Made on the guarded graph, that checkpoint
names (``METADATA_KEY``) the invocation whose state it edits, so the run that continues from
it (``invoke(None)``, ``Command(resume=...)``) is recorded as that invocation's child, and a
crash of that run is found and resumed by recovery. Edits made on the raw graph name nothing;
recovery then reads back over them to the checkpoint they edited.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._invocation import thread_config
from ._lineage import METADATA_KEY, acheckpoint_invocation, aget_tuple, checkpoint_invocation

if TYPE_CHECKING:
    from ._recorder import Recorder


class EditsMixin:
    """``update_state``/``bulk_update_state`` and their async twins on the guarded graph, and
    the lineage reads continuing runs share with them."""

    _graph: Any
    _rec: Recorder

    if TYPE_CHECKING:  # provided by GuardedGraph

        def _merged(self, config: dict[str, Any] | None) -> dict[str, Any] | None: ...

    def _saver(self) -> Any:
        saver = getattr(self._graph, "checkpointer", None)
        return None if saver is None or isinstance(saver, bool) else saver

    @staticmethod
    def _naming(config: dict[str, Any], invocation: str | None) -> dict[str, Any]:
        if invocation is None:
            return config
        return {**config, "metadata": {**(config.get("metadata") or {}),
                                       METADATA_KEY: invocation}}

    def _thread_invocation(self, config: dict[str, Any] | None) -> str | None:
        """The invocation the checkpoint ``config`` points at (the thread's latest, or its
        ``checkpoint_id``) belongs to; ``None`` when unknown (errors counted as ``link``)."""
        saver, lookup = self._saver(), thread_config(config)
        if saver is None or lookup is None:
            return None
        named: str | None = self._rec.rt.policy.call(
            "link", lambda: checkpoint_invocation(saver, saver.get_tuple(lookup))
        )
        return named

    async def _athread_invocation(self, config: dict[str, Any] | None) -> str | None:
        """:meth:`_thread_invocation` with the saver's async reads."""
        saver, lookup = self._saver(), thread_config(config)
        if saver is None or lookup is None:
            return None
        try:
            return await acheckpoint_invocation(saver, await aget_tuple(saver, lookup))
        except Exception as exc:
            self._rec.rt.policy.error("link", exc)
            return None

    def _edit_config(self, config: dict[str, Any]) -> dict[str, Any]:
        merged = self._merged(config) or {}
        return self._naming(merged, self._thread_invocation(merged))

    async def _aedit_config(self, config: dict[str, Any]) -> dict[str, Any]:
        merged = self._merged(config) or {}
        return self._naming(merged, await self._athread_invocation(merged))

    def update_state(
        self,
        config: dict[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> Any:
        """The graph's ``update_state``; the new checkpoint keeps the thread's lineage."""
        return self._graph.update_state(self._edit_config(config), values, as_node, task_id)

    async def aupdate_state(
        self,
        config: dict[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> Any:
        """The graph's ``aupdate_state``; the new checkpoint keeps the thread's lineage."""
        edited = await self._aedit_config(config)
        return await self._graph.aupdate_state(edited, values, as_node, task_id)

    def bulk_update_state(self, config: dict[str, Any], supersteps: Sequence[Any]) -> Any:
        """The graph's ``bulk_update_state``; the new checkpoints keep the thread's lineage."""
        return self._graph.bulk_update_state(self._edit_config(config), supersteps)

    async def abulk_update_state(
        self, config: dict[str, Any], supersteps: Sequence[Any]
    ) -> Any:
        """The graph's ``abulk_update_state``; the new checkpoints keep the lineage."""
        edited = await self._aedit_config(config)
        return await self._graph.abulk_update_state(edited, supersteps)
