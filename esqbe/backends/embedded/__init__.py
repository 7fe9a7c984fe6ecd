"""The embedded backend: one directory on disk (SQLite + vector file + tantivy + faiss)."""
