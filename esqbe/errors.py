"""esqbe's errors: one hierarchy (issue 21 completes it: exit and HTTP status declared per class)."""
from __future__ import annotations


class BackendError(RuntimeError):
    """A backend cannot do what was asked (unreachable engine, missing index, bad state)."""


class StorageError(BackendError):
    """The index cannot be read or written (disk full, read-only, I/O error); `.report` says what a run
    had committed before it (an IndexReport), when there was a run."""


class ModelMismatchError(BackendError):
    """The index was built with another encoder than the one asked to query or extend it."""
