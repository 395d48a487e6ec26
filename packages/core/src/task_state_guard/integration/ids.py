"""Id and name-label rules shared by every adapter.

* A framework job (Celery task id, Dramatiq message id, LangGraph invocation id) maps to its
  logical task with ``uuid5(namespace, prefix + framework id)``: deterministic, so any process
  (a producer, a web handler, an operator) finds the same ledger task. Each adapter owns one
  namespace and never changes it, or existing ledgers would no longer find their tasks.
* The namespaces and prefixes of the shipped adapters are defined here, once
  (:data:`CELERY`, :data:`DRAMATIQ`, :data:`LANGGRAPH`, in :data:`FRAMEWORKS`): the adapters
  derive their ids from these objects, and :func:`job_task_id` lets an operator's tool (the
  CLI's ``--celery``/``--dramatiq``/``--langgraph``) find a job by the id the operator has.
* A framework name (task, actor, graph or node name) becomes a ledger name label: characters
  outside ``[A-Za-z0-9_.:/<>-]`` become ``_``, a first character outside ``[A-Za-z0-9_<]`` gets a
  ``_`` prefix, and the label is cut to 200 characters. A name with nothing left has no label.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from ..model import InvalidInput

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:\-/<>]")
_NAME_FIRST = re.compile(r"[A-Za-z0-9_<]")
_NAME_MAX = 200
# The version (5) and variant (RFC 4122) bits of a name-based SHA-1 UUID, as uuid.UUID sets them.
_UUID5_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID5_SET = (0x5000 << 64) | (0x8000 << 48)


class IdScheme:
    """The deterministic ids of one framework: ``uuid5(namespace, prefix + framework id)``.

    The ids are exactly ``str(uuid.uuid5(...))``, computed from a SHA-1 state that has already
    hashed the namespace: ``uuid.uuid5`` builds a new OpenSSL SHA-1 each call, which costs
    ~4x more than copying one, and far more in a worker between jobs (cold caches).
    """

    __slots__ = ("_seed", "namespace", "prefix")

    def __init__(self, namespace: uuid.UUID, prefix: str = "") -> None:
        self.namespace = namespace
        self.prefix = prefix
        self._seed = hashlib.sha1(namespace.bytes, usedforsecurity=False)

    def _uuid5(self, text: str) -> str:
        h = self._seed.copy()
        h.update(text.encode("utf-8"))  # UnicodeEncodeError for a lone surrogate, as uuid5
        n = int.from_bytes(h.digest()[:16], "big") & _UUID5_CLEAR | _UUID5_SET
        x = f"{n:032x}"
        return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"

    def logical_task_id(self, framework_id: str) -> str:
        """The ledger id of the logical task of ``framework_id`` (a non-empty string)."""
        if not isinstance(framework_id, str) or not framework_id:
            raise InvalidInput("the framework id must be a non-empty string")
        try:
            return self._uuid5(self.prefix + framework_id)
        except UnicodeEncodeError:  # a lone surrogate: no framework can have sent that id
            raise InvalidInput("the framework id is not valid text") from None

    def derived_id(self, text: str) -> str:
        """A further deterministic id in this namespace (attempt placeholders and the like)."""
        return self._uuid5(text)


#: Celery: ``uuid5(CELERY.namespace, "celery-task:" + task id)``.
CELERY = IdScheme(uuid.UUID("5b0c0e52-7c8f-5d0e-9a51-0c3e1a7a4c11"), "celery-task:")
#: Dramatiq: ``uuid5(DRAMATIQ.namespace, message id)``.
DRAMATIQ = IdScheme(uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:message"))
#: Dramatiq's expected attempt ids: ``uuid5(DRAMATIQ_ATTEMPTS.namespace, "<message id>/<n>")``.
DRAMATIQ_ATTEMPTS = IdScheme(
    uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:attempt"))
#: LangGraph: ``uuid5(LANGGRAPH.namespace, invocation id)`` (its node attempts and recovery
#: invocation ids are derived in the same namespace).
LANGGRAPH = IdScheme(uuid.UUID("6f0c3b8e-4a57-5d7e-9a51-2b7f1c0e8d42"))

def langgraph_recovery_id(lost_task_id: str) -> str:
    """The invocation id of the LangGraph run that recovers the run whose ledger id is
    ``lost_task_id`` (deterministic: two processes recovering at once race on one ledger
    task, and the web view tells a recovery run from another continuation by it)."""
    return "recover-" + uuid.uuid5(LANGGRAPH.namespace, f"recover|{lost_task_id}").hex


#: The job id scheme of each shipped adapter, by framework name. Never change one: existing
#: ledgers would no longer find their jobs.
FRAMEWORKS: Mapping[str, IdScheme] = MappingProxyType(
    {"celery": CELERY, "dramatiq": DRAMATIQ, "langgraph": LANGGRAPH})


def job_task_id(framework: str, framework_id: str) -> str:
    """The ledger id of the job (logical task) a framework knows as ``framework_id``.

    ``framework`` is ``"celery"`` (a task id), ``"dramatiq"`` (a message id) or
    ``"langgraph"`` (an invocation id; a recovery run's is ``"recover-..."``). Any id works,
    custom ones included: the ledger id is computed, nothing is looked up or stored. An unknown
    framework or an empty id is an :class:`~task_state_guard.InvalidInput` that does not
    repeat the value.
    """
    scheme = FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if scheme is None:
        raise InvalidInput("unknown framework: use one of " + ", ".join(FRAMEWORKS))
    return scheme.logical_task_id(framework_id)


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


__all__ = [
    "CELERY",
    "DRAMATIQ",
    "DRAMATIQ_ATTEMPTS",
    "FRAMEWORKS",
    "LANGGRAPH",
    "IdScheme",
    "job_task_id",
    "langgraph_recovery_id",
    "name_label",
]
