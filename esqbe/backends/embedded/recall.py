"""Recall of the embedded index's IVF, measured on the index's own rows (issue 23): the exact top papers of a facet
streamed over its rows (bounded memory at any size: one chunk of rows at a time, no copy of the facet), and the
writer's calibration of `nprobe` for a recall target.

Calibration counts recall as the first stage does (`KnnMixin.knn`): papers, k = 100, per query sentence the ANN's
`oversample * k + 16` sentence hits folded to the `2k` best papers, which are re-scored exactly, so a true top-k
paper is found exactly when it is among those `2k`. The queries are stored sentence vectors of the facet (a seeded
sample, each query's own paper left out of both sides, as a query paper is), the truth is brute force over the
facet's live rows, and the chosen `nprobe` is the smallest of a fixed ladder whose recall@k on the sample reaches the
target: its mean (`statistic="mean"`) or its 10th percentile (`"p10"`: nine in ten query sentences at least at the
target, not just the average; docs/performance.md measures what that costs). Cost: one exact pass over the facet's
rows for the sample (float16 rows read in chunks) and a batched faiss search per rung tried; the sample shrinks for
large facets so that the exact pass stays under ~4e11 multiply-adds (docs/performance.md gives the time at 1M papers).

An IVF of 4-bit PQ fast-scan codes (the writer's structure since session 8, `ann.ANN_PQ_FASTSCAN`) has a second knob,
`refine`: per query sentence the ANN's hits are folded to the `refine * k` best papers (`2k` above), asking it for
`oversample * k * refine / 2 + 16` hits, all re-scored exactly from the stored vectors; its coarser scores need more
than 2k papers to hold recall. Its calibration tries `REFINE_LADDER` in order and keeps the first refine whose nprobe
reaching the target scans at most an eighth of the lists (`_SCAN_SHARE`), else the refine reaching it with the
fewest lists: the scan and the exact re-score both cost, and this keeps each bounded."""
from __future__ import annotations

import time

import numpy as np

from .layout import _State, f16_to_f32

#: the nprobe values calibration tries, in order (capped at the IVF's list count)
NPROBE_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)
#: queries sampled for calibration (at most; fewer for a facet so large that the exact pass would cost more)
CALIBRATION_QUERIES = 256
_EXACT_BUDGET = 4e11  # multiply-adds of the calibration's exact pass
_CHUNK_ROWS = 131_072
#: papers re-scored per query sentence, as multiples of k, that calibration tries for a PQ fast-scan IVF, in order
REFINE_LADDER = (2, 3, 4, 6, 8)
_SCAN_SHARE = 8  # a refine is kept when its nprobe is at most nlist / _SCAN_SHARE
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
    (0: no cap): those with the highest sum over query sentences of their approximate score, a sentence whose
    candidates a paper is not among counting 0, as the nested-kNN score counts a sentence whose top k it is not in."""
    if not candidates:
        return np.zeros(0, dtype=np.int64)
    papers, inverse = np.unique(np.concatenate([c[0] for c in candidates]).astype(np.int64), return_inverse=True)
    total = np.bincount(inverse, weights=np.concatenate([c[1] for c in candidates]), minlength=len(papers))
    if live is not None:
        ok = live(papers)
        papers, total = papers[ok], total[ok]
    if cap <= 0 or len(papers) <= cap:
        return papers
    return np.sort(papers[np.argpartition(-total, cap - 1)[:cap]])


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
                     refines: tuple[int, ...] = (2,)) -> dict:
    """The smallest `nprobe` of the ladder whose recall@k (papers) on a seeded sample of the facet's own sentences
    reaches `target` by `statistic` (the sample's mean, or its 10th percentile; the IVF's list count, every list,
    if none below it does), for the first of `refines` that reaches it within an eighth of the lists, else for the
    one that reaches it with the fewest lists (the smaller on a tie); `refines` = (2,), today's rule, for an
    IVF-SQ8. Returns {"nprobe", "refine", "recall" (the statistic at
    that nprobe), "statistic", "mean", "p10", "target", "queries", "seconds"}."""
    import faiss

    if statistic not in RECALL_STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(RECALL_STATISTICS)} (got {statistic!r})")
    started = time.perf_counter()
    rows = facet_rows(st, code)
    if len(rows) < 2:  # nothing to measure (every row retired, or one): every list, as exact as the IVF gets
        return {"nprobe": int(index.nlist), "refine": int(refines[-1]), "recall": 1.0, "statistic": statistic,
                "mean": 1.0, "p10": 1.0, "target": target, "queries": 0, "seconds": 0.0}
    n_q = int(np.clip(_EXACT_BUDGET / max(1, len(rows) * st.dim), 32, queries))
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(len(rows), size=min(n_q, len(rows)), replace=False))
    q = np.ascontiguousarray(np.asarray(st.vec[rows[picked]], dtype=np.float32))
    own = np.asarray(st.pno[rows[picked]]).astype(np.int64)
    truth, _ = exact_top_papers(st, rows, q, k, own)
    nlist = int(index.nlist)
    ladder = [p for p in NPROBE_LADDER if p < nlist] + [nlist]
    bits = st.ok_bits()
    sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits)) if bits is not None else None
    cap = max(1, nlist // _SCAN_SHARE)
    best: tuple[int, int, np.ndarray] | None = None  # (nprobe, refine, per-query recall) of the fewest lists so far
    last_seen = (nlist, int(refines[-1]), np.ones(1))
    for refine in refines:
        kk = ann_hits(k, oversample, refine)
        for nprobe in ladder:
            if best is not None and nprobe >= best[0]:
                break  # a larger refine is worth its re-scoring only with fewer lists
            sp = faiss.SearchParametersIVF(nprobe=int(nprobe))  # type: ignore[call-arg]
            if sel is not None:
                sp.sel = sel
            sims, ids = index.search(q, kk, params=sp)
            found = [c[c != o] for c, o in zip(ann_candidates(ids, sims, k, refine), own)]
            per_query = recall_of(found, truth)
            last_seen = (int(nprobe), int(refine), per_query)
            if _statistic(per_query, statistic) >= target:
                best = (int(nprobe), int(refine), per_query)
                break
        if best is not None and best[0] <= cap:
            break  # the smallest refine scanning at most an eighth of the lists
    chosen, refine, per_query = best if best is not None else last_seen
    return {"nprobe": int(chosen), "refine": int(refine), "recall": round(_statistic(per_query, statistic), 4),
            "statistic": statistic, "mean": round(_statistic(per_query, "mean"), 4),
            "p10": round(_statistic(per_query, "p10"), 4), "target": target, "queries": int(len(q)),
            "seconds": round(time.perf_counter() - started, 2)}


def _statistic(per_query: np.ndarray, statistic: str) -> float:
    return float(per_query.mean() if statistic == "mean" else np.percentile(per_query, 10))
