"""Who may read the web view: the token, the sessions its sign-in starts, and how fast a
client may guess.

Sessions: signing in with the token sets the cookie ``tsg_session`` = ``ISSUED.ID.MAC``: the
time it was issued (whole seconds), a random session id, and an HMAC of both under a key
derived from the token (so several processes serving one ledger with one token accept each
other's sessions, and a new token ends every session). A session is accepted until
``lifetime`` seconds after it was issued (the cookie's ``Max-Age`` says the same to the
browser), and not after ``POST /logout`` ended it: the process that answered the sign-out
keeps the id until the session would have expired anyway. That list is bounded: when it is
full, every session issued so far ends at once. (An application mounted in several worker
processes ends a session in the process that answered the sign-out; the browser drops the
cookie too.)

Guessing: a token that was presented and is wrong (the sign-in form, ``/login?token=``, or an
``Authorization: Bearer`` header) costs one credit of its client's bucket (its IP address, an
IPv6 client's /64) and, for a sign-in, one of a bucket shared by every client. An empty bucket
refuses before any check, answering ``429`` with ``Retry-After``; a right token costs nothing.
Session cookies are not counted: they are checked by their MAC, which cannot be guessed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import re
import secrets
import threading
import time
from collections.abc import Callable

SESSION_COOKIE = "tsg_session"
DEFAULT_SESSION_SECONDS = 12 * 3600
#: Sessions ended by a sign-out remembered at once; beyond it, every session so far ends.
MAX_ENDED = 10000
#: A client's bucket: this many wrong tokens at once, then one more every this many seconds.
CLIENT_BURST, CLIENT_REFILL_SECONDS = 10, 6.0
#: The bucket of the sign-in shared by every client.
OVERALL_BURST, OVERALL_REFILL_SECONDS = 30, 2.0
#: Clients whose buckets are remembered; beyond it, new clients share one bucket.
MAX_CLIENTS = 4096
_SESSION = re.compile(r"([0-9]{1,12})\.([A-Za-z0-9_-]{16})\.([0-9a-f]{64})", re.ASCII)
_SKEW_SECONDS = 60  # a session issued this far "in the future" (a clock step) is accepted


def same_token(given: str, token: str) -> bool:
    """Whether ``given`` is ``token`` (in constant time)."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


class Sessions:
    """The session cookies of one token (see the module's docstring); thread-safe."""

    def __init__(self, token: str, lifetime: float, clock: Callable[[], float] = time.time,
                 ) -> None:
        self._key = hmac.new(token.encode("utf-8"), b"tsg-serve-session-2",
                             hashlib.sha256).digest()
        self.lifetime = lifetime
        self._clock = clock
        self._lock = threading.Lock()
        self._ended: dict[str, float] = {}  # session id -> when it expires anyway
        self._not_before = 0.0

    def _mac(self, issued: str, session_id: str) -> str:
        return hmac.new(self._key, f"{issued}.{session_id}".encode("ascii"),
                        hashlib.sha256).hexdigest()

    def issue(self) -> str:
        """A new session's cookie value."""
        issued, session_id = str(int(self._clock())), secrets.token_urlsafe(12)
        return f"{issued}.{session_id}.{self._mac(issued, session_id)}"

    def _check(self, value: str) -> tuple[str, float] | None:
        """``(session id, expiry)`` of a valid, live session cookie value, else None."""
        match = _SESSION.fullmatch(value)
        if match is None:
            return None
        issued, session_id, mac = match.groups()
        if not hmac.compare_digest(mac, self._mac(issued, session_id)):
            return None
        now, at = self._clock(), int(issued)
        expires = at + self.lifetime
        with self._lock:
            ended = session_id in self._ended or at < self._not_before
        if ended or not at - _SKEW_SECONDS <= now < expires:
            return None
        return session_id, expires

    def valid(self, value: str | None) -> bool:
        """Whether ``value`` is the cookie of a live session."""
        return value is not None and self._check(value) is not None

    def end(self, value: str | None) -> None:
        """End the session of ``value`` (nothing when it is none, or not live)."""
        checked = None if value is None else self._check(value)
        if checked is None:
            return
        now = self._clock()
        with self._lock:
            self._ended = {k: until for k, until in self._ended.items() if until > now}
            if len(self._ended) >= MAX_ENDED:
                self._ended.clear()
                self._not_before = math.floor(now) + 1
            else:
                self._ended[checked[0]] = checked[1]

    def cookie(self, value: str, *, secure: bool) -> str:
        """The ``Set-Cookie`` value that starts the session ``value``."""
        return (f"{SESSION_COOKIE}={value}; Path=/; Max-Age={int(self.lifetime)}; HttpOnly; "
                f"SameSite=Strict{'; Secure' if secure else ''}")

    @staticmethod
    def clearing_cookie(*, secure: bool) -> str:
        """The ``Set-Cookie`` value that makes the browser drop the session cookie."""
        return (f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
                f"{'; Secure' if secure else ''}")


