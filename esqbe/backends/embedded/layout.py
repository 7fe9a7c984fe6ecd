"""The on-disk layout of an embedded index (format 2): the format constants, the SQLite schema, and a reader's
view of the sentence rows at one generation (`_State`). The layout itself is described in the package's
backend module (esqbe.backends.embedded.backend)."""
from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
from pathlib import Path

import numpy as np

from ...domain import FACET_LABELS

FORMAT_VERSION = 2
VECTOR_DTYPE = np.float16

#: per-index kNN parameters (stored in the index's settings; constructor keywords override them)
KNN_DEFAULTS = {
    "exact_threshold": 20_000,  # a facet with at most this many rows is searched exactly
    "merge_threshold": 20_000,  # a writer folds a facet's delta into its ANN once the delta is past this
    "nprobe": 32,  # IVF lists visited per query sentence
    "oversample": 4,  # ANN sentence hits asked per query sentence, as a multiple of k
    # papers from the ANN re-scored exactly per query, at most (0: all; never below refine * k), each sentence's best
    # candidates first: bounds a many-sentence query's re-score (12 sentences x 300 papers at refine 3); at hard 1M
    # recall@100 0.966 against 0.969 uncapped, 0.947 for queries of 6+ sentences (docs/performance.md)
    "exact_cap": 1_000,
    "bm25_max_df": 0.2,  # BM25 query terms in more than this fraction of the documents are dropped; see bm25()
    # BM25 keeps at most this many query terms, the most selective (0: all); see bm25(): BM25's p99 at hard 1M 36-43 ->
    # 18 ms, CSFCube dev 62.01 / 42.68 -> 61.98 / 42.62 (64 terms: unchanged, p99 27 ms; docs/performance.md)
    "bm25_max_terms": 48,
}
#: the range each first-stage parameter may take (`EmbeddedBackend.configure` refuses others)
KNN_LIMITS = {"exact_threshold": (0, 10**9), "merge_threshold": (1, 10**9), "nprobe": (1, 1 << 20),
              "oversample": (1, 64), "exact_cap": (0, 10**7), "bm25_max_df": (1e-6, 1.0),
              "bm25_max_terms": (0, 10**6)}
