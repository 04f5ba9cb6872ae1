"""The one error a user can cause in running a sweep beyond its preset (whose mistakes are ConfigErrors).
Its own module, free of Optuna, so the command line can catch it without loading Optuna."""
from __future__ import annotations


class SweepError(ValueError):
    """A sweep that cannot run as asked: no [sweep] section, a storage that cannot hold it, a folder that
    is no sweep's. str() is one line naming the file or folder and the fix (exit code 2)."""
