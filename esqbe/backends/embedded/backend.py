"""The embedded backend: one directory, no server, sized for a million papers on one machine.

Layout of an index directory (format 2; docs/performance.md says why each choice was made):

- `papers.sqlite` (WAL): the source of truth for papers (title, sentences, facets, metadata, content
  hash, token counts), each with a *paper number* `pno` (allocated in increasing order, a new one
  per stored version) and the range of its sentence rows in the vector files. Retired versions
  (deleted or replaced papers) go to the `dead` table, so they vanish from results at once.
  `settings` holds the encoder metadata, the committed row count, the next paper number, the
  generation (bumped by every commit) and the ANN manifest.
- `vectors.f16` (rows x dim float16), `rows.pno` (int32) and `rows.facet` (int8): append-only,
  memory-mapped sentence rows in paper-number order. A write appends rows at the committed row
  count, fsyncs, then commits SQLite; rows past the committed count (a killed write) are ignored
  by readers and cut off by the next writer.
- `ann/<facet>-<n>.faiss`: per facet, a faiss IVF index (inner-product coarse quantizer trained on
  the facet's vectors, 8-bit scalar-quantized lists, ids = paper numbers) over the facet's rows
  below the row count it was built at; it is memory-mapped by readers. Rows above it (the *delta*:
  fresh writes) are searched exactly. A writer merges the delta into the ANN when it closes and the
  delta is past `merge_threshold` rows (retraining when the facet has doubled since training): the new
  file is written aside and swapped in through the manifest, so a kill at any point leaves the
  last committed manifest, and readers keep the file they have open. Facets smaller than
  `exact_threshold` rows are searched exactly. ANN hits are re-scored exactly (float16 rows).
- `text/`: a tantivy index (BM25 over title + abstract, plus one field per facet), derived from
  SQLite: papers not yet in it are marked `text_indexed = 0` and synced by the next writer (`2`: a stored
  row it cannot take, reported once and left out of BM25, so that it never blocks a later write).

Readers take no lock and write nothing: opening an index never repairs it (a writer does that when
it takes the directory's write lock, `write.lock`), so queries run during a load and on a
read-only directory. A second writer waits for the first, saying so on stderr.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import sys
import time
from collections import Counter
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ...core.filters import MetadataColumns, MetadataFilter
from ...core.fusion import fuse, top_k
from ...domain import (
    FACET_LABELS,
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    IndexMeta,
    Paper,
    UpsertResult,
    paper_problem,
)
from ...errors import BackendError, StorageError
from ..base import Backend, WriteLockBusy

FORMAT_VERSION = 2
VECTOR_DTYPE = np.float16
#: per-index kNN parameters (stored in the index's settings; constructor keywords override them)
KNN_DEFAULTS = {
    "exact_threshold": 20_000,  # a facet with at most this many rows is searched exactly
    "merge_threshold": 20_000,  # a writer folds a facet's delta into its ANN once the delta is past this
    "nprobe": 32,  # IVF lists visited per query sentence
    "oversample": 4,  # ANN sentence hits asked per query sentence, as a multiple of k
    "bm25_max_df": 0.2,  # BM25 query terms in more than this fraction of the documents are dropped; see bm25()
}
#: a BM25 query keeps at least its this many most selective terms, however common they are
BM25_MIN_TERMS = 8
_FACET_CODES = {f: i for i, f in enumerate(FACET_LABELS)}
_QUERY_SYNTAX = re.compile(r"[^\w\s]+", re.UNICODE)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS papers (
    paper_id TEXT PRIMARY KEY, pno INTEGER NOT NULL UNIQUE, title TEXT NOT NULL, sentences TEXT NOT NULL,
    facets TEXT NOT NULL, metadata TEXT NOT NULL, content_hash TEXT NOT NULL, token_counts TEXT,
    row_start INTEGER NOT NULL, n_rows INTEGER NOT NULL, text_indexed INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS papers_pending ON papers(text_indexed) WHERE text_indexed = 0;
CREATE TABLE IF NOT EXISTS dead (pno INTEGER PRIMARY KEY, row_start INTEGER NOT NULL, n_rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS text_deletes (paper_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS token_counts (token TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""


def _flock_within(fd: int, timeout: float) -> bool:
    """Take an exclusive flock on `fd`, trying until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class _State:
    """What a reader sees at one generation: memory-mapped rows, retired papers, ANN files, deltas."""

    def __init__(self, gen: int, rows: int, dim: int, path: Path, dead_pnos: np.ndarray, next_pno: int, manifest: dict):
        self.gen, self.rows, self.dim = gen, rows, dim
        self.next_pno = next_pno
        self.manifest = manifest
        if rows:
            self.vec = np.memmap(path / "vectors.f16", dtype=VECTOR_DTYPE, mode="r", shape=(rows, dim))
            self.pno = np.memmap(path / "rows.pno", dtype=np.int32, mode="r", shape=(rows,))
            self.facet = np.memmap(path / "rows.facet", dtype=np.int8, mode="r", shape=(rows,))
        else:
            self.vec = np.zeros((0, dim), dtype=VECTOR_DTYPE)
            self.pno = np.zeros(0, dtype=np.int32)
            self.facet = np.zeros(0, dtype=np.int8)
        self.dead = np.zeros(max(next_pno, 1), dtype=bool)
        self.dead[dead_pnos[dead_pnos < len(self.dead)]] = True
        self.n_dead = int(self.dead.sum())
        self._ok_bits = None
        self.delta: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}

    def row_ranges(self, pnos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row ranges [start, end) of the given paper numbers (rows are in paper-number order). The
        numbers are cast to the rows' int32 first: searchsorted with int64 keys would convert the
        whole memory-mapped column (7.5M rows at 1M papers) on every call."""
        keys = np.asarray(pnos, dtype=self.pno.dtype)
        return np.searchsorted(self.pno, keys, side="left"), np.searchsorted(self.pno, keys, side="right")

    def ok_bits(self):
        """Bitmap over paper numbers of live papers (for faiss's IDSelectorBitmap), or None if all are live."""
        if self.n_dead == 0:
            return None
        if self._ok_bits is None:
            self._ok_bits = np.packbits(~self.dead, bitorder="little")
        return self._ok_bits


class EmbeddedBackend(Backend):
    """A local index directory (see module docstring)."""

    name = "embedded"
    facet_text = True

    def __init__(self, path: str | os.PathLike, *, exact_threshold: int | None = None, create: bool = True,
                 merge_threshold: int | None = None, nprobe: int | None = None):
        self.path = Path(path)
        self._overrides = {k: v for k, v in (("exact_threshold", exact_threshold), ("merge_threshold", merge_threshold),
                                             ("nprobe", nprobe)) if v is not None}
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._files = None
        self._text_index = None
        self._text_writer = None
        self._text_gen = None
        self._state_cache: _State | None = None
        self._ann_cache: dict[str, tuple[object, bool]] = {}  # ANN file -> (faiss index, read into memory)
        self._vec_fd: int | None = None  # vectors.f16, read with pread by queries (_read_rows)
        self._meta_cols = None  # (generation, MetadataColumns) for filters
        db = self.path / "papers.sqlite"
        if not self.path.exists():
            if not create:
                raise BackendError(f"no index at {self.path} (run `esqbe index` first)")
            try:
                self.path.mkdir(parents=True)
            except OSError as e:
                raise StorageError(f"cannot create the index directory {self.path}: {e.strerror}") from None
        elif not self.path.is_dir():
            raise BackendError(f"{self.path} exists and is not an index directory")
        if not db.exists():
            if not create:
                raise BackendError(f"{self.path} is not an esqbe index (no papers.sqlite); run `esqbe index --path {self.path} FILE` to create one")
            self._acquire_write()  # creates the schema
        else:
            self._open_reader()
        version = self._setting("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise BackendError(f"{self.path} is an esqbe index of format {version}; this esqbe reads format {FORMAT_VERSION}: "
                               "re-index into a new path")

    # --- connections and the write lock ---------------------------------------------------------
    def _open_reader(self) -> None:
        db = self.path / "papers.sqlite"
        uri = f"file:{db}?mode=ro"
        if not os.access(self.path, os.W_OK):
            wal = self.path / "papers.sqlite-wal"
            if not wal.exists() or wal.stat().st_size == 0:
                uri += "&immutable=1"  # nobody can write here, and SQLite could not create its shared-memory file
        try:
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute("SELECT 1 FROM settings LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot read the index at {self.path}: {e}") from None

    @property
    def writable(self) -> bool:
        return self._lock_fd is not None

    def begin_write(self, timeout: float | None = None) -> None:
        """Take the write lock now, waiting at most `timeout` seconds for another writer (None: as long as
        it takes), else WriteLockBusy naming the holder's pid: what a server that must answer does
        before a write (`end_write` gives the lock back)."""
        self._acquire_write(timeout)

    def _acquire_write(self, timeout: float | None = None) -> None:
        """Take the directory's write lock (waiting for another writer, with a message), then repair:
        cut rows past the last commit, drop half-written ANN files, bring the text index up to SQLite."""
        if self._lock_fd is not None:
            return
        lock = self.path / "write.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(f"cannot write to the index at {self.path}: {e.strerror} (a read-only index can be queried, not changed)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if timeout is None:
                print(f"esqbe: another process (pid {holder}) is writing to {self.path}; waiting for it to finish...",
                      file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            elif not _flock_within(fd, timeout):
                os.close(fd)
                raise WriteLockBusy(f"another writer (pid {holder}) has held the write lock of {self.path} for over "
                                    f"{timeout:g}s", holder=holder)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        try:
            if self._db is not None:
                self._db.close()
            self._db = sqlite3.connect(self.path / "papers.sqlite", isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 10000")
            if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            fresh = not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'settings'").fetchone()
            self._db.executescript(_SCHEMA)
            if fresh:
                self._db.execute("INSERT OR IGNORE INTO settings VALUES ('format_version', ?)", (json.dumps(FORMAT_VERSION),))
            self._recover()
        except sqlite3.OperationalError as e:
            self._release_write()
            raise StorageError(f"cannot write to the index at {self.path}: {e}") from None

    def _release_write(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def end_write(self) -> None:
        """End this handle's write session and give the write lock back, staying open for reading: what
        `close` does for a writer (fold a due delta into the IVF, flush the text index, checkpoint), minus
        the closing. A long-lived process that writes now and then (`esqbe serve`) calls it after each
        write, so another writer (`esqbe index`, a second server) is not blocked while it idles; the next
        write takes the lock again (and repairs, as every writer does)."""
        if not self.writable:
            return
        try:
            self._finish_write()
        finally:
            self._close_files()
            self._db.close()
            self._db = None
            self._release_write()
            self._open_reader()

    def _finish_write(self) -> None:
        """A writer's last steps: fold a due delta into its IVF, finish the text index, checkpoint."""
        try:
            self.optimize()
        finally:
            if self._text_writer is not None:
                self._text_writer.wait_merging_threads()
                self._text_writer = None
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _close_files(self) -> None:
        if self._files:
            for fd in self._files.values():
                os.close(fd)
            self._files = None
        if self._vec_fd is not None:
            os.close(self._vec_fd)
            self._vec_fd = None

    def _recover(self) -> None:
        """Writer-side repair after a crash: vector files back to the committed row count, stray ANN
        files removed, text index synced."""
        meta = self.meta()
        rows = int(self._setting("rows", 0))
        dim = meta.dim if meta else 0
        for name, width in (("vectors.f16", dim * np.dtype(VECTOR_DTYPE).itemsize), ("rows.pno", 4), ("rows.facet", 1)):
            f = self.path / name
            if f.exists() and width and f.stat().st_size != rows * width:
                os.truncate(f, rows * width)
        keep = {v["file"] for v in self._setting("ann", {}).values()}
        ann_dir = self.path / "ann"
        if ann_dir.exists():
            for f in ann_dir.iterdir():
                if f.name not in keep:
                    f.unlink(missing_ok=True)
        self._sync_text()

    # --- metadata -------------------------------------------------------------------------------
    def _setting(self, key: str, default=None):
        row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def _set(self, key: str, value) -> None:
        self._db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, json.dumps(value)))

    def _generation(self) -> int:
        return int(self._setting("generation", 0))

    def knn_params(self) -> dict:
        return {**KNN_DEFAULTS, **self._setting("knn_params", {}), **self._overrides}

    def configure(self, **params) -> None:
        """Store first-stage parameters in the index (kNN: exact_threshold, merge_threshold, nprobe, oversample;
        BM25: bm25_max_df). They keep the historical name `knn_params` (in the settings and in stats())."""
        unknown = set(params) - set(KNN_DEFAULTS)
        if unknown:
            raise BackendError(f"unknown kNN parameter(s) {', '.join(sorted(unknown))}; known: {', '.join(KNN_DEFAULTS)}")
        self._acquire_write()
        with self._tx():
            self._set("knn_params", {**self._setting("knn_params", {}),
                                     **{k: type(KNN_DEFAULTS[k])(v) for k, v in params.items()}})
            self._bump_generation()

    def meta(self) -> IndexMeta | None:
        d = self._setting("meta")
        return IndexMeta.from_dict(d) if d else None

    def ensure(self, meta: IndexMeta) -> None:
        """Check `meta` against the index (creating it if new) and take the write lock: an indexing run
        calls this first, so it waits for another writer up front, repairs a crashed one's leftovers,
        and folds its writes into the ANN files when it closes."""
        existing = self.meta()
        if existing is not None:
            existing.check(meta)
        self._acquire_write()
        if existing is not None:
            return
        with self._tx():
            if self._setting("meta") is None:
                self._set("meta", meta.to_dict())
                self._set("format_version", FORMAT_VERSION)
        self.meta().check(meta)

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
    @staticmethod
    def _text_schema():
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("paper_id", stored=True, tokenizer_name="raw")
        for f in ("title", "abstract", *(f"facet_{x}" for x in FACET_LABELS)):
            sb.add_text_field(f, tokenizer_name="en_stem")
        return sb.build()

    @property
    def text_index(self):
        if self._text_index is None:
            import tantivy

            text = self.path / "text"
            if self.writable:
                text.mkdir(exist_ok=True)
                self._text_index = tantivy.Index(self._text_schema(), path=str(text), reuse=True)
            elif (text / "meta.json").exists() and os.access(text, os.W_OK):
                self._text_index = tantivy.Index.open(str(text))
            elif (text / "meta.json").exists():
                # tantivy's reader takes a lock file beside the index; where it cannot write (a read-only
                # index), it reads the same files through a private directory of links
                import atexit
                import shutil
                import tempfile

                shadow = Path(tempfile.mkdtemp(prefix="esqbe-text-"))
                atexit.register(shutil.rmtree, shadow, True)
                for f in text.resolve().iterdir():  # absolute links: the index may be named relative to the cwd
                    if not f.name.endswith(".lock"):
                        os.symlink(f, shadow / f.name)
                self._text_index = tantivy.Index.open(str(shadow))
            else:  # nothing indexed yet: an empty in-memory index answers BM25 with nothing
                self._text_index = tantivy.Index(self._text_schema())
        return self._text_index

    def _sync_text(self) -> None:
        """Writer only: bring the tantivy index up to SQLite (delete removed papers, (re)add pending ones)."""
        deletes = [r[0] for r in self._db.execute("SELECT paper_id FROM text_deletes")]
        pending = self._db.execute(
            "SELECT paper_id, title, sentences, facets FROM papers WHERE text_indexed = 0"
        ).fetchall()
        if not deletes and not pending:
            return

        if self._text_writer is None:
            self._text_writer = self.text_index.writer(heap_size=200_000_000, num_threads=1)
        writer = self._text_writer
        for pid in deletes:
            writer.delete_documents_by_term("paper_id", pid)
        unindexable = []
        for pid, title, sentences, facets in pending:
            writer.delete_documents_by_term("paper_id", pid)
            try:
                document = _text_document(pid, title, json.loads(sentences), json.loads(facets))
            except (TypeError, ValueError) as e:
                unindexable.append((pid, e))
                continue
            writer.add_document(document)
        writer.commit()
        with self._tx():
            self._db.executemany("DELETE FROM text_deletes WHERE paper_id = ?", [(p,) for p in deletes])
            self._db.executemany("UPDATE papers SET text_indexed = 1 WHERE paper_id = ?", [(p[0],) for p in pending])
            # a stored row the text index cannot take (written by an esqbe that did not check its input): it
            # stays out of BM25, marked so that no later write replays it, and is reported once, here
            self._db.executemany("UPDATE papers SET text_indexed = 2 WHERE paper_id = ?", [(p,) for p, _ in unindexable])
            self._bump_generation()  # readers reload the text index on a new generation
        self.text_index.reload()
        for pid, e in unindexable:
            print(f"esqbe: warning: paper {pid} in {self.path} cannot be indexed for BM25 ({e}); it is left out of "
                  "BM25: index a corrected copy or delete it", file=sys.stderr, flush=True)

    # --- writes ---------------------------------------------------------------------------------
    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        out = {}
        for chunk in _chunks(ids, 500):
            q = f"SELECT paper_id, content_hash FROM papers WHERE paper_id IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._db.execute(q, chunk).fetchall()))
        return out

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
                facets.append(np.fromiter((_FACET_CODES.get(f, _FACET_CODES["unlabeled"]) for f in p.facets), dtype=np.int8, count=n))
                next_pno += 1
                rows += n
            if retired:
                self._db.executemany("INSERT OR REPLACE INTO dead VALUES (?, ?, ?)", retired)
            if inserts:
                self._db.executemany("INSERT OR REPLACE INTO papers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)", inserts)
            self._apply_token_delta(delta)
            if rows > start:
                try:
                    self._append_rows(start, np.concatenate(vecs), np.concatenate(pnos), np.concatenate(facets))
                except OSError as e:
                    raise StorageError(f"cannot write vectors to {self.path}: {e.strerror}") from None
            if inserts or retired:
                self._set("rows", rows)
                self._set("next_pno", next_pno)
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
        self._acquire_write()
        found = 0
        delta: Counter = Counter()
        with self._tx():
            for pid in ids:
                row = self._db.execute("SELECT token_counts, pno, row_start, n_rows FROM papers WHERE paper_id = ?", (pid,)).fetchone()
                if not row:
                    continue
                found += 1
                delta.subtract(json.loads(row[0] or "{}"))
                self._db.execute("INSERT OR REPLACE INTO dead VALUES (?, ?, ?)", row[1:])
                self._db.execute("DELETE FROM papers WHERE paper_id = ?", (pid,))
                self._db.execute("INSERT OR IGNORE INTO text_deletes VALUES (?)", (pid,))
            self._apply_token_delta(delta)
            if found:
                self._bump_generation()
        self._sync_text()
        return found

    # --- ANN maintenance (writer) ---------------------------------------------------------------
    def optimize(self, *, force: bool = False, progress=None) -> dict:
        """Fold each facet's delta into its ANN index when it is past `merge_threshold` rows (or `force`),
        retraining the IVF when the facet has doubled since it was trained. Returns what was built."""
        self._acquire_write()
        params = self.knn_params()
        st = self._state()
        manifest = dict(self._setting("ann", {}))
        built = {}
        for label, code in _FACET_CODES.items():
            entry = manifest.get(label)
            covered = entry["rows"] if entry else 0
            tail = st.facet[covered:]
            n_delta = int(np.count_nonzero(tail == code))
            n_total = n_delta + (entry["size"] if entry else 0)
            if entry is None and n_total <= params["exact_threshold"] and not force:
                continue
            if n_delta == 0 or (n_delta <= params["merge_threshold"] and not force and entry is not None):
                continue
            retrain = entry is None or n_total >= 2 * entry["trained_on"]
            if progress:
                progress(f"building the {label} ANN index ({n_total} sentence rows{', training' if retrain else ''})")
            name, size, trained_on = self._build_ann(st, label, code, None if retrain else entry)
            manifest[label] = {"file": name, "rows": st.rows, "size": size, "trained_on": trained_on}
            with self._tx():
                self._set("ann", manifest)
                self._bump_generation()
            if entry is not None:
                (self.path / "ann" / entry["file"]).unlink(missing_ok=True)
            built[label] = manifest[label]
        return built

    def _build_ann(self, st: _State, label: str, code: int, entry: dict | None) -> tuple[str, int, int]:
        import faiss

        dim = st.dim
        if entry is None:
            rows = np.flatnonzero(st.facet[: st.rows] == code)
            rows = rows[~st.dead[st.pno[rows]]]
            nlist = int(np.clip(min(2 * np.sqrt(len(rows)), len(rows) / 39), 1, 2048))
            rng = np.random.default_rng(0)
            sample = np.sort(rng.choice(len(rows), size=min(len(rows), 40 * nlist), replace=False))
            train = np.asarray(st.vec[rows[sample]], dtype=np.float32)
            index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                                  faiss.METRIC_INNER_PRODUCT)
            index.cp.niter = 10
            index.train(train)
            trained_on = len(rows)
        else:
            index = faiss.read_index(str(self.path / "ann" / entry["file"]))
            rows = entry["rows"] + np.flatnonzero(st.facet[entry["rows"] : st.rows] == code)
            rows = rows[~st.dead[st.pno[rows]]]
            trained_on = entry["trained_on"]
        for chunk in _chunks(rows, 200_000):
            index.add_with_ids(np.asarray(st.vec[chunk], dtype=np.float32), np.asarray(st.pno[chunk], dtype=np.int64))
        (self.path / "ann").mkdir(exist_ok=True)
        name = f"{label}-{st.gen}-{os.getpid()}.faiss"
        tmp = self.path / "ann" / (name + ".tmp")
        faiss.write_index(index, str(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path / "ann" / name)
        return name, int(index.ntotal), trained_on

    # --- reads ----------------------------------------------------------------------------------
    def _state(self, need_rows: int = 0) -> _State:
        """The reader's view, refreshed when the generation moved (one small SQLite read per call)."""
        gen = self._generation()
        st = self._state_cache
        if st is not None and st.gen == gen and st.rows >= need_rows:
            return st
        self._db.execute("BEGIN")
        try:
            gen = self._generation()
            meta = self.meta()
            rows = int(self._setting("rows", 0))
            next_pno = int(self._setting("next_pno", 0))
            manifest = self._setting("ann", {})
            dead = np.fromiter((r[0] for r in self._db.execute("SELECT pno FROM dead")), dtype=np.int64)
        finally:
            self._db.execute("COMMIT")
        new = _State(gen, rows, meta.dim if meta else 1, self.path, dead, next_pno, manifest)
        if st is not None:
            for code, cached in st.delta.items():  # extend cached deltas instead of rebuilding them
                if st.manifest.get(FACET_LABELS[code]) == manifest.get(FACET_LABELS[code]):
                    new.delta[code] = cached
        self._state_cache = new
        if self._text_index is not None and self._text_gen != gen:
            self._text_index.reload()
        self._text_gen = gen
        return new

    def _delta(self, st: _State, code: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of a facet above its ANN (all its rows if it has none), as float32; cached per reader and
        extended with the rows later commits append."""
        entry = st.manifest.get(FACET_LABELS[code])
        covered = entry["rows"] if entry else 0
        idx, mat, scanned = st.delta.get(code, (np.zeros(0, dtype=np.int64), np.zeros((0, st.dim), dtype=np.float32), covered))
        if scanned < st.rows:
            new = scanned + np.flatnonzero(np.asarray(st.facet[scanned : st.rows]) == code)
            if len(new):
                idx = np.concatenate([idx, new])
                mat = np.concatenate([mat, np.asarray(st.vec[new], dtype=np.float32)])
            st.delta[code] = (idx, mat, st.rows)
        return idx, mat

    def _ann(self, st: _State, code: int):
        """The facet's ANN index. The first search of a process memory-maps the file (a one-off query
        starts at once); the second reads it into memory (~0.6 s for the largest facet at 1M papers),
        because a search over memory-mapped lists pays for mapping every page it touches the first
        time, which keeps a process's first few thousand queries ~2x slower (docs/performance.md)."""
        entry = st.manifest.get(FACET_LABELS[code])
        if entry is None:
            return None
        name = entry["file"]
        cached = self._ann_cache.get(name)
        if cached is not None and cached[1]:
            return cached[0]
        import faiss

        flags = faiss.IO_FLAG_READ_ONLY if cached is not None else faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY
        index = faiss.read_index(str(self.path / "ann" / name), flags)
        self._ann_cache = {k: v for k, v in self._ann_cache.items() if k in {e["file"] for e in st.manifest.values()}}
        self._ann_cache[name] = (index, cached is not None)  # (index, in memory)
        return index

    def get(self, paper_ids: Sequence[str]) -> dict[str, IndexedPaper]:
        out = {}
        for chunk in _chunks(list(dict.fromkeys(map(str, paper_ids))), 500):
            q = (
                "SELECT paper_id, title, sentences, facets, metadata, row_start, n_rows FROM papers "
                f"WHERE paper_id IN ({','.join('?' * len(chunk))})"
            )
            found = self._db.execute(q, chunk).fetchall()
            if not found:
                continue
            st = self._state(max(r[5] + r[6] for r in found))
            rows = self._read_rows(st, np.array([r[5] for r in found]), np.array([r[6] for r in found])).astype(np.float32)
            at = 0
            for pid, title, sentences, facets, metadata, start, n in found:
                paper = Paper(pid, title, json.loads(sentences), json.loads(facets), _load_metadata(metadata))
                out[pid] = IndexedPaper(paper, rows[at : at + n])
                at += n
        return out

    def _read_rows(self, st: _State, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The rows [start, start + n) of each range, concatenated (float16), read with pread. A query reads a
        few thousand scattered rows; through the memory map each read would map a whole page-cache folio
        (up to 2 MB) into the process, and after some hundred queries the whole vector file (5.4 GB at 1M
        papers) would count in the query process's RSS. Read this way it stays in the page cache only."""
        lengths = np.asarray(lengths, dtype=np.int64)
        out = np.empty((int(lengths.sum()), st.dim), dtype=VECTOR_DTYPE)
        if not len(out):
            return out
        if self._vec_fd is None:
            self._vec_fd = os.open(self.path / "vectors.f16", os.O_RDONLY)
        width = st.dim * out.itemsize
        at = 0
        for start, n in zip(np.asarray(starts, dtype=np.int64).tolist(), lengths.tolist()):
            if n:
                if os.preadv(self._vec_fd, [out[at : at + n]], start * width) != n * width:
                    raise StorageError(f"{self.path / 'vectors.f16'} is shorter than the index's committed rows")
                at += n
        return out

    def pnos(self, paper_ids: Iterable[str]) -> np.ndarray:
        """Paper numbers of the given ids (those that exist), sorted: the form `knn(allowed=...)` takes."""
        out = []
        for chunk in _chunks(list(dict.fromkeys(map(str, paper_ids))), 900):
            q = f"SELECT pno FROM papers WHERE paper_id IN ({','.join('?' * len(chunk))})"
            out.extend(r[0] for r in self._db.execute(q, chunk))
        return np.unique(np.asarray(out, dtype=np.int64))

    def _ids_of(self, pnos: np.ndarray) -> dict[int, str]:
        out = {}
        for chunk in _chunks([int(p) for p in pnos], 900):
            q = f"SELECT pno, paper_id FROM papers WHERE pno IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._db.execute(q, chunk).fetchall()))
        return out

    def paper_ids(self) -> list[str]:
        return [pid for (pid,) in self._db.execute("SELECT paper_id FROM papers ORDER BY paper_id")]

    def token_counts(self) -> tuple[dict[str, int], int] | None:
        counts = dict(self._db.execute("SELECT token, count FROM token_counts"))
        return counts, int(sum(counts.values()))

    def stats(self) -> dict:
        meta = self.meta()
        st = self._state()
        papers = self._db.execute("SELECT COUNT(*) FROM papers").fetchone()[0]
        live = ~st.dead[st.pno] if st.rows else np.zeros(0, dtype=bool)
        counts = np.bincount(np.asarray(st.facet)[live], minlength=len(FACET_LABELS)) if st.rows else np.zeros(len(FACET_LABELS), int)
        by_facet = {f: int(counts[c]) for f, c in _FACET_CODES.items() if counts[c]}
        size = _dir_size(self.path)
        params = self.knn_params()
        knn = {}
        for f, c in _FACET_CODES.items():
            entry = st.manifest.get(f)
            if entry:
                knn[f] = f"ivf-sq8 ({entry['size']} rows) + exact delta ({int(np.count_nonzero(st.facet[entry['rows']:] == c))} rows)"
            elif counts[c]:
                knn[f] = "exact"
        return {
            "backend": self.name,
            "path": str(self.path),
            "papers": papers,
            "sentences": int(sum(by_facet.values())),
            "sentences_by_facet": dict(sorted(by_facet.items())),
            "model": meta.model if meta else None,
            "dim": meta.dim if meta else None,
            "encoder_mode": meta.encoder_mode if meta else None,
            "knn": knn,
            "knn_params": params,
            # top-level metadata keys and how many papers have each: what `--filter` can name
            "metadata_keys": dict(self._db.execute(
                "SELECT key, COUNT(*) FROM (SELECT metadata FROM papers WHERE json_valid(metadata)) AS p, json_each(p.metadata) "
                "WHERE type != 'null' GROUP BY key ORDER BY key")),  # json_valid: NaN stored by an older esqbe
            "bytes_on_disk": size,
            "bytes_per_paper": round(size / papers) if papers else None,
        }

    # --- first stage ----------------------------------------------------------------------------
    def bm25(self, text: str, k: int, *, exclude: frozenset[str] = frozenset(), restrict_to: frozenset[str] | None = None,
             fields: Sequence[str] = ("title", "abstract")) -> dict[str, float]:
        """BM25 of the query text against the given fields; returns paper id -> score.

        The query is the query parser's: each distinct word of the text, analysed (en_stem), as a term
        query in each field, all SHOULD; except that terms found in more than `bm25_max_df` (a fraction,
        default 0.2) of the documents are dropped, keeping at least the BM25_MIN_TERMS most selective:
        classic corpus-statistics stop words (Lucene's more-like-this max_doc_freq, Elasticsearch's old
        cutoff_frequency). They add little to BM25 (idf < 1.6) and cost the most: at 1M papers the
        ~55-word query of a facet takes ~38 ms with them and ~9 ms without (docs/performance.md); the
        CSFCube dev default moved from 61.92 to 61.86 aggregated NDCG%20. 1.0 keeps every term."""
        terms = _query_terms(text)
        if not terms or k <= 0:
            return {}
        self._state()  # reloads the text index if a writer committed since
        return self._bm25(terms, k, exclude, restrict_to, fields)

    def _bm25(self, terms: list[str], k: int, exclude: frozenset[str], restrict_to: frozenset[str] | None,
              fields: Sequence[str]) -> dict[str, float]:
        """bm25() on analysed terms, without refreshing the reader's view (first_stage runs it in a thread)."""
        import tantivy

        index = self.text_index
        schema = index.schema
        searcher = index.searcher()
        max_df = float(self.knn_params()["bm25_max_df"])
        distinct = list(dict.fromkeys(terms))
        if max_df < 1.0 and len(distinct) > BM25_MIN_TERMS:
            df = {t: max(searcher.doc_freq(f, t) for f in fields) for t in distinct}
            present = sorted((t for t in distinct if df[t]), key=lambda t: df[t])  # a term in no document scores nothing
            max_docs = max_df * searcher.num_docs
            keep = set(present[:BM25_MIN_TERMS]) | {t for t in present if df[t] <= max_docs}
            terms = [t for t in terms if t in keep]
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, f, t, index_option="freq")) for t in terms for f in fields])
        limit = k
        if restrict_to is None and len(exclude) <= 64:
            # a bare disjunction of term queries is what tantivy prunes with block-max WAND (~1.5x faster at
            # 1M papers); wrapped with a MUST_NOT it is scored exhaustively, so the few excluded papers (the
            # query paper) are dropped from a slightly longer list instead
            limit = k + len(exclude)
        else:
            clauses = [(tantivy.Occur.Must, query)]
            if restrict_to is not None:
                clauses.append((tantivy.Occur.Must, tantivy.Query.term_set_query(schema, "paper_id", sorted(restrict_to))))
            if exclude:
                clauses.append((tantivy.Occur.MustNot, tantivy.Query.term_set_query(schema, "paper_id", sorted(exclude))))
            query = tantivy.Query.boolean_query(clauses)
        out = {}
        for score, addr in searcher.search(query, limit=limit, count=False).hits:
            pid = searcher.doc(addr)["paper_id"][0]
            if pid not in exclude and len(out) < k:
                out[pid] = float(score)
        return out

    def _exact_best(self, st: _State, pnos: np.ndarray, codes: list[int] | None, q: np.ndarray, keep: int | None = None):
        """Exact best cosine per (paper, query sentence) over the papers' rows of the given facets.
        Returns (papers having such rows, best (P', m)); with `keep`, in chunks, keeping per query
        sentence only each chunk's `keep` best papers (enough for a top-`keep`)."""
        pnos = np.unique(pnos)
        if keep is not None and len(pnos) > 20_000:
            parts = [self._exact_best(st, pnos[i : i + 20_000], codes, q) for i in range(0, len(pnos), 20_000)]
            out_p, out_b = [], []
            for papers, best in parts:
                if len(papers) > keep:
                    top = np.unique(np.argpartition(-best, keep - 1, axis=0)[:keep].ravel())
                    papers, best = papers[top], best[top]
                out_p.append(papers)
                out_b.append(best)
            return np.concatenate(out_p), np.concatenate(out_b)
        starts, ends = st.row_ranges(pnos)
        lengths = ends - starts
        if lengths.sum() == 0:
            return np.zeros(0, dtype=np.int64), np.zeros((0, len(q)), dtype=np.float32)
        rows = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths) + np.arange(lengths.sum())
        vectors = self._read_rows(st, starts, lengths)  # every row of the papers, one read per paper
        if codes is not None:
            keep = np.isin(np.asarray(st.facet[rows]), codes)
            rows, vectors = rows[keep], vectors[keep]
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros((0, len(q)), dtype=np.float32)
        sims = vectors.astype(np.float32) @ q.T
        papers = np.asarray(st.pno[rows])
        first = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
        return papers[first].astype(np.int64), np.maximum.reduceat(sims, first, axis=0)

    def knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None, exclude: frozenset[str] = frozenset(),
            restrict_to: frozenset[str] | None = None, allowed: np.ndarray | None = None,
            exact: bool = False) -> dict[str, float]:
        """Per query sentence, the k most similar papers by their best sentence (of `facet`, if given).

        Returns paper id -> mean over query sentences of the best cosine (0 where a query sentence did
        not reach the paper among its k), the engines' nested-kNN score model. `restrict_to` (ids) and
        `allowed` (sorted paper numbers, see `pnos()`) limit the candidates; a small allowed set is
        searched exactly. `exact=True` searches every row exactly (the reference for recall).
        """
        st = self._state()
        if st.rows == 0 or k <= 0 or len(vectors) == 0:
            return {}
        params = self.knn_params()
        q = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        m = len(q)
        codes = [_FACET_CODES[facet]] if facet is not None else list(range(len(FACET_LABELS)))
        banned = self.pnos(exclude) if exclude else np.zeros(0, dtype=np.int64)
        if restrict_to is not None:
            ids = self.pnos(restrict_to)
            allowed = ids if allowed is None else np.intersect1d(ids, allowed)
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=np.int64)
            allowed = allowed[(allowed < len(st.dead))]
            allowed = np.setdiff1d(allowed[~st.dead[allowed]], banned)
            starts, ends = st.row_ranges(allowed)
            n_allowed_rows = int((ends - starts).sum())
            if n_allowed_rows <= max(params["exact_threshold"], 1) or exact:
                papers, best = self._exact_best(st, allowed, codes if facet is not None else None, q, keep=k)
                return self._top_papers(papers, best, k)
        if exact:
            return self._top_papers(*self._brute_force(st, codes, banned, q, k), k)
        cand = []
        kk = params["oversample"] * k + 16
        for code in codes:
            index = self._ann(st, code)
            if index is not None:
                import faiss

                if allowed is not None:
                    mask = np.zeros(len(st.dead), dtype=bool)
                    mask[allowed] = True
                    bits = np.packbits(mask, bitorder="little")
                else:
                    bits = st.ok_bits()
                sp = faiss.SearchParametersIVF(nprobe=int(params["nprobe"]))
                if bits is not None:
                    sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))
                    sp.sel = sel
                sims, ids = _search_one_thread(index, q, kk, sp)
                for j in range(m):  # the 2k papers with the best approximate sentence score go to exact re-scoring
                    ok = ids[j] >= 0
                    hit_ids, hit_sims = ids[j][ok], sims[j][ok]
                    order = np.lexsort((-hit_sims, hit_ids))
                    hit_ids, hit_sims = hit_ids[order], hit_sims[order]
                    first = np.r_[True, hit_ids[1:] != hit_ids[:-1]]
                    hit_ids, hit_sims = hit_ids[first], hit_sims[first]
                    if len(hit_ids) > 2 * k:
                        hit_ids = hit_ids[np.argpartition(-hit_sims, 2 * k - 1)[: 2 * k]]
                    cand.append(hit_ids)
            idx, mat = self._delta(st, code)
            if len(idx):
                sims = mat @ q.T
                papers = np.asarray(st.pno[idx])
                ok = ~st.dead[papers]
                if allowed is not None:
                    ok &= np.isin(papers, allowed)
                if len(banned):
                    ok &= ~np.isin(papers, banned)
                if not ok.all():
                    sims, papers = sims[ok], papers[ok]
                if len(papers):
                    first = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
                    best = np.maximum.reduceat(sims, first, axis=0)
                    pp = papers[first]
                    kd = min(k, len(pp))
                    top = np.argpartition(-best, kd - 1, axis=0)[:kd]  # (kd, m)
                    cand.append(pp[top.ravel()])
        if not cand:
            return {}
        pool = np.unique(np.concatenate(cand).astype(np.int64))
        pool = pool[~st.dead[pool]]
        if len(banned):
            pool = np.setdiff1d(pool, banned)
        papers, best = self._exact_best(st, pool, codes if facet is not None else None, q)
        return self._top_papers(papers, best, k)

    def _brute_force(self, st: _State, codes: list[int], banned: np.ndarray, q: np.ndarray, k: int, chunk: int = 500_000):
        """Every live row of the facets, scanned in chunks (the reference ANN recall is measured against);
        keeps each chunk's k best papers per query sentence. A paper split over two chunks is kept twice
        with each part's best; the maximum is taken at the end."""
        out_p, out_b = [], []
        for lo in range(0, st.rows, chunk):
            hi = min(st.rows, lo + chunk)
            rows = lo + np.flatnonzero(np.isin(np.asarray(st.facet[lo:hi]), codes))
            papers = np.asarray(st.pno[rows]).astype(np.int64)
            ok = ~st.dead[papers] & ~np.isin(papers, banned)
            rows, papers = rows[ok], papers[ok]
            if not len(rows):
                continue
            sims = np.asarray(st.vec[rows], dtype=np.float32) @ q.T
            first = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
            best, pp = np.maximum.reduceat(sims, first, axis=0), papers[first]
            if len(pp) > k:
                top = np.unique(np.argpartition(-best, k - 1, axis=0)[:k].ravel())
                best, pp = best[top], pp[top]
            out_p.append(pp)
            out_b.append(best)
        if not out_p:
            return np.zeros(0, dtype=np.int64), np.zeros((0, len(q)), dtype=np.float32)
        papers, best = np.concatenate(out_p), np.concatenate(out_b)
        order = np.argsort(papers, kind="stable")
        papers, best = papers[order], best[order]
        first = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
        return papers[first], np.maximum.reduceat(best, first, axis=0)

    def _top_papers(self, papers: np.ndarray, best: np.ndarray, k: int) -> dict[str, float]:
        if len(papers) == 0:
            return {}
        m = best.shape[1]
        kk = min(k, len(papers))
        top = np.argpartition(-best, kk - 1, axis=0)[:kk]  # (kk, m)
        total = np.zeros(len(papers))
        for j in range(m):
            total[top[:, j]] += best[top[:, j], j]
        hit = np.unique(top.ravel())
        ids = self._ids_of(papers[hit])
        return {ids[int(p)]: float(total[i]) / m for p, i in zip(papers[hit], hit) if int(p) in ids}

    # --- metadata filters (esqbe.core.filters): evaluated on SQLite's metadata, fed to BM25 and kNN as allowed ids
    def _metadata_columns(self) -> MetadataColumns:
        """Every paper's metadata as filter columns, built once per generation (at the first filtered query)."""
        gen = self._generation()
        if self._meta_cols is None or self._meta_cols[0] != gen:
            ids, metas = [], []
            for pid, m in self._db.execute("SELECT paper_id, metadata FROM papers"):
                ids.append(pid)
                metas.append(_load_metadata(m))
            self._meta_cols = (gen, MetadataColumns(ids, metas))
        return self._meta_cols[1]

    def filter_ids(self, flt: MetadataFilter | None) -> frozenset[str] | None:
        """Ids of the papers a filter allows (None: no filter). Evaluated before any ranking."""
        if flt is None or not flt:
            return None
        if flt.engine_query is not None:
            raise BackendError("an engine query filter (--engine-filter) needs the elasticsearch or opensearch backend")
        return self._metadata_columns().allowed(flt.conditions)

    def first_stage(self, request: FirstStageRequest) -> list[Candidate]:
        restrict = request.restrict_to
        allowed = self.filter_ids(request.filter)
        deny: frozenset[str] = frozenset()
        if allowed is not None:
            if restrict is not None:
                restrict = restrict & allowed
            elif len(allowed) * 2 > len(self._metadata_columns()):
                # a filter that keeps most papers: BM25 excludes the few it drops instead of listing the many it keeps
                deny = frozenset(self._metadata_columns().ids) - allowed
                restrict = allowed
            else:
                restrict = allowed
            if not restrict:
                return []
        # BM25 over the candidates' sentences of the query's facet (bm25_text: facet), else title + abstract
        fields = (f"facet_{request.bm25_facet}",) if request.bm25_facet else ("title", "abstract")
        # BM25 runs in a worker thread while kNN runs here: tantivy and faiss release the GIL, so on two
        # cores the first stage takes about as long as the slower of the two, not their sum
        self._state()  # one refreshed view for both (reloads the text index once, here, not in two threads)
        terms = _query_terms(request.text)
        bm25_job = _first_stage_pool().submit(self._bm25, terms, request.bm25_k, request.exclude | deny,
                                              None if deny else restrict, fields) if terms and request.bm25_k > 0 else None
        try:
            # kNN only ever sees the allowed papers: exact over a small allowed set, the ANN with an id bitmap otherwise
            knn = self.knn(request.vectors, request.knn_k, facet=request.facet, exclude=request.exclude,
                           restrict_to=restrict)
        finally:  # never leave the BM25 running past this query (a kNN error is raised, not hidden by BM25's)
            if bm25_job is not None:
                futures_wait([bm25_job])
        bm25 = bm25_job.result() if bm25_job is not None else {}
        fused = top_k(fuse(bm25, knn, request.fusion, request.bm25_weight), request.k)
        papers = self.get([pid for pid, _ in fused]) if request.with_papers else {}
        return [Candidate(pid, score, bm25.get(pid, 0.0), knn.get(pid, 0.0), papers.get(pid)) for pid, score in fused]

    def close(self) -> None:
        if self._db is None:
            return
        try:
            if self.writable:
                self._finish_write()
        finally:
            self._close_files()
            self._text_index = None
            self._state_cache = None
            self._ann_cache = {}
            self._meta_cols = None
            self._db.close()
            self._db = None
            self._release_write()


