"""`esqbe check recall`: how much of the exact kNN the first stage's approximate kNN finds, on the user's own index.

A seeded sample of the index's papers are the queries. For each facet, each query paper's sentences of that facet
are searched as a query does (the first stage's facet-filtered kNN alone: papers, k = 100, the query paper left
out) and exactly (`Backend.exact_knn`: brute force over the facet's rows on the embedded index, a `script_score`
over every document on the engines), and recall@10 / @100 compare the top papers of the two. Reported per facet:
mean, min and 10th percentile of each recall, the latency of both searches, and the setting that decided the
approximate search (`Backend.knn_setting`: nprobe calibrated or fixed, or exact)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..domain import FACET_LABELS, FirstStageRequest
from ..errors import UserError

RECALL_KS = (10, 100)


@dataclass
class FacetRecall:
    facet: str
    queries: int
    setting: str
    recall: dict[str, dict[str, float]] = field(default_factory=dict)  # "@10" -> {"mean", "min", "p10"}
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # "knn" / "exact" -> {"p50", "p99"}


@dataclass
class RecallReport:
    backend: str
    papers: int
    queries: int
    seed: int
    k: int
    facets: list[FacetRecall]
    #: per query, what each side returned (paper ids, best first), when asked for (`keep_results`)
    results: list[dict] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _top(scores: dict[str, float], n: int) -> list[str]:
    return [pid for pid, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def _spread(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": round(float(a.mean()), 4), "min": round(float(a.min()), 4),
            "p10": round(float(np.percentile(a, 10)), 4)}


def _latency(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float) * 1000
    return {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2)}


def check_recall(backend, *, queries: int = 50, facet: str | None = None, seed: int = 0, k: int = 100,
                 keep_results: bool = False) -> RecallReport:
    """Measure the first stage's kNN recall@10 and @k against exact search on `backend`'s own papers."""
    if queries < 1:
        raise UserError(f"--queries must be at least 1 (got {queries})")
    ids, total = backend.sample_papers(queries, seed)
    if not ids:
        raise UserError("the index holds no papers: nothing to measure recall on")
    papers = backend.get(ids)
    facets = [facet] if facet else list(FACET_LABELS)
    out, results = [], []
    for f in facets:
        rec: dict[int, list[float]] = {n: [] for n in RECALL_KS}
        t_knn, t_exact = [], []
        for pid in ids:
            paper = papers.get(pid)
            rows = paper.paper.facet_indices(f) if paper is not None else []
            if not rows:
                continue
            q = np.ascontiguousarray(paper.vectors[rows], dtype=np.float32)
            exclude = frozenset({pid})
            started = time.perf_counter()
            found = backend.first_stage(FirstStageRequest(text="", vectors=q, facet=f, k=k, knn_k=k, bm25_k=0,
                                                          exclude=exclude, fusion="knn", with_papers=False))
            t_knn.append(time.perf_counter() - started)
            started = time.perf_counter()
            exact = backend.exact_knn(q, k, facet=f, exclude=exclude)
            t_exact.append(time.perf_counter() - started)
            approx = {c.paper_id: c.knn for c in found}
            for n in RECALL_KS:
                truth = _top(exact, min(n, k))
                rec[n].append(len(set(truth) & set(_top(approx, min(n, k)))) / len(truth) if truth else 1.0)
            if keep_results:
                results.append({"paper_id": pid, "facet": f, "knn": _top(approx, k), "exact": _top(exact, k)})
        if not t_knn:
            if facet:
                raise UserError(f"none of the {len(ids)} sampled papers has {facet} sentences")
            continue
        out.append(FacetRecall(f, len(t_knn), backend.knn_setting(f),
                               {f"@{n}": _spread(rec[n]) for n in RECALL_KS},
                               {"knn": _latency(t_knn), "exact": _latency(t_exact)}))
    return RecallReport(backend.name, total, len(ids), seed, k, out, results if keep_results else None)
