"""Backend selection: a ``postgresql://`` (or ``postgres://``) URL opens the optional
PostgreSQL backend (package ``task-state-guard-postgres``); anything else is a SQLite path.

This module only recognises and redacts URLs; it never imports a database driver itself.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any

from . import reasons as r
from .model import StorageError

if TYPE_CHECKING:
    from .database import Database

URL_PREFIXES = ("postgresql://", "postgres://")
#: The fixed error when a PostgreSQL URL is given but the backend is not installed.
MISSING_BACKEND = (
    "a PostgreSQL ledger needs the task-state-guard-postgres package "
    "(pip install task-state-guard-postgres)"
)
_BACKEND_MODULE = "task_state_guard_postgres"
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^@/?#]*)@")
_PASSWORD_PARAM = re.compile(r"([?&])password=[^&#]*&?", re.IGNORECASE)


def is_url(target: object) -> bool:
    """True when ``target`` is a PostgreSQL URL (``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and target[:13].lower().startswith(URL_PREFIXES)


def redact(target: str) -> str:
    """``target`` without any password (a URL's user info and ``password=`` parameter)."""
    if not is_url(target):
        return target

    def user_only(match: re.Match[str]) -> str:
        user = match.group(2).split(":", 1)[0]
        return f"{match.group(1)}{user}@" if user else match.group(1)

    text = _USERINFO.sub(user_only, target, count=1)
    text = _PASSWORD_PARAM.sub(lambda m: m.group(1), text)
    return text.rstrip("?&")


def open_database(url: str, **options: Any) -> Database:
    """Open the PostgreSQL backend's database object for ``url``.

    Raises ``StorageError`` with :data:`MISSING_BACKEND` when the backend (or its driver) is
    not installed.
    """
    try:
        backend = importlib.import_module(_BACKEND_MODULE)
    except ImportError:
        raise StorageError(MISSING_BACKEND, reason=r.BACKEND_MISSING) from None
    db: Database = backend.open_database(url, **options)
    return db


__all__ = ["MISSING_BACKEND", "URL_PREFIXES", "is_url", "open_database", "redact"]