_FACET_CODES = {f: i for i, f in enumerate(FACET_LABELS)}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS papers (
    paper_id TEXT PRIMARY KEY, pno INTEGER NOT NULL UNIQUE, title TEXT NOT NULL, sentences TEXT NOT NULL,
    facets TEXT NOT NULL, metadata TEXT NOT NULL, content_hash TEXT NOT NULL, token_counts TEXT,
    row_start INTEGER NOT NULL, n_rows INTEGER NOT NULL, text_indexed INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS papers_pending ON papers(text_indexed) WHERE text_indexed = 0;
CREATE INDEX IF NOT EXISTS papers_pno_id ON papers(pno, paper_id);
CREATE TABLE IF NOT EXISTS dead (pno INTEGER PRIMARY KEY, row_start INTEGER NOT NULL, n_rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS text_deletes (paper_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS token_counts (token TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS watches (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, vectors BLOB NOT NULL, mark INTEGER NOT NULL, created REAL NOT NULL,
    last_run REAL, feed_key TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS watch_matches (
    name TEXT NOT NULL, paper_id TEXT NOT NULL, found REAL NOT NULL, hit TEXT NOT NULL, PRIMARY KEY (name, paper_id));
CREATE INDEX IF NOT EXISTS watch_matches_found ON watch_matches(name, found);
CREATE TABLE IF NOT EXISTS aliases (key TEXT PRIMARY KEY, paper_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS follows (name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL);
"""
#: the saved queries (`esqbe watch`, esqbe.index.watches) and what they found: tables added by CREATE ... IF NOT EXISTS
#: like the rest, so a writer adds them to an index made before them (same format); a reader of such an index sees
#: no watches (esqbe.backends.embedded.watchstore); `aliases` likewise (esqbe.backends.embedded.aliases), and `follows`
#: (the followed sources, esqbe.backends.embedded.followstore)

#: the tables of esqbe's schema, and those every index has had since format 2 (a database with both was created whole)
SCHEMA_TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", _SCHEMA))
CORE_TABLES = frozenset({"settings", "papers"})
#: the name `papers.sqlite` is built under, in the index directory, before it is renamed into place
CREATING = "papers.sqlite.creating"


def create_database(path: Path) -> None:
    """`path/papers.sqlite` made whole or not at all: its schema and format written in one transaction under a
    temporary name (`CREATING`), synced, then renamed into place (and the directory synced), as Lucene and tantivy
    commit: whoever sees `papers.sqlite` sees a complete index, whenever the creator was killed. The caller holds
    the write lock, so a `CREATING` file is a killed creator's and is replaced."""
    tmp = path / CREATING
    for leftover in (tmp, path / f"{CREATING}-journal", path / f"{CREATING}-wal", path / f"{CREATING}-shm"):
        leftover.unlink(missing_ok=True)
    con = sqlite3.connect(tmp, isolation_level=None)
    try:
        con.execute("PRAGMA synchronous = FULL")
        finish_schema(con)
        # WAL set here, not once in place: switching a database in place to WAL goes through a rollback journal, and
        # a writer killed within it left papers.sqlite with a hot journal that no read-only reader may roll back
        con.execute("PRAGMA journal_mode = WAL")
    finally:
        con.close()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path / "papers.sqlite")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself on disk
    finally:
        os.close(fd)


def finish_schema(con: sqlite3.Connection) -> None:
    """The schema's missing tables and the format, in one transaction: a new database's whole schema, an index made
    before a table (watches, aliases) its new tables, a creation an older esqbe left half done (`unfinished`) the
    rest of it. SQLite's DDL is transactional, so a kill leaves all of it or none."""
    fresh = not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'settings'").fetchone()
    version = (f"INSERT OR IGNORE INTO settings VALUES ('format_version', '{json.dumps(FORMAT_VERSION)}');"
               if fresh else "")
    try:
        con.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}{version}COMMIT;")
    except sqlite3.Error:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise


def unfinished(con: sqlite3.Connection, path: Path) -> tuple[bool, str] | None:
    """None when the database holds an index (its core tables are there); else (whether a writer may finish it, what
    to tell a user). A database without them and without papers is a creation an older esqbe did not finish (killed
    between creating the file and its tables; or an empty file): a writer finishes it with `finish_schema`, losing
    nothing (there are no papers). One with papers, or with tables esqbe does not make, is not an index."""
    tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if CORE_TABLES <= tables:
        return None
    q = shlex.quote(str(path))
    papers = con.execute("SELECT COUNT(*) FROM papers").fetchone()[0] if "papers" in tables else 0
    foreign = sorted(tables - SCHEMA_TABLES)
    if papers or foreign:
        held = (f"holds {papers} papers but no settings table" if papers
                else f"has tables esqbe does not make ({', '.join(foreign[:5])})")
        return False, (f"{path} is not an esqbe index: its papers.sqlite {held}; move it aside (`mv {q} {q}.old`) "
                       f"and run `esqbe index --path {q} FILE` to make a new one")
    return True, (f"the creation of the index at {path} was interrupted (papers.sqlite has no papers and not all of "
                  f"its tables); `esqbe index --path {q} FILE` finishes it")


#: the `settings` key set once `aliases` holds the identifiers of every paper (an index from before the table gets
#: them from its papers' metadata when a writer first opens it: esqbe.backends.embedded.aliases)
ALIASES_FILLED = "aliases_filled"
#: the `settings` key set once `aliases` holds every paper's title key (`title:...`: likely duplicates across runs,
#: esqbe.index.merge); an index made before them gets them likewise
TITLES_FILLED = "title_keys_filled"


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    """Stored float16 rows as float32, bit for bit what `h.astype(np.float32)` gives for every finite value, in
    ~0.9 ms for 4,800 x 384 against numpy's 3.1 ms (its half cast is scalar; docs/performance.md): the
    half's bits moved into a float32's (sign kept, exponent and mantissa shifted down three bits) and the float32
    scaled by 2^112, the difference of the two exponent biases; the scaling is exact, and it makes subnormal halves
    come out right too. An infinity or NaN would come out finite: the writer refuses non-finite vectors, so stored
    rows have none."""
    u = np.asarray(h).view(np.uint16).astype(np.int32)
    u <<= 16  # the half's sign in bit 31
    sign = u & np.int32(-(2**31))
    u >>= 3  # arithmetic shift: exponent and mantissa in bits 13..27 (the sign copied into 28..31, cleared next)
    u &= 0x0FFF_FFFF
    u |= sign
    out = u.view(np.float32)
    out *= np.float32(2.0**112)
    return out


class _State:
    """What a reader sees at one generation: memory-mapped rows, retired papers, ANN files, deltas."""

    def __init__(self, gen: int, rows: int, dim: int, path: Path, dead_pnos: np.ndarray, next_pno: int, manifest: dict):
        self.gen, self.rows, self.dim = gen, rows, dim
        self.next_pno = next_pno
        self.manifest = manifest
        if rows:
            self.vec: np.ndarray = np.memmap(path / "vectors.f16", dtype=VECTOR_DTYPE, mode="r", shape=(rows, dim))
            self.pno: np.ndarray = np.memmap(path / "rows.pno", dtype=np.int32, mode="r", shape=(rows,))
            self.facet: np.ndarray = np.memmap(path / "rows.facet", dtype=np.int8, mode="r", shape=(rows,))
        else:
            self.vec = np.zeros((0, dim), dtype=VECTOR_DTYPE)
            self.pno = np.zeros(0, dtype=np.int32)
            self.facet = np.zeros(0, dtype=np.int8)
        self.dead = np.zeros(max(next_pno, 1), dtype=bool)
        self.dead[dead_pnos[dead_pnos < len(self.dead)]] = True
        self.n_dead = int(self.dead.sum())
        self._ok_bits: np.ndarray | None = None
        self.delta: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}

    def row_ranges(self, pnos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row ranges [start, end) of the given paper numbers (rows are in paper-number order). The
        numbers are cast to the rows' int32 first: searchsorted with int64 keys would convert the
        whole memory-mapped column (7.5M rows at 1M papers) on every call."""
        keys = np.asarray(pnos, dtype=self.pno.dtype)
        return np.searchsorted(self.pno, keys, side="left"), np.searchsorted(self.pno, keys, side="right")

    def rows_of(self, pnos: np.ndarray, codes: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The row numbers of the given papers (sorted, unique paper numbers), only those of the facets `codes` if
        given, and each row's paper (from its range, not the pno column): (rows, papers), both in row order."""
        starts, ends = self.row_ranges(pnos)
        lengths = ends - starts
        rows = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths) + np.arange(lengths.sum())
        papers = np.repeat(np.asarray(pnos, dtype=np.int64), lengths)
        if codes is not None and len(rows):
            facet = np.asarray(self.facet[rows])
            of_facets = facet == codes[0] if len(codes) == 1 else np.isin(facet, codes)
            rows, papers = rows[of_facets], papers[of_facets]
        return rows, papers

    def ok_bits(self):
        """Bitmap over paper numbers of live papers (for faiss's IDSelectorBitmap), or None if all are live."""
        if self.n_dead == 0:
            return None
        if self._ok_bits is None:
            self._ok_bits = np.packbits(~self.dead, bitorder="little")
        return self._ok_bits


def _load_metadata(text: str) -> dict:
    """Stored metadata; a NaN or Infinity an older esqbe stored reads as null, so that it serialises as JSON."""
    return json.loads(text, parse_constant=lambda _: None)


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

