"""Backends behind one interface (`esqbe.backends.base.Backend`)."""
from .base import (  # noqa: F401
    Backend,
    BackendError,
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    IndexMeta,
    ModelMismatchError,
    UpsertResult,
)
