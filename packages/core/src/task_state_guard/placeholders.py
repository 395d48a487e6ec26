"""Numbered SQL placeholders (``?1``), bound the way every CPython accepts.

The transition statements are written once, with SQLite's numbered placeholders, so that a value
used several times (the clock reading) is passed once, and the PostgreSQL backend prepares the
same text. CPython's ``sqlite3`` deprecates binding numbered placeholders from a sequence (a
warning since 3.12, an error from 3.14), so before a statement runs it is rewritten to plain
``?`` placeholders with its values repeated in their order (each text is rewritten once).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

_NUMBERED = re.compile(r"\?(\d+)")


@lru_cache(maxsize=256)
def _plan(sql: str) -> tuple[str, tuple[int, ...]]:
    """``sql`` with plain placeholders, and the 0-based parameter index of each in order."""
    order: list[int] = []

    def mark(match: re.Match[str]) -> str:
        order.append(int(match.group(1)) - 1)
        return "?"

    text = _NUMBERED.sub(mark, sql)
    if order and text.count("?") != len(order):
        raise ValueError("a statement mixes numbered and plain placeholders")
    return text, tuple(order)


def positional(sql: str, params: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """``(text, values)`` to execute ``sql`` (numbered placeholders) with ``params``."""
    text, order = _plan(sql)
    if not order:
        return sql, tuple(params)
    return text, tuple(params[index] for index in order)


def positional_rows(
    sql: str, rows: Sequence[Sequence[Any]]
) -> tuple[str, list[tuple[Any, ...]]]:
    """:func:`positional` for ``executemany``: one text, every row's values in its order."""
    text, order = _plan(sql)
    if not order:
        return sql, [tuple(row) for row in rows]
    return text, [tuple(row[index] for index in order) for row in rows]


__all__ = ["positional", "positional_rows"]
