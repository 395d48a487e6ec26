"""Privacy scanning helpers and the hook for adapter privacy runs.

An adapter privacy run drives one adapter end to end with canary strings in every place a user
could put private data (task arguments, payloads, exception messages, host names) and returns
any extra text the run produced (CLI output, logs). ``test_privacy.py`` runs it on each ledger
backend, then scans the ledger's database, its sidecars and owner files (a PostgreSQL ledger:
every row of its schema), and that text, for the canary.

Register one with::

    # tests/reliability/adapter_privacy.py (imported by load_adapter_runs)
    from .privacy_hooks import adapter_privacy_run

    @adapter_privacy_run("celery")
    def celery_run(db: str, canary: str) -> list[str]:
        ...  # run a real worker against the ledger db (a path or a URL) with canary-laden tasks
        return [captured_cli_output]
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

import ledger_backends

#: ``run(db, canary) -> extra outputs``; ``db`` is the ledger: a SQLite path or a PostgreSQL URL.
AdapterPrivacyRun = Callable[[str, str], list[str]]
ADAPTER_PRIVACY_RUNS: dict[str, AdapterPrivacyRun] = {}


def adapter_privacy_run(name: str) -> Callable[[AdapterPrivacyRun], AdapterPrivacyRun]:
    """Register ``fn(db, canary) -> extra outputs`` as the privacy run of one adapter."""

    def register(fn: AdapterPrivacyRun) -> AdapterPrivacyRun:
        ADAPTER_PRIVACY_RUNS[name] = fn
        return fn

    return register


def _encodings(text: str) -> list[bytes]:
    return [text.encode("utf-8"), text.encode("utf-16-le"), text.encode("utf-16-be"),
            text.lower().encode(), text.upper().encode()]


def ledger_files(db_path: Path) -> list[Path]:
    """The database, every sidecar beside it and every owner lock file."""
    base = str(db_path)
    files = [p for p in db_path.parent.iterdir() if str(p).startswith(base) and p.is_file()]
    owners = Path(base + "-owners")
    if owners.is_dir():
        files += [p for p in owners.iterdir() if p.is_file()]
    return files


def host_markers() -> list[str]:
    """Host names worth searching for (too-short names would match by chance)."""
    names = {socket.gethostname(), socket.getfqdn(), os.uname().nodename}
    return sorted(n for n in names if len(n) >= 6 and n not in ("localhost",))


def find_leaks(db_path: Path | str, secrets: Iterable[str],
               outputs: Iterable[str] = ()) -> list[str]:
    """Return 'where:what' for every secret found in the ledger files (a PostgreSQL ledger:
    every row of its schema, as text) or the outputs."""
    leaks = []
    if str(db_path).startswith(("postgresql://", "postgres://")):
        blobs = [("schema", ledger_backends.stored_bytes(str(db_path)))]
    else:
        blobs = [(p.name, p.read_bytes()) for p in ledger_files(Path(db_path))]
    blobs += [(f"output#{i}", o.encode("utf-8", "surrogatepass")) for i, o in enumerate(outputs)]
    for secret in secrets:
        for where, blob in blobs:
            if any(e in blob for e in _encodings(secret)):
                leaks.append(f"{where}:{secret[:3]}...")
    return leaks


def load_adapter_runs() -> dict[str, AdapterPrivacyRun]:
    """Import the modules that register adapter runs (none is required to exist yet)."""
    import importlib

    module = f"{__package__}.adapter_privacy" if __package__ else "adapter_privacy"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
    return dict(ADAPTER_PRIVACY_RUNS)
