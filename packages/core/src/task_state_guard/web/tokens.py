"""The token of ``tsg serve``: how strong it must be, the file it is read from, and the file
made beside the ledger on the first start.

A token is at least 16 printable ASCII characters without spaces, of at least 6 different
characters, and not one short pattern repeated (``aaaaaaaaaaaaaaaa``, ``abababab...``).

A token file is opened without blocking (``O_NONBLOCK``: a FIFO or a device never hangs the
start) and judged by what was opened (``fstat``): it must be a regular file, owned by the user
serving or by root, and private: nothing for other users, and for a file of the user's own
nothing for the group either (``chmod 600``). A root-owned file may be readable by its group,
which is how Kubernetes mounts a Secret for a pod's ``fsGroup``. A file given with
``--token-file`` may be a symbolic link (Kubernetes mounts Secrets as links); the file made
beside the ledger never is (``O_NOFOLLOW``).

Where the default token lives: a SQLite ledger's is ``<ledger file>.serve-token`` in the
ledger's own directory (which the ledger already requires to be private); a PostgreSQL
ledger's is ``serve-token`` in the user's configuration directory
(``$XDG_CONFIG_HOME/task-state-guard``, else ``~/.config/task-state-guard``), made ``0700``.
Errors are fixed texts (reasons ``serve_token_invalid``, ``serve_token_weak``,
``serve_token_file_unsafe``): never the path, never the token.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat

from .. import reasons as r
from ..model import InvalidInput
from ..store.backends import is_url

MIN_TOKEN_LENGTH = 16
MIN_DISTINCT_CHARACTERS = 6
MAX_TOKEN_BYTES = 4096
#: The default token file of a SQLite ledger: the ledger file's name with this suffix.
TOKEN_SUFFIX = ".serve-token"
#: The default token file of a PostgreSQL ledger, in the user's configuration directory.
CONFIG_DIR_NAME = "task-state-guard"
CONFIG_FILE_NAME = "serve-token"
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no spaces
_READ_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_CLOEXEC", 0))
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _invalid(message: str, reason: str = r.SERVE_TOKEN_INVALID) -> InvalidInput:
    return InvalidInput(message, reason=reason)


def _unsafe(message: str) -> InvalidInput:
    return InvalidInput(message, reason=r.SERVE_TOKEN_FILE_UNSAFE)


def _repeats(token: str) -> bool:
    """Whether ``token`` is a pattern of at most half its length, repeated."""
    size = len(token)
    return any(token == (token[:period] * (size // period + 1))[:size]
               for period in range(1, size // 2 + 1))


def check_token(text: object) -> str:
    """``text`` without surrounding whitespace when it is a strong enough token (see the
    module's docstring), else ``InvalidInput`` (``serve_token_invalid``)."""
    token = text.strip() if isinstance(text, str) else ""
    if len(token) < MIN_TOKEN_LENGTH or not _TOKEN.fullmatch(token):
        raise _invalid("the token must be at least 16 printable characters without spaces")
    if len(set(token)) < MIN_DISTINCT_CHARACTERS or _repeats(token):
        raise _invalid("the token is too weak: it repeats a few characters; use a random "
                       "one (openssl rand -hex 32)", r.SERVE_TOKEN_WEAK)
    return token


def _strong(token: str) -> bool:
    try:
        check_token(token)
    except InvalidInput:
        return False
    return True


def _judge(st: os.stat_result) -> None:
    """A token file must be a regular file, the user's (or root's), and private."""
    if not stat.S_ISREG(st.st_mode):
        raise _unsafe("the token file must be a regular file")
    euid = os.geteuid()
    if st.st_uid == euid:
        if st.st_mode & 0o077:
            raise _unsafe("the token file must not be readable or writable by the group or "
                           "others (chmod 600)")
    elif st.st_uid == 0:
        if st.st_mode & 0o027:
            raise _unsafe("the token file must not be writable by the group or readable by "
                           "others")
    else:
        raise _unsafe("the token file must be owned by the user serving, or by root")


def read_token_file(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> str:
    """The checked token in the first line of the file ``path`` (see the module's
    docstring); ``InvalidInput`` (``serve_token_invalid``) otherwise."""
    try:
        fd = os.open(path, _READ_FLAGS | (0 if follow_symlinks else _NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _unsafe("the token file must not be a symbolic link") from None
        raise _invalid("the token file cannot be read") from None
    except ValueError:  # a NUL in the path
        raise _invalid("the token file cannot be read") from None
    try:
        _judge(os.fstat(fd))
        data = b""
        while len(data) <= MAX_TOKEN_BYTES:
            chunk = os.read(fd, MAX_TOKEN_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        raise _invalid("the token file cannot be read") from None
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_BYTES:
        raise _invalid("the token file is too long")
    lines = data.decode("ascii", "replace").splitlines()
    return check_token(lines[0] if lines else "")


def default_token_path(db: str | os.PathLike[str]) -> str:
    """Where the token of the ledger ``db`` is kept when none is given (see the module's
    docstring); ``InvalidInput`` when a PostgreSQL ledger's user has no home to keep it in."""
    if is_url(db):
        base = os.environ.get("XDG_CONFIG_HOME", "")
        if not os.path.isabs(base):
            home = os.path.expanduser("~")
            if not os.path.isabs(home):
                raise _invalid("there is no configuration directory for the token: give "
                               "--token-file")
            base = os.path.join(home, ".config")
        return os.path.join(base, CONFIG_DIR_NAME, CONFIG_FILE_NAME)
    return os.path.abspath(os.fspath(db)) + TOKEN_SUFFIX


def _write_new(path: str, token: str) -> bool:
    """Write ``token`` to ``path`` if no file is there, all at once (a private temporary file
    linked into place); False when a file already was."""
    folder = os.path.dirname(path)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            os.write(fd, (token + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
    finally:
        os.unlink(temporary)
    return True


def ensure_token_file(db: str | os.PathLike[str]) -> tuple[str, str, bool]:
    """The default token of the ledger ``db``: ``(token, path, made)``. The first start makes
    it (``0600``, 43 random URL-safe characters); later starts read and check it."""
    path = default_token_path(db)
    if is_url(db):
        folder = os.path.dirname(path)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError:
            raise _invalid("the token's configuration directory cannot be made: give "
                           "--token-file") from None
    token = secrets.token_urlsafe(32)
    while not _strong(token):  # a random token is almost never weak; never kept if so
        token = secrets.token_urlsafe(32)
    try:
        made = _write_new(path, token)
    except OSError:
        raise _invalid("the token file beside the ledger cannot be made: give --token-file, "
                       "or --no-token on loopback") from None
    if made:
        return token, path, True
    return read_token_file(path, follow_symlinks=False), path, False


__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_SUFFIX", "check_token", "default_token_path",
           "ensure_token_file", "read_token_file"]
