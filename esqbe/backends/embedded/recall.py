"""Recall of the embedded index's IVF, measured on the index's own rows: the exact top papers of a facet
streamed over its rows (bounded memory at any size: one chunk of rows at a time, no copy of the facet), and the
writer's calibration of `nprobe` for a recall target.

Calibration counts recall as `esqbe check recall` does, on what the first stage returns (`KnnMixin.knn`): papers,
k = 100, each query a paper of the facet (a seeded sample, its own paper left out of both sides, as a query paper is)
asking with all its sentences of the facet; per query sentence the ANN's hits are folded to the best papers, whose
union is re-scored exactly, and the paper score is each sentence's best cosine summed over the sentences whose k best
papers it is among. The truth is the same score over all the facet's live rows (brute force), and the chosen `nprobe`
is the smallest of a fixed ladder whose recall@k on the sample reaches the target: its mean (`statistic="mean"`) or
its 10th percentile (`"p10"`: nine in ten query papers at least at the target, not just the average;
docs/performance.md measures what that costs). Cost: one exact pass over the facet's rows for the sample's sentences
(float16 rows read in chunks), then per rung tried a batched faiss search and each query's exact re-score; the
sample shrinks for large facets so that the exact pass stays under ~4e11 multiply-adds (docs/performance.md gives
the time at 1M papers).

An IVF of 4-bit PQ fast-scan codes (the writer's structure for a facet of 1,000 rows or more,
`ann.ANN_PQ_FASTSCAN`) has a second knob,
`refine`: per query sentence the ANN's hits are folded to the `refine * k` best papers (`2k` for an IVF-SQ8), asking it for
`oversample * k * refine / 2 + 16` hits, all re-scored exactly from the stored vectors; its coarser scores need more
than 2k papers to hold recall. Its calibration finds, for each refine of `REFINE_LADDER`, the fewest lists reaching
the target, and keeps the pair the first stage does fastest by a cost model of the two (`SCAN_NS_PER_CODE`,
`RESCORE_NS_PER_ROW`: lists x codes per list against papers x rows per paper), rather than the first refine reaching
the target within an eighth of the lists."""
from __future__ import annotations

import time

import numpy as np

from .layout import _State, f16_to_f32

#: the nprobe values calibration tries (capped at the IVF's list count): steps of ~1.25x from 64 up, so that holding
#: the target with 90% confidence does not overshoot by a 1.5x step (bisected: the extra rungs cost ~1 search each)
NPROBE_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
                 1024, 1280, 1536, 2048, 4096)
#: queries sampled for calibration (at most; fewer for a facet so large that the exact pass would cost more)
CALIBRATION_QUERIES = 256
_EXACT_BUDGET = 4e11  # multiply-adds of the calibration's exact pass
_CHUNK_ROWS = 131_072
#: papers re-scored per query sentence, as multiples of k, that calibration tries for a PQ fast-scan IVF, in order
REFINE_LADDER = (2, 3, 4, 6, 8)
#: the first stage's cost per query sentence, for choosing between (nprobe, refine) pairs that both reach the target:
#: faiss scanning one PQ fast-scan code, and re-scoring one stored row exactly (pread, float16 -> float32, product);
#: measured in the warm query at hard 1M on the 2-core reference machine (docs/performance.md)
SCAN_NS_PER_CODE = 5.8
RESCORE_NS_PER_ROW = 2_800.0
#: what the target bounds: the sample's mean recall, or its 10th percentile
RECALL_STATISTICS = ("mean", "p10")


