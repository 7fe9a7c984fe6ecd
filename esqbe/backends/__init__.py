"""Backends behind one interface (`esqbe.backends.base.Backend`)."""
from ..domain import Candidate, FirstStageRequest, IndexedPaper, IndexMeta, UpsertResult
from ..errors import BackendError, ModelMismatchError
from .base import Backend
