"""The HTML pages of ``tsg serve``: overview, stuck work, a job, and the small ones.

Each function turns what the ledger answered into one page (bytes); none reads the ledger.
The overview shows aggregates only (never an id); the stuck-work list and the job page show
ledger and framework ids, as ``tsg tasks`` and ``tsg get`` do. Nothing else exists to show:
the ledger stores no task arguments, results or messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..durations import humanize, utc
from ..model import Task
from ..ops.events import TaskEvent
from ..ops.history import OutcomeHistory
from ..ops.job_state import JobState
from ..ops.status import INVALID_LABEL
from ..ops.task_list import TaskListing
from ..rules import TASK_ORDER
from . import filters, job_parts
from .chart import outcome_chart
from .filters import Narrowing
from .html import View, ago, badge, esc, link, page, table

TASK_STATES_SHOWN = TASK_ORDER
#: The overview's chart windows: (label, seconds, buckets).
WINDOWS = {"1h": (3600.0, 12), "6h": (21600.0, 24), "24h": (86400.0, 24), "7d": (604800.0, 28)}
NAMES_SHOWN = 50


# ----------------------------------------------------------------------------- overview


_ALERT = ' class="alert"'


def _card(title: str, rows: Sequence[tuple[str, str, bool, str]], foot: str = "") -> str:
    """A card of counts: label, value, alert, and the list the value links to (or "")."""
    items = "".join(
        f"<dt>{esc(label)}</dt><dd{_ALERT if alert else ''}>"
        f"{link(href, value) if href else esc(value)}</dd>"
        for label, value, alert, href in rows)
    return f'<section class="card"><h2>{esc(title)}</h2><dl>{items}</dl>{foot}</section>'


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else humanize(seconds)


def _verdicts_card(view: View, report: dict[str, Any]) -> str | None:
    """Lost-job verdicts (``report["verdicts"]``: state -> framework -> count), when the
    ledger keeps them: waiting to be published to the framework, and published."""
    verdicts = report.get("verdicts")
    if not isinstance(verdicts, Mapping):
        return None
    pending = verdicts.get("pending") or {}
    published = verdicts.get("published") or {}
    rows = []
    for framework in sorted(set(pending) | set(published)):
        waiting, done = int(pending.get(framework, 0)), int(published.get(framework, 0))
        shown = link(_drill(view, "verdict_pending", framework), str(waiting), "alert") \
            if waiting else "0"
        rows.append([esc(framework), shown,
                     link(_drill(view, "verdict_published", framework), str(done)) if done
                     else "0"])
    grid = table(["framework", "waiting", "published"], rows, numeric=frozenset({1, 2}),
                 raw=frozenset({0, 1, 2}), cls="mini", empty="none")
    oldest = _age(report.get("oldest_pending_verdict_age_seconds"))
    return (f'<section class="card"><h2>Lost-job verdicts</h2>{grid}'
            f"<dl><dt>oldest waiting</dt><dd>{esc(oldest)}</dd></dl></section>")


def _drill(view: View, flag: str, framework: str = "") -> str:
    """The list behind one of the overview's counts."""
    return view.href("/stuck", {"flag": flag, "framework": framework})