class _Bucket:
    __slots__ = ("credits", "stamp")

    def __init__(self, credits: float, stamp: float) -> None:
        self.credits = credits
        self.stamp = stamp


class GuessLimit:
    """The buckets of wrong tokens (see the module's docstring); thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, _Bucket] = {}
        self._overall = _Bucket(OVERALL_BURST, clock())

    @staticmethod
    def _refill(bucket: _Bucket, burst: int, every: float, now: float) -> None:
        bucket.credits = min(float(burst), bucket.credits + (now - bucket.stamp) / every)
        bucket.stamp = now

    def _client(self, client: str, now: float) -> _Bucket:
        bucket = self._clients.get(client)
        if bucket is None:
            if len(self._clients) >= MAX_CLIENTS:
                for key, each in list(self._clients.items()):  # forget the ones refilled
                    self._refill(each, CLIENT_BURST, CLIENT_REFILL_SECONDS, now)
                    if each.credits >= CLIENT_BURST:
                        del self._clients[key]
            key = client if len(self._clients) < MAX_CLIENTS else "*"
            bucket = self._clients.setdefault(key, _Bucket(CLIENT_BURST, now))
        self._refill(bucket, CLIENT_BURST, CLIENT_REFILL_SECONDS, now)
        return bucket

    def retry_after(self, client: str, *, sign_in: bool) -> int | None:
        """Seconds until ``client`` may present a token again, or None when it may now."""
        now = self._clock()
        with self._lock:
            waits = []
            bucket = self._client(client, now)
            if bucket.credits < 1:
                waits.append((1 - bucket.credits) * CLIENT_REFILL_SECONDS)
            if sign_in:
                self._refill(self._overall, OVERALL_BURST, OVERALL_REFILL_SECONDS, now)
                if self._overall.credits < 1:
                    waits.append((1 - self._overall.credits) * OVERALL_REFILL_SECONDS)
        return max(1, math.ceil(max(waits))) if waits else None

    def wrong(self, client: str, *, sign_in: bool) -> None:
        """Count one wrong token from ``client``."""
        now = self._clock()
        with self._lock:
            bucket = self._client(client, now)
            bucket.credits = max(0.0, bucket.credits - 1)
            if sign_in:
                self._refill(self._overall, OVERALL_BURST, OVERALL_REFILL_SECONDS, now)
                self._overall.credits = max(0.0, self._overall.credits - 1)


def client_key(address: str) -> str:
    """The bucket of a client address: the address itself, an IPv6 one's /64 network."""
    try:
        parsed = ipaddress.ip_address(address.strip())
    except ValueError:
        return "unknown"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def cookie_value(header: str, name: str = SESSION_COOKIE) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header (the first one), or None."""
    for part in header.split(";"):
        key, equals, value = part.strip().partition("=")
        if equals and key == name:
            return value.strip().strip('"')
    return None


__all__ = ["DEFAULT_SESSION_SECONDS", "SESSION_COOKIE", "GuessLimit", "Sessions", "client_key",
           "cookie_value", "same_token"]
