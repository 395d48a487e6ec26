"""The SQLite backend: the ledger in one local file (``Ledger(path)``).

``database`` (the database object: connections, transactions, the clock, owner probes),
``schema`` (the layouts, their exact fingerprints and migrations), ``storage`` (path and
permission safety), ``connections`` (opening connections, read modes, error mapping) and
``owners`` (owner liveness through lock files). The PostgreSQL backend
(``task_state_guard_postgres``) mirrors this layout.
"""
