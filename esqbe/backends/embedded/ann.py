"""The approximate side of kNN on the embedded index: per-facet faiss IVF files (built and merged by a writer,
swapped in through the manifest), a reader's view of the rows (`_state`) with each facet's exact delta, and the
threads faiss searches run on.

faiss searches on one OpenMP thread: a query's few vectors split poorly over threads, and BM25 runs on the
other core meanwhile (first_stage); faiss's spare threads spinning between searches slow both. A query of many
sentences has its search split into parts instead, one per ANN thread (`_search_ann_threads`). OpenMP's thread
count is a per-thread setting, so the searches run in threads of esqbe's own (`_ann_pool`) whose count is set
once, when each starts (`_one_omp_thread`): the threads of the application that calls esqbe keep theirs."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...domain import FACET_LABELS
from .host import EmbeddedHost
from .layout import _FACET_CODES, _chunks, _State
from .recall import REFINE_LADDER, calibrate_nprobe

_POOL = None
#: the IVF codes a writer builds (the manifest entry's "structure"; an entry without one is an IVF-SQ8, as every
#: index built before this structure): 4-bit PQ fast-scan, two dimensions per sub-quantizer (dim / 2 bytes a row, against
#: dim for SQ8), ~6x faster to scan per list on the hard corpus at equal recall (docs/performance.md),
#: its coarser scores made up by re-scoring more papers exactly (the calibrated `refine`)
ANN_PQ_FASTSCAN = "ivf-pq4fs"
ANN_SQ8 = "ivf-sq8"
_PQ_MIN_ROWS = 1_000  # fewer rows (a forced tiny ANN) get SQ8: PQ's 16-centroid sub-quantizers need >= 624 samples
_ANN_POOL = None


class AnnMixin(EmbeddedHost):
    """ANN files and the reader's view (mixed into EmbeddedBackend). Uses the backend's `_acquire_write`, `_tx`,
    `_bump_generation` (WriteLockMixin), `knn_params`, `recall_target`, `recall_statistic`, `meta`, `_setting`,
    `_set` and `_generation`."""

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
            name, size, trained_on, index = self._build_ann(st, label, code, None if retrain else entry)
            structure = _structure_of(index)
            manifest[label] = {"file": name, "rows": st.rows, "size": size, "trained_on": trained_on,
                               "structure": structure}
            # the nprobe (and, for PQ fast-scan, the papers re-scored) that hold the recall target on this IVF,
            # measured on the facet's own rows
            manifest[label] = self._calibrated(st, label, code, index, manifest[label], self.recall_target,
                                               self.recall_statistic, progress)
            del index
            with self._tx():
                self._set("ann", manifest)
                self._bump_generation()
            if entry is not None:
                (self.path / "ann" / entry["file"]).unlink(missing_ok=True)
            built[label] = manifest[label]
        return built

    def calibrate_knn(self, target: float, statistic: str = "mean", *, force: bool = False,
                      progress=None) -> dict | None:
        """Re-calibrate each facet's IVF (nprobe, and for PQ fast-scan the papers re-scored) for recall@100 >= `target`
        by `statistic`, without rebuilding it, where its stored calibration is for another target or statistic, or
        was counted by an older rule (per sentence, before "unit": "papers"), or `force`. The writer calibrates each
        IVF as it builds it; this is for an IVF built before the target changed. Takes the write lock only when
        something is due. Returns {facet: calibration} of what was stored, None when nothing was due."""
        def due(manifest: dict) -> list[str]:
            return [label for label, entry in manifest.items()
                    if force or _calibration_due(entry.get("calibration"), target, statistic)]

        if not due(self._setting("ann", {})):
            return None
        self._acquire_write()
        st = self._state()
        manifest = dict(st.manifest)  # as the write lock found it (another writer may have calibrated meanwhile)
        done = {}
        for label in due(manifest):
            index = self._ann(st, _FACET_CODES[label])
            manifest[label] = self._calibrated(st, label, _FACET_CODES[label], index, manifest[label], target,
                                               statistic, progress)
            done[label] = manifest[label]["calibration"]
        if done:
            with self._tx():
                self._set("ann", manifest)
                self._bump_generation()
        return done or None

    def _calibrated(self, st: _State, label: str, code: int, index, entry: dict, target: float, statistic: str,
                    progress=None) -> dict:
        """The manifest entry of a facet's IVF with its calibration for `target` (recall@100 by `statistic`)."""
        if progress:
            progress(f"calibrating the {label} ANN index for recall@100 ({statistic}) >= {target}")
        params = self.knn_params()
        cal = calibrate_nprobe(st, code, index, target=target, oversample=int(params["oversample"]), statistic=statistic,
                               refines=REFINE_LADDER if entry.get("structure") == ANN_PQ_FASTSCAN else (2,),
                               exact_cap=int(params["exact_cap"]))
        return {**entry, "calibration": cal, "nprobe": cal["nprobe"], "refine": cal["refine"]}

    def _build_ann(self, st: _State, label: str, code: int, entry: dict | None) -> tuple[str, int, int, object]:
        import faiss

        dim = st.dim
        if entry is None:
            rows = np.flatnonzero(st.facet[: st.rows] == code)
            rows = rows[~st.dead[st.pno[rows]]]
            nlist = int(np.clip(min(2 * np.sqrt(len(rows)), len(rows) / 39), 1, 2048))
            rng = np.random.default_rng(0)
            sample = np.sort(rng.choice(len(rows), size=min(len(rows), 40 * nlist), replace=False))
            train = np.asarray(st.vec[rows[sample]], dtype=np.float32)
            if dim % 2 == 0 and len(rows) >= _PQ_MIN_ROWS:
                index: faiss.Index = faiss.index_factory(dim, f"IVF{nlist},PQ{dim // 2}x4fs", faiss.METRIC_INNER_PRODUCT)
            else:
                index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                                      faiss.METRIC_INNER_PRODUCT)
            faiss.extract_index_ivf(index).cp.niter = 10
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
        return name, int(index.ntotal), trained_on, index

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


