"""``tsg metrics``: print the exposition, replace a textfile atomically, or serve it over HTTP.

Every run reads a fresh status through a read-only ledger open and closes it again; nothing
here writes the ledger.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from . import adapter_counters
from .ledger import Ledger
from .metrics import check_textfile, format_prometheus, write_textfile
from .model import InvalidInput, LedgerError

DEFAULT_LISTEN = "127.0.0.1:9464"

Payload = dict[str, Any] | str


def parse_listen(value: object) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6; port 0 picks a free one) → ``(host, port)``.

    The host must be an IP address; errors never echo the value.
    """
    if not isinstance(value, str) or ":" not in value:
        raise InvalidInput("listen must be HOST:PORT")
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput("the listen host must be an IP address") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidInput("the listen port must be 0-65535")
    return str(address), int(port_text)


def check_metrics_options(
    textfile: str | None, serve: bool, listen: str | None, metrics_dir: str | None = None
) -> dict[str, Any]:
    """Check the options before any database is opened; errors never echo a value.

    ``metrics_dir`` (``--metrics-dir``, else ``$TSG_METRICS_DIR``): the adapters' metrics
    directory, whose summed counters are added to the exposition."""
    if serve and textfile is not None:
        raise InvalidInput("--serve and --textfile exclude each other")
    if listen is not None and not serve:
        raise InvalidInput("--listen needs --serve")
    if metrics_dir is not None and (not metrics_dir or "\0" in metrics_dir):
        raise InvalidInput("the metrics directory must be a path")
    return {
        "textfile": None if textfile is None else check_textfile(textfile),
        "listen": parse_listen(DEFAULT_LISTEN if listen is None else listen) if serve else None,
        "metrics_dir": metrics_dir,
    }


def metrics_text(
    ledger: Ledger, *, active_grace_seconds: float | None = None, metrics_dir: str | None = None
) -> str:
    """What ``tsg metrics`` prints: the ledger's families (``Ledger.status()``) and, with a
    metrics directory, the adapters' counters summed over every process that counted into it."""
    text = format_prometheus(ledger.status(active_grace_seconds=active_grace_seconds))
    if metrics_dir is not None:
        text += adapter_counters.format_directory(metrics_dir)
    return text


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
            return metrics_text(ledger, active_grace_seconds=values["grace"],
                                metrics_dir=values.get("metrics_dir"))
        finally:
            ledger.close()

    text = render()
    if values["listen"] is not None:
        from .metrics_http import bind, run  # the network code loads only for --serve

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


__all__ = ["DEFAULT_LISTEN", "check_metrics_options", "metrics_text", "parse_listen",
           "run_metrics"]
