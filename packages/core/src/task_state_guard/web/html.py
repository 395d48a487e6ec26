"""HTML building blocks of the ``tsg serve`` pages: escaping, links, tables and the layout.

Every value is escaped where it is written into the page (:func:`esc`), whatever its source.
The layout carries the page's one stylesheet and one script, both with the response's nonce
(the Content-Security-Policy allows nothing else), and the auto-refresh: a small script when
JavaScript runs (it waits while the operator types), a ``<meta http-equiv="refresh">`` inside
``<noscript>`` when it does not. Pausing is a link (``refresh=off``) that every other link of
the page keeps, so it works without JavaScript too.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

from ..durations import humanize, utc


def esc(value: object) -> str:
    """``value`` as text safe inside an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def ago(at: float | None, now: float) -> str:
    """``5m ago`` (``in 5m`` for a time ahead of ``now``; ``-`` for none)."""
    if at is None:
        return "-"
    delta = now - at
    return f"{humanize(delta)} ago" if delta >= 0 else f"in {humanize(-delta)}"


@dataclass(frozen=True, slots=True)
class View:
    """What every page of one request shares: the nonce, the refresh interval (0: off),
    whether the operator paused it, and whether it shows a "Sign out" button (signed in with
    a session)."""

    nonce: str
    refresh_seconds: int
    paused: bool
    sign_out: bool = False

    def href(self, path: str, params: Mapping[str, object] | None = None) -> str:
        """A link to ``path`` with ``params`` (empty values left out), keeping the pause."""
        query = {k: str(v) for k, v in (params or {}).items() if v not in (None, "", False)}
        if self.paused:
            query["refresh"] = "off"
        return path + ("?" + urlencode(query) if query else "")


def link(href: str, text: str, cls: str = "") -> str:
    """An anchor (``href`` must already be a safe local URL built by :meth:`View.href`)."""
    klass = f' class="{esc(cls)}"' if cls else ""
    return f'<a href="{esc(href)}"{klass}>{esc(text)}</a>'