_ANALYZER = None
_POOL = None


def _first_stage_pool():
    """One worker thread shared by every embedded index of the process (BM25 beside the kNN)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(1, thread_name_prefix="esqbe-bm25")
    return _POOL


def _forget_pool() -> None:  # a forked child has no worker thread: it makes its own pool
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


def _search_one_thread(index, q: np.ndarray, k: int, params):
    """faiss search on one OpenMP thread: a query's few vectors split poorly over threads, and BM25 runs on
    the other core meanwhile (first_stage); faiss's spare thread spinning between searches slows both."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return index.search(q, k, params=params)
    finally:
        faiss.omp_set_num_threads(threads)


def _text_document(pid: str, title, sentences, facets):
    """The tantivy document of a stored paper (TypeError/ValueError for a row that is not one)."""
    import tantivy

    if not isinstance(title, str) or not isinstance(sentences, list) or not isinstance(facets, list):
        raise TypeError("title, sentences or facets of the wrong type")
    fields = {"paper_id": pid, "title": title, "abstract": " ".join(sentences)}
    for label in FACET_LABELS:
        text = " ".join(s for s, f in zip(sentences, facets) if f == label)
        if text:
            fields[f"facet_{label}"] = text
    return tantivy.Document(**fields)


def _load_metadata(text: str) -> dict:
    """Stored metadata; a NaN or Infinity an older esqbe stored reads as null, so that it serialises as JSON."""
    return json.loads(text, parse_constant=lambda _: None)


def _query_terms(text: str) -> list[str]:
    """The query parser's terms for `text`: its distinct words (lower-cased, query syntax dropped), analysed
    as the text fields are (so two words with one stem give that term twice, as the parser does)."""
    words = list(dict.fromkeys(_QUERY_SYNTAX.sub(" ", text or "").lower().split()))
    return _analyzer().analyze(" ".join(words)) if words else []


def _analyzer():
    """tantivy's `en_stem` analyzer (the text fields' tokenizer), to turn query text into the indexed terms."""
    global _ANALYZER
    if _ANALYZER is None:
        import tantivy

        _ANALYZER = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
                     .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.stemmer("english")).build())
    return _ANALYZER


def _dir_size(path: Path) -> int:
    """Bytes under `path`; files a writer removes meanwhile (merged text segments) are skipped."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


def _chunks(items, n: int):
    for i in range(0, len(items), n):
        yield items[i : i + n]