def facet_rows(st: _State, code: int) -> np.ndarray:
    """Row numbers of the facet's live rows, read from the facet column in chunks."""
    out = []
    for lo in range(0, st.rows, 4_000_000):
        hi = min(st.rows, lo + 4_000_000)
        rows = lo + np.flatnonzero(np.asarray(st.facet[lo:hi]) == code)
        out.append(rows[~st.dead[np.asarray(st.pno[rows])]])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def exact_top_papers(st: _State, rows: np.ndarray, q: np.ndarray, k: int, own: np.ndarray | None = None,
                     chunk: int = _CHUNK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Per query vector, the k papers with the best cosine over `rows` (sorted row numbers of one facet, in paper
    order), best first, the query's `own` paper left out: (papers (m, k), cosines (m, k)), -1 / -inf padded.
    Streams `chunk` rows at a time, cut at paper boundaries, so a paper is scored once and memory stays bounded."""
    m = len(q)
    best_p = np.full((m, k), -1, dtype=np.int64)
    best_s = np.full((m, k), -np.inf, dtype=np.float32)
    lo = 0
    while lo < len(rows):
        hi = min(len(rows), lo + chunk)
        if hi < len(rows):  # move the cut to the first row of a paper
            pnos_at = np.asarray(st.pno[rows[lo:hi + 1]])
            cut = np.flatnonzero(pnos_at[1:] != pnos_at[:-1])
            hi = lo + int(cut[-1]) + 1 if len(cut) else hi
        part = rows[lo:hi]
        lo = hi
        papers = np.asarray(st.pno[part]).astype(np.int64)
        # (m, rows): the per-paper maximum then runs along contiguous rows, ~4x faster than down columns
        sims = q @ f16_to_f32(st.vec[part]).T
        first = np.flatnonzero(np.r_[True, papers[1:] != papers[:-1]])
        best, pp = np.maximum.reduceat(sims, first, axis=1), papers[first]  # (m, P)
        if own is not None:
            best[pp[None, :] == own[:, None]] = -np.inf
        kk = min(k, len(pp))
        top = np.argpartition(-best, kk - 1, axis=1)[:, :kk]
        all_s = np.concatenate([best_s, np.take_along_axis(best, top, axis=1)], axis=1)
        all_p = np.concatenate([best_p, pp[top]], axis=1)
        keep = np.argsort(-all_s, axis=1, kind="stable")[:, :k]
        best_s, best_p = np.take_along_axis(all_s, keep, axis=1), np.take_along_axis(all_p, keep, axis=1)
    best_p[~np.isfinite(best_s)] = -1
    return best_p, best_s


def ann_hits(k: int, oversample: int, refine: int = 2) -> int:
    """Sentence hits the first stage asks the ANN for per query sentence (`oversample * k + 16` at refine 2)."""
    return oversample * k * refine // 2 + 16


def ann_candidates(ids: np.ndarray, sims: np.ndarray, k: int, refine: int = 2) -> list[np.ndarray]:
    """Per query, the papers the first stage re-scores exactly from the ANN's sentence hits: the `refine * k` best by
    approximate score (`KnnMixin.knn` keeps them with this very rule, `ann_candidate_scores`)."""
    return [papers for papers, _ in ann_candidate_scores(ids, sims, k, refine)]


def ann_candidate_scores(ids: np.ndarray, sims: np.ndarray, k: int, refine: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    """`ann_candidates` with each paper's best approximate score: per query, (papers, scores)."""
    out = []
    for hit_ids, hit_sims in zip(ids, sims):
        ok = hit_ids >= 0
        hit_ids, hit_sims = hit_ids[ok], hit_sims[ok]
        order = np.lexsort((-hit_sims, hit_ids))
        hit_ids, hit_sims = hit_ids[order], hit_sims[order]
        first = np.r_[True, hit_ids[1:] != hit_ids[:-1]]
        hit_ids, hit_sims = hit_ids[first], hit_sims[first]
        if len(hit_ids) > refine * k:
            top = np.argpartition(-hit_sims, refine * k - 1)[: refine * k]
            hit_ids, hit_sims = hit_ids[top], hit_sims[top]
        out.append((hit_ids, hit_sims))
    return out


def capped_union(candidates: list[tuple[np.ndarray, np.ndarray]], cap: int, live=None) -> np.ndarray:
    """The papers of all query sentences' candidates (sorted), those `live(papers)` (a mask) keeps, at most `cap` of them
    (0: no cap): each sentence's best candidates first, i.e. the papers whose best rank in any sentence's candidates
    (by approximate score) is highest, ties by their approximate score summed over the sentences. Every sentence
    keeps its own top candidates, so its k best of the re-scored are its true k best as far as the ANN found them;
    a cap that kept the best summed scores instead favoured papers near many sentences and left a sentence's own
    best out (at hard 1M a cap of 1,000 held recall@100 0.61 for queries of 6+ sentences against 0.95 this way)."""
    if not candidates:
        return np.zeros(0, dtype=np.int64)
    papers, inverse = np.unique(np.concatenate([c[0] for c in candidates]).astype(np.int64), return_inverse=True)
    total = np.bincount(inverse, weights=np.concatenate([c[1] for c in candidates]), minlength=len(papers))
    # each candidate's rank among its sentence's candidates (0 = that sentence's best approximate score)
    ranks = np.concatenate([np.argsort(np.argsort(-c[1], kind="stable"), kind="stable") for c in candidates])
    best = np.full(len(papers), np.iinfo(np.int64).max)
    np.minimum.at(best, inverse, ranks)
    if live is not None:
        ok = live(papers)
        papers, total, best = papers[ok], total[ok], best[ok]
    if cap <= 0 or len(papers) <= cap:
        return papers
    return np.sort(papers[np.lexsort((-total, best))[:cap]])


def recall_of(found: list[np.ndarray], truth: np.ndarray) -> np.ndarray:
    """Per query, the share of its true papers (a row of `truth`, -1 padded) that `found` holds."""
    out = np.ones(len(truth))
    for i, (f, t) in enumerate(zip(found, truth)):
        t = t[t >= 0]
        if len(t):
            out[i] = np.isin(t, f).mean()
    return out


def calibrate_nprobe(st: _State, code: int, index, *, target: float, oversample: int, k: int = 100,
                     seed: int = 0, queries: int = CALIBRATION_QUERIES, statistic: str = "mean",
                     refines: tuple[int, ...] = (2,), exact_cap: int = 0) -> dict:
    """The smallest `nprobe` of the ladder whose recall@k (papers) on a seeded sample of the facet's own papers,
    each queried with all its sentences of the facet as a query does, reaches `target` by `statistic` (the sample's
    mean, held with 90% confidence: its lower bound `_lower_bound`; or its 10th percentile; the IVF's list count,
    every list, if none below it does), for the one of `refines` whose pair is the cheapest by the cost model (the
    first on a tie); `refines` = (2,) for an IVF-SQ8. `exact_cap` is the first stage's (`KNN_DEFAULTS`).
    Returns {"nprobe", "refine", "recall" (the statistic at that nprobe), "statistic", "mean", "p10", "lower_bound",
    "target", "queries" (query papers), "sentences", "unit": "papers", "seconds"}.

    Recall is counted as `esqbe check recall` counts it, on what the first stage returns (`KnnMixin.knn`): per query
    sentence the ANN's hits folded to the `refine * k` best papers, their union (capped at `exact_cap`) re-scored
    exactly, each sentence's k best of those summed into the paper's score, the top k against the same score over
    every row. Counting each sentence alone would be too strict: a query of several sentences recovers from
    one sentence's miss, so that held recall@100 at ~0.98 for a 0.95 target at hard 1M (docs/performance.md)."""
    import faiss

    if statistic not in RECALL_STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(RECALL_STATISTICS)} (got {statistic!r})")
    started = time.perf_counter()
    rows = facet_rows(st, code)
    pnos = np.asarray(st.pno[rows]).astype(np.int64)
    papers, first_row, counts = np.unique(pnos, return_index=True, return_counts=True)
    if len(papers) < 2:  # nothing to measure (every paper retired, or one): every list, as exact as the IVF gets
        return {"nprobe": int(index.nlist), "refine": int(refines[-1]), "recall": 1.0, "statistic": statistic,
                "mean": 1.0, "p10": 1.0, "target": target, "queries": 0, "sentences": 0, "unit": "papers",
                "seconds": 0.0}
    # query papers in a seeded order until their sentences fill the exact pass's budget
    budget = int(np.clip(_EXACT_BUDGET / max(1, len(rows) * st.dim), 32, queries))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(papers))
    take = order[: max(1, int(np.searchsorted(np.cumsum(counts[order]), budget, side="right")))]
    take = np.sort(take)
    q_rows = np.concatenate([rows[first_row[i] : first_row[i] + counts[i]] for i in take])
    owner = np.repeat(np.arange(len(take)), counts[take])  # each query sentence's query paper
    own = np.repeat(papers[take], counts[take])
    q = np.ascontiguousarray(f16_to_f32(st.vec[q_rows]))
    truth_p, truth_s = exact_top_papers(st, rows, q, k, own)
    truth = [_paper_top(truth_p[owner == i], truth_s[owner == i], k) for i in range(len(take))]
    nlist = int(index.nlist)
    ladder = [p for p in NPROBE_LADDER if p < nlist] + [nlist]
    bits = st.ok_bits()
    sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits)) if bits is not None else None
    list_rows = len(rows) / nlist  # codes scanned per list visited
    paper_rows = len(rows) / len(papers)  # rows re-scored per paper

    def cost(nprobe: int, refine: int) -> float:
        """Estimated ns per query sentence: the lists scanned and the papers re-scored."""
        return nprobe * list_rows * SCAN_NS_PER_CODE + refine * k * paper_rows * RESCORE_NS_PER_ROW
    limit_of = {r: max(exact_cap, r * k) if exact_cap > 0 else 0 for r in refines}

    def recall_at(nprobe: int, refine: int) -> np.ndarray:
        """Per query paper, recall@k of the first stage at this rung."""
        sp = faiss.SearchParametersIVF(nprobe=int(nprobe))  # type: ignore[call-arg]
        if sel is not None:
            sp.sel = sel
        sims, ids = index.search(q, ann_hits(k, oversample, refine), params=sp)
        cands = ann_candidate_scores(ids, sims, k, refine)
        out = np.ones(len(take))
        for i, paper in enumerate(papers[take]):
            mine = np.flatnonzero(owner == i)
            found = first_stage_top(st, code, [cands[j] for j in mine], q[mine], int(paper), k, limit_of[refine])
            out[i] = recall_of([found], truth[i][None, :])[0]
        return out

    best: tuple[int, int, np.ndarray] | None = None  # (nprobe, refine, per-query recall) of the cheapest so far
    fewest = nlist + 1  # the fewest lists any refine so far reached the target with
    last_seen = (nlist, int(refines[-1]), np.ones(1))
    for refine in refines:
        # the first rung reaching the target, by bisection (recall grows with nprobe), among those scanning fewer
        # lists than a smaller refine needed: a larger refine with as many lists re-scores more for nothing
        rungs = [p for p in ladder if p < fewest]
        lo, hi = 0, len(rungs)
        found: tuple[int, int, np.ndarray] | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            per_query = recall_at(rungs[mid], refine)
            last_seen = (int(rungs[mid]), int(refine), per_query)
            if _reaches(per_query, statistic, target):
                found, hi = (int(rungs[mid]), int(refine), per_query), mid
            else:
                lo = mid + 1
        if found is not None:
            fewest = found[0]
            if best is None or cost(found[0], found[1]) < cost(best[0], best[1]):
                best = found
    chosen, refine, per_query = best if best is not None else last_seen
    return {"nprobe": int(chosen), "refine": int(refine), "recall": round(_statistic(per_query, statistic), 4),
            "statistic": statistic, "mean": round(_statistic(per_query, "mean"), 4),
            "p10": round(_statistic(per_query, "p10"), 4), "lower_bound": round(_lower_bound(per_query), 4),
            "target": target, "queries": int(len(take)),
            "sentences": int(len(q)), "unit": "papers", "seconds": round(time.perf_counter() - started, 2)}


