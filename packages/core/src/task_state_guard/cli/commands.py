"""The ``task-state-guard`` / ``tsg`` command line.

Except for ``--help``, ``--version``, ``metrics`` and ``--format text`` (their text on stdout;
``metrics --textfile`` and ``--serve`` print JSON lines), every outcome is one compact,
key-sorted JSON line on stdout and nothing on stderr (``--progress`` adds progress lines on
stderr, only when asked). Durations take ``90``, ``90s``, ``15m``, ``2h``, ``1d``.
Exit codes: 0 success (healthy doctor), 1 unhealthy doctor, 2 input/storage/state error, 3
unexpected internal error (also when the output cannot be written: a closed or full stdout,
``--help`` and ``--version`` included).
Rejected values, paths and exception texts are never echoed: an error line is exactly the
specification's ``{"error":"<category>","ok":false}``, the category one of 0.1.0's
``InvalidInput``, ``TaskNotFound`` and ``StateConflict`` (a storage or identity problem,
``LedgerBusy`` included, is a ``StateConflict``; an unsafe location an ``InvalidInput``), or
``InternalError``. ``--explain`` (or ``TSG_EXPLAIN=1``; an invalid ``TSG_EXPLAIN`` is itself
refused, with the reason only when asked for) adds ``"reason"`` to a usage or storage
error: the rule it broke, from the closed vocabulary of :mod:`task_state_guard.reasons`; to an
``InternalError`` it adds ``"exception"``, the standard class of what was raised (the nearest
built-in or ``sqlite3`` class, never its text); ``--format text`` prints the category, the
reason, what failed and its fix as text.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .. import __version__
from .. import reasons as r
from ..durations import parse_count, parse_seconds
from ..ledger import Ledger
from ..model import (
    DELIVERY_CLOSED,
    TASK_STATES,
    TERMINAL_STATES,
    InvalidInput,
    LedgerError,
    canonical_id,
    check_code_shape,
    check_name,
    check_payload_hash,
    check_state,
    check_thread_id,
    error_category,
)
from ..ops.reconcile import ReconcilePolicy
from ..ops.status import format_text
from ..web.serve import DEFAULT_LISTEN, check_access_options, check_serve_options, run_serve
from . import operator_reads
from . import text as cli_text
from .metrics_command import check_metrics_dir, check_metrics_options, run_metrics
from .reason_help import describe

DEFAULT_ACTIVE_GRACE = 600.0
DEFAULT_DELIVERY_GRACE = 600.0


class _UsageError(InvalidInput):
    """A command line the parser refused (printed as ``InvalidInput`` with its reason)."""


def _usage_reason(message: str) -> str:
    """Classify argparse's message (never printed) into a fixed reason."""
    if "invalid choice" in message:
        return r.UNKNOWN_COMMAND if message.startswith("argument command:") else r.INVALID_VALUE
    if "the following arguments are required" in message:
        missing = message.partition(":")[2].split(",")
        return r.MISSING_COMMAND if "command" in (m.strip() for m in missing) else (
            r.MISSING_ARGUMENT)
    if "expected one argument" in message:
        return r.MISSING_VALUE
    if "unrecognized arguments" in message or "ambiguous option" in message:
        return r.UNKNOWN_OPTION
    return r.USAGE_ERROR


