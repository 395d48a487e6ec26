"""``batch`` and ``abatch`` of a guarded graph: one recorded invocation per input."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol


class _Invoker(Protocol):
    def invoke(self, input: Any, config: Any = ..., **kwargs: Any) -> Any: ...

    async def ainvoke(self, input: Any, config: Any = ..., **kwargs: Any) -> Any: ...


class BatchMixin:
    """``batch``/``abatch`` on top of the class's own ``invoke``/``ainvoke``."""

    def batch(
        self: _Invoker,
        inputs: Sequence[Any],
        config: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        *,
        invocation_ids: Sequence[str] | None = None,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """:meth:`invoke` for each input (one recorded invocation each), in threads like
        ``Runnable.batch`` (``max_concurrency`` of the first config bounds them); outputs in
        input order. ``config``: one for all, or one per input; ``invocation_ids`` likewise
        one per input."""
        configs = _configs(config, len(inputs))
        ids = _ids(invocation_ids, len(inputs))
        if not inputs:
            return []
        limit = (configs[0] or {}).get("max_concurrency") or len(inputs)

        def one(i: int) -> Any:
            try:
                return self.invoke(inputs[i], configs[i], invocation_id=ids[i], **kwargs)
            except Exception as exc:
                if return_exceptions:
                    return exc
                raise

        with ThreadPoolExecutor(max_workers=min(limit, len(inputs))) as pool:
            return list(pool.map(one, range(len(inputs))))

    async def abatch(
        self: _Invoker,
        inputs: Sequence[Any],
        config: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        *,
        invocation_ids: Sequence[str] | None = None,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """:meth:`ainvoke` for each input concurrently (see :meth:`batch`)."""
        configs = _configs(config, len(inputs))
        ids = _ids(invocation_ids, len(inputs))
        if not inputs:
            return []
        gate = asyncio.Semaphore((configs[0] or {}).get("max_concurrency") or len(inputs))

        async def one(i: int) -> Any:
            async with gate:
                try:
                    return await self.ainvoke(
                        inputs[i], configs[i], invocation_id=ids[i], **kwargs
                    )
                except Exception as exc:
                    if return_exceptions:
                        return exc
                    raise

        return list(await asyncio.gather(*(one(i) for i in range(len(inputs)))))


def _configs(config: Any, count: int) -> list[dict[str, Any] | None]:
    if isinstance(config, Sequence) and not isinstance(config, str | bytes):
        if len(config) != count:
            raise ValueError("batch: one config per input, or a single config")
        return list(config)
    return [config] * count


def _ids(invocation_ids: Sequence[str] | None, count: int) -> list[str | None]:
    if invocation_ids is None:
        return [None] * count
    if len(invocation_ids) != count:
        raise ValueError("batch: one invocation id per input")
    return list(invocation_ids)
