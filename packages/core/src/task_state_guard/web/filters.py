"""The stuck-work list's narrowing filters: reason code, framework, a name search and the
overview's counts (a flag), each read from the query string, checked, and written back into
the page's form and links.

A refused value is answered with a fixed text (:class:`Refused`), never the value. The name
search is a substring of a name label, so only a label's characters can match: anything else
is refused rather than searched for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..model import FRAMEWORK_LABELS, TASK_CODES
from ..ops.task_list import COUNT_CAP, FLAGS, MAX_CONTAINS, TaskListing
from .html import esc

#: Every task reason code, in the order the states list them.
CODES: tuple[str, ...] = tuple(code for state in ("succeeded", "failed", "timed_out",
                                                    "cancelled")
                               for code in sorted(TASK_CODES[state]))
FRAMEWORKS: tuple[str, ...] = tuple(sorted(FRAMEWORK_LABELS))
#: The flags, as the form names them (the overview's drill-downs link to them).
FLAG_LABELS: tuple[tuple[str, str], ...] = (
    ("past_deadline", "running past its deadline"),
    ("owner_dead", "running, owner process dead"),
    ("awaiting_delivery", "closed, result owed"),
    ("verdict_pending", "lost, verdict waiting"),
    ("verdict_published", "lost, verdict published"),
)
assert tuple(flag for flag, _label in FLAG_LABELS) == FLAGS
_SEARCH = re.compile(rf"[A-Za-z0-9_.:/<>-]{{1,{MAX_CONTAINS}}}", re.ASCII)


class Refused(ValueError):
    """A filter value the page refuses (its message is fixed text, never the value)."""


@dataclass(frozen=True, slots=True)
class Narrowing:
    """The filters as given (valid): ``""`` where not given."""

    code: str = ""
    framework: str = ""
    contains: str = ""
    flag: str = ""

    def params(self) -> dict[str, object]:
        """The query-string values of these filters."""
        return {"code": self.code, "framework": self.framework, "q": self.contains,
                "flag": self.flag}


def parse(params: Mapping[str, str]) -> Narrowing:
    """The filters in ``params`` (``Refused``, with a fixed text, for a value not allowed)."""
    code = params.get("code", "")
    if code and code not in CODES:
        raise Refused("Unknown reason code.")
    framework = params.get("framework", "")
    if framework and framework not in FRAMEWORKS:
        raise Refused("The framework is one of celery, dramatiq or langgraph.")
    contains = params.get("q", "").strip()
    if contains and not _SEARCH.fullmatch(contains):
        raise Refused(f"A name search is up to {MAX_CONTAINS} characters of a name label: "
                      "letters, digits and _ . : / < > -.")
    flag = params.get("flag", "")
    if flag and flag not in FLAGS:
        raise Refused("Unknown flag.")
    return Narrowing(code, framework, contains, flag)


def _select(name: str, label: str, choices: Sequence[tuple[str, str]], chosen: str) -> str:
    options = "".join(
        f'<option value="{esc(value)}"{" selected" if value == chosen else ""}>{esc(text)}'
        "</option>" for value, text in (("", "any"), *choices))
    return f'<label>{esc(label)}<select name="{name}">{options}</select></label>'


def form_fields(narrow: Narrowing) -> str:
    """The filters' fields of the list's form."""
    return (
        f'<label>Name contains<input name="q" value="{esc(narrow.contains)}" size="16" '
        f'maxlength="{MAX_CONTAINS}" placeholder="fetch"></label>'
        + _select("code", "Reason code", [(c, c) for c in CODES], narrow.code)
        + _select("framework", "Framework", [(f, f) for f in FRAMEWORKS], narrow.framework)
        + _select("flag", "Only", FLAG_LABELS, narrow.flag)
    )


def note(narrow: Narrowing) -> str:
    """What a list narrowed to an overview count shows of it: the overview counts running
    jobs and attempts together, the list one kind at a time."""
    if narrow.flag not in ("past_deadline", "owner_dead"):
        return ""
    return (' <span class="muted">(the overview counts jobs and attempts together: choose '
            "Rows: attempts for the attempts)</span>")


def total(listing: TaskListing) -> str:
    """How many rows match, as the list's heading says it (``10,000+`` past the cap)."""
    if listing.total is None:
        return ""
    count = f"{COUNT_CAP:,}+" if listing.total_capped else f"{listing.total:,}"
    return f"{count} match" + ("" if count == "1" else "es")


__all__ = ["CODES", "FLAG_LABELS", "FRAMEWORKS", "Narrowing", "Refused", "form_fields",
           "note", "parse", "total"]