class _OutputFailed(Exception):
    """``--help`` or ``--version`` text could not be written to stdout (closed, full)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError("the command line was refused", reason=_usage_reason(message))

    def _print_message(self, message: str, file: Any = None) -> None:
        """``--help`` and ``--version`` text, written and flushed: an output that cannot take
        it is the contract's output failure (exit 3), not a silent success (argparse itself
        ignores write errors)."""
        if message and not _write(message):
            raise _OutputFailed


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; anything left over is an unknown option or an unexpected argument."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        unknown = any(token.startswith("-") and token != "-" for token in extra)
        raise _UsageError("the command line was refused",
                          reason=r.UNKNOWN_OPTION if unknown else r.UNEXPECTED_ARGUMENT)
    return args


def _seconds(value: str | None, env: str, default: float, what: str) -> float:
    text = value if value is not None else os.environ.get(env)
    if text is None:
        return default
    return parse_seconds(text, what)


def _positive_int(text: str | None, what: str) -> int | None:
    if text is None:
        return None
    return parse_count(text, what, minimum=1, maximum=10**9)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (exposed for documentation and tests)."""
    parser = _Parser(
        prog="task-state-guard",
        description="Embedded SQLite ledger that reconciles stale task and delivery state.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"task-state-guard {__version__}")
    parser.add_argument("--db", help="database path (default: $TSG_DB)")
    parser.add_argument("--allow-external-acl", action="store_true",
                        help="non-POSIX hosts: acknowledge an externally managed private ACL")
    parser.add_argument("--busy-timeout-ms", help="lock wait before LedgerBusy (default 5000)")
    parser.add_argument("--explain", action="store_true",
                        help="add the reason to an error line (also TSG_EXPLAIN=1)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("init", help="create (or migrate) the ledger")
    create = sub.add_parser("create", help="create a queued task")
    create.add_argument("--id", dest="task_id")
    create.add_argument("--parent")
    create.add_argument("--timeout-seconds", help="seconds, or a duration: 90s, 15m, 2h, 1d")
    create.add_argument("--internal", action="store_true", help="no direct delivery obligation")
    create.add_argument("--name", help="identifier label (framework task/actor/graph name)")
    create.add_argument("--payload-sha256", help="optional SHA-256 hex fingerprint")
    for name, text in (("start", "queued -> running"), ("heartbeat", "refresh a running task")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("task_id")
    for name, text in (("close", "close a task"), ("delivery", "close a task's delivery")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("task_id")
        cmd.add_argument("--status", required=True, help="the terminal (delivery) state")
        cmd.add_argument("--code")
    reconcile = sub.add_parser("reconcile", help="time out stale tasks, settle overdue deliveries")
    reconcile.add_argument("--active-grace-seconds", help=_DURATION)
    reconcile.add_argument("--delivery-grace-seconds", help=_DURATION)
    reconcile.add_argument("--dry-run", action="store_true")
    _add_progress(reconcile)
    _add_format(reconcile)
    _add_format(sub.add_parser("doctor", help="counts-only health check (exit 1 when unhealthy)"))
    for name in ("get", "children"):
        cmd = sub.add_parser(name, help=f"{name} by task id, or by a framework's job id")
        cmd.add_argument("task_id", nargs="?", help="the ledger id (or name the job below)")
        _add_job(cmd)
        cmd.add_argument("--extras", action="store_true",
                         help="add name, heartbeat_at, has_owner and framework_id to each task")
        if name == "get":
            cmd.add_argument("--events", action="store_true", help="add the task's event history")
        _add_format(cmd)
    tasks = sub.add_parser("tasks", help="list tasks (ids by state, or rows with --details)")
    tasks.add_argument("--status", help="a task state (rows: default queued and running)")
    tasks.add_argument("--name", help="only tasks with this name label")
    tasks.add_argument("--stale-seconds", help="only tasks idle this long (" + _DURATION + ")")
    tasks.add_argument("--older-than", help="only tasks created this long ago (" + _DURATION + ")")
    tasks.add_argument("--attempts", action="store_true",
                       help="rows: list attempts (child tasks) instead of logical tasks; "
                            "needs --details or --format text")
    tasks.add_argument("--contradicted", action="store_true",
                       help="rows: only jobs closed other than succeeded with an attempt that "
                            "succeeded after the close, in any state unless --status (with "
                            "--attempts: those attempts); needs --details or --format text")
    tasks.add_argument("--details", action="store_true",
                       help="one row per task instead of ids (implied by --format text)")
    tasks.add_argument("--thread", help="only the runs recorded with this LangGraph thread id, "
                                        "oldest first, in any state unless --status")
    tasks.add_argument("--limit", help="at most this many (rows: default 100)")
    _add_job(tasks, " (ids: it and its children; rows: it, or its --attempts; any state)")
    _add_format(tasks)
    status = sub.add_parser("status", help="counts by state, delivery state and name")
    status.add_argument("--format", choices=("json", "text"), default="json")
    status.add_argument("--active-grace-seconds", help=_DURATION)
    metrics = sub.add_parser("metrics", help="Prometheus text exposition of status")
    metrics.add_argument("--active-grace-seconds", help=_DURATION)
    metrics.add_argument("--textfile", help="replace this file atomically (node exporter)")
    metrics.add_argument("--serve", action="store_true", help="the same as tsg serve")
    _add_serve_options(metrics, "with --serve: ")
    _add_metrics_dir(metrics)
    serve = sub.add_parser("serve", help="read-only web view and GET /metrics over HTTP")
    serve.add_argument("--active-grace-seconds", help=_DURATION)
    _add_serve_options(serve, "")
    _add_metrics_dir(serve)
    prune = sub.add_parser("prune", help="delete closed task trees older than a cut-off")
    prune.add_argument("--older-than", required=True, help=_DURATION)
    prune.add_argument("--dry-run", action="store_true")
    _add_progress(prune)
    _add_format(prune)
    return parser


_DURATION = "seconds, or a duration: 90s, 15m, 2h, 1d"

#: ``--celery ID``, ``--dramatiq ID``, ``--langgraph ID``: a job by the id its framework gave
#: it (the framework names of ``task_state_guard.integration.ids.FRAMEWORKS``, imported only
#: when one is used).
JOB_OPTIONS = {
    "celery": "TASK_ID",
    "dramatiq": "MESSAGE_ID",
    "langgraph": "INVOCATION_ID",
}


def _add_job(cmd: argparse.ArgumentParser, scope: str = "") -> None:
    group = cmd.add_mutually_exclusive_group()
    for framework, metavar in JOB_OPTIONS.items():
        group.add_argument(f"--{framework}", metavar=metavar,
                           help=f"the job with this {framework} id{scope}")


def _add_serve_options(cmd: argparse.ArgumentParser, prefix: str) -> None:
    cmd.add_argument("--listen", help=f"{prefix}IP:PORT (default {DEFAULT_LISTEN})")
    cmd.add_argument("--token-file", help=f"{prefix}token file (or $TSG_SERVE_TOKEN; default: "
                                          "made beside the ledger on the first start)")
    cmd.add_argument("--no-token", action="store_true",
                     help=f"{prefix}no token, loopback only: every local user can read the view")
    cmd.add_argument("--public-metrics", action="store_true",
                     help=f"{prefix}answer GET /metrics without the token")
    cmd.add_argument("--session-lifetime", help=f"{prefix}sign-in sessions last T (default 12h)")
    cmd.add_argument("--behind-https-proxy", action="store_true",
                     help=f"{prefix}an HTTPS proxy is in front: Secure session cookies")
    cmd.add_argument("--refresh", help=f"{prefix}pages refresh every T (default 30s; 0: off)")


def _add_metrics_dir(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--metrics-dir",
                     help="add the adapters' counters summed over every process that counts "
                          "into this directory (default: $TSG_METRICS_DIR)")


def _metrics_dir(args: argparse.Namespace) -> str | None:
    """``--metrics-dir``, else ``$TSG_METRICS_DIR`` (unset or empty: none)."""
    given: str | None = args.metrics_dir
    return given if given is not None else (os.environ.get("TSG_METRICS_DIR") or None)


def _add_format(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--format", choices=("json", "text"), default="json",
                     help="json (default): one JSON line; text: for people")


def _add_progress(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--progress", action="store_true",
                     help="progress lines (done/total) on stderr while the pass runs")


_READ_ONLY = frozenset({"get", "children", "tasks", "status", "metrics", "serve", "doctor"})
# The commands that create a missing ledger: init; create (a new task needs one); reconcile,
# whose apply mode the specification keeps on the normal (creating, migrating) open, so that
# `tsg reconcile && exec worker` works on a fresh volume. Everything else names a task that
# must already exist, or changes existing history (prune): a mistyped --db is database_missing.
_CREATING = frozenset({"init", "create", "reconcile"})
_BY_ID = frozenset({"start", "heartbeat", "close", "delivery", "get", "children"})
# The writing commands that first run SQLite's quick_check and refuse a damaged file
# (database_damaged) before writing anything: init, and the operator's and bulk writes. The
# lifecycle commands of one existing task (start, heartbeat, close, delivery), run by job
# scripts as often as their jobs, change one row in place and are spared the full read.
_VERIFYING = frozenset({"init", "create", "reconcile", "prune"})


def _named_job(args: argparse.Namespace) -> tuple[str, str] | None:
    """The ``(framework, id)`` a ``--celery``/``--dramatiq``/``--langgraph`` option named."""
    named = [(f, getattr(args, f, None)) for f in JOB_OPTIONS]
    found = [(f, value) for f, value in named if value is not None]
    return found[0] if found else None


def _check_target(args: argparse.Namespace) -> None:
    """``get``/``children`` take a ledger id or a framework's job id: exactly one."""
    if args.command in ("get", "children"):
        named = _named_job(args) is not None
        if args.task_id is None and not named:
            raise _UsageError("name a task", reason=r.MISSING_ARGUMENT)
        if args.task_id is not None and named:
            raise _UsageError("a task id or a job id, not both", reason=r.UNEXPECTED_ARGUMENT)


def _check_ids(args: argparse.Namespace) -> None:
    """Reject malformed ids before the database is opened (whatever state it is in); turn a
    framework's job id into its ledger id (computed, so the typed id is never printed). The
    id ``get``/``children`` take without a framework option may be a ledger id or any
    framework's job id: it is looked up once the ledger is open."""
    job = _named_job(args) if args.command in ("get", "children", "tasks") else None
    if job is not None:
        from ..integration.ids import job_task_id

        args.task_id = job_task_id(*job)
        # ``get --langgraph ID``: a thread id too, when no invocation has that id.
        args.thread_of_job = job[1] if job[0] == "langgraph" and args.command == "get" else None
    elif args.command == "tasks":
        args.task_id = None
    if args.command in ("get", "children") and job is None:
        from ..integration.lookup import candidate_ids

        candidate_ids(args.task_id)  # a ledger id or any framework's job id, resolved once open
        args.any_id = True
    elif args.command in _BY_ID:
        canonical_id(args.task_id)
    elif args.command == "create":
        for value, what in ((args.task_id, "task id"), (args.parent, "parent id")):
            if value is not None:
                canonical_id(value, what)


def _open(args: argparse.Namespace) -> Ledger:
    path = args.db if args.db is not None else os.environ.get("TSG_DB")
    if not path:
        raise InvalidInput("no database: pass --db or set TSG_DB", reason=r.MISSING_DATABASE_PATH)
    try:
        busy = 5000 if args.busy_timeout_ms is None else parse_count(
            args.busy_timeout_ms, "busy timeout", minimum=1, maximum=600_000)
    except InvalidInput:
        raise InvalidInput("bad busy timeout", reason=r.INVALID_VALUE) from None
    read_only = args.command in _READ_ONLY or bool(getattr(args, "dry_run", False))
    return Ledger(
        path,
        busy_timeout_ms=busy,
        allow_external_acl=bool(args.allow_external_acl),
        read_only=read_only,
        # the read commands may use transient sidecars; a dry-run creates nothing at all
        transient_sidecars=args.command in _READ_ONLY,
        create=args.command in _CREATING,
        _check_schema=args.command != "doctor",
        _verify_integrity=args.command in _VERIFYING,
    )


def _check_values(args: argparse.Namespace) -> dict[str, Any]:
    """Parse and check every other value before the database is opened.

    A rejected value is an ``InvalidInput`` whatever the database's state (missing, busy,
    locked by a concurrent writer), and nothing is opened or created for it.
    """
    command = args.command
    values: dict[str, Any] = {}
    if command == "create":
        values["timeout"] = None if args.timeout_seconds is None else parse_seconds(
            args.timeout_seconds, "timeout_seconds", maximum=None)  # any finite, as in 0.1.0
        check_name(args.name)
        check_payload_hash(args.payload_sha256)
    elif command in ("close", "delivery"):
        allowed = TERMINAL_STATES if command == "close" else DELIVERY_CLOSED
        check_state(args.status, allowed, "status")
        check_code_shape(args.code)
    elif command == "tasks":
        values["rows"] = bool(args.details) or args.format == "text"
        for flag, given in (("--attempts", args.attempts), ("--contradicted", args.contradicted)):
            if given and not values["rows"]:
                raise InvalidInput(f"{flag} lists rows: add --details or --format text",
                                   reason=r.MISSING_ARGUMENT)
        if args.status is None and not values["rows"] and args.thread is None:
            raise InvalidInput("the id list needs --status", reason=r.MISSING_ARGUMENT)
        if args.thread is not None:
            check_thread_id(args.thread)
        if args.status is not None:
            check_state(args.status, TASK_STATES, "task status")
        check_name(args.name)
        values["stale"] = None if args.stale_seconds is None else _seconds(
            args.stale_seconds, "", 0.0, "stale_seconds")
        values["older"] = None if args.older_than is None else _seconds(
            args.older_than, "", 0.0, "older-than")
        values["limit"] = _positive_int(args.limit, "limit")
    elif command == "reconcile":
        values["policy"] = ReconcilePolicy(
            active_grace_seconds=_seconds(args.active_grace_seconds,
                                          "TSG_ACTIVE_GRACE_SECONDS",
                                          DEFAULT_ACTIVE_GRACE, "active grace"),
            delivery_grace_seconds=_seconds(args.delivery_grace_seconds,
                                            "TSG_DELIVERY_GRACE_SECONDS",
                                            DEFAULT_DELIVERY_GRACE, "delivery grace"),
        )
    elif command in ("status", "metrics", "serve"):
        values["grace"] = _seconds(args.active_grace_seconds, "TSG_ACTIVE_GRACE_SECONDS",
                                   DEFAULT_ACTIVE_GRACE, "active grace")
    if command == "metrics":
        values["metrics_dir"] = _metrics_dir(args)
        values.update(check_metrics_options(args.textfile, args.serve, args.listen,
                                            args.refresh, args.token_file,
                                            values["metrics_dir"]))
    elif command == "serve":
        values["metrics_dir"] = check_metrics_dir(_metrics_dir(args))
        values.update(check_serve_options(args.listen, args.refresh))
    if command == "serve" or (command == "metrics" and args.serve):
        values.update(check_access_options(args.no_token, args.public_metrics,
                                           args.session_lifetime, args.behind_https_proxy))
    elif command == "metrics" and (args.no_token or args.public_metrics or args.behind_https_proxy
                                   or args.session_lifetime is not None):
        raise InvalidInput("the access options need --serve")
    elif command == "prune":
        values["older"] = _seconds(args.older_than, "", 0.0, "older-than")
    return values


def _progress(args: argparse.Namespace, what: str) -> Callable[[int, int], None] | None:
    """The stderr progress printer when ``--progress`` was given (else nothing on stderr)."""
    if not args.progress:
        return None
    return cli_text.progress_printer(args.command, what, sys.stderr)


def _run(args: argparse.Namespace) -> tuple[dict[str, Any] | str, int]:
    command = args.command
    _check_target(args)
    try:
        _check_ids(args)
        values = _check_values(args)
    except InvalidInput as exc:  # a specific reason is kept; any other refusal is a value's
        raise InvalidInput("a value was refused", reason=exc.reason or r.INVALID_VALUE) from None
    if command == "serve" or (command == "metrics" and values["listen"] is not None):
        return run_serve(lambda: _open(args), values,
                         db=args.db if args.db is not None else os.environ.get("TSG_DB", ""),
                         token_file=args.token_file,
                         emit=_emit, categorize=error_category)
    if command == "metrics":
        return run_metrics(lambda: _open(args), values)
    ledger = _open(args)
    try:
        if command == "init":
            return {"ok": True, "storage": ledger.storage_info()}, 0
        if command == "create":
            task = ledger.create_task(
                task_id=args.task_id, parent_id=args.parent, timeout_seconds=values["timeout"],
                delivery_required=not args.internal, name=args.name,
                payload_hash=args.payload_sha256,
            )
        elif command == "start":
            task = ledger.start_task(args.task_id, owner=False)
        elif command == "heartbeat":
            task = ledger.heartbeat(args.task_id)
        elif command == "close":
            task = ledger.close_task(args.task_id, args.status, code=args.code)
        elif command == "delivery":
            task = ledger.set_delivery(args.task_id, args.status, code=args.code)
        elif command in ("get", "children", "tasks"):
            return operator_reads.run(ledger, args, values), 0
        elif command == "reconcile":
            report = ledger.reconcile(values["policy"], dry_run=bool(args.dry_run),
                                      progress=_progress(args, "open tasks examined"))
            if args.format == "text":
                return cli_text.reconcile(report), 0
            return {"ok": True, "reconcile": report}, 0
        elif command == "doctor":
            report = ledger.doctor()
            code = 0 if report["healthy"] else 1
            if args.format == "text":
                return cli_text.doctor(report), code
            return {"ok": report["healthy"], **report}, code
        elif command == "status":
            report = ledger.status(active_grace_seconds=values["grace"])
            if args.format == "text":
                return format_text(report) + "\n", 0
            return {"ok": True, "status": report}, 0
        elif command == "prune":
            report = ledger.prune(values["older"], dry_run=bool(args.dry_run),
                                  progress=_progress(args, "closed trees examined"))
            if args.format == "text":
                return cli_text.prune(report), 0
            return {"ok": True, "prune": report}, 0
        else:  # pragma: no cover - argparse restricts commands
            raise InvalidInput("unknown command")
        return {"ok": True, "task": task.to_dict()}, 0
    finally:
        ledger.close()


def error_payload(exc: LedgerError, *, explain: bool = False) -> dict[str, Any]:
    """The CLI's error line for ``exc``: exactly 0.1.0's ``{"error":..., "ok":false}``; with
    ``explain``, plus the reason when the error has one."""
    payload: dict[str, Any] = {"error": error_category(exc), "ok": False}
    if explain and exc.reason is not None:
        payload["reason"] = exc.reason
    return payload


def error_text(category: str, reason: str | None) -> str:
    """The ``--format text`` rendering of an error: its category, reason, what failed, fix."""
    lines = [f"error: {category}"]
    if reason is not None:
        what, fix = describe(reason)
        lines += [f"reason: {reason}: {what}", f"fix: {fix}"]
    return "\n".join(lines) + "\n"


_FLAG_TRUE = frozenset({"1", "true", "yes", "on"})
_FLAG_FALSE = frozenset({"", "0", "false", "no", "off"})


def _explain_from_environment() -> bool:
    """``TSG_EXPLAIN``: 1/true/yes/on adds reasons; unset, empty or 0/false/no/off does not."""
    value = os.environ.get("TSG_EXPLAIN", "").strip().lower()
    if value in _FLAG_TRUE:
        return True
    if value in _FLAG_FALSE:
        return False
    raise InvalidInput("TSG_EXPLAIN must be a boolean", reason=r.INVALID_VALUE)


def _requested_output(argv: Sequence[str]) -> tuple[bool, bool]:
    """``(--explain, --format text)`` as written, for a command line the parser refuses."""
    explain = text = False
    for index, token in enumerate(argv):
        if token == "--":
            break
        explain = explain or token == "--explain"
        text = text or token == "--format=text" or (
            token == "--format" and argv[index + 1 : index + 2] == ["text"])
    return explain, text


def _write(text: str) -> bool:
    """Write ``text`` to stdout; False when it cannot be written (closed, full, broken pipe)."""
    out = sys.stdout
    try:
        if out is None:
            return False
        out.write(text)
        out.flush()
        return True
    except (OSError, ValueError):
        _discard_stdout()
        return False


def _discard_stdout() -> None:
    """Point stdout's descriptor at the null device, so that what is still buffered is dropped
    quietly at exit instead of failing again (and printing a traceback)."""
    with contextlib.suppress(Exception):
        descriptor = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, descriptor)
        finally:
            os.close(null)


def _stdout_closed() -> bool:
    """True when the process was started with stdout closed (nothing could be reported)."""
    out = sys.stdout
    if out is None:
        return True
    try:
        os.fstat(out.fileno())
    except (io.UnsupportedOperation, AttributeError):
        return False  # replaced by an in-memory stream: usable
    except (OSError, ValueError):
        return True
    return False


def _render(payload: dict[str, Any] | str) -> str:
    if isinstance(payload, str):
        return payload
    return json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n"


def _emit(payload: dict[str, Any] | str) -> None:
    """Print ``payload``; raise ``OSError`` when stdout cannot take it."""
    if not _write(_render(payload)):
        raise OSError("stdout cannot be written")


def exception_class(exc: BaseException) -> str:
    """The standard class ``exc`` is (or derives from) for an ``InternalError`` line: the
    nearest built-in exception, or ``sqlite3.<class>``; never a class this process defined
    itself, whose name is not a closed set."""
    for cls in type(exc).__mro__:
        name: str = cls.__qualname__
        if cls.__module__ == "builtins" and getattr(builtins, name, None) is cls:
            return name
        if cls.__module__ == "sqlite3" and getattr(sqlite3, name, None) is cls:
            return f"sqlite3.{name}"
    return "BaseException"  # pragma: no cover - every exception derives from it


def _report(category: str, reason: str | None, *, explain: bool, text: bool, code: int,
            exception: str | None = None) -> int:
    if text:
        rendered = error_text(category, reason)
        if explain and exception is not None:
            rendered += f"exception: {exception}\n"
        written = _write(rendered)
    else:
        payload: dict[str, Any] = {"error": category, "ok": False}
        if explain and reason is not None:
            payload["reason"] = reason
        if explain and exception is not None:
            payload["exception"] = exception
        written = _write(_render(payload))
    return code if written else 3


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    explain, text = _requested_output(tokens)
    if _stdout_closed():
        return 3  # nothing could be reported: do nothing at all
    try:
        explain = _explain_from_environment() or explain
    except InvalidInput as exc:  # the reason only when the command line asked for one
        return _report("InvalidInput", exc.reason, explain=explain, text=text, code=2)
    parser = build_parser()
    try:
        args = _parse(parser, tokens)
        explain = explain or bool(args.explain)
        text = getattr(args, "format", "json") == "text"
        payload, code = _run(args)
    except LedgerError as exc:
        return _report(error_category(exc), exc.reason, explain=explain, text=text, code=2)
    except _OutputFailed:
        return 3  # --help or --version could not be written: nothing more can be reported
    except Exception as exc:
        return _report("InternalError", None, explain=explain, text=text, code=3,
                       exception=exception_class(exc))
    return code if _write(_render(payload)) else 3


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
