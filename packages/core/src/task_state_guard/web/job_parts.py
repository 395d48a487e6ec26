"""Parts of the job page beyond its fields: the owner's liveness and the lost verdict, the runs
that continue or recover a job (LangGraph), and the link from such a run to the one it
follows. Each function returns HTML; none reads the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..durations import utc
from ..model import Liveness, Task
from ..ops.job_state import JobState
from .html import View, ago, badge, esc, link, table

#: What a run's role is called: a recovery run resumes a lost run's thread; a continuation
#: is any other run that carries a thread on (a resume, a ``Command``).
RECOVERY, CONTINUATION = "recovery run", "continuation"
_LIVENESS = {Liveness.ALIVE: "alive", Liveness.DEAD: "dead (reconcile closes its work)",
             Liveness.UNKNOWN: "unknown (not provable from here)"}


def _short(task_id: str) -> str:
    return task_id[:8] + "…"


def run_of(view: View, parent_id: str) -> str:
    """The list's cell of a job that is a later run of another job: a link to that job."""
    return "run of " + link(view.href("/job", {"id": parent_id, "kind": "ledger"}),
                            _short(parent_id))


def owner(task: Task, state: JobState | None) -> str:
    """Whether a task's owner process lives: probed while the task runs, else whether one
    was recorded."""
    if state is not None and task.id in state.owners:
        return _LIVENESS[state.owners[task.id]]
    return "recorded" if task.has_owner else "none recorded"


def state_items(task: Task, state: JobState | None, now: float) -> str:
    """The job's owner (alive, dead, unknown) and its lost verdict (none, pending, published,
    with the time), as items of the fields' list."""
    verdict = "none (not closed as lost by an adapter's job)"
    if state is not None and state.verdict is not None:
        found = state.verdict
        if found.state == "published" and found.published_at is not None:
            verdict = (f"published {utc(found.published_at)} ({ago(found.published_at, now)})"
                       " to the framework")
        else:
            verdict = (f"pending since {utc(found.recorded_at)} ({ago(found.recorded_at, now)})"
                       ": no adapter of its framework has published it yet")
    rows = [("owner process", owner(task, state)), ("lost verdict", verdict)]
    return "".join(f"<dt>{esc(label)}</dt><dd>{esc(value)}</dd>" for label, value in rows)


def follows(view: View, job: Task, parent: Task | None, roles: Mapping[str, str]) -> str:
    """The notice of a job that is a later run of another: which, as a link."""
    if parent is None:
        return ""
    role = roles.get(job.id, CONTINUATION)
    return (f'<p class="notice" role="note">This job is the {esc(role)} of '
            f'{link(view.href("/job", {"id": parent.id, "kind": "ledger"}), parent.id)}'
            f" ({esc(parent.name or 'unnamed')}, {esc(parent.status.value)}).</p>")


def runs_table(view: View, runs: Sequence[Task], roles: Mapping[str, str]) -> str:
    """The later runs of a job (a resume, a recovery run), each a link, with its role."""
    out = ""
    if runs:
        rows = [[link(view.href("/job", {"id": run.id, "kind": "ledger"}), run.id, "id"),
                 esc(roles.get(run.id, CONTINUATION)), esc(run.name or "-"),
                 badge(run.status.value), esc(run.terminal_code or "-"),
                 esc(utc(run.created_at))] for run in runs]
        out += "<h2>Later runs of this job</h2>" + table(
            ["run", "role", "name", "state", "code", "created"], rows,
            raw=frozenset(range(6)))
    return out


__all__ = ["CONTINUATION", "RECOVERY", "follows", "owner", "run_of", "runs_table",
           "state_items"]
