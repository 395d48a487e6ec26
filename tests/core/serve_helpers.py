"""A real `tsg serve` process for the tests, and raw HTTP requests to it."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping

from core_helpers import cli_env


class Served:
    """`tsg [--db DB] serve ...` (or any command line that serves) in a subprocess."""

    def __init__(self, db: str, *args: str, command: tuple[str, ...] = ("serve",),
                 env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "task_state_guard", "--db", db, *command, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**cli_env(), **(env or {})},
        )
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

    def request(self, path: str, method: str = "GET", *, headers: Mapping[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, dict[str, str], str]:
        """One request; the status, the headers (names as sent) and the body."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
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
        return self.proc.returncode, out, err


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), as a client that crashed does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
