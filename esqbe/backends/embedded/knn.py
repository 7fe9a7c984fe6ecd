"""kNN maths on the embedded index: per query sentence, the papers whose best sentence is closest; exact over a
small allowed set, else the ANN's candidates (plus each facet's exact delta) re-scored exactly; the engines'
nested-kNN score model (mean over query sentences of the best cosine)."""
from __future__ import annotations

import numpy as np

from ...domain import FACET_LABELS
from .ann import _search_ann_threads
from .host import EmbeddedHost
from .layout import _FACET_CODES, _State, f16_to_f32
from .recall import ann_candidate_scores, ann_hits, capped_union


class KnnMixin(EmbeddedHost):
    """kNN (mixed into EmbeddedBackend). Uses the backend's `_state`, `_ann`, `_delta` (AnnMixin), `knn_params`,
    `nprobe_for`, `refine_for`,
    `pnos`, `_ids_of` and `_read_rows`."""

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
        rows, papers = st.rows_of(pnos, codes)  # only the facet's rows are read (about half a paper's rows)
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros((0, len(q)), dtype=np.float32)
        runs = np.flatnonzero(np.r_[True, np.diff(rows) != 1])  # a paper's facet rows are one run or a few
        vectors = self._read_rows(st, rows[runs], np.diff(np.r_[runs, len(rows)]))
        # q.T made contiguous: OpenBLAS multiplies (rows, dim) by a contiguous (dim, m) ~3-10x faster than by a
        # transposed view on this machine (docs/performance.md), with the same products
        sims = f16_to_f32(vectors) @ np.ascontiguousarray(q.T)
        first = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
        return papers[first], np.maximum.reduceat(sims, first, axis=0)

    def knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None, exclude: frozenset[str] = frozenset(),
            restrict_to: frozenset[str] | None = None, allowed: np.ndarray | None = None,
            exact: bool = False, effort: float = 1.0) -> dict[str, float]:
        """Per query sentence, the k most similar papers by their best sentence (of `facet`, if given).

        Returns paper id -> mean over query sentences of the best cosine (0 where a query sentence did
        not reach the paper among its k), the engines' nested-kNN score model. `restrict_to` (ids) and
        `allowed` (sorted paper numbers, see `pnos()`) limit the candidates; a small allowed set is
        searched exactly. `exact=True` searches every row exactly (the reference for recall). `effort` scales
        each IVF's nprobe (at least one list; FirstStageRequest.ann_effort).
        """
        if not (np.isfinite(effort) and effort > 0):
            raise ValueError(f"ANN effort must be a finite number above 0 (got {effort!r})")
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
        cand, ann_cand = [], []
        floor = 0  # the cap never keeps fewer papers than one query sentence re-scores (refine * k)
        for code in codes:
            index = self._ann(st, code)
            if index is not None:
                import faiss

                refine = self.refine_for(FACET_LABELS[code], st)
                kk = ann_hits(k, int(params["oversample"]), refine)

                if allowed is not None:
                    mask = np.zeros(len(st.dead), dtype=bool)
                    mask[allowed] = True
                    bits = np.packbits(mask, bitorder="little")
                else:
                    bits = st.ok_bits()
                # faiss's generated stubs miss the keyword arguments its SWIG constructors take
                nprobe = max(1, round(self.nprobe_for(FACET_LABELS[code], st) * effort))
                sp = faiss.SearchParametersIVF(nprobe=nprobe)  # type: ignore[call-arg]
                if bits is not None:
                    sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))
                    sp.sel = sel
                sims, ids = _search_ann_threads(index, q, kk, sp)
                # the refine * k papers with the best approximate sentence score go to exact re-scoring (the same
                # rule the recall calibration counts with; 2k for an IVF-SQ8), their union capped below
                ann_cand.extend(ann_candidate_scores(ids[:m], sims[:m], k, refine))
                floor = max(floor, refine * k)
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
        if ann_cand:
            # a many-sentence query re-scores at most `exact_cap` papers, each sentence's best candidates first
            # (capped_union): m sentences x refine * k papers made p99 grow with m. Calibration counts the cap; at hard
            # 1M a cap of 1,000 held recall@100 0.966 against 0.969 uncapped (docs/performance.md)
            cap = int(params["exact_cap"])
            cand.append(capped_union(ann_cand, max(cap, floor) if cap > 0 else 0,
                                     lambda p: ~st.dead[p] & ~np.isin(p, banned)))  # a retired or excluded paper takes no place
        if not cand:
            return {}
        pool = np.unique(np.concatenate(cand).astype(np.int64))
        pool = pool[~st.dead[pool]]
        if len(banned):
            pool = np.setdiff1d(pool, banned)
        papers, best = self._exact_best(st, pool, codes if facet is not None else None, q)
        return self._top_papers(papers, best, k)

    def _brute_force(self, st: _State, codes: list[int], banned: np.ndarray, q: np.ndarray, k: int,
                     chunk: int = 500_000) -> tuple[np.ndarray, np.ndarray]:
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
            sims = f16_to_f32(st.vec[rows]) @ q.T
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
