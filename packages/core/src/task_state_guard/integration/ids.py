"""Id and name-label rules shared by every adapter.

* A framework job (Celery task id, Dramatiq message id, LangGraph invocation id) maps to its
  logical task with ``uuid5(namespace, prefix + framework id)``: deterministic, so any process
  (a producer, a web handler, an operator) finds the same ledger task. Each adapter owns one
  namespace and never changes it, or existing ledgers would no longer find their tasks.
* A framework name (task, actor, graph or node name) becomes a ledger name label: characters
  outside ``[A-Za-z0-9_.:/<>-]`` become ``_``, a first character outside ``[A-Za-z0-9_<]`` gets a
  ``_`` prefix, and the label is cut to 200 characters. A name with nothing left has no label.
"""

from __future__ import annotations

import re
import uuid
from functools import lru_cache

from ..model import InvalidInput

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:\-/<>]")
_NAME_FIRST = re.compile(r"[A-Za-z0-9_<]")
_NAME_MAX = 200


class IdScheme:
    """The deterministic ids of one framework: ``uuid5(namespace, prefix + framework id)``."""

    __slots__ = ("namespace", "prefix")

    def __init__(self, namespace: uuid.UUID, prefix: str = "") -> None:
        self.namespace = namespace
        self.prefix = prefix

    def logical_task_id(self, framework_id: str) -> str:
        """The ledger id of the logical task of ``framework_id`` (a non-empty string)."""
        if not isinstance(framework_id, str) or not framework_id:
            raise InvalidInput("the framework id must be a non-empty string")
        return str(uuid.uuid5(self.namespace, self.prefix + framework_id))

    def derived_id(self, text: str) -> str:
        """A further deterministic id in this namespace (attempt placeholders and the like)."""
        return str(uuid.uuid5(self.namespace, text))


def _label(name: str) -> str | None:
    label = _NAME_BAD.sub("_", name)
    if not _NAME_FIRST.match(label):
        label = "_" + label
    return label[:_NAME_MAX] or None


_cached_label = lru_cache(maxsize=4096)(_label)


def name_label(name: object) -> str | None:
    """The ledger name label of a framework name (see the module docstring); cached."""
    if not isinstance(name, str) or not name:
        return None
    return _cached_label(name)


__all__ = ["IdScheme", "name_label"]
