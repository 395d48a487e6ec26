"""The adapters' counters of every process, summed in one small file per directory.

An adapter counts, per process, the ledger errors its hooks met, the rewrites the ledger
refused and the reconciles it ran (``guard.stats()``). Under a Celery prefork pool each child
keeps its own counters, so no single process can serve them all. With a metrics directory (the
adapters' ``metrics_dir`` setting, ``TSG_METRICS_DIR``), every process also adds each increment
to :data:`FILE_NAME` there, under an exclusive ``flock`` on :data:`LOCK_NAME` beside it: read
the file, add, write a temporary file, rename it over the old one. The file then holds the sums
of every process that ever counted into it (children that exited included), and ``tsg metrics``
given the same directory exposes them. The sums never go down while the file lives; deleting
it starts them at zero again, which Prometheus' ``rate()`` reads as a counter reset. An adapter
writes its counters at zero when a worker starts, and :func:`format_directory` adds
:data:`ERRORS_BY_ADAPTER` (each adapter's errors of every kind, derived, never stored), so an
alert's ``increase()`` sees the first error of each kind.

Only the adapter's name, hook names, exception class names and conflict kinds are written
(identifiers, never ids, values or paths); a reader accepts nothing else, so a tampered file
cannot put text of its own into the exposition.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping

FILE_NAME = "tsg-adapter-counters.json"
LOCK_NAME = "tsg-adapter-counters.lock"
FORMAT = 1
#: The families, with their label names, that processes add to the file.
FAMILIES: Mapping[str, tuple[str, ...]] = {
    "tsg_adapter_ledger_errors_total": ("adapter", "error", "hook"),
    "tsg_adapter_conflicts_total": ("adapter", "kind"),
    "tsg_adapter_reconciles_total": ("adapter",),
    "tsg_adapter_verdicts_published_total": ("adapter",),
    "tsg_adapter_framework_successes_total": ("adapter", "where"),
}
#: Every ledger error of an adapter, whatever its hook and class: not stored, derived when the
#: file is read (the sum of that adapter's ``tsg_adapter_ledger_errors_total``), for every
#: adapter the file names, so it reads 0 from a worker's start (when the adapter writes its
#: zeros) and ``increase()`` sees the first error of every kind.
ERRORS_BY_ADAPTER = "tsg_adapter_ledger_errors_all_total"
MAX_BYTES = 1 << 20  # a file this large was not written by us: it is refused, not read
MAX_ENTRIES = 10_000  # label sets kept; increments of further ones are dropped

_LABEL_VALUE = re.compile(r"[A-Za-z0-9_.:<>/-]{1,200}\Z")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(family: object, labels: object) -> Key | None:
    """The validated ``(family, sorted labels)`` of one entry, or ``None``."""
    names = FAMILIES.get(family) if isinstance(family, str) else None
    if names is None or not isinstance(labels, dict) or sorted(labels) != list(names):
        return None
    pairs = tuple(sorted(labels.items()))
    if not all(isinstance(v, str) and _LABEL_VALUE.match(v) for _, v in pairs):
        return None
    return family, pairs  # type: ignore[return-value]


def _decode(raw: bytes) -> dict[Key, int]:
    """The valid entries of a file's bytes (an unreadable document has none)."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    entries = document.get("counters") if isinstance(document, dict) else None
    found: dict[Key, int] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not (isinstance(entry, list) and len(entry) == 3):
            continue
        key = _key(entry[0], entry[1])
        value = entry[2]
        if key is None or type(value) is not int or value < 0 or len(found) >= MAX_ENTRIES:
            continue
        found[key] = found.get(key, 0) + value
    return found


