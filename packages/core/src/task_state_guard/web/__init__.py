"""`tsg serve`: the read-only web view and `/metrics`, and the server that runs them.
"""
