"""A real `tsg serve` process for the tests, and raw HTTP requests to it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping

from core_helpers import cli_env

#: The token a served test process gets (``TSG_SERVE_TOKEN``) unless the test gives its own
#: (``--token-file``, ``--no-token``, or ``TSG_SERVE_TOKEN`` in ``env``).
TOKEN = "served-test-token-K7qZ9wX2"


class Served:
    """`tsg [--db DB] serve ...` (or any command line that serves) in a subprocess.

    ``token``: sent as ``Authorization: Bearer`` by :meth:`request` (unless the request
    carries its own ``Authorization`` or ``Cookie``, or ``auth=False``); it is also given to
    the server as ``TSG_SERVE_TOKEN`` unless the command line or ``env`` chooses the access
    itself. ``tty``: stderr is a pseudo-terminal (:meth:`terminal_line` reads it)."""

    def __init__(self, db: str, *args: str, command: tuple[str, ...] = ("serve",),
                 env: Mapping[str, str] | None = None, token: str | None = TOKEN,
                 tty: bool = False) -> None:
        env = dict(env or {})
        chosen = "--no-token" in args or "--token-file" in args or "TSG_SERVE_TOKEN" in env
        if token is not None and not chosen:
            env["TSG_SERVE_TOKEN"] = token
        self.token = None if "--no-token" in args else token
        self.tty: int | None = None
        stderr: int = subprocess.PIPE
        if tty:
            self.tty, stderr = pty.openpty()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "task_state_guard", "--db", db, *command, *args],
                stdout=subprocess.PIPE, stderr=stderr, text=True,
                env={**cli_env(), **env},
            )
        finally:
            if tty:
                os.close(stderr)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            out, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"the server did not start: {out!r} {err!r}")
        self.banner = json.loads(line)
        host, _, port = self.banner["listen"].rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)

    @property
    def base(self) -> str:
        """The server's address as a URL prefix."""
        return f"http://{self.banner['listen']}"

    def terminal_line(self, timeout: float = 30) -> str:
        """The next line the server wrote to its terminal (``tty=True``)."""
        assert self.tty is not None
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([self.tty], [], [], 0.5)[0]:
                try:
                    chunk = os.read(self.tty, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
        return data.decode("utf-8", "replace").replace("\r\n", "\n")

    def request(self, path: str, method: str = "GET", *, headers: Mapping[str, str] | None = None,
                body: bytes | None = None, auth: bool = True,
                ) -> tuple[int, dict[str, str], str]:
        """One request; the status, the headers (names as sent) and the body."""
        sent = dict(headers or {})
        if auth and self.token is not None and not {"authorization", "cookie"} & {
                name.lower() for name in sent}:
            sent["Authorization"] = f"Bearer {self.token}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read().decode()
        finally:
            conn.close()

    def raw(self, data: bytes) -> bytes:
        """Send ``data`` as it is and read the whole answer (the server closes)."""
        with socket.create_connection((self.host, self.port), timeout=30) as sock:
            sock.sendall(data)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM; the exit code, the rest of stdout and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        if self.tty is not None:
            with contextlib.suppress(OSError):
                os.close(self.tty)
            self.tty = None
        return self.proc.returncode, out, err or ""


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), as a client that crashed does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
