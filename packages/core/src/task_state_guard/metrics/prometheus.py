"""Prometheus text exposition of a status report, and its atomic textfile writer. No ids.

The format is Prometheus' text exposition format 0.0.4: one ``# HELP`` and one ``# TYPE`` line
per family, then its samples. Every family and label is listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable
from typing import Any

from .. import reasons
from ..model import InvalidInput, StorageError
from ..sqlite import links
from ..store import backends

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXTFILE_MODE = 0o644  # a new textfile: readable by the node exporter's user; no ids in it

Sample = tuple[dict[str, str], float | int]


def escape_label(value: str) -> str:
    """A label value escaped for the text format (backslash, double quote, line feed)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exposition:
    """Collects metric families and renders them in the text format."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self.samples = 0

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        """Add one family (``kind``: ``gauge`` or ``counter``) with its samples."""
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{key}="{escape_label(val)}"' for key, val in labels.items())
            self._lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")
            self.samples += 1

    def render(self) -> str:
        """The exposition, ending in a line feed."""
        return "\n".join(self._lines) + "\n"


def format_prometheus(report: dict[str, Any]) -> str:
    """Render a status report (``Ledger.status()``) in the text exposition format."""
    out = Exposition()
    out.family(
        "tsg_tasks", "gauge",
        "Tasks in the ledger by kind (task: logical task, attempt: its execution attempts) "
        "and task state.",
        [({"kind": kind, "status": state}, count)
         for kind, states in report["tasks_by_kind"].items() for state, count in states.items()],
    )
    out.family(
        "tsg_deliveries", "gauge",
        "Tasks in the ledger by delivery obligation (owed: a recipient is owed the result, "
        "internal: nobody is) and delivery state.",
        [({"delivery_status": state, "kind": kind}, count)
         for kind, states in report["deliveries_by_kind"].items()
         for state, count in states.items()],
    )
    out.family(
        "tsg_deliveries_awaiting", "gauge",
        "Closed tasks whose delivery is still pending, by obligation (owed: the result is ready "
        "and not yet delivered; internal: a record nobody closed, settled by reconcile).",
        [({"kind": kind}, count) for kind, count in report["deliveries_awaiting"].items()],
    )
    out.family(
        "tsg_tasks_by_name", "gauge", "Tasks by kind, name label and task state.",
        [({"kind": kind, "name": name, "status": state}, count)
         for kind, key in (("task", "by_name"), ("attempt", "attempts_by_name"))
         for name, states in report[key].items() for state, count in states.items()],
    )
    out.family(
        "tsg_outcomes_total", "counter",
        "Task closes since the ledger was created, by kind, terminal state and reason code "
        "(never lowered by prune).",
        [({"code": code, "kind": kind, "status": state}, total)
         for kind, states in report["outcomes_total"].items()
         for state, codes in states.items() for code, total in codes.items()],
    )
    out.family(
        "tsg_delivery_outcomes_total", "counter",
        "Delivery closes since the ledger was created, by obligation, delivery state and reason "
        "code (never lowered by prune).",
        [({"code": code, "delivery_status": state, "kind": kind}, total)
         for kind, states in report["delivery_outcomes_total"].items()
         for state, codes in states.items() for code, total in codes.items()],
    )
    out.family(
        "tsg_verdicts", "gauge",
        "Lost-job verdicts in the ledger's outbox by framework and state (pending: no adapter "
        "of that framework has published it yet; published: kept until prune).",
        [({"framework": framework, "status": state}, count)
         for state, by_framework in report["verdicts"].items()
         for framework, count in by_framework.items()],
    )
    for key, name, text in (
        ("oldest_pending_verdict_age_seconds", "tsg_oldest_pending_verdict_age_seconds",
         "Time since the oldest pending lost-job verdict was recorded (0 when none)."),
        ("oldest_queued_age_seconds", "tsg_oldest_queued_age_seconds",
         "Age of the oldest queued task (0 when none)."),
        ("oldest_running_age_seconds", "tsg_oldest_running_age_seconds",
         "Time since the oldest running task started (0 when none)."),
        ("oldest_owed_delivery_age_seconds", "tsg_oldest_owed_delivery_age_seconds",
         "Time since the oldest closed task that owes a delivery closed (0 when none)."),
    ):
        out.family(name, "gauge", text, [({}, report[key] or 0)])
    for key, text in (
        ("running_past_deadline", "Running tasks past their deadline."),
        ("running_heartbeat_stale", "Running tasks without a heartbeat for the active grace."),
        ("running_owner_dead", "Running tasks whose owning process is provably dead."),
    ):
        out.family(f"tsg_{key}", "gauge", text, [({}, report[key])])
    out.family("tsg_active_grace_seconds", "gauge",
               "The active grace the heartbeat-stale count was taken with.",
               [({}, report["active_grace_seconds"])])
    return out.render()


def format_server_counters(counts: dict[str, int]) -> str:
    """The ``tsg serve`` process's own counter: connections that ended without a normal
    response, by reason (``reset``, ``timeout``, ``overload``, ``malformed``, ``internal``)."""
    out = Exposition()
    out.family(
        "tsg_serve_connections_dropped_total", "counter",
        "Connections to this tsg serve process that ended without a normal response, by reason "
        "(since the process started).",
        [({"reason": reason}, count) for reason, count in counts.items()],
    )
    return out.render()


# ----------------------------------------------------------------------------- textfile


#: The node exporter's textfile collector reads only files of this suffix.
TEXTFILE_SUFFIX = ".prom"
#: How every exposition this module renders begins: the mark of a previous textfile of ours.
_OURS = b"# HELP tsg_"
_LEDGER_FILES = ("", "-wal", "-shm", "-journal", "-owners")


def check_textfile(path: object) -> str:
    """Check a ``--textfile`` target before anything is read: a ``*.prom`` file name (the
    collector's convention) in an existing directory. Errors never name the path."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidInput("the textfile path must be a non-empty path")
    directory, base = os.path.split(os.path.abspath(path))
    if not base.endswith(TEXTFILE_SUFFIX) or base == TEXTFILE_SUFFIX:
        raise InvalidInput(
            "the textfile must be a *.prom file", reason=reasons.TEXTFILE_NAME_INVALID
        )
    if not os.path.isdir(directory):
        raise InvalidInput("the textfile's directory does not exist")
    return path


def resolve_target(path: str) -> str:
    """The textfile's path with its directory's symbolic links resolved, each judged as the
    ledger's own path is (``symlink_in_sticky_directory``: another user's link in ``/tmp``)."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(links.resolve_protected(directory), base)


def check_target(path: str, ledger_path: str | None) -> None:
    """Refuse to replace anything but a previous textfile of ours (or nothing): the ledger, its
    sidecars and owner lock directory (``textfile_is_ledger``), and any existing entry that is
    not a regular file beginning as this module's expositions do (``textfile_not_ours``)."""
    directory, base = os.path.split(os.path.abspath(path))
    real = os.path.join(os.path.realpath(directory), base)
    if ledger_path is not None and not backends.is_url(ledger_path):
        ledger = os.path.realpath(ledger_path)
        if real in {ledger + suffix for suffix in _LEDGER_FILES} or os.path.dirname(
            real
        ) == ledger + "-owners":
            raise InvalidInput(
                "the textfile would replace the ledger", reason=reasons.TEXTFILE_IS_LEDGER
            )
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(real, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return  # a new textfile
    except OSError:  # a symbolic link, or nothing this user may read: not ours to replace
        if os.path.lexists(real):
            raise StorageError(
                "the textfile is not a previous textfile", reason=reasons.TEXTFILE_NOT_OURS
            ) from None
        return
    try:
        st = os.fstat(fd)
        head = os.read(fd, len(_OURS)) if stat.S_ISREG(st.st_mode) else b""
    except OSError:
        head = b""
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or head != _OURS:
        raise StorageError(
            "the textfile is not a previous textfile", reason=reasons.TEXTFILE_NOT_OURS
        )


def write_textfile(path: str, text: str, *, ledger_path: str | None = None) -> int:
    """Replace ``path`` with ``text`` atomically (node exporter's textfile convention).

    ``path`` must be a ``*.prom`` name; an existing file there must be a previous textfile of
    ours (never the ledger at ``ledger_path``, its sidecars or owner lock directory, a link or
    another program's file). The text goes to a hidden temporary file in the same directory
    (never matched by the collector's ``*.prom``), is flushed and fsynced, then renamed over
    ``path``; the directory is fsynced after. On any error the temporary file is removed and
    ``path`` is left as it was (``StorageError``). The new file always gets mode 0644 (no
    special bits, whatever the replaced file had: it may be another user's) and belongs to
    this user. A symbolic link on the way is followed only as the kernel's
    ``protected_symlinks`` rule allows (:func:`resolve_target`). Returns the number of bytes
    written.
    """
    check_textfile(path)
    path = resolve_target(path)
    check_target(path, ledger_path)
    directory, base = os.path.split(path)
    data = text.encode("utf-8")
    try:
        os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        pass
    except OSError:
        raise StorageError(
            "the textfile cannot be read", reason=reasons.TEXTFILE_NOT_ACCESSIBLE
        ) from None
    temp = os.path.join(directory, f".{base}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        raise StorageError(
            "the textfile's directory is not writable",
            reason=reasons.TEXTFILE_DIRECTORY_NOT_WRITABLE,
        ) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, TEXTFILE_MODE)  # never the replaced file's (another user's) mode
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise StorageError(
            "the textfile could not be written", reason=reasons.TEXTFILE_NOT_WRITTEN
        ) from None
    _fsync_directory(directory)
    return len(data)


def _fsync_directory(directory: str) -> None:
    """Make the rename durable (best effort: some platforms cannot open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["CONTENT_TYPE", "TEXTFILE_SUFFIX", "Exposition", "check_target", "check_textfile",
           "format_prometheus", "format_server_counters", "resolve_target", "write_textfile"]
