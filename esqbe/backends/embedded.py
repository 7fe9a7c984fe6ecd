"""The embedded backend: one directory, no server.

- `papers.sqlite`: the source of truth (papers, per-sentence facets, sentence vectors, corpus
  token counts), written in one transaction per batch, so a killed run opens at its last commit.
- `text/`: a tantivy inverted index (BM25 over title + abstract, plus one field per facet).
  It is derived from SQLite: papers not yet in it are marked `text_indexed = 0` and synced on
  the next write or open, so a crash between the two stores heals itself.
- sentence kNN: exact (numpy over the facet's sentences) up to `exact_threshold` sentences,
  faiss HNSW above it, with the facet as a faiss ID selector; the ANN index is cached on disk
  per generation.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..fusion import fuse, top_k
from ..papers import FACET_LABELS, Paper
from .base import (
    Backend,
    BackendError,
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    IndexMeta,
    UpsertResult,
)

FORMAT_VERSION = 1
EXACT_THRESHOLD = 200_000
_FACET_CODES = {f: i for i, f in enumerate(FACET_LABELS)}
_QUERY_SYNTAX = re.compile(r"[^\w\s]+", re.UNICODE)


class EmbeddedBackend(Backend):
    """A local index directory (see module docstring)."""

    name = "embedded"
    facet_text = True

    def __init__(self, path: str | os.PathLike, *, exact_threshold: int = EXACT_THRESHOLD, create: bool = True):
        self.path = Path(path)
        self.exact_threshold = exact_threshold
        if not self.path.exists():
            if not create:
                raise BackendError(f"no index at {self.path} (run `esqbe index` first)")
            self.path.mkdir(parents=True)
        elif not self.path.is_dir():
            raise BackendError(f"{self.path} exists and is not an index directory")
        self._db = sqlite3.connect(self.path / "papers.sqlite", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS papers (
                paper_id TEXT PRIMARY KEY, title TEXT NOT NULL, sentences TEXT NOT NULL, facets TEXT NOT NULL,
                metadata TEXT NOT NULL, content_hash TEXT NOT NULL, vectors BLOB NOT NULL,
                token_counts TEXT, text_indexed INTEGER NOT NULL DEFAULT 0);
            CREATE INDEX IF NOT EXISTS papers_pending ON papers(text_indexed) WHERE text_indexed = 0;
            CREATE TABLE IF NOT EXISTS text_deletes (paper_id TEXT PRIMARY KEY);
            CREATE TABLE IF NOT EXISTS token_counts (token TEXT PRIMARY KEY, count INTEGER NOT NULL);
            """
        )
        self._text_index = None
        self._kn = None  # in-memory sentence matrix, rebuilt when the generation changes
        self._sync_text()

    # --- metadata -------------------------------------------------------------------------------
    def _setting(self, key: str, default=None):
        row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def _generation(self) -> int:
        return int(self._setting("generation", 0))

    def meta(self) -> IndexMeta | None:
        d = self._setting("meta")
        return IndexMeta.from_dict(d) if d else None

    def ensure(self, meta: IndexMeta) -> None:
        existing = self.meta()
        if existing is not None:
            existing.check(meta)
            return
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO settings VALUES ('meta', ?)", (json.dumps(meta.to_dict()),))
            self._db.execute("INSERT OR REPLACE INTO settings VALUES ('format_version', ?)", (json.dumps(FORMAT_VERSION),))

    def _tx(self):
        db = self._db

        class _Tx:
            def __enter__(self_inner):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, *rest):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return _Tx()

    def _bump_generation(self) -> None:
        self._db.execute(
            "INSERT INTO settings VALUES ('generation', '1') ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )

    # --- text index (tantivy) ---------------------------------------------------------------------
    @property
    def text_index(self):
        if self._text_index is None:
            import tantivy

            sb = tantivy.SchemaBuilder()
            sb.add_text_field("paper_id", stored=True, tokenizer_name="raw")
            for f in ("title", "abstract", *(f"facet_{x}" for x in FACET_LABELS)):
                sb.add_text_field(f, tokenizer_name="en_stem")
            (self.path / "text").mkdir(exist_ok=True)
            self._text_index = tantivy.Index(sb.build(), path=str(self.path / "text"), reuse=True)
        return self._text_index

    def _sync_text(self) -> None:
        """Bring the tantivy index up to SQLite: delete removed papers, (re)add pending ones."""
        deletes = [r[0] for r in self._db.execute("SELECT paper_id FROM text_deletes")]
        pending = self._db.execute(
            "SELECT paper_id, title, sentences, facets FROM papers WHERE text_indexed = 0"
        ).fetchall()
        if not deletes and not pending:
            return
        import tantivy

        writer = self.text_index.writer(heap_size=50_000_000, num_threads=1)
        try:
            for pid in deletes:
                writer.delete_documents_by_term("paper_id", pid)
            for pid, title, sentences, facets in pending:
                writer.delete_documents_by_term("paper_id", pid)
                sentences, facets = json.loads(sentences), json.loads(facets)
                fields = {"paper_id": pid, "title": title, "abstract": " ".join(sentences)}
                for label in FACET_LABELS:
                    text = " ".join(s for s, f in zip(sentences, facets) if f == label)
                    if text:
                        fields[f"facet_{label}"] = text
                writer.add_document(tantivy.Document(**fields))
            writer.commit()
            writer.wait_merging_threads()
        finally:
            del writer
        with self._tx():
            self._db.executemany("DELETE FROM text_deletes WHERE paper_id = ?", [(p,) for p in deletes])
            self._db.executemany("UPDATE papers SET text_indexed = 1 WHERE paper_id = ?", [(p[0],) for p in pending])
        self.text_index.reload()

    # --- writes ---------------------------------------------------------------------------------
    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        out = {}
        for chunk in _chunks(ids, 500):
            q = f"SELECT paper_id, content_hash FROM papers WHERE paper_id IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._db.execute(q, chunk).fetchall()))
        return out

    def upsert(self, papers: Sequence[IndexedPaper]) -> UpsertResult:
        meta = self.meta()
        if meta is None:
            raise BackendError("index has no encoder metadata; call ensure(meta) before writing")
        result = UpsertResult()
        delta: Counter = Counter()
        with self._tx():
            for ip in papers:
                p = ip.paper
                if ip.vectors.shape[1] != meta.dim:
                    raise BackendError(f"paper {p.paper_id}: vectors are {ip.vectors.shape[1]}-d, index is {meta.dim}-d")
                h = p.content_hash()
                row = self._db.execute("SELECT content_hash, token_counts FROM papers WHERE paper_id = ?", (p.paper_id,)).fetchone()
                if row and row[0] == h:
                    result.unchanged += 1
                    continue
                if row:
                    result.replaced += 1
                    delta.subtract(json.loads(row[1] or "{}"))
                else:
                    result.added += 1
                delta.update(ip.token_counts or {})
                self._db.execute(
                    "INSERT OR REPLACE INTO papers VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                    (
                        p.paper_id, p.title, json.dumps(p.sentences, ensure_ascii=False), json.dumps(p.facets),
                        json.dumps(p.metadata, ensure_ascii=False), h, ip.vectors.astype(np.float32).tobytes(),
                        json.dumps(ip.token_counts) if ip.token_counts is not None else None,
                    ),
                )
            self._apply_token_delta(delta)
            if result.added or result.replaced:
                self._bump_generation()
        self._sync_text()
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
        found = 0
        delta: Counter = Counter()
        with self._tx():
            for pid in ids:
                row = self._db.execute("SELECT token_counts FROM papers WHERE paper_id = ?", (pid,)).fetchone()
                if not row:
                    continue
                found += 1
                delta.subtract(json.loads(row[0] or "{}"))
                self._db.execute("DELETE FROM papers WHERE paper_id = ?", (pid,))
                self._db.execute("INSERT OR IGNORE INTO text_deletes VALUES (?)", (pid,))
            self._apply_token_delta(delta)
            if found:
                self._bump_generation()
        self._sync_text()
        return found

    # --- reads ----------------------------------------------------------------------------------
    def get(self, paper_ids: Sequence[str]) -> dict[str, IndexedPaper]:
        meta = self.meta()
        out = {}
        for chunk in _chunks(list(dict.fromkeys(map(str, paper_ids))), 500):
            q = (
                "SELECT paper_id, title, sentences, facets, metadata, vectors FROM papers "
                f"WHERE paper_id IN ({','.join('?' * len(chunk))})"
            )
            for pid, title, sentences, facets, metadata, blob in self._db.execute(q, chunk):
                vectors = np.frombuffer(blob, dtype=np.float32).reshape(-1, meta.dim)
                paper = Paper(pid, title, json.loads(sentences), json.loads(facets), json.loads(metadata))
                out[pid] = IndexedPaper(paper, vectors)
        return out

    def token_counts(self) -> tuple[dict[str, int], int] | None:
        counts = dict(self._db.execute("SELECT token, count FROM token_counts"))
        return counts, int(sum(counts.values()))

    def stats(self) -> dict:
        meta = self.meta()
        papers = self._db.execute("SELECT COUNT(*) FROM papers").fetchone()[0]
        facets: Counter = Counter()
        for (f,) in self._db.execute("SELECT facets FROM papers"):
            facets.update(json.loads(f))
        size = sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
        return {
            "backend": self.name,
            "path": str(self.path),
            "papers": papers,
            "sentences": int(sum(facets.values())),
            "sentences_by_facet": dict(sorted(facets.items())),
            "model": meta.model if meta else None,
            "dim": meta.dim if meta else None,
            "encoder_mode": meta.encoder_mode if meta else None,
            "knn": "exact" if sum(facets.values()) <= self.exact_threshold else "faiss-hnsw",
            "bytes_on_disk": size,
        }

    # --- first stage ----------------------------------------------------------------------------
    def bm25(self, text: str, k: int, *, exclude: frozenset[str] = frozenset(), restrict_to: frozenset[str] | None = None,
             fields: Sequence[str] = ("title", "abstract")) -> dict[str, float]:
        """BM25 of the query text against the given fields; returns paper id -> score."""
        import tantivy

        words = _QUERY_SYNTAX.sub(" ", text).lower().split()
        if not words or k <= 0:
            return {}
        index = self.text_index
        query = index.parse_query(" ".join(words), list(fields))
        clauses = [(tantivy.Occur.Must, query)]
        if restrict_to is not None:
            clauses.append((tantivy.Occur.Must, tantivy.Query.term_set_query(index.schema, "paper_id", sorted(restrict_to))))
        for pid in exclude:
            clauses.append((tantivy.Occur.MustNot, tantivy.Query.term_query(index.schema, "paper_id", pid)))
        searcher = index.searcher()
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit=k, count=False).hits
        return {searcher.doc(addr)["paper_id"][0]: float(score) for score, addr in hits}

    def _sentence_matrix(self):
        """All sentence vectors in one matrix, with each row's paper and facet; rebuilt per generation."""
        gen = self._generation()
        if self._kn is not None and self._kn["generation"] == gen:
            return self._kn
        meta = self.meta()
        ids, vecs, paper_of, facet_of = [], [], [], []
        for pid, facets, blob in self._db.execute("SELECT paper_id, facets, vectors FROM papers ORDER BY paper_id"):
            labels = json.loads(facets)
            vecs.append(np.frombuffer(blob, dtype=np.float32).reshape(-1, meta.dim))
            paper_of.extend([len(ids)] * len(labels))
            facet_of.extend(_FACET_CODES.get(f, _FACET_CODES["unlabeled"]) for f in labels)
            ids.append(pid)
        matrix = np.vstack(vecs) if vecs else np.zeros((0, meta.dim if meta else 1), dtype=np.float32)
        self._kn = {
            "generation": gen,
            "ids": ids,
            "index_of": {p: i for i, p in enumerate(ids)},
            "matrix": np.ascontiguousarray(matrix),
            "paper_of": np.asarray(paper_of, dtype=np.int64),
            "facet_of": np.asarray(facet_of, dtype=np.int8),
            "ann": None,
        }
        return self._kn

    def _ann(self, kn):
        """faiss HNSW over every sentence (inner product = cosine on unit vectors), cached on disk per generation."""
        import faiss

        if kn["ann"] is not None:
            return kn["ann"]
        cache = self.path / f"ann-{kn['generation']}.faiss"
        if cache.exists():
            index = faiss.read_index(str(cache))
        else:
            index = faiss.IndexHNSWFlat(kn["matrix"].shape[1], 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 80
            index.add(kn["matrix"])
            tmp = cache.with_suffix(".tmp")
            faiss.write_index(index, str(tmp))
            os.replace(tmp, cache)
            for old in self.path.glob("ann-*.faiss"):
                if old != cache:
                    old.unlink(missing_ok=True)
        kn["ann"] = index
        return index

    def knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None, exclude: frozenset[str] = frozenset(),
            restrict_to: frozenset[str] | None = None) -> dict[str, float]:
        """Per query sentence, the k most similar candidate sentences (of `facet`, if given), grouped by paper.

        Returns paper id -> mean over query sentences of the best cosine found (0 where a query
        sentence did not reach the paper), the engines' nested-kNN score model.
        """
        kn = self._sentence_matrix()
        if len(kn["ids"]) == 0 or k <= 0 or len(vectors) == 0:
            return {}
        q = np.asarray(vectors, dtype=np.float32)
        rows = np.ones(len(kn["paper_of"]), dtype=bool)
        if facet is not None:
            rows &= kn["facet_of"] == _FACET_CODES[facet]
        if restrict_to is not None:
            allowed = np.zeros(len(kn["ids"]), dtype=bool)
            allowed[[kn["index_of"][p] for p in restrict_to if p in kn["index_of"]]] = True
            rows &= allowed[kn["paper_of"]]
        if exclude:
            banned = np.zeros(len(kn["ids"]), dtype=bool)
            banned[[kn["index_of"][p] for p in exclude if p in kn["index_of"]]] = True
            rows &= ~banned[kn["paper_of"]]
        selected = np.flatnonzero(rows)
        if selected.size == 0:
            return {}
        if selected.size <= self.exact_threshold or restrict_to is not None:
            sims = kn["matrix"][selected] @ q.T  # (S', m)
            papers = kn["paper_of"][selected]
            # best sentence per (paper, query sentence): sentences of a paper are contiguous rows
            starts = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
            best = np.maximum.reduceat(sims, starts, axis=0)  # (P', m)
            paper_idx = papers[starts]
            total = np.zeros(len(paper_idx))
            hit = np.zeros(len(paper_idx), dtype=bool)
            kk = min(k, len(paper_idx))
            for j in range(q.shape[0]):
                top = np.argpartition(-best[:, j], kk - 1)[:kk]
                total[top] += best[top, j]
                hit[top] = True
            return {kn["ids"][p]: float(s) / q.shape[0] for p, s in zip(paper_idx[hit], total[hit])}
        import faiss

        index = self._ann(kn)
        params = faiss.SearchParametersHNSW(sel=faiss.IDSelectorBatch(selected.astype(np.int64)), efSearch=max(4 * k, 64))
        sims, ids = index.search(q, 4 * k, params=params)
        total: dict[int, float] = {}
        for j in range(q.shape[0]):
            best: dict[int, float] = {}
            for s, i in zip(sims[j], ids[j]):
                if i < 0:
                    continue
                p = int(kn["paper_of"][i])
                if p not in best or s > best[p]:
                    best[p] = float(s)
            for p, s in sorted(best.items(), key=lambda kv: -kv[1])[:k]:
                total[p] = total.get(p, 0.0) + s
        return {kn["ids"][p]: s / q.shape[0] for p, s in total.items()}

    def first_stage(self, request: FirstStageRequest) -> list[Candidate]:
        fields = (f"facet_{request.bm25_facet}",) if request.bm25_facet else ("title", "abstract")
        bm25 = self.bm25(request.text, request.bm25_k, exclude=request.exclude, restrict_to=request.restrict_to, fields=fields)
        knn = self.knn(request.vectors, request.knn_k, facet=request.facet, exclude=request.exclude,
                       restrict_to=request.restrict_to)
        fused = top_k(fuse(bm25, knn, request.fusion, request.bm25_weight), request.k)
        papers = self.get([pid for pid, _ in fused]) if request.with_papers else {}
        return [Candidate(pid, score, bm25.get(pid, 0.0), knn.get(pid, 0.0), papers.get(pid)) for pid, score in fused]

    def close(self) -> None:
        self._text_index = None
        self._kn = None
        if self._db is not None:
            self._db.close()
            self._db = None


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i : i + n]