def _encode(counters: Mapping[Key, int]) -> bytes:
    entries = [[family, dict(pairs), value] for (family, pairs), value in sorted(counters.items())]
    return json.dumps({"format": FORMAT, "counters": entries}, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def _read_file(path: str) -> bytes:
    """The bytes of ``path`` (empty when it does not exist); a link or a non-file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)  # a FIFO never blocks
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("the counters file is not a regular file")
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise OSError("the counters file is too large")
    return data


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


Increment = tuple[str, Mapping[str, str], int]


def add(directory: str, increments: Iterable[Increment]) -> None:
    """Add each ``(family, labels, amount)`` to the file in ``directory`` (created 0700 if
    missing), all in one locked update; an amount of 0 makes a counter appear at zero.

    Raises ``ValueError`` for a family or label set outside :data:`FAMILIES` and ``OSError``
    when the directory or file cannot be used; the file is then left as it was.
    """
    wanted: list[tuple[Key, int]] = []
    for family, labels, amount in increments:
        key = _key(family, dict(labels))
        if key is None or type(amount) is not int or amount < 0:
            raise ValueError("not an adapter counter")
        wanted.append((key, amount))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, FILE_NAME)
    with _locked(directory):
        counters = _decode(_read_file(path))
        for key, amount in wanted:
            if key in counters or len(counters) < MAX_ENTRIES:
                counters[key] = counters.get(key, 0) + amount
        temporary = f"{path}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(_encode(counters))
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def read(directory: str) -> dict[Key, int]:
    """Every process's sums from the file in ``directory`` (empty when there is none yet).

    Raises ``OSError`` when the file exists and cannot be read (a link, too large, no access).
    """
    return _decode(_read_file(os.path.join(directory, FILE_NAME)))


def samples(counters: Mapping[Key, int], family: str) -> list[tuple[dict[str, str], int]]:
    """One family's samples from :func:`read`'s result, sorted by labels (with
    :data:`ERRORS_BY_ADAPTER`: each adapter's sum of ledger errors, 0 for an adapter the file
    names without any)."""
    if family == ERRORS_BY_ADAPTER:
        totals: dict[str, int] = {}
        for (name, pairs), value in counters.items():
            adapter = dict(pairs)["adapter"]
            add = value if name == "tsg_adapter_ledger_errors_total" else 0
            totals[adapter] = totals.get(adapter, 0) + add
        return [({"adapter": adapter}, total) for adapter, total in sorted(totals.items())]
    return [(dict(pairs), value) for (name, pairs), value in sorted(counters.items())
            if name == family]


_HELP = {
    ERRORS_BY_ADAPTER:
        "Ledger errors inside framework hooks, of any hook and exception class, summed over "
        "every process that counted into the metrics directory, by adapter (0 from a worker's "
        "start: alert on this one).",
    "tsg_adapter_ledger_errors_total":
        "Ledger errors inside framework hooks, summed over every process that counted into the "
        "metrics directory, by adapter, hook or operation, and exception class (the job ran on).",
    "tsg_adapter_conflicts_total":
        "Refused rewrites of terminal records (e.g. a late completion after a reconcile closed "
        "the task), summed over every process that counted into the metrics directory.",
    "tsg_adapter_reconciles_total":
        "Reconcile passes run by adapters, summed over every process that counted into the "
        "metrics directory.",
    "tsg_adapter_verdicts_published_total":
        "Lost-job verdicts published by adapters (result backend, on_lost), summed over every "
        "process that counted into the metrics directory.",
    "tsg_adapter_framework_successes_total":
        "Jobs whose success the framework's result store held, not treated as lost: closed "
        "succeeded before a reconcile (where=reconcile) or their lost-job verdict superseded "
        "unpublished (where=verdict), summed over every process that counted into the metrics "
        "directory.",
}


def format_directory(directory: str) -> str:
    """The summed counters of ``directory`` as Prometheus text (``tsg metrics --metrics-dir``),
    with ``tsg_adapter_counters_readable`` (0 when the file exists and cannot be read; the
    counter families are then empty)."""
    from .prometheus import Exposition  # the exposition format lives with the ledger's families

    try:
        counters, readable = read(directory), 1
    except OSError:
        counters, readable = {}, 0
    out = Exposition()
    for family in (ERRORS_BY_ADAPTER, *FAMILIES):
        out.family(family, "counter", _HELP[family], samples(counters, family))
    out.family("tsg_adapter_counters_readable", "gauge",
               "1 when the metrics directory's adapter counters file is absent or was read; 0 "
               "when it exists and cannot be read.", [({}, readable)])
    return out.render()


__all__ = [
    "ERRORS_BY_ADAPTER", "FAMILIES", "FILE_NAME", "LOCK_NAME", "add", "format_directory", "read",
    "samples",
]
