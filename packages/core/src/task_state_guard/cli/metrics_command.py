"""``tsg metrics``: print the exposition or replace a textfile atomically; ``--serve`` is an
alias of ``tsg serve`` (:mod:`task_state_guard.web.serve`), which serves ``/metrics``.

Every run reads a fresh status through a read-only ledger open and closes it again; nothing
here writes the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ledger import Ledger
from ..metrics.exposition import metrics_text
from ..metrics.prometheus import check_textfile, write_textfile
from ..model import InvalidInput
from ..web.serve import check_serve_options

Payload = dict[str, Any] | str


def check_metrics_options(
    textfile: str | None, serve: bool, listen: str | None, refresh: str | None = None,
    token_file: str | None = None, metrics_dir: str | None = None,
) -> dict[str, Any]:
    """Check the options before any database is opened; errors never echo a value.

    ``metrics_dir`` (``--metrics-dir``, else ``$TSG_METRICS_DIR``): the adapters' metrics
    directory, whose summed counters are added to the exposition."""
    if serve and textfile is not None:
        raise InvalidInput("--serve and --textfile exclude each other")
    if not serve and (listen is not None or refresh is not None or token_file is not None):
        raise InvalidInput("--listen, --refresh and --token-file need --serve")
    values: dict[str, Any] = {"textfile": None if textfile is None else check_textfile(textfile),
                              "metrics_dir": check_metrics_dir(metrics_dir)}
    if serve:
        values.update(check_serve_options(listen, refresh))
    else:
        values["listen"] = None
    return values


def check_metrics_dir(metrics_dir: str | None) -> str | None:
    """A metrics directory option: None, or a non-empty path."""
    if metrics_dir is not None and (not metrics_dir or "\0" in metrics_dir):
        raise InvalidInput("the metrics directory must be a path")
    return metrics_dir


def run_metrics(open_ledger: Callable[[], Ledger], values: dict[str, Any]) -> tuple[Payload, int]:
    """Print or write the exposition; returns the CLI's payload and exit code (errors raise).

    Plain: the exposition for stdout. ``textfile``: the text is rendered first, then written
    atomically; an error leaves the file as it was and raises (the CLI prints the JSON error on
    stdout only); success is one JSON line with the byte and sample counts.
    """
    ledger = open_ledger()
    try:
        text = metrics_text(ledger, active_grace_seconds=values["grace"],
                            metrics_dir=values.get("metrics_dir"))
        ledger_path = ledger.path
    finally:
        ledger.close()
    if values["textfile"] is None:
        return text, 0
    size = write_textfile(values["textfile"], text, ledger_path=ledger_path)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {"ok": True, "textfile": {"bytes": size, "samples": samples}}, 0


__all__ = ["check_metrics_dir", "check_metrics_options", "metrics_text", "run_metrics"]
