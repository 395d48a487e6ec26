"""Prometheus text: the ledger's families, the exposition `tsg metrics` and `/metrics` print,
and the adapters' summed counters.
"""
