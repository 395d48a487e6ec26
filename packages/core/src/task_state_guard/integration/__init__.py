"""The integration layer adapters are built on (standard library only).

An adapter translates its framework's signals, middleware hooks or callbacks into calls on an
:class:`AdapterRuntime`; the runtime owns the ledger handle per process, heartbeats, attempts
(each claim described by one :class:`AttemptSpec`), the error policy, delivery marks, lost-job
verdicts, reconcile and counters. :func:`resolve_settings` gives every adapter the
same settings, :class:`IdScheme` and :func:`name_label` the same id and label rules (each
shipped adapter's namespace is defined once, in :mod:`~task_state_guard.integration.ids`;
:func:`find_job` finds a job by its framework id, :func:`find_any` a task by its ledger id or
any framework's job id), and
:mod:`~task_state_guard.integration.codes` names the states and reason codes. See
``docs/architecture.md`` ("Writing an adapter").
"""

from ..ops.verdicts import Verdict
from . import codes
from .errors import ErrorPolicy
from .ids import FRAMEWORKS, IdScheme, job_task_id, name_label
from .lookup import find_any, find_job
from .metrics import format_adapter_metrics
from .runtime import AdapterRuntime, AttemptSpec, Closing, LostHook, LostTask, SuccessCheck
from .settings import ConfigurationError, SettingArgs, Settings, env_name, resolve_settings
from .surface import AdapterSurface

__all__ = [
    "FRAMEWORKS",
    "AdapterRuntime",
    "AdapterSurface",
    "AttemptSpec",
    "Closing",
    "ConfigurationError",
    "ErrorPolicy",
    "IdScheme",
    "LostHook",
    "LostTask",
    "SettingArgs",
    "Settings",
    "SuccessCheck",
    "Verdict",
    "codes",
    "env_name",
    "find_any",
    "find_job",
    "format_adapter_metrics",
    "job_task_id",
    "name_label",
    "resolve_settings",
]
