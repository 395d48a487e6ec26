"""The ledger's operations over many tasks: reconcile, prune, doctor, the verdict outbox, status,
outcome history, event reads and the operator's task listings.
"""
