"""Writes to the embedded index: papers upserted (rows appended and made durable, then SQLite committed; a
replaced or deleted version retired to `dead`), the corpus token counts kept in step, the text index synced."""
from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from ...domain import IndexedPaper, UpsertResult, paper_problem
from ...errors import BackendError
from .host import EmbeddedHost
from .layout import _FACET_CODES, VECTOR_DTYPE, _chunks


class WritesMixin(EmbeddedHost):
    """upsert / delete (mixed into EmbeddedBackend). Uses the backend's `meta`, `_setting`, `_set`,
    `_acquire_write`, `_tx`, `_bump_generation` (WriteLockMixin) and `_sync_text` (TextIndexMixin)."""

    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        out = {}
        for chunk in _chunks(ids, 500):
            q = f"SELECT paper_id, content_hash FROM papers WHERE paper_id IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._db.execute(q, chunk).fetchall()))
        return out

    def update_sources(self, sources: dict[str, list[dict]]) -> int:
        """Each paper's `sources` set in its stored metadata where they differ: one SQLite transaction; vectors, token
        counts and the text index are not touched."""
        rows = [(json.dumps(v, ensure_ascii=False, allow_nan=False), k) for k, v in sources.items()]
        if not rows:
            return 0
        self._acquire_write()
        with self._tx():
            before = self._db.total_changes
            self._db.executemany(
                "UPDATE papers SET metadata = json_set(metadata, '$.sources', json(?1)) WHERE paper_id = ?2 "
                "AND coalesce(json(json_extract(metadata, '$.sources')), '') != json(?1)", rows)
            changed = self._db.total_changes - before
            if changed:
                self._bump_generation()  # a reader's cached metadata (filters) is read again
        return changed

    def _append_rows(self, start: int, vectors: np.ndarray, pnos: np.ndarray, facets: np.ndarray) -> None:
        """Write rows at `start` (the committed row count) and make them durable before SQLite commits."""
        if self._files is None:
            self._files = {name: os.open(self.path / name, os.O_RDWR | os.O_CREAT, 0o644)
                           for name in ("vectors.f16", "rows.pno", "rows.facet")}
        for name, arr in (("vectors.f16", vectors.astype(VECTOR_DTYPE)), ("rows.pno", pnos.astype(np.int32)),
                          ("rows.facet", facets.astype(np.int8))):
            fd = self._files[name]
            width = arr.itemsize * (arr.shape[1] if arr.ndim == 2 else 1)
            os.ftruncate(fd, start * width)
            data = memoryview(np.ascontiguousarray(arr).tobytes())
            offset = start * width
            while data:
                n = os.pwrite(fd, data, offset)
                data, offset = data[n:], offset + n
            os.fsync(fd)

    def upsert(self, papers: Sequence[IndexedPaper]) -> UpsertResult:
        meta = self.meta()
        if meta is None:
            raise BackendError("index has no encoder metadata; call ensure(meta) before writing")
        self._acquire_write()
        result = UpsertResult()
        delta: Counter = Counter()
        vecs, pnos, facets = [], [], []
        latest = {ip.paper_id: ip for ip in papers}  # the same id twice in one batch: the last one wins
        result.replaced += len(papers) - len(latest)
        papers = []
        for ip in latest.values():  # what reaches SQLite is what the text index and the filters can take
            problem = paper_problem(ip.paper)
            if problem:
                result.errors.append(f"{ip.paper_id}: {problem[0]}: {problem[1]} (not stored)")
            else:
                papers.append(ip)
        with self._tx():
            rows = start = int(self._setting("rows", 0))
            next_pno = int(self._setting("next_pno", 0))
            inserts, retired = [], []
            for ip in papers:
                p = ip.paper
                if ip.vectors.shape[1] != meta.dim:
                    raise BackendError(f"paper {p.paper_id}: vectors are {ip.vectors.shape[1]}-d, index is {meta.dim}-d")
                h = p.content_hash()
                row = self._db.execute(
                    "SELECT content_hash, token_counts, pno, row_start, n_rows FROM papers WHERE paper_id = ?",
                    (p.paper_id,)).fetchone()
                if row and row[0] == h:
                    result.unchanged += 1
                    continue
                if row:
                    result.replaced += 1
                    delta.subtract(json.loads(row[1] or "{}"))
                    retired.append((row[2], row[3], row[4]))
                else:
                    result.added += 1
                delta.update(ip.token_counts or {})
                n = len(p.sentences)
                inserts.append((
                    p.paper_id, next_pno, p.title, json.dumps(p.sentences, ensure_ascii=False), json.dumps(p.facets),
                    json.dumps(p.metadata, ensure_ascii=False, allow_nan=False), h,
                    json.dumps(ip.token_counts) if ip.token_counts is not None else None, rows, n,
                ))
                vecs.append(ip.vectors)
                pnos.append(np.full(n, next_pno, dtype=np.int32))
                facets.append(np.fromiter((_FACET_CODES.get(f, _FACET_CODES["unlabeled"]) for f in p.facets),
                                          dtype=np.int8, count=n))
                next_pno += 1
                rows += n
            if retired:
                self._db.executemany("INSERT OR REPLACE INTO dead VALUES (?, ?, ?)", retired)
            if inserts:
                self._db.executemany("INSERT OR REPLACE INTO papers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)", inserts)
                self._remember_identifiers(papers)  # its DOI / arXiv / PubMed id names it (esqbe.index.merge)
            self._apply_token_delta(delta)
            if rows > start:
                try:
                    self._append_rows(start, np.concatenate(vecs), np.concatenate(pnos), np.concatenate(facets))
                except OSError as e:  # an OSError still, so that the index run words it as any other (disk full, read-only)
                    raise OSError(e.errno, f"cannot write vectors to {self.path}: {e.strerror}") from None
            if inserts or retired:
                self._set("rows", rows)
                self._set("next_pno", next_pno)
                self._bump_generation()
        try:
            self._sync_text()
        except OSError as e:  # the papers are committed (BM25 catches up on the next write): the caller counts them
            e.committed = result  # type: ignore[attr-defined]
            raise
        return result

    def _apply_token_delta(self, delta: Counter) -> None:
        rows = [(t, c) for t, c in delta.items() if c]
        self._db.executemany(
            "INSERT INTO token_counts VALUES (?, ?) ON CONFLICT(token) DO UPDATE SET count = count + excluded.count", rows
        )
        if rows:
            self._db.execute("DELETE FROM token_counts WHERE count <= 0")

    def delete(self, paper_ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        self._acquire_write()
        found = 0
        delta: Counter = Counter()
        with self._tx():
            for pid in ids:
                row = self._db.execute("SELECT token_counts, pno, row_start, n_rows FROM papers WHERE paper_id = ?",
                                       (pid,)).fetchone()
                if not row:
                    continue
                found += 1
                delta.subtract(json.loads(row[0] or "{}"))
                self._db.execute("INSERT OR REPLACE INTO dead VALUES (?, ?, ?)", row[1:])
                self._db.execute("DELETE FROM papers WHERE paper_id = ?", (pid,))
                self._db.execute("DELETE FROM aliases WHERE paper_id = ?", (pid,))  # its identifiers name no paper now
                self._db.execute("INSERT OR IGNORE INTO text_deletes VALUES (?)", (pid,))
            self._apply_token_delta(delta)
            if found:
                self._bump_generation()
        self._sync_text()
        return found