def overview(view: View, report: dict[str, Any], history: OutcomeHistory, window: str,
             now: float) -> bytes:
    """The overview: at-risk work, owed deliveries, verdicts, the chart and the counts."""
    kinds, owed = report["tasks_by_kind"], report["deliveries_by_kind"]
    grace = humanize(report["active_grace_seconds"])
    risk = [
        ("past deadline", str(report["running_past_deadline"]),
         report["running_past_deadline"] > 0, _drill(view, "past_deadline")),
        (f"heartbeat stale (≥ {grace})", str(report["running_heartbeat_stale"]),
         report["running_heartbeat_stale"] > 0, view.href("/stuck", {
             "status": "running", "idle": f"{report['active_grace_seconds']:.3f}".rstrip("0")
             .rstrip(".")})),
        ("owner dead", str(report["running_owner_dead"]), report["running_owner_dead"] > 0,
         _drill(view, "owner_dead")),
    ]
    awaiting = report["deliveries_awaiting"]
    cards = [
        _card("Running at risk", risk,
              f'<p>{link(view.href("/stuck", {"status": "running"}), "Running work")}</p>'),
        _card("Work in progress", [
            ("queued jobs", str(kinds["task"]["queued"]), False, ""),
            ("running jobs", str(kinds["task"]["running"]), False, ""),
            ("oldest queued", _age(report["oldest_queued_age_seconds"]), False, ""),
            ("oldest running", _age(report["oldest_running_age_seconds"]), False, ""),
        ]),
        _card("Awaiting delivery", [
            ("owed (result ready)", str(awaiting["owed"]), awaiting["owed"] > 0,
             _drill(view, "awaiting_delivery")),
            ("internal (nobody owed)", str(awaiting["internal"]), False, ""),
            ("oldest owed", _age(report["oldest_owed_delivery_age_seconds"]), False, ""),
        ]),
    ]
    verdicts = _verdicts_card(view, report)
    if verdicts is not None:
        cards.append(verdicts)
    windows = " · ".join(
        f"<strong>{esc(key)}</strong>" if key == window
        else link(view.href("/", {"window": key}), key) for key in WINDOWS
    )
    states = table(
        ["state", "jobs (logical tasks)", "attempts"],
        [[s, str(kinds["task"][s]), str(kinds["attempt"][s])] for s in TASK_STATES_SHOWN],
        numeric=frozenset({1, 2}),
    )
    deliveries = table(
        ["delivery", "owed", "internal"],
        [[s, str(owed["owed"][s]), str(owed["internal"][s])] for s in owed["owed"]],
        numeric=frozenset({1, 2}),
    )
    body = (
        f'<div class="cards">{"".join(cards)}</div>'
        f"<h2>Jobs closed over the last {esc(window)} <span class=\"muted\">({windows})</span></h2>"
        f"{outcome_chart(history)}"
        f'<h2>By state</h2><div class="row">{states}{deliveries}</div>'
        f"<h2>Jobs by name</h2>{_names(report['by_name'])}"
        f"<h2>Outcomes since the ledger was created</h2>{_totals(report)}"
    )
    return page(view, "Overview", body, here="/", params={"window": window}, now=now)


