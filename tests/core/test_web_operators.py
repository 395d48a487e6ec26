"""What operators use next to Flower and rq-dashboard, in the web view's WSGI application
called in-process on both backends: the overview's counts link to their lists; lists filter
by reason code, framework, a name search and those counts, and say how many rows match; the
job page shows the lost verdict and whether the owner lives; pausing keeps the page; a
LangGraph recovery run links to the run it recovers and node attempts show their node."""

from __future__ import annotations

import html
import io
import re
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from core_helpers import Clock
from task_state_guard import Ledger
from task_state_guard.integration.ids import LANGGRAPH, langgraph_recovery_id
from task_state_guard.web import make_wsgi_app

IDS = re.compile(r'href="/job\?id=([0-9a-f-]{36})&amp;kind=ledger[^"]*" class="id"')


def _get(app: Any, path: str) -> tuple[int, str]:
    """GET ``path`` (with its query) from the WSGI app: the status and the page."""
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer["status"] = int(status.split()[0])
        return lambda data: None

    route, _, query = path.partition("?")
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": route, "QUERY_STRING": query,
               "HTTP_HOST": "localhost", "wsgi.input": io.BytesIO(b"")}
    body = b"".join(app(environ, start_response)).decode("utf-8")
    return answer["status"], body


def _listed(app: Any, path: str) -> list[str]:
    status, body = _get(app, path)
    assert status == 200, (path, body[-400:])
    return IDS.findall(body)


def _href(body: str, pattern: str) -> str:
    found = re.search(r'href="(' + pattern + r')"', body)
    assert found is not None, pattern
    return html.unescape(found.group(1))


def _link_to(body: str, text: str) -> str:
    """The target of the link whose text is ``text``."""
    found = re.search(r'href="([^"]+)"[^>]*>' + re.escape(text) + "</a>", body)
    assert found is not None, text
    return html.unescape(found.group(1))


_DEAD_OWNER = """
import sys
from task_state_guard import Ledger
with Ledger(sys.argv[1]) as led:
    task = led.create_task(name="app.orphan")
    led.start_task(task.id)  # owned by this process, which then ends without closing it
    print(task.id)
"""


