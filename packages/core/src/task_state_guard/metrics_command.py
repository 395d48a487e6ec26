"""``tsg metrics``: print the exposition, replace a textfile atomically, or serve it over HTTP.

Every run reads a fresh status through a read-only ledger open and closes it again; nothing
here writes the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .ledger import Ledger
from .metrics import check_textfile, format_prometheus, write_textfile
from .metrics_http import DEFAULT_LISTEN, bind, parse_listen, run
from .model import InvalidInput, LedgerError

Payload = dict[str, Any] | str


def check_metrics_options(textfile: str | None, serve: bool, listen: str | None) -> dict[str, Any]:
    """Check the options before any database is opened; errors never echo a value."""
    if serve and textfile is not None:
        raise InvalidInput("--serve and --textfile exclude each other")
    if listen is not None and not serve:
        raise InvalidInput("--listen needs --serve")
    return {
        "textfile": None if textfile is None else check_textfile(textfile),
        "listen": parse_listen(DEFAULT_LISTEN if listen is None else listen) if serve else None,
    }


def run_metrics(
    open_ledger: Callable[[], Ledger],
    values: dict[str, Any],
    *,
    emit: Callable[[Payload], None],
    categorize: Callable[[LedgerError], str],
) -> tuple[Payload, int]:
    """Run the command; returns the CLI's payload and exit code (errors raise).

    Plain: the exposition for stdout. ``textfile``: the text is rendered first, then written
    atomically; an error leaves the file as it was and raises (the CLI prints the JSON error on
    stdout only); success is one JSON line with the byte and sample counts. ``listen``: the
    first scrape is rendered once to fail fast, the endpoint is bound, one JSON line with the
    bound address is printed, and it serves until SIGTERM or SIGINT.
    """

    def render() -> str:
        ledger = open_ledger()
        try:
            return format_prometheus(ledger.status(active_grace_seconds=values["grace"]))
        finally:
            ledger.close()

    text = render()
    if values["listen"] is not None:
        server = bind(values["listen"], render, categorize)
        host, port = str(server.server_address[0]), int(server.server_address[1])
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        emit({"listen": shown, "ok": True})
        run(server)
        return "", 0
    if values["textfile"] is None:
        return text, 0
    size = write_textfile(values["textfile"], text)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {"ok": True, "textfile": {"bytes": size, "samples": samples}}, 0


__all__ = ["check_metrics_options", "run_metrics"]
