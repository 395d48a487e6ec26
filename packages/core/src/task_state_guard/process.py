"""This process's id, kept without a system call per read.

``os.getpid()`` is a system call on every read (glibc no longer caches it). The ledger's hot
paths compare a stored pid with this process's on every job (a connection, the adapter
runtime's per-process state, the owner token) to notice a ``fork()``: they read
:data:`THIS` instead, which the child refreshes at fork (``os.register_at_fork``), before
any other code of the child runs.
"""

from __future__ import annotations

import os


class _This:
    """This process: ``pid`` is refreshed in a child created by ``os.fork()``."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def refresh(self) -> None:
        self.pid = os.getpid()


#: This process (``THIS.pid``: its id, as ``os.getpid()`` would answer).
THIS = _This()
os.register_at_fork(after_in_child=THIS.refresh)

__all__ = ["THIS"]
