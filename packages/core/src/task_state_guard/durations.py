"""Durations as people write them (``90``, ``90s``, ``15m``, ``2h``, ``1d``) and as they read them.

:func:`parse_seconds` is the one parser behind every option and environment value that takes
seconds (the CLI, the ``TSG_*_SECONDS`` values, the adapters' settings given as text). The
grammar is exactly: ASCII digits, optionally a fraction (``.`` and digits), optionally one unit
``s``, ``m``, ``h`` or ``d``. Nothing else is accepted: no sign (``-0``, ``+5``), no spaces, no
exponent (``1e3``), no ``_`` separators, no other digits (Arabic-Indic, full-width), no
``inf``/``nan``, no compound ``1h30``; the error never repeats the rejected text.
:func:`parse_count` is the same for whole numbers (``--limit``, ``--busy-timeout-ms``).
"""

from __future__ import annotations

import math
import re
import time

from .model import MAX_SECONDS, InvalidInput

#: Seconds per accepted unit suffix.
UNITS: dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)", re.ASCII)
_COUNT = re.compile(r"[0-9]+", re.ASCII)


def parse_seconds(
    text: str, what: str, *, allow_zero: bool = True, maximum: float | None = MAX_SECONDS
) -> float:
    """Return the duration ``text`` denotes, in seconds.

    ``90`` and ``90.5`` are seconds; ``90s``, ``15m``, ``2h``, ``1d`` (and ``1.5h``) carry a unit.
    The result is finite, not negative, at most ``maximum`` (about 317 years by default;
    ``None``: any finite value), and positive unless ``allow_zero``; anything else raises
    :class:`InvalidInput` naming ``what`` only.
    """
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(
            f"{what} must be a duration in seconds or with a unit s, m, h or d"
        )
    number = float(match.group(1)) * UNITS.get(match.group(2), 1)
    if not math.isfinite(number) or (maximum is not None and number > maximum):
        raise InvalidInput(f"{what} is out of range")
    if number == 0 and not allow_zero:
        raise InvalidInput(f"{what} must be positive")
    return number


def parse_count(text: str, what: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """Return the whole number ``text`` denotes: ASCII digits only (no sign, space, ``_`` or
    other digits ``str.isdigit()`` accepts, such as ``²``), from ``minimum`` to ``maximum``
    (when given); anything else raises :class:`InvalidInput` naming ``what`` only. Every
    numeric option, setting and request value is read with it (or :func:`parse_seconds`)."""
    longest = 4000 if maximum is None else min(4000, len(str(maximum)) + 8)  # leading zeros
    if not isinstance(text, str) or len(text) > longest or _COUNT.fullmatch(text) is None:
        raise InvalidInput(f"{what} must be a whole number")  # int() refuses longer ones
    number = int(text)
    if number < minimum or (maximum is not None and number > maximum):
        raise InvalidInput(f"{what} is out of range")
    return number


def humanize(seconds: float | None) -> str:
    """A short reading of a duration: ``45s``, ``15m``, ``2h 5m``, ``3d 4h``; ``-`` for none.

    Below a minute, tenths of a second are kept under ten seconds (``2.5s``); longer durations
    show their two largest units. A negative value (a clock behind the ledger) reads as ``0s``.
    """
    if seconds is None or not math.isfinite(seconds):
        return "-"
    value = max(0.0, seconds)
    if value < 10:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
        return f"{text}s"
    whole = int(value)
    if whole < 60:
        return f"{whole}s"
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (count, _unit) in enumerate(parts) if count)
    shown = [f"{count}{unit}" for count, unit in parts[first : first + 2] if count]
    return " ".join(shown)


def utc(at: float | None) -> str:
    """A ledger time as ``YYYY-MM-DD HH:MM:SSZ`` (``-`` for none)."""
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))