def _owned_by_a_dead_process(db: str) -> str:
    done = subprocess.run([sys.executable, "-c", _DEAD_OWNER, db], capture_output=True,
                          text=True, timeout=120, check=True)
    task_id = done.stdout.strip()
    with Ledger(db) as led:  # PostgreSQL ends a finished client's session within moments
        deadline = time.monotonic() + 20
        while led.status()["running_owner_dead"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert led.status()["running_owner_dead"] == 1
    return task_id


def _lost(led: Ledger, name: str, framework: str | None = "celery") -> str:
    job = led.create_task(name=name, framework=framework)
    led.start_task(job.id, owner=False)
    led.close_task(job.id, "timed_out", code="owner_lost")
    return job.id


def test_the_overview_counts_link_to_their_lists(db: str) -> None:
    clock = Clock(time.time() - 3600)
    with Ledger(db, clock=clock) as led:
        late = led.create_task(name="app.late", timeout_seconds=60)
        led.start_task(late.id, owner=False)  # its deadline passed 59 minutes ago
        fresh = led.create_task(name="app.fresh")
        led.start_task(fresh.id, owner=False)
        owed = led.create_task(name="app.owed")
        led.start_task(owed.id, owner=False)
        led.close_task(owed.id, "succeeded", code="worker_completed")  # result not delivered
        waiting = _lost(led, "app.waiting", "dramatiq")
        published = _lost(led, "app.told", "dramatiq")
        led.mark_verdicts_published([published])
    dead = _owned_by_a_dead_process(db)
    app = make_wsgi_app(db, no_token=True, refresh_seconds=0)
    status, overview = _get(app, "/")
    assert status == 200
    expected = {
        r"/stuck\?flag=past_deadline": [late.id],
        r"/stuck\?status=running&amp;idle=600": [late.id, fresh.id],  # heartbeat stale
        r"/stuck\?flag=owner_dead": [dead],
        r"/stuck\?flag=awaiting_delivery": [owed.id, waiting, published],
        r"/stuck\?flag=verdict_pending&amp;framework=dramatiq": [waiting],
        r"/stuck\?flag=verdict_published&amp;framework=dramatiq": [published],
    }
    for pattern, ids in expected.items():
        target = _href(overview, pattern)
        assert _listed(app, target) == ids, pattern
        count = re.search(r'href="' + pattern + r'"[^>]*>(\d+)</a>', overview)
        assert count is not None and int(count.group(1)) == len(ids), pattern


def test_lists_filter_by_code_framework_and_name_and_say_how_many_match(db: str) -> None:
    hostile = "<script>alert_1_</script>"
    with Ledger(db) as led:
        celery = [_lost(led, "app.sync_orders") for _ in range(2)]
        dramatiq = _lost(led, "app.sync_users", "dramatiq")
        failed = led.create_task(name=hostile, framework="celery")
        led.start_task(failed.id, owner=False)
        led.close_task(failed.id, "failed", code="worker_failed")
        queued = led.create_task(name="app.sync_later")
    app = make_wsgi_app(db, no_token=True, refresh_seconds=0)

    def page(**params: str) -> tuple[list[str], str]:
        status, body = _get(app, "/stuck?" + urlencode(params))
        assert status == 200, params
        return IDS.findall(body), body

    ids, body = page(code="owner_lost")  # a reason code: in any state
    assert ids == [*celery, dramatiq] and "3 matches" in body
    assert page(code="owner_lost", framework="dramatiq")[0] == [dramatiq]
    assert page(framework="celery", status="timed_out")[0] == celery
    assert page(q="sync_")[0] == [queued.id]  # open work by default
    ids, body = page(q="sync_", code="owner_lost", per="25")
    assert ids == [*celery, dramatiq] and "3 matches" in body
    assert page(q="orders", code="owner_lost")[0] == celery
    assert page(q="nothing.like.it", code="owner_lost")[1].count("0 matches") == 1
    ids, body = page(q="<script>", status="failed")
    assert ids == [failed.id] and "1 match<" in body
    assert "<script>" not in body and "&lt;script&gt;alert_1_&lt;/script&gt;" in body
    status, body = _get(app, f"/job?id={failed.id}")
    assert status == 200 and "<script>" not in body and "Job &lt;script&gt;alert_1_" in body
    # every refused value: 400 with a fixed text, never the value
    for params, text in (({"code": "bogus<b>"}, "Unknown reason code."),
                         ({"framework": "rq<b>"}, "The framework is one of"),
                         ({"q": "two words<b>"}, "A name search is up to 200"),
                         ({"q": "x" * 201}, "A name search is up to 200"),
                         ({"flag": "everything<b>"}, "Unknown flag.")):
        status, body = _get(app, "/stuck?" + urlencode(params))
        assert status == 400 and text in body, params
        assert "<b>" not in body and "x" * 201 not in body and "bogus" not in body


def test_a_total_past_the_cap_is_shown_as_capped(db: str) -> None:
    with Ledger(db) as led, led.atomic():
        for _ in range(10_001):
            led.create_task(name="app.bulk")
    app = make_wsgi_app(db, no_token=True, refresh_seconds=0)
    status, body = _get(app, "/stuck?per=25")
    assert status == 200 and "10,000+ matches" in body and len(IDS.findall(body)) == 25
    status, body = _get(app, "/stuck?q=nothing")
    assert status == 200 and "0 matches" in body


def test_the_job_page_shows_the_verdict_and_whether_the_owner_lives(db: str) -> None:
    with Ledger(db) as led:
        pending = _lost(led, "app.lost")
        published = _lost(led, "app.told")
        led.mark_verdicts_published([published])
        unowned = led.create_task(name="app.nobody")
        led.start_task(unowned.id, owner=False)
        alive = led.create_task(name="app.here")
        led.start_task(alive.id)  # owned by this test process, alive
        attempt = led.create_task(parent_id=alive.id, delivery_required=False, name="app.here")
        led.start_task(attempt.id)
        dead = _owned_by_a_dead_process(db)
        app = make_wsgi_app(db, no_token=True, refresh_seconds=0)

        def fields(task_id: str) -> str:
            status, body = _get(app, f"/job?id={task_id}")
            assert status == 200
            return body

        assert re.search(r"<dt>lost verdict</dt><dd>pending since [^<]*: no adapter",
                         fields(pending))
        assert re.search(r"<dt>lost verdict</dt><dd>published [^<]* to the framework",
                         fields(published))
        assert "<dt>lost verdict</dt><dd>none" in fields(unowned.id)
        assert "<dt>owner process</dt><dd>none recorded" in fields(unowned.id)
        page = fields(alive.id)
        assert "<dt>owner process</dt><dd>alive" in page
        row = [r for r in re.findall(r"<tr>.*?</tr>", page) if attempt.id in r]
        assert len(row) == 1 and "<td>alive</td>" in row[0]
        assert "<dt>owner process</dt><dd>dead" in fields(dead)


def test_pausing_page_two_keeps_the_page_and_the_filters(db: str) -> None:
    with Ledger(db) as led, led.atomic():
        made = [led.create_task(name=f"app.page{n % 2}").id for n in range(60)]
    app = make_wsgi_app(db, no_token=True, refresh_seconds=30)
    first = _get(app, "/stuck?per=25&q=page1")[1]
    assert IDS.findall(first) == made[1::2][:25]
    second = _get(app, _link_to(first, "Next \u203a"))[1]
    assert IDS.findall(second) == made[1::2][25:]
    pause = _link_to(second, "Pause")
    assert "after=" in pause and "q=page1" in pause and "refresh=off" in pause
    paused = _get(app, pause)[1]
    assert IDS.findall(paused) == made[1::2][25:] and "Auto-refresh paused" in paused
    resume = _link_to(paused, "Resume")
    assert "after=" in resume and "q=page1" in resume and "refresh=off" not in resume
    back = _get(app, _link_to(second, "\u2039 Previous"))[1]
    pause = _link_to(back, "Pause")
    assert "before=" in pause and IDS.findall(_get(app, pause)[1]) == made[1::2][:25]


def test_a_recovery_run_links_to_the_run_it_recovers_and_attempts_show_their_node(
        db: str) -> None:
    """The shape the LangGraph adapter records: an invocation with node attempts, lost, then
    a recovery run (a child that owes its own delivery, its id derived from the lost run's)
    with node attempts of its own, and a later continuation."""
    with Ledger(db) as led:
        lost = led.create_task(name="agent", framework="langgraph")
        led.start_task(lost.id, owner=False)
        for node in ("plan", "search"):
            step = led.create_task(parent_id=lost.id, delivery_required=False, name=node)
            led.start_task(step.id, owner=False)
            if node == "plan":
                led.close_task(step.id, "succeeded", code="worker_completed")
        led.close_task(step.id, "timed_out", code="owner_lost")
        led.close_task(lost.id, "timed_out", code="owner_lost")
        recovery_id = LANGGRAPH.logical_task_id(langgraph_recovery_id(lost.id))
        recovery = led.create_task(task_id=recovery_id, parent_id=lost.id, name="agent")
        led.start_task(recovery.id, owner=False)
        resumed = led.create_task(parent_id=recovery.id, delivery_required=False,
                                  name="search")
        led.start_task(resumed.id, owner=False)
        later = led.create_task(parent_id=lost.id, name="agent")
    app = make_wsgi_app(db, no_token=True, refresh_seconds=0)
    status, page = _get(app, f"/job?id={lost.id}")
    assert status == 200
    attempts = page[page.index("<h2>Attempts</h2>"):page.index("<h2>Timeline</h2>")]
    assert re.findall(r"<tr><td class=\"num\">(\d+)</td><td><code>[^<]+</code></td><td>(\w+)",
                      attempts) == [("1", "plan"), ("2", "search")]  # no "attempt #3"
    runs = page[page.index("Later runs of this job"):page.index("<h2>Attempts</h2>")]
    assert IDS.findall(runs) == [recovery.id, later.id]
    assert "recovery run" in runs and "continuation" in runs
    # the recovery run's own page: its node attempt, and a link back to the run it recovers
    status, page = _get(app, f"/job?id={resumed.id}")
    assert status == 200 and "This job is the recovery run of" in page
    assert f'href="/job?id={lost.id}&amp;kind=ledger"' in page
    assert "<td>search</td>" in page and resumed.id in page
    # in the list, a later run says which run it follows
    listed = _get(app, "/stuck")[1]
    row = [r for r in re.findall(r"<tr>.*?</tr>", listed) if recovery.id in r]
    assert len(row) == 1 and f'run of <a href="/job?id={lost.id}&amp;kind=ledger"' in row[0]


@pytest.mark.parametrize("flag", ["verdict_pending", "verdict_published"])
def test_a_verdict_flag_lists_only_jobs_in_that_state(db: str, flag: str) -> None:
    with Ledger(db) as led:
        lost = [_lost(led, f"app.v{n}") for n in range(3)]
        led.mark_verdicts_published(lost[1:2])
        _lost(led, "app.unframed", None)  # closed lost without an adapter: owes no verdict
    app = make_wsgi_app(db, no_token=True, refresh_seconds=0)
    wanted = [lost[1]] if flag == "verdict_published" else [lost[0], lost[2]]
    assert _listed(app, f"/stuck?flag={flag}") == wanted
    assert _listed(app, f"/stuck?flag={flag}&framework=dramatiq") == []
