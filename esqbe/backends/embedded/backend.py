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
- `similarity_scale.json`: a note derived from the papers (esqbe.index.scale: where a hit's score stands
  among the index's own matches), replaced whole by whoever measured it, reader or writer; deleting it only
  makes the next query measure it again.

Readers take no lock and write no paper: opening an index never repairs it (a writer does that when
it takes the directory's write lock, `write.lock`), so queries run during a load and on a
read-only directory. A second writer waits for the first, saying so on stderr (at most `write_lock_wait`
seconds; past it the write stops with an error that names the bound).

Creation is atomic: `papers.sqlite` is built whole under a temporary name and renamed into place by a writer holding
the lock, so a creation killed at any point leaves either no index (the next run creates it) or a complete empty one.
A `papers.sqlite` an older esqbe left half made (no tables, or some; no papers) is finished by the next writer and
refused by readers with the command that finishes it.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import wait as futures_wait
from pathlib import Path

import numpy as np

from ...core.filter_check import check_conditions, listed_key
from ...core.filters import MetadataColumns, MetadataFilter
from ...core.fusion import fuse, top_k
from ...domain import (
    FACET_LABELS,
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    IndexMeta,
    Paper,
)
from ...errors import BackendError, StorageError
from ..base import Backend
from .aliases import AliasesMixin
from .ann import ANN_PQ_FASTSCAN, ANN_SQ8, AnnMixin, _calibration_due, _first_stage_pool
from .followstore import FollowStoreMixin
from .knn import KnnMixin
from .layout import (
    _FACET_CODES,
    FORMAT_VERSION,
    KNN_DEFAULTS,
    KNN_LIMITS,
    VECTOR_DTYPE,
    _chunks,
    _dir_size,
    _load_metadata,
    _State,
    f16_to_f32,
)
from .lock import WriteLockMixin, _Unfinished
from .textindex import TextIndexMixin, _query_terms
from .watchstore import WatchStoreMixin
from .writes import WritesMixin


def _knn_param(name: str, value) -> int | float:
    """A first-stage parameter checked: a finite number of the default's type, within `KNN_LIMITS`."""
    kind, (low, high) = type(KNN_DEFAULTS[name]), KNN_LIMITS[name]
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and kind is int and value != int(value):
        ok = False
    if not ok or not low <= value <= high:
        raise BackendError(f"kNN parameter {name} must be {'an integer' if kind is int else 'a number'} "
                           f"from {low:g} to {high:g} (got {value!r})")
    return kind(value)


class EmbeddedBackend(WriteLockMixin, TextIndexMixin, WritesMixin, AliasesMixin, AnnMixin, KnnMixin, WatchStoreMixin,
                      FollowStoreMixin, Backend):
    """A local index directory (see module docstring)."""

    name = "embedded"
    facet_text = True

    def __init__(self, path: str | os.PathLike, *, exact_threshold: int | None = None, create: bool = True,
                 merge_threshold: int | None = None, nprobe: int | None = None, recall_target: float = 0.95,
                 recall_statistic: str = "mean", write_lock_wait: float | None = None):
        self.path = Path(path)
        #: seconds a write waits for another writer's lock before WriteLockBusy (None: as long as it takes)
        self.write_lock_wait = write_lock_wait
        #: kNN recall@100 a writer calibrates each IVF's nprobe for when it builds or merges it (esqbe.backends.embedded.recall)
        self.recall_target = float(recall_target)
        #: what the target bounds: the calibration sample's mean recall, or its 10th percentile ("p10")
        self.recall_statistic = recall_statistic
        self._overrides = {k: v for k, v in (("exact_threshold", exact_threshold), ("merge_threshold", merge_threshold),
                                             ("nprobe", nprobe)) if v is not None}
        self._db = None  # type: ignore[assignment]  # opened below, as a reader or the writer, before any use
        self._lock_fd: int | None = None
        self._files = None
        self._text_index = None
        self._text_writer = None
        self._text_gen = None
        self._state_cache: _State | None = None
        self._ann_cache: dict[str, tuple[object, bool]] = {}  # ANN file -> (faiss index, read into memory)
        self._vec_fd: int | None = None  # vectors.f16, read with pread by queries (_read_rows)
        self._meta_cols: tuple[int, MetadataColumns] | None = None  # (generation, columns) for filters
        self._pno_index = False  # papers_pno_id seen in this index (_ids_of)
        db = self.path / "papers.sqlite"
        if not self.path.exists():
            if not create:
                raise BackendError(f"no index at {self.path} (run `esqbe index` first)")
            try:
                self.path.mkdir(parents=True, exist_ok=True)  # exist_ok: another writer creating it meanwhile
            except OSError as e:
                raise StorageError(f"cannot create the index directory {self.path}: {e.strerror}") from None
        if not self.path.is_dir():
            raise BackendError(f"{self.path} exists and is not an index directory")
        if not db.exists():
            if not create:
                raise BackendError(f"{self.path} is not an esqbe index (no papers.sqlite); "
                                   f"run `esqbe index --path {self.path} FILE` to create one")
            self._acquire_write()  # creates papers.sqlite whole, under the lock (another creator is waited for)
        else:
            try:
                self._open_reader()
            except _Unfinished:
                if not create:
                    raise  # a reader changes nothing: the message names the command that finishes it
                self._acquire_write()  # finishes what an older esqbe left half made (it holds no papers)
        version = self._setting("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise BackendError(f"{self.path} is an esqbe index of format {version}; this esqbe reads format {FORMAT_VERSION}: "
                               "re-index into a new path")

    def _setting(self, key: str, default=None):
        row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def _set(self, key: str, value) -> None:
        self._db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, json.dumps(value)))

    def _generation(self) -> int:
        return int(self._setting("generation", 0))

    def knn_params(self) -> dict:
        return {**KNN_DEFAULTS, **self._setting("knn_params", {}), **self._overrides}

    def nprobe_for(self, facet: str, st: _State | None = None) -> int:
        """IVF lists a query of `facet` visits: a fixed nprobe (the constructor's, or one stored with `configure`)
        if the user set one, else the value calibrated for the recall target when the facet's IVF was built,
        else the default."""
        fixed = self._overrides.get("nprobe", self._setting("knn_params", {}).get("nprobe"))
        if fixed is not None:
            return int(fixed)
        entry = (st or self._state()).manifest.get(facet) or {}
        return int(entry.get("nprobe", KNN_DEFAULTS["nprobe"]))

    def refine_for(self, facet: str, st: _State | None = None) -> int:
        """Papers re-scored exactly per query sentence, as a multiple of k: the value calibrated with the facet's IVF
        (a PQ fast-scan IVF's), else 2 (an IVF-SQ8's, and every index built before PQ fast-scan IVFs)."""
        entry = (st or self._state()).manifest.get(facet) or {}
        return int(entry.get("refine", 2))

    def exact_knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None,
                  exclude: frozenset[str] = frozenset()) -> dict[str, float]:
        """Brute force over every live row of the facet, streamed in chunks (no copy of the facet)."""
        return self.knn(vectors, k, facet=facet, exclude=exclude, exact=True)

    def knn_setting(self, facet: str) -> str:
        st = self._state()
        entry = st.manifest.get(facet)
        if entry is None:
            return "exact"
        fixed = "nprobe" in self._overrides or "nprobe" in self._setting("knn_params", {})
        how = "fixed" if fixed else "calibrated" if "calibration" in entry else "default"
        return f"ivf nprobe {self.nprobe_for(facet, st)}{_refine_words(entry)} ({how})"

    def configure(self, **params) -> None:
        """Store first-stage parameters in the index (kNN: exact_threshold, merge_threshold, nprobe, oversample;
        BM25: bm25_max_df). They keep the historical name `knn_params` (in the settings and in stats())."""
        unknown = set(params) - set(KNN_DEFAULTS)
        if unknown:
            raise BackendError(f"unknown kNN parameter(s) {', '.join(sorted(unknown))}; known: {', '.join(KNN_DEFAULTS)}")
        checked = {k: _knn_param(k, v) for k, v in params.items()}
        self._acquire_write()
        with self._tx():
            self._set("knn_params", {**self._setting("knn_params", {}), **checked})
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
        stored = self.meta()
        assert stored is not None  # written just above
        stored.check(meta)

    def get(self, paper_ids: Sequence[str], *, resolve: bool = True) -> dict[str, IndexedPaper]:
        """The papers stored under these ids; an id merged into another paper (esqbe.index.merge) gives that paper,
        under the id asked for (`resolve`)."""
        out = {}
        ids = list(dict.fromkeys(map(str, paper_ids)))
        for chunk in _chunks(ids, 500):
            q = (
                "SELECT paper_id, title, sentences, facets, metadata, row_start, n_rows FROM papers "
                f"WHERE paper_id IN ({','.join('?' * len(chunk))})"
            )
            found = self._db.execute(q, chunk).fetchall()
            if not found:
                continue
            st = self._state(max(r[5] + r[6] for r in found))
            rows = f16_to_f32(self._read_rows(st, np.array([r[5] for r in found]), np.array([r[6] for r in found])))
            at = 0
            for pid, title, sentences, facets, metadata, _start, n in found:
                paper = Paper(pid, title, json.loads(sentences), json.loads(facets), _load_metadata(metadata))
                out[pid] = IndexedPaper(paper, rows[at : at + n])
                at += n
        merged = self.resolve_ids([pid for pid in ids if pid not in out]) if resolve and len(out) < len(ids) else {}
        if merged:
            got = self.get(sorted(set(merged.values())), resolve=False)
            out.update({asked: got[pid] for asked, pid in merged.items() if pid in got})
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
        # byte slices of a memoryview: cheaper per read than array slices (numpy's stubs miss the buffer protocol)
        buf = memoryview(out).cast("B")  # type: ignore[arg-type]
        fd, at = self._vec_fd, 0
        for offset, size in zip((np.asarray(starts, dtype=np.int64) * width).tolist(), (lengths * width).tolist()):
            if size:
                if os.preadv(fd, [buf[at : at + size]], offset) != size:
                    raise StorageError(f"{self.path / 'vectors.f16'} is shorter than the index's committed rows")
                at += size
        return out

    def pnos(self, paper_ids: Iterable[str]) -> np.ndarray:
        """Paper numbers of the given ids (those that exist), sorted: the form `knn(allowed=...)` takes."""
        out: list[int] = []
        for chunk in _chunks(list(dict.fromkeys(map(str, paper_ids))), 900):
            q = f"SELECT pno FROM papers WHERE paper_id IN ({','.join('?' * len(chunk))})"
            out.extend(r[0] for r in self._db.execute(q, chunk))
        return np.unique(np.asarray(out, dtype=np.int64))

    def _ids_of(self, pnos: np.ndarray) -> dict[int, str]:
        """Paper ids of paper numbers, read from the covering index papers_pno_id where the index has it (a writer adds
        it to an index made before it): the kNN's few hundred hits per query, ~0.7 ms at 1M papers against ~5 ms
        through the papers' rows (SQLite's planner picks the unique pno index, hence INDEXED BY)."""
        if not self._pno_index:
            self._pno_index = bool(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'papers_pno_id'").fetchone())
        table = "papers INDEXED BY papers_pno_id" if self._pno_index else "papers"
        out = {}
        for chunk in _chunks([int(p) for p in pnos], 900):
            q = f"SELECT pno, paper_id FROM {table} WHERE pno IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._db.execute(q, chunk).fetchall()))
        return out

    def paper_ids(self) -> list[str]:
        return [pid for (pid,) in self._db.execute("SELECT paper_id FROM papers ORDER BY paper_id")]

    def paper_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM papers").fetchone()[0])

    keeps_notes = True

    def read_note(self, name: str) -> dict | None:
        """`NAME.json` in the index directory (None when absent or not a JSON object)."""
        try:
            value = json.loads((self.path / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_note(self, name: str, value: dict) -> None:
        """`NAME.json` in the index directory, replaced whole (a reader never sees half of it; the last writer wins)."""
        tmp = self.path / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_text(json.dumps(value, allow_nan=False))
            os.replace(tmp, self.path / f"{name}.json")
        finally:
            tmp.unlink(missing_ok=True)

    def token_counts(self) -> tuple[dict[str, int], int] | None:
        counts = dict(self._db.execute("SELECT token, count FROM token_counts"))
        return counts, int(sum(counts.values()))

    def stats(self) -> dict:
        meta = self.meta()
        st = self._state()
        papers = self._db.execute("SELECT COUNT(*) FROM papers").fetchone()[0]
        live = ~st.dead[st.pno] if st.rows else np.zeros(0, dtype=bool)
        counts = (np.bincount(np.asarray(st.facet)[live], minlength=len(FACET_LABELS)) if st.rows
                  else np.zeros(len(FACET_LABELS), int))
        by_facet = {f: int(counts[c]) for f, c in _FACET_CODES.items() if counts[c]}
        size = _dir_size(self.path)
        params = self.knn_params()
        if "nprobe" not in self._overrides and "nprobe" not in self._setting("knn_params", {}):
            params.pop("nprobe")  # not fixed: each IVF's calibrated value (knn, knn_calibration) is what queries use
        knn, calibration = {}, {}
        for f, c in _FACET_CODES.items():
            entry = st.manifest.get(f)
            if entry:
                delta = int(np.count_nonzero(st.facet[entry["rows"]:] == c))
                cal = entry.get("calibration")
                if not (isinstance(cal, dict) and {"recall", "target"} <= cal.keys()):
                    cal = None  # none, or a damaged entry: shown as the default nprobe, and due for re-calibration
                how = ("fixed" if "nprobe" in self._overrides or "nprobe" in self._setting("knn_params", {})
                       else f"calibrated: recall@100 {_stat_name(cal)}{cal['recall']} >= {cal['target']}" if cal else "default")
                # a calibration made for another target or statistic than this handle's settings (or by the older
                # per-sentence rule): the next index run re-calibrates it, `check recall --calibrate` does it now
                due = _calibration_due(cal, self.recall_target, self.recall_statistic)
                stale = (f"; not for knn_recall_target {self.recall_target:g} ({self.recall_statistic}): "
                         "`esqbe check recall --calibrate`" if due and cal else "")
                knn[f] = (f"{entry.get('structure', ANN_SQ8)} ({entry['size']} rows) + exact delta ({delta} rows), "
                          f"nprobe {self.nprobe_for(f, st)}{_refine_words(entry)} ({how}{stale})")
                calibration[f] = {"nprobe": self.nprobe_for(f, st), "refine": self.refine_for(f, st),
                                  "structure": entry.get("structure", ANN_SQ8), "setting": how.split(":")[0], **(cal or {}),
                                  "due": due}
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
            # per facet with an IVF: the nprobe queries use, and how it was chosen (calibrated for knn_recall_target)
            "knn_calibration": calibration,
            # top-level metadata keys and how many papers have each: what `--filter` can name
            "metadata_keys": {key: n for key, n in self._db.execute(
                "SELECT key, COUNT(*) FROM (SELECT metadata FROM papers WHERE json_valid(metadata)) AS p, json_each(p.metadata) "
                "WHERE type != 'null' GROUP BY key ORDER BY key") if listed_key(key)},  # json_valid: NaN stored by an older esqbe
            "bytes_on_disk": size,
            "bytes_per_paper": round(size / papers) if papers else None,
        }

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

    #: `ids_where` builds the metadata columns (every paper's metadata read) for at most this many papers; a larger
    #: index answers it only once a filter has built them (a server's reader keeps them per generation)
    IDS_WHERE_MAX_PAPERS = 100_000

    def ids_where(self, path: str, test) -> list[str]:
        built = self._meta_cols is not None and self._meta_cols[0] == self._generation()
        if not built and self._db.execute("SELECT COUNT(*) FROM papers").fetchone()[0] > self.IDS_WHERE_MAX_PAPERS:
            return []  # `esqbe search` must not read a million papers' metadata to look for an author
        return self._metadata_columns().ids_where(path, test)

    def check_filter(self, flt: MetadataFilter | None) -> None:
        """A key no paper has (a typo) or a value no paper has for its key: said, with near values, not "no hits"."""
        if flt:
            check_conditions(flt.conditions, self._metadata_columns())

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
        early: dict[str, IndexedPaper] = {}
        try:
            # kNN only ever sees the allowed papers: exact over a small allowed set, the ANN with an id bitmap otherwise
            knn = self.knn(request.vectors, request.knn_k, facet=request.facet, exclude=request.exclude,
                           restrict_to=restrict, effort=request.ann_effort)
            if request.with_papers and knn and bm25_job is not None and not bm25_job.done():
                # BM25 is still running on the other core: read the kNN's best papers meanwhile (most of the fused
                # top k), so that only BM25's own are left to read after it (~3 ms of the warm query at 1M papers)
                early = self.get([pid for pid, _ in top_k(knn, request.k)])
        finally:  # never leave the BM25 running past this query (a kNN error is raised, not hidden by BM25's)
            if bm25_job is not None:
                futures_wait([bm25_job])
        bm25 = bm25_job.result() if bm25_job is not None else {}
        fused = top_k(fuse(bm25, knn, request.fusion, request.bm25_weight), request.k)
        papers: dict[str, IndexedPaper] = {}
        if request.with_papers:
            missing = [pid for pid, _ in fused if pid not in early]
            papers = {**early, **(self.get(missing) if missing else {})}
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
            self._db = None  # type: ignore[assignment]  # closed: nothing reads it after close()
            self._release_write()


def _refine_words(entry: dict) -> str:
    """How `stats` and `check recall` name a PQ fast-scan IVF's re-scored papers (nothing for an IVF-SQ8's 2k)."""
    return f" refine {int(entry.get('refine', 2))}" if entry.get("structure") == ANN_PQ_FASTSCAN else ""


def _stat_name(cal: dict) -> str:
    """How a calibration's recall is named in `stats`: the mean (as before: unnamed) or "p10 "."""
    return "" if cal.get("statistic", "mean") == "mean" else f"{cal['statistic']} "
