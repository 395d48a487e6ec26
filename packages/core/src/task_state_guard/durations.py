"""Durations as people write them (``90``, ``90s``, ``15m``, ``2h``, ``1d``) and as they read them.

:func:`parse_seconds` is the one parser behind every option and environment value that takes
seconds (the CLI, the adapters' ``TSG_*_SECONDS`` settings). A plain number keeps its meaning
(seconds, as ``float()`` reads it); a number with one unit suffix must be a plain decimal. Nothing
else is accepted (no compound ``1h30``, no sign, no other unit), and the error never repeats the
rejected text.
"""

from __future__ import annotations

import math
import re

from .model import MAX_SECONDS, InvalidInput

#: Seconds per accepted unit suffix.
UNITS: dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_WITH_UNIT = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")


def parse_seconds(text: str, what: str, *, allow_zero: bool = True) -> float:
    """Return the duration ``text`` denotes, in seconds.

    ``90`` and ``90.5`` are seconds; ``90s``, ``15m``, ``2h``, ``1d`` (and ``1.5h``) carry a unit.
    The result is finite, not negative, at most about 317 years, and positive unless
    ``allow_zero``; anything else raises :class:`InvalidInput` naming ``what`` only.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be a duration")
    match = _WITH_UNIT.fullmatch(text)
    if match is not None:
        number = float(match.group(1)) * UNITS[match.group(2)]
    else:
        try:
            number = float(text)
        except ValueError:
            raise InvalidInput(
                f"{what} must be a duration in seconds or with a unit s, m, h or d"
            ) from None
    if not math.isfinite(number) or number < 0 or number > MAX_SECONDS:
        raise InvalidInput(f"{what} is out of range")
    if number == 0 and not allow_zero:
        raise InvalidInput(f"{what} must be positive")
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
