"""The store seam: the protocol every ledger backend provides, the step specs it receives, the
query definitions both backends share, and the backend registry.
"""