def _calibration_due(cal, target: float, statistic: str) -> bool:
    """Whether a stored IVF calibration no longer answers for `target` / `statistic`: none, another target or
    statistic, one counted per sentence by an esqbe before recall was counted per query paper, or one that is not
    a calibration at all (a damaged manifest entry: re-calibrating writes a good one)."""
    if not isinstance(cal, dict) or cal.get("unit") != "papers" or cal.get("statistic", "mean") != statistic:
        return True
    stored = cal.get("target")
    return not isinstance(stored, (int, float)) or isinstance(stored, bool) or float(stored) != float(target)


def _structure_of(index) -> str:
    """The manifest's name of an ANN index's structure."""
    import faiss

    return ANN_PQ_FASTSCAN if isinstance(index, faiss.IndexIVFPQFastScan) else ANN_SQ8


def _first_stage_pool():
    """One worker thread shared by every embedded index of the process (BM25 beside the kNN)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(1, thread_name_prefix="esqbe-bm25")
    return _POOL


def _one_omp_thread() -> None:
    """Initializer of each ANN search thread: faiss on one OpenMP thread, set once for this thread only."""
    import faiss

    faiss.omp_set_num_threads(1)


def _ann_pool() -> ThreadPoolExecutor:
    """The threads faiss searches run on, shared by every embedded index of the process: as many as there are
    cores, so that concurrent queries search at once as they did on their own threads."""
    global _ANN_POOL
    if _ANN_POOL is None:
        _ANN_POOL = ThreadPoolExecutor(_ann_threads(), thread_name_prefix="esqbe-ann", initializer=_one_omp_thread)
    return _ANN_POOL


def _ann_threads() -> int:
    """How many ANN threads `_ann_pool` has."""
    return max(2, os.cpu_count() or 1)


def _forget_pool() -> None:  # a forked child has no worker threads: it makes its own pools
    global _POOL, _ANN_POOL
    _POOL = None
    _ANN_POOL = None


os.register_at_fork(after_in_child=_forget_pool)


#: a query of more sentences than this has its ANN search split over the ANN threads, into one part per this many
#: sentences, one part per thread at most (the hits are the same: each query sentence is searched on its own). A
#: query's BM25 ends long before the ANN search of a many-sentence query, which left the other core idle: at hard 1M
#: the background queries of 8-12 sentences (the p99) spent 30-40 ms in faiss on one core
#: (docs/performance.md)
ANN_SPLIT_SENTENCES = 4


def _search_ann_threads(index, q: np.ndarray, k: int, params):
    """faiss search on one OpenMP thread per part (see the module docstring): handed to the ANN threads, which hold
    that setting from their start, in ceil(m / `ANN_SPLIT_SENTENCES`) parts of nearly equal size for m query
    sentences, one per ANN thread at most; the caller waits (faiss releases the GIL, so BM25 runs meanwhile)."""
    pool = _ann_pool()
    parts = min(_ann_threads(), -(-len(q) // ANN_SPLIT_SENTENCES))
    if parts <= 1:
        return pool.submit(index.search, q, k, params=params).result()
    futures = [pool.submit(index.search, part, k, params=params) for part in np.array_split(q, parts)]
    results = [f.result() for f in futures]
    return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
