"""Suite-wide fixtures: PostgreSQL ledgers (``pg_url``) for any test directory."""

from pg_fixtures import pg_stale_cleanup, pg_url

__all__ = ["pg_stale_cleanup", "pg_url"]
