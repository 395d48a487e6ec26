"""What a page's query asks for, parsed and checked: the stuck-work list's filters, sort and
page position, and the ids an operator's pasted id can stand for. A refused value raises
:class:`~task_state_guard.web.messages.BadInput` with a fixed text.
"""

from __future__ import annotations

from ..durations import parse_seconds
from ..model import TASK_STATES, InvalidInput, canonical_id, check_name
from ..ops.task_list import ORDERS, parse_cursor
from . import filters, pages
from .messages import ASCII_DIGITS, BadInput

PER_PAGE = (25, 50, 100, 200)
#: The kinds of id a job can be found by: (form value, label). ``any`` tries each in turn.
ID_KINDS: tuple[tuple[str, str], ...] = (
    ("any", "any kind of id"), ("ledger", "ledger id"), ("celery", "Celery task id"),
    ("dramatiq", "Dramatiq message id"), ("langgraph", "LangGraph invocation id"),
)
MAX_ID_LENGTH = 1000


def _ledger_id(kind: str, value: str) -> str:
    if kind == "ledger":
        return canonical_id(value.lower() if len(value) == 36 else value)
    from ..integration.ids import job_task_id

    return job_task_id(kind, value)


def job_candidates(kind: str, value: str) -> list[tuple[str, str]]:
    """The ledger ids an operator's pasted id can stand for, as ``(kind, ledger id)``: one for
    a given kind (``InvalidInput`` when the text is not an id of that kind), every kind it can
    be for ``any`` (a framework's job id is computed from it, nothing is looked up)."""
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput("the id is too long")
    if kind != "any":
        return [(kind, _ledger_id(kind, value))]
    found = []
    for each, _label in ID_KINDS[1:]:
        try:
            found.append((each, _ledger_id(each, value)))
        except InvalidInput:
            continue
    if not found:
        raise InvalidInput("not an id of any kind")
    return found


def stuck_query(params: dict[str, str]) -> tuple[pages.StuckQuery, str | None, bool]:
    status = params.get("status") or "active"
    if status != "active" and status not in TASK_STATES:
        raise BadInput("Unknown state.")
    name = params.get("name", "").strip()
    try:
        check_name(name or None)
    except InvalidInput:
        raise BadInput("A name is a task, actor or graph name label.") from None
    durations = {}
    for key in ("idle", "older"):
        text = params.get(key, "").strip()
        try:
            if text:
                parse_seconds(text, key)
        except InvalidInput:
            raise BadInput("Durations are seconds or a number with s, m, h or d (15m).") from None
        durations[key] = text
    rows = params.get("rows", "")
    if rows not in ("", "attempts"):
        raise BadInput("Rows are jobs or attempts.")
    order = params.get("sort") or "created"
    if order not in ORDERS:
        raise BadInput("Unknown sort order.")
    direction = params.get("dir", "")
    if direction not in ("", "asc", "desc"):
        raise BadInput("Unknown sort direction.")
    per = params.get("per") or "50"
    if not ASCII_DIGITS.fullmatch(per) or len(per) > 3 or int(per) not in PER_PAGE:
        raise BadInput("Rows per page are 25, 50, 100 or 200.")
    job = params.get("job", "").strip()
    job_kind = params.get("job_kind") or "any"
    if job_kind not in dict(ID_KINDS):
        raise BadInput("Unknown kind of id.")
    if job:
        try:
            job_candidates(job_kind, job)
        except InvalidInput:
            raise BadInput("That is not a valid id of the kind chosen.") from None
    after, before = params.get("after"), params.get("before")
    if after and before:
        raise BadInput("A page starts after one row or ends before one, not both.")
    try:
        narrow = filters.parse(params)
    except filters.Refused as exc:
        raise BadInput(str(exc)) from None
    query = pages.StuckQuery(status, name, durations["idle"], durations["older"],
                             rows == "attempts", order, direction == "desc", int(per), job,
                             job_kind, narrow)
    cursor = after or before or None
    if cursor is not None:
        try:
            parse_cursor(order, cursor)
        except InvalidInput:
            raise BadInput("That page position is not valid; start from the first page.") \
                from None
    return query, cursor, bool(before)


__all__ = ["ID_KINDS", "MAX_ID_LENGTH", "PER_PAGE", "job_candidates", "stuck_query"]
