"""libpq's password file (``~/.pgpass``), judged before libpq reads it.

libpq skips a password file that is not a regular file or that group or others may access,
and says so by printing a warning with the file's path straight to the process's stderr (not
through any notice hook a client can set). The ledger never lets a path reach stderr: when
libpq would skip the file anyway, :func:`quiet` points libpq at a password file that cannot
exist, so it skips it silently; the connection is then exactly what it would have been. If
the server then refuses the credentials, the refusal's reason is ``password_file_not_private``
(the fix is ``chmod 600`` on the file), never the file's path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: A password file libpq cannot find (a path below the null device, which is no directory):
#: libpq skips a missing file without a word.
NO_PASSFILE = os.devnull + "/.pgpass"


def _libpq_passfile(params: Mapping[str, object], environ: Mapping[str, str]) -> str | None:
    """The password file libpq would read for ``params``, or None when it reads none (a
    password is given, in the URL or ``PGPASSWORD``)."""
    if params.get("password") or environ.get("PGPASSWORD"):
        return None
    given = params.get("passfile") or environ.get("PGPASSFILE")
    if given:
        return str(given)
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".pgpass") if home and home != "~" else None


def refused_by_libpq(path: str) -> bool:
    """Whether libpq would skip (and warn about) the password file at ``path``: it exists and
    is not a regular file, or group or others have any access to it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False  # missing or unreadable: libpq skips it without a word
    return not stat.S_ISREG(st.st_mode) or bool(st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def quiet(conninfo: str, environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """``(conninfo, skipped)``: ``conninfo`` unchanged, or, when libpq would skip the password
    file with a warning on stderr, pointing at :data:`NO_PASSFILE` and ``skipped`` true.
    Windows' libpq checks no permissions (and warns of none): nothing changes there."""
    if os.name != "posix":
        return conninfo, False
    env = os.environ if environ is None else environ
    params = conninfo_to_dict(conninfo)
    path = _libpq_passfile(params, env)
    if path is None or not refused_by_libpq(path):
        return conninfo, False
    params["passfile"] = NO_PASSFILE
    return make_conninfo("", **params), True


__all__ = ["NO_PASSFILE", "quiet", "refused_by_libpq"]
