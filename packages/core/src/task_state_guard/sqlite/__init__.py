"""The SQLite backend: the ledger in one local file (``Ledger(path)``).

``database`` (the database object: connections, transactions, the clock, owner liveness;
``open_database``, which the backend registry calls), ``schema`` (the layouts, their exact
fingerprints and migrations), ``storage`` (path and permission safety), ``connections``
(opening connections, read modes, error mapping), ``owners`` (owner liveness through lock
files), ``queries`` (the aggregates' reads and a pass's writes in SQLite's SQL), ``doctor``
(its probes) and ``attempts`` (begin and end attempt). The PostgreSQL backend
(``task_state_guard_postgres``) mirrors this layout.
"""