def _names(by_name: dict[str, dict[str, int]]) -> str:
    ranked = sorted(by_name.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    rows = [[name if name != INVALID_LABEL else "(invalid label)",
             *(str(counts[s]) for s in TASK_STATES_SHOWN)] for name, counts in
            ranked[:NAMES_SHOWN]]
    text = table(["name", *TASK_STATES_SHOWN], rows,
                 numeric=frozenset(range(1, len(TASK_STATES_SHOWN) + 1)),
                 empty="no named jobs")
    if len(ranked) > NAMES_SHOWN:
        text += (f'<p class="muted">The {NAMES_SHOWN} names with the most jobs are shown; '
                 f"{len(ranked) - NAMES_SHOWN} more exist.</p>")
    return text


def _totals(report: dict[str, Any]) -> str:
    rows = []
    for key, what in (("outcomes_total", "closed"), ("delivery_outcomes_total", "delivery")):
        for kind, states in report[key].items():
            for state, codes in states.items():
                rows += [[f"{kind} {what}", state, code or "-", str(total)]
                         for code, total in codes.items() if total]
    return table(["what", "state", "code", "total"], rows, numeric=frozenset({3}),
                 empty="nothing has closed yet")


# ----------------------------------------------------------------------------- stuck work


@dataclass(frozen=True, slots=True)
class StuckQuery:
    """The stuck-work page's filters, order and page, as the operator gave them (valid)."""

    status: str  # "active" (queued or running) or a task state
    name: str
    idle: str  # a duration as typed ("15m"), or ""
    older: str
    attempts: bool
    order: str
    descending: bool
    per_page: int
    job: str = ""  # one job, by an id of ``job_kind``
    job_kind: str = "any"
    narrow: Narrowing = field(default_factory=Narrowing)  # code, framework, search, flag

    def params(self, **changes: object) -> dict[str, object]:
        """The query string of this view, with ``changes``."""
        values: dict[str, object] = {
            "status": "" if self.status == "active" else self.status, "name": self.name,
            "idle": self.idle, "older": self.older, "rows": "attempts" if self.attempts else "",
            "sort": self.order, "dir": "desc" if self.descending else "",
            "per": "" if self.per_page == 50 else self.per_page,
            "job": self.job, "job_kind": "" if self.job_kind == "any" else self.job_kind,
            **self.narrow.params(),
        }
        values.update(changes)
        return values


_SORTS = (("created", "Age"), ("activity", "Idle"), ("name", "Name"), ("status", "State"))


def _sort_header(view: View, query: StuckQuery, order: str, label: str) -> str:
    here = query.order == order
    descending = not query.descending if here else False
    # Age and idle time grow as the stored times (creation, last sign of life) shrink.
    shown_descending = query.descending != (order in ("created", "activity"))
    arrow = (" ▼" if shown_descending else " ▲") if here else ""
    return link(view.href("/stuck", query.params(sort=order, dir="desc" if descending else "")),
                label + arrow)


def stuck(view: View, query: StuckQuery, listing: TaskListing, *, has_previous: bool,
          kinds: Sequence[tuple[str, str]], error: str = "",
          position: Mapping[str, str] | None = None) -> bytes:
    """The stuck-work list: the filters form, the sortable table and the pager;
    ``position``: the page's cursor (``after`` or ``before``), which pausing keeps."""
    options = "".join(
        f'<option value="{esc(value)}"{" selected" if value == query.status else ""}>'
        f"{esc(text)}</option>"
        for value, text in [("active", "queued or running"),
                            *((s, s) for s in TASK_STATES_SHOWN)]
    )
    rows_kind = "".join(
        f'<option value="{value}"{" selected" if (value == "attempts") == query.attempts else ""}>'
        f"{text}</option>" for value, text in (("", "jobs (logical tasks)"),
                                               ("attempts", "attempts"))
    )
    hidden = "".join(
        f'<input type="hidden" name="{k}" value="{esc(v)}">'
        for k, v in (("sort", query.order), ("dir", "desc" if query.descending else ""),
                     ("refresh", "off" if view.paused else "")) if v
    )
    form = (
        '<form class="filters" method="get" action="/stuck">'
        f'<label>State<select name="status">{options}</select></label>'
        f'<label>Name<input name="name" value="{esc(query.name)}" size="22" '
        'placeholder="app.tasks.fetch"></label>'
        f'<label>Idle at least<input name="idle" value="{esc(query.idle)}" size="7" '
        'placeholder="15m"></label>'
        f'<label>Created at least<input name="older" value="{esc(query.older)}" size="7" '
        'placeholder="2h"></label>'
        f'<label>Rows<select name="rows">{rows_kind}</select></label>'
        f'<label>One job<input name="job" value="{esc(query.job)}" size="22" '
        'placeholder="an id" autocomplete="off"></label>'
        f'<label>Kind of id<select name="job_kind">{_options(kinds, query.job_kind)}'
        "</select></label>"
        f"{filters.form_fields(query.narrow)}"
        f'{hidden}<button type="submit">Apply</button> '
        f'{link(view.href("/stuck"), "Clear")}</form>'
    )
    heads = [esc("Ledger id"), esc("Kind"), esc("Parent" if query.attempts else "Framework id"),
             _sort_header(view, query, "name", "Name"), _sort_header(view, query, "status",
                                                                      "State"),
             esc("Code"), esc("Delivery"), _sort_header(view, query, "created", "Age"),
             _sort_header(view, query, "activity", "Idle")]
    if not query.attempts:
        heads.append(esc("Attempts"))
    rows = []
    for item in listing.tasks:
        task = item.task
        other = task.parent_id if query.attempts else task.framework_id
        shown = "-" if other is None else f"<code>{esc(other)}</code>"
        if not query.attempts and task.parent_id is not None:  # a run continuing another
            shown = job_parts.run_of(view, task.parent_id)
        row = [link(view.href("/job", {"id": task.id, "kind": "ledger"}), task.id, "id"),
               esc(item.kind), shown,
               esc(task.name or "-"), badge(task.status.value), esc(task.terminal_code or "-"),
               badge(task.delivery_status.value), esc(humanize(item.age_seconds)),
               esc(humanize(item.idle_seconds))]
        if not query.attempts:
            row.append(str(item.attempts))
        rows.append(row)
    grid = table(heads, rows, header_html=heads, raw=frozenset(range(len(heads))),
                 numeric=frozenset({7, 8, 9}), empty="no tasks match")
    pager = []
    if has_previous:
        pager.append(link(view.href("/stuck", query.params()), "« First page"))
        pager.append(link(view.href("/stuck", query.params(
            before=listing.tasks[0].cursor if listing.tasks else "")), "\u2039 Previous"))
    if listing.more and listing.tasks:
        pager.append(link(view.href("/stuck", query.params(after=listing.tasks[-1].cursor)),
                          "Next \u203a"))
    alert = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    matches = filters.total(listing)
    heading = f'<p class="total"><strong>{esc(matches)}</strong>{filters.note(query.narrow)}</p>' \
        if matches else ""
    body = (f"{alert}{form}{heading}{grid}"
            f'<div class="pager">{"".join(pager)}</div>'
            f'<p class="muted">{len(listing.tasks)} shown, {query.per_page} per page. '
            "Ids are shown on purpose: protect this page like the ledger.</p>")
    return page(view, "Stuck work", body, here="/stuck",
                params={**query.params(), **(position or {})}, now=listing.at)


# ----------------------------------------------------------------------------- a job


@dataclass(frozen=True, slots=True)
class JobView:
    """What the job page shows: the logical task, its attempts (at most a page of them,
    ``more`` when others exist), each task's events, the id asked for, and the attempts that
    contradict the job's close."""

    job: Task
    attempts: list[Task]
    more: bool
    events: dict[str, list[TaskEvent]]
    asked: str
    #: The attempts that contradict the job's close (at most a page of them; ``more_contradicting``
    #: when others do too): they succeeded after it closed otherwise.
    contradicting: frozenset[str] = frozenset()
    more_contradicting: bool = False
    #: The later runs of this job (children that owe their own delivery: a LangGraph resume
    #: or recovery run), the run this job follows (None: a root), each run's role by id, and
    #: the job's owner liveness and lost verdict.
    runs: tuple[Task, ...] = ()
    parent: Task | None = None
    roles: Mapping[str, str] = field(default_factory=dict)
    state: JobState | None = None


def _options(choices: Sequence[tuple[str, str]], chosen: str) -> str:
    return "".join(
        f'<option value="{esc(k)}"{" selected" if k == chosen else ""}>{esc(text)}</option>'
        for k, text in choices
    )


def search_form(view: View, kinds: Sequence[tuple[str, str]], chosen: str = "",
                value: str = "") -> str:
    """The form that finds a job by its ledger id or a framework's id."""
    options = _options(kinds, chosen)
    paused = '<input type="hidden" name="refresh" value="off">' if view.paused else ""
    return (
        '<form class="filters" method="get" action="/job">'
        f'<label>Id<input name="id" value="{esc(value)}" size="44" required '
        'placeholder="paste a ledger, Celery, Dramatiq or LangGraph id" autocomplete="off">'
        f'</label><label>Kind of id<select name="kind">{options}</select></label>{paused}'
        '<button type="submit">Find</button></form>'
    )


def job_search(view: View, kinds: Sequence[tuple[str, str]], *, chosen: str = "",
               value: str = "", error: str = "", now: float | None = None,
               choices: Sequence[tuple[str, str]] = ()) -> bytes:
    """The job page without a job: the search form, why the last search found none, or the
    jobs it could mean (``choices``: links and their kind of id)."""
    alert = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    if choices:
        items = "".join(f"<li>{link(href, f'the job with this {label}')}</li>"
                        for href, label in choices)
        alert += f"<p>That id names more than one job:</p><ul>{items}</ul>"
    body = (alert + search_form(view, kinds, chosen, value) +
            '<p class="muted">A framework id is turned into the ledger id the adapter derives '
            "from it; nothing is stored or logged about the search.</p>")
    return page(view, "Find a job", body, here="/job", now=now)


def _when(at: float | None, now: float) -> str:
    return "-" if at is None else esc(f"{utc(at)} ({ago(at, now)})")


def _fields(task: Task, now: float, extra: str = "") -> str:
    delivery = task.delivery_status.value + ("" if task.delivery_required else
                                             " (internal: no delivery owed)")
    rows = [
        ("ledger id", f"<code>{esc(task.id)}</code>"),
        ("framework id", "-" if task.framework_id is None else
         f"<code>{esc(task.framework_id)}</code>"),
        ("name", esc(task.name or "-")),
        ("state", badge(task.status.value)),
        ("code", esc(task.terminal_code or "-")),
        ("delivery", esc(delivery)),
        ("delivery code", esc(task.delivery_code or "-")),
        ("created", _when(task.created_at, now)),
        ("started", _when(task.started_at, now)),
        ("last heartbeat", _when(task.heartbeat_at, now)),
        ("ended", _when(task.ended_at, now)),
        ("deadline", _when(task.deadline_at, now)),
        ("owner recorded", "yes" if task.has_owner else "no"),
    ]
    items = "".join(f"<dt>{esc(label)}</dt><dd>{value}</dd>" for label, value in rows)
    return f'<section class="card job"><dl>{items}{extra}</dl></section>'


def _phase(is_job: bool, kind: str) -> int:
    """At equal times, the lifecycle order: the job opens, its attempts open and close, then
    the job closes."""
    opening = kind in ("created", "started")
    if is_job:
        return 0 if opening else 3
    return 1 if opening else 2


def _timeline(data: JobView) -> str:
    """Every event of the job and its attempts, oldest first."""
    labels = {data.job.id: "job"}
    labels.update({a.id: f"attempt {n}" for n, a in enumerate(data.attempts, start=1)})
    order = {task_id: n for n, task_id in enumerate(labels)}
    merged = sorted(
        ((event.at, _phase(task_id == data.job.id, event.kind), order[task_id], step,
          task_id, event)
         for task_id, events in data.events.items() for step, event in enumerate(events)),
        key=lambda item: item[:4],
    )
    start = data.job.created_at
    items = []
    for at, _phase_rank, _who, _step, task_id, event in merged:
        ok = event.state in ("succeeded", "delivered", "not_applicable")
        cls = f"ev-{event.kind}" + (" ok" if ok else "")
        shown = event.code if event.code not in (None, event.kind) else None
        code = f" · <code>{esc(shown)}</code>" if shown else ""
        items.append(
            f'<li class="{cls}"><span class="when">{esc(utc(at))} '
            f"(+{esc(humanize(at - start))})</span><strong>{esc(labels[task_id])}</strong> "
            f"{esc(event.kind)} → {badge(event.state)}{code}</li>"
        )
    return f'<ol class="timeline">{"".join(items)}</ol>'


def _contradiction(data: JobView) -> str:
    """The notice of a job whose attempts contradict its close (doctor's warning)."""
    if not data.contradicting:
        return ""
    count, more = len(data.contradicting), data.more_contradicting
    which = f"{count}{'+' if more else ''} attempt{'' if count == 1 and not more else 's'}"
    close = data.job.status.value + (f"/{data.job.terminal_code}" if data.job.terminal_code
                                     else "")
    return (
        '<p class="notice" role="note"><strong>Attempts contradict the close.</strong> '
        f"This job closed {esc(close)}, and {esc(which)} of it succeeded after that. A close "
        "is final, so the ledger keeps it; the framework ran the job again after it was "
        "closed (for example a Celery task revoked and then run, or a job closed lost whose "
        "message came back). The framework's own record may say it succeeded.</p>"
    )


def job(view: View, data: JobView, kinds: Sequence[tuple[str, str]], now: float) -> bytes:
    """One job: its fields, its attempts and its event history as a timeline."""
    job_task = data.job
    note = ""
    if data.asked != job_task.id:
        note = (f'<p class="muted">The id asked for is attempt '
                f"<code>{esc(data.asked)}</code> of this job.</p>")
    marked = " after the job closed"
    rows = [
        [str(n), f"<code>{esc(a.id)}</code>", esc(a.name or "-"),
         badge(a.status.value) + (esc(marked) if a.id in data.contradicting else ""),
         esc(a.terminal_code or "-"),
         esc(utc(a.started_at)), esc(utc(a.ended_at)),
         esc(humanize(a.ended_at - a.started_at)) if a.ended_at and a.started_at else "-",
         esc(job_parts.owner(a, data.state))]
        for n, a in enumerate(data.attempts, start=1)
    ]
    attempts = table(["#", "attempt id", "name (node)", "state", "code", "started", "ended",
                      "ran", "owner"],
                     rows, raw=frozenset(range(9)), numeric=frozenset({0, 7}),
                     empty="no attempts recorded")
    if data.more:
        attempts += (f'<p class="muted">The first {len(data.attempts)} attempts are shown; '
                     "more exist (tsg children ID lists them all).</p>")
    body = (
        search_form(view, kinds) + note + _contradiction(data)
        + job_parts.follows(view, job_task, data.parent, data.roles)
        + _fields(job_task, now, job_parts.state_items(job_task, data.state, now))
        + job_parts.runs_table(view, data.runs, data.roles)
        + f"<h2>Attempts</h2>{attempts}<h2>Timeline</h2>{_timeline(data)}"
    )
    return page(view, f"Job {job_task.name or ''}".strip(), body, here="/job",
                params={"id": data.asked}, now=now)


# ----------------------------------------------------------------------------- the small ones


def message(view: View, title: str, text: str, status_note: str = "", *, here: str = "",
            params: Mapping[str, object] | None = None) -> bytes:
    """A page with one fixed message (errors: never a trace, a path or a value); ``here``
    and ``params``: the page it stands for, which its refresh reloads."""
    body = f'<p class="error" role="alert">{esc(text)}</p>'
    if status_note:
        body += f'<p class="muted">{esc(status_note)}</p>'
    return page(view, title, body, here=here, params=params)


def login(view: View, next_path: str, failed: bool) -> bytes:
    """The token form (only when the server has a token)."""
    alert = ('<p class="error" role="alert">That token was not accepted.</p>' if failed
             else "")
    body = (
        f"{alert}<p>This view needs the server's token: open the sign-in address "
        "<code>tsg serve</code> printed, or paste the token from its file (beside a SQLite "
        "ledger, <code>LEDGER.serve-token</code>; else the file given to "
        "<code>--token-file</code>, or <code>TSG_SERVE_TOKEN</code>).</p>"
        '<form class="filters" method="post" action="/login">'
        '<label>Token<input type="password" name="token" size="40" required '
        'autocomplete="current-password"></label>'
        f'<input type="hidden" name="next" value="{esc(next_path)}">'
        '<button type="submit">Sign in</button></form>'
    )
    return page(view, "Sign in", body, here="")


__all__ = ["WINDOWS", "JobView", "StuckQuery", "job", "job_search", "login", "message",
           "overview", "search_form", "stuck"]
