"""The embedded backend: one directory on disk (SQLite + vector file + tantivy + faiss)."""
from .backend import EmbeddedBackend

__all__ = ["EmbeddedBackend"]