def first_stage_top(st: _State, code: int, candidates: list[tuple[np.ndarray, np.ndarray]], q: np.ndarray, own: int,
                    k: int, cap: int) -> np.ndarray:
    """The k papers the first stage's kNN returns for one query paper (`own`, left out) from its sentences' ANN
    candidates (`ann_candidate_scores`): their union capped at `cap` (`capped_union`), re-scored exactly over the
    facet's rows, each sentence's k best summed (`KnnMixin.knn` / `_top_papers`); -1 padded."""
    pool = capped_union(candidates, cap, lambda p: (p != own) & ~st.dead[p])
    return _paper_top(*_rescore(st, pool, code, q, k), k)


def _rescore(st: _State, pool: np.ndarray, code: int, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact re-score of a query's pooled papers over their rows of the facet, as the first stage's
    (`KnnMixin._exact_best`), read through the memory map (a writer's short pass): per query sentence its k best
    papers of the pool, (papers (m, k'), cosines (m, k')) -1 / -inf padded."""
    m = len(q)
    if len(pool) == 0:
        return np.full((m, 1), -1, dtype=np.int64), np.full((m, 1), -np.inf, dtype=np.float32)
    r, owner = st.rows_of(pool, [code])
    if len(r) == 0:
        return np.full((m, 1), -1, dtype=np.int64), np.full((m, 1), -np.inf, dtype=np.float32)
    sims = q @ f16_to_f32(st.vec[r]).T  # (m, rows)
    first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    best, pp = np.maximum.reduceat(sims, first, axis=1), owner[first]  # (m, P)
    kk = min(k, len(pp))
    top = np.argpartition(-best, kk - 1, axis=1)[:, :kk]
    return pp[top], np.take_along_axis(best, top, axis=1)


def _paper_top(papers: np.ndarray, cosines: np.ndarray, k: int) -> np.ndarray:
    """The first stage's paper score from each query sentence's best papers (rows of `papers` / `cosines`, -1 /
    -inf padded): a paper's cosines summed over the sentences whose best it is among; the k best papers, -1 padded
    (`KnnMixin._top_papers`)."""
    ok = (papers >= 0) & np.isfinite(cosines)
    if not ok.any():
        return np.full(k, -1, dtype=np.int64)
    ids, inverse = np.unique(papers[ok], return_inverse=True)
    total = np.bincount(inverse, weights=cosines[ok].astype(np.float64), minlength=len(ids))
    order = np.lexsort((ids, -total))[:k]
    return np.r_[ids[order], np.full(k - len(order), -1, dtype=np.int64)]


def _statistic(per_query: np.ndarray, statistic: str) -> float:
    return float(per_query.mean() if statistic == "mean" else np.percentile(per_query, 10))


#: one-sided z of the bound calibration holds the mean to: the sample's mean less 1.28 standard errors (90%)
_Z_MEAN = 1.2816


def _lower_bound(per_query: np.ndarray) -> float:
    """The sample mean less `_Z_MEAN` standard errors: with 90% confidence the facet's mean is at least this."""
    if len(per_query) < 2:
        return float(per_query.mean())
    return float(per_query.mean() - _Z_MEAN * per_query.std(ddof=1) / np.sqrt(len(per_query)))


def _reaches(per_query: np.ndarray, statistic: str, target: float) -> bool:
    """Whether a rung holds the target: for the mean, its 90% lower bound (a sample of ~80 query papers estimates it
    to about +-0.01, and a setting whose sample mean just reaches 0.95 gave 0.944 on another 40 papers at hard 100K;
    docs/performance.md); for the 10th percentile, the sample's."""
    return (_lower_bound(per_query) if statistic == "mean" else _statistic(per_query, statistic)) >= target
