"""The `tsg` command line, its text renderings and the reasons' help texts.
"""

from .commands import main

__all__ = ["main"]
