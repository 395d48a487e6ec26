"""TaskStateGuard on PostgreSQL: one ledger for a fleet of hosts.

Install it and give any ledger a ``postgresql://`` (or ``postgres://``) URL instead of a path:
``Ledger(url)``, an adapter's ``db=url``, ``TSG_DB=url`` or ``tsg --db url``. The transitions,
guards, reason codes, reconcile decisions, doctor, status, metrics and prune are the core's;
this package provides the database object they run on (see :mod:`.database`) with owner
liveness across hosts (:mod:`.owners`) and guarded migrations (:mod:`.ddl`).
"""

from .admin import drop_schema, drop_stale_schemas
from .database import PostgresDatabase, open_database
from .ddl import SCHEMA_VERSION
from .url import CLIENT_DEFAULTS, DEFAULT_SCHEMA, SERVER_KEEPALIVE

__version__ = "0.1.0"

__all__ = [
    "CLIENT_DEFAULTS",
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "SERVER_KEEPALIVE",
    "PostgresDatabase",
    "__version__",
    "drop_schema",
    "drop_stale_schemas",
    "open_database",
]
