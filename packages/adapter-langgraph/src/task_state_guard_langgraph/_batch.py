"""``batch`` and ``abatch`` of a guarded graph: one recorded invocation per input."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: ``config``: one for all inputs, or one per input.
Configs = dict[str, Any] | Sequence[dict[str, Any] | None] | None


def batch(
    invoke: Callable[..., Any],
    inputs: Sequence[Any],
    config: Configs,
    *,
    invocation_ids: Sequence[str] | None,
    return_exceptions: bool,
    kwargs: dict[str, Any],
) -> list[Any]:
    """``invoke`` (a guarded graph's) for each input, in threads like ``Runnable.batch``
    (``max_concurrency`` of the first config bounds them); outputs in input order."""
    configs = _configs(config, len(inputs))
    ids = _ids(invocation_ids, len(inputs))
    if not inputs:
        return []
    limit = (configs[0] or {}).get("max_concurrency") or len(inputs)

    def one(i: int) -> Any:
        try:
            return invoke(inputs[i], configs[i], invocation_id=ids[i], **kwargs)
        except Exception as exc:
            if return_exceptions:
                return exc
            raise

    with ThreadPoolExecutor(max_workers=min(limit, len(inputs))) as pool:
        return list(pool.map(one, range(len(inputs))))


async def abatch(
    ainvoke: Callable[..., Awaitable[Any]],
    inputs: Sequence[Any],
    config: Configs,
    *,
    invocation_ids: Sequence[str] | None,
    return_exceptions: bool,
    kwargs: dict[str, Any],
) -> list[Any]:
    """``ainvoke`` (a guarded graph's) for each input concurrently (see :func:`batch`)."""
    configs = _configs(config, len(inputs))
    ids = _ids(invocation_ids, len(inputs))
    if not inputs:
        return []
    gate = asyncio.Semaphore((configs[0] or {}).get("max_concurrency") or len(inputs))

    async def one(i: int) -> Any:
        async with gate:
            try:
                return await ainvoke(inputs[i], configs[i], invocation_id=ids[i], **kwargs)
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
