"""`tsg serve` in a real browser (headless Chromium over the DevTools protocol), against a
ledger that real Celery, Dramatiq and LangGraph work wrote, with a SIGKILLed worker's job.

The operator signs in as `tsg serve` tells them to: the address with the token it printed to
their terminal (the token made beside the ledger on the first start); at the end they sign
out. Each page is loaded, its visible text asserted, a screenshot taken into the test's
folder, and every request the browser made is checked to have gone to the server on
127.0.0.1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
from cdp_client import Chromium, Page
from core_helpers import run_cli
from ledger_backends import stored_state
from mixed_ledger import MixedLedger
from serve_helpers import Served


@pytest.fixture
def server(mixed_ledger: MixedLedger) -> Iterator[Served]:
    served = Served(mixed_ledger.db, "--listen", "127.0.0.1:0", "--refresh", "0", token=None,
                    tty=True)
    try:
        yield served
    finally:
        code, _out, err = served.stop()
        assert code == 0 and err == ""


def _only_local(page: Page, server: Served) -> None:
    """Every request of the page went to the server (nothing else, nothing off the host)."""
    assert page.requests
    for url in page.requests:
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.port) == ("http", "127.0.0.1",
                                                              server.port), url


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _value(text: str, label: str) -> str:
    """The figure shown next to ``label`` in a card (label and value: one line each, or one
    tab-separated line)."""
    lines = _lines(text)
    for index, line in enumerate(lines):
        if line == label:
            return lines[index + 1]
        if line.startswith(label + "\t"):
            return line.split("\t")[-1]
    raise AssertionError(f"{label!r} not on the page")


def test_every_page_against_real_framework_work(
    browser: Chromium, server: Served, mixed_ledger: MixedLedger, tmp_path: Path
) -> None:
    page = browser.page()
    before = stored_state(mixed_ledger.db)

    # Signed out, a page is the sign-in form and shows nothing of the ledger.
    page.goto(server.base + "/stuck")
    assert "needs the server's token" in page.text()
    assert mixed_ledger.celery_lost not in page.text()
    # The sign-in address tsg serve printed to the operator's terminal: signed in, on the
    # overview, the token no longer in the address bar.
    printed = server.terminal_line()
    assert printed.startswith(f"tsg serve: open {server.base}/login?token=")
    page.goto(printed.split()[-1])
    assert urlsplit(page.url()).path == "/" and "token" not in page.url()

    # Overview: the SIGKILLed worker's job is running with a dead owner (the job and its
    # attempt: both were owned by the killed process); aggregates, no ids.
    page.goto(server.base + "/")
    text = page.text()
    dead = json.loads(run_cli("--db", mixed_ledger.db, "status").stdout)["status"][
        "running_owner_dead"]
    assert dead == 2 and _value(text, "owner dead") == "2"
    for name in ("tsgt.ok", "tsgt.sleep", "ok", "agent_planner"):
        assert name in _lines(page.evaluate(
            "[...document.querySelectorAll('table td:first-child')].map(e=>e.innerText)"
            ".join('\\n')")), name
    assert page.evaluate("document.querySelectorAll('svg rect[fill=\"#1f8a4c\"]').length") >= 1
    for framework_id in (mixed_ledger.celery_ok, mixed_ledger.celery_lost,
                         mixed_ledger.dramatiq_ok, mixed_ledger.langgraph_ok,
                         mixed_ledger.celery_lost_ledger_id):
        assert framework_id not in text
    page.screenshot(tmp_path / "overview.png")

    # The "owner dead" count opens the list of those jobs: the SIGKILLed worker's.
    page.click('section.card a[href*="flag=owner_dead"]')
    text = page.text()
    assert mixed_ledger.celery_lost_ledger_id in text
    assert any(line.startswith("1 match (the overview counts jobs and attempts together")
               for line in _lines(text))  # the job here; with its attempt, the count's 2
    page.goto(server.base + "/")

    # Stuck work: the lost job is listed (running, its Celery id beside its ledger id).
    page.click('header nav a[href^="/stuck"]')
    text = page.text()
    assert mixed_ledger.celery_lost_ledger_id in text and mixed_ledger.celery_lost in text
    assert mixed_ledger.celery_ok not in text  # finished work is not stuck
    page.screenshot(tmp_path / "stuck.png")

    # The job: from the list; attempts and the timeline so far.
    page.click(f'a[href*="{mixed_ledger.celery_lost_ledger_id}"]')
    assert "running" in page.text()
    page.screenshot(tmp_path / "job-running.png")

    # Each framework's job by the id the operator pastes into the form.
    for pasted, name in ((mixed_ledger.dramatiq_ok, "ok"),
                         (mixed_ledger.langgraph_ok, "agent_planner"),
                         (mixed_ledger.celery_lost, "tsgt.sleep")):
        page.click('header nav a[href^="/job"]')
        page.type_into('input[name="id"]', pasted)
        page.click('main form button[type="submit"]')
        text = page.text()
        assert f"Job {name}" in text, text
        assert ("running" if name == "tsgt.sleep" else "succeeded") in text
    assert mixed_ledger.celery_lost_ledger_id in page.text()

    # An operator reconciles (the CLI, not the server): the lost job's verdict shows.
    assert run_cli("--db", mixed_ledger.db, "reconcile").code == 0
    page.goto(page.url())
    text = page.text()
    assert "owner_lost" in text and "timed_out" in text
    events = re.findall(r"^.*\b(job|attempt 1) (created|started|closed) →", text, re.M)
    assert events == [("job", "created"), ("job", "started"), ("attempt 1", "created"),
                      ("attempt 1", "started"), ("attempt 1", "closed"), ("job", "closed")]
    page.screenshot(tmp_path / "job.png")

    # The overview after the verdict: nothing runs with a dead owner any more, and the lost
    # job's verdict waits for a Celery worker to publish it (the only one was killed).
    page.goto(server.base + "/")
    text = page.text()
    assert _value(text, "owner dead") == "0"
    assert "owner_lost" in text
    verdicts = page.evaluate(
        "[...document.querySelectorAll('section.card')].find(s => /verdicts/i.test("
        "s.querySelector('h2').innerText)).querySelector('table').innerText")
    assert _lines(verdicts)[1:] == ["celery\t1\t0", "dramatiq\t0\t0", "langgraph\t0\t0"]
    page.screenshot(tmp_path / "overview-after.png")
    # Celery's waiting verdict opens the list of the jobs it is owed for.
    page.click('section.card a[href*="flag=verdict_pending"]')
    text = page.text()
    assert mixed_ledger.celery_lost_ledger_id in text and "1 match" in _lines(text)
    assert "framework=celery" in page.url()

    _only_local(page, server)
    # The page's own style and script ran under its Content-Security-Policy, and the browser
    # refused nothing.
    assert page.evaluate("getComputedStyle(document.querySelector('header'))"
                         ".backgroundColor") == "rgb(29, 35, 48)"
    assert not [line for line in page.log if "Content Security Policy" in line], page.log
    for shot in ("overview", "stuck", "job-running", "job"):
        assert (tmp_path / f"{shot}.png").read_bytes().startswith(b"\x89PNG")
    # The reconcile wrote; the pages read afterwards did not.
    after = stored_state(mixed_ledger.db)
    page.goto(server.base + "/stuck?status=timed_out")
    page.goto(server.base + f"/job?id={mixed_ledger.celery_lost_ledger_id}")
    assert stored_state(mixed_ledger.db) == after != before

    # Sign out: the session ends; the same browser sees the sign-in form again.
    page.click("header form.signout button")
    assert urlsplit(page.url()).path == "/login" and "Sign in" in page.text()
    page.goto(server.base + f"/job?id={mixed_ledger.celery_lost_ledger_id}")
    assert "needs the server's token" in page.text()
    assert mixed_ledger.celery_lost_ledger_id not in page.text()
    page.screenshot(tmp_path / "signed-out.png")


def test_pages_work_without_javascript_and_refresh_can_be_paused(
    browser: Chromium, mixed_ledger: MixedLedger, tmp_path: Path
) -> None:
    served = Served(mixed_ledger.db, "--listen", "127.0.0.1:0", "--refresh", "1")
    try:
        page = browser.page()
        page.scripts(False)
        assert served.token is not None
        page.goto(served.base + "/login?" + urlencode(
            {"token": served.token, "next": "/stuck?status=timed_out"}))
        assert "tsgt.sleep" in page.text() or "no tasks match" in page.text()
        page.settle(3.5)  # <noscript> refresh: the page reloads itself every second
        loads = [u for u in page.requests if urlsplit(u).path == "/stuck"]
        assert len(loads) >= 2
        page.click("header .refresh a")  # Pause: a plain link, no script needed
        assert "refresh=off" in page.url() and "Auto-refresh paused" in page.text()
        count = len(page.requests)
        page.settle(2.5)
        assert len(page.requests) == count  # paused: no reload
        page.click('header nav a[href^="/job"]')  # navigation keeps the pause
        assert "refresh=off" in page.url()
        page.screenshot(tmp_path / "no-javascript.png")

        # With JavaScript: the script refreshes (and counts down), but not while the operator
        # types.
        page.scripts(True)
        page.goto(served.base + "/stuck")
        page.settle(0.5)
        assert page.evaluate("document.getElementById('countdown') !== null")
        page.type_into('input[name="name"]', "tsgt")
        count = len(page.requests)
        page.settle(2.5)
        assert len(page.requests) == count
        page.evaluate("document.activeElement.blur()")
        page.settle(3.0)
        assert len(page.requests) > count
        _only_local(page, served)
        assert not [line for line in page.log if "Content Security Policy" in line], page.log
    finally:
        code, _out, err = served.stop()
    assert code == 0 and err == ""