_NUM = ' class="num"'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: frozenset[int] = frozenset(),
    raw: frozenset[int] = frozenset(),
    cls: str = "",
    empty: str = "nothing to show",
    header_html: Sequence[str] | None = None,
) -> str:
    """A table; cells are escaped unless their column is in ``raw`` (already HTML)."""
    klass = f' class="{esc(cls)}"' if cls else ""
    heads = header_html if header_html is not None else [esc(h) for h in headers]
    head = "".join(
        f'<th scope="col"{_NUM if i in numeric else ""}>{h}</th>' for i, h in enumerate(heads)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td{_NUM if i in numeric else ""}>{c if i in raw else esc(c)}</td>'
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="empty">{esc(empty)}</td></tr>')
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def badge(state: str) -> str:
    """A task or delivery state, coloured by what it means."""
    return f'<span class="st st-{esc(state)}">{esc(state)}</span>'


NAV = (("/", "Overview"), ("/stuck", "Stuck work"), ("/job", "Find a job"))

_CSS = """
:root{--fg:#1d2330;--muted:#5d6675;--line:#dde1e8;--bg:#f6f7f9;--card:#fff;--accent:#2456c5;
--ok:#1f8a4c;--bad:#c0392b;--warn:#b7650b;--lost:#7d3cb5;--idle:#6b7280}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg)}
header{display:flex;flex-wrap:wrap;align-items:center;gap:8px 24px;padding:10px 24px;
background:#1d2330;color:#fff}
header .brand{font-weight:600;letter-spacing:.2px}
header nav a{color:#c9d4ea;text-decoration:none;margin-right:16px}
header nav a.here{color:#fff;border-bottom:2px solid #7fa6ff}
header .refresh{margin-left:auto;color:#c9d4ea;font-size:13px}
header .refresh a{color:#fff}
header form.signout{margin:0}
header form.signout button{padding:2px 8px;font-size:13px}
main{padding:16px 24px 40px;max-width:1280px}
h1{font-size:20px;margin:4px 0 12px}
h2{font-size:15px;margin:22px 0 8px}
.muted{color:var(--muted)}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.card h2{margin:0 0 6px;font-size:13px;text-transform:uppercase;letter-spacing:.4px;
color:var(--muted)}
.card dl{margin:0;display:grid;grid-template-columns:1fr auto;gap:2px 12px}
.card dd{margin:0;text-align:right;font-variant-numeric:tabular-nums;font-weight:600}
.card dd.alert,.card .alert{color:var(--bad);font-weight:600}
table{border-collapse:collapse;background:var(--card);border:1px solid var(--line);
font-variant-numeric:tabular-nums}
th,td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap}
th{background:#eef1f5;font-weight:600;font-size:13px}
th a{color:inherit}
td.num,th.num{text-align:right}
td.empty{color:var(--muted);font-style:italic}
td code,dd code{font-size:12.5px}
.st{padding:1px 7px;border-radius:10px;font-size:12.5px;background:#e8ebf0}
.st-succeeded,.st-delivered{background:#dcf3e5;color:#14613a}
.st-failed{background:#fbe1de;color:#8f2418}
.st-timed_out{background:#efe3fa;color:#5b2590}
.st-running{background:#e0eaff;color:#1d44a0}
.st-queued,.st-pending{background:#fff0d9;color:#8a4b06}
form.filters{display:flex;flex-wrap:wrap;gap:10px 16px;align-items:end;margin:0 0 12px}
form label{display:flex;flex-direction:column;font-size:12.5px;color:var(--muted)}
input,select,button{font:inherit;padding:4px 6px}
.pager{margin:10px 0;display:flex;gap:16px}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
table.mini{border:0;margin:0 0 6px;width:100%}
table.mini th{background:none;padding:2px 0;color:var(--muted);font-weight:400}
table.mini td{padding:2px 0;border:0}
.job dl{grid-template-columns:max-content 1fr;gap:3px 24px}
.job dd{text-align:left;font-weight:400}
.error{background:#fbe1de;border:1px solid #e8b4ad;padding:8px 12px;border-radius:6px}
.notice{background:#fff0d9;border:1px solid #ecc98f;padding:8px 12px;border-radius:6px}
.chart{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px}
.legend{display:flex;gap:14px;font-size:12.5px;margin:4px 0 0 8px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
.c-succeeded{background:var(--ok)}.c-failed{background:var(--bad)}.c-lost{background:var(--lost)}
.c-timed_out{background:var(--warn)}.c-cancelled{background:var(--idle)}
ol.timeline{list-style:none;margin:0;padding:0 0 0 14px;border-left:2px solid var(--line)}
ol.timeline li{position:relative;padding:4px 0 8px 10px}
ol.timeline li::before{content:"";position:absolute;left:-21px;top:9px;width:10px;height:10px;
border-radius:50%;background:var(--accent)}
ol.timeline li.ev-closed::before{background:var(--bad)}
ol.timeline li.ev-closed.ok::before{background:var(--ok)}
ol.timeline li.ev-delivery::before{background:var(--idle)}
ol.timeline .when{color:var(--muted);font-variant-numeric:tabular-nums;margin-right:8px}
"""

# Auto-refresh while JavaScript runs: count down, wait while a form field has the focus.
_SCRIPT = """
(function(){var b=document.body,s=+b.dataset.refresh,l=document.getElementById('countdown');
if(!s)return;var left=s;setInterval(function(){var a=document.activeElement;
if(a&&/^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)){left=s;}else{left-=1;}
if(l)l.textContent=left>0?' in '+left+' s':'';if(left<=0)location.reload();},1000);})();
"""


_SIGN_OUT = ('<form class="signout" method="post" action="/logout">'
             '<button type="submit">Sign out</button></form>')


def _refresh_bar(view: View, here: str, params: Mapping[str, object]) -> str:
    if view.refresh_seconds <= 0:
        return '<span class="refresh">Auto-refresh off</span>'
    query = {k: str(v) for k, v in params.items() if v not in (None, "", False)}
    if view.paused:
        resume = here + ("?" + urlencode(query) if query else "")
        return f'<span class="refresh">Auto-refresh paused · {link(resume, "Resume")}</span>'
    pause = here + "?" + urlencode({**query, "refresh": "off"})
    return (f'<span class="refresh">Auto-refresh every {view.refresh_seconds} s'
            f'<span id="countdown"></span> · {link(pause, "Pause")}</span>')


def page(
    view: View,
    title: str,
    body: str,
    *,
    here: str,
    params: Mapping[str, object] | None = None,
    now: float | None = None,
) -> bytes:
    """A whole page: the header (navigation, refresh control), ``body`` and the as-of time."""
    live = view.refresh_seconds > 0 and not view.paused
    meta = (f'<noscript><meta http-equiv="refresh" content="{view.refresh_seconds}">'
            "</noscript>") if live else ""
    nav = "".join(
        link(view.href(path), text, "here" if path == here else "") for path, text in NAV
    )
    as_of = f'<p class="muted">Read at {esc(utc(now))} · read-only view</p>' if now else ""
    text = (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{esc(title)} · TaskStateGuard</title>{meta}"
        '<link rel="icon" href="data:,">'
        f'<style nonce="{esc(view.nonce)}">{_CSS}</style></head>'
        f'<body data-refresh="{view.refresh_seconds if live else 0}">'
        f'<header><span class="brand">TaskStateGuard</span><nav>{nav}</nav>'
        f"{_refresh_bar(view, here, params or {})}{_SIGN_OUT if view.sign_out else ''}"
        "</header>"
        f"<main><h1>{esc(title)}</h1>{body}{as_of}</main>"
        f'<script nonce="{esc(view.nonce)}">{_SCRIPT}</script>'
        "</body></html>\n"
    )
    return text.encode("utf-8")


__all__ = ["NAV", "View", "ago", "badge", "esc", "link", "page", "table"]
