"""Fusing the first stage's two ranked lists (BM25, sentence kNN) into one, on the client.

Every backend can return the two lists; fusing them here keeps rankings identical across backends
and needs no engine licence (RRF/linear retrievers are Enterprise-only in Elasticsearch). This fusion only chooses
which papers go on to rescoring (and orders them with rescorer `none`); a hit's score does not read it
(esqbe.query.combine: a function of the query and the paper alone).
"""
from __future__ import annotations

import numpy as np

from ..errors import ParameterError

FUSION_METHODS = ("rrf", "linear", "bm25", "knn")
RRF_K = 60


def _minmax(scores: dict[str, float]) -> dict[str, float]:
    if not scores:
        return {}
    vals = np.fromiter(scores.values(), dtype=np.float64)
    lo, hi = float(vals.min()), float(vals.max())
    span = hi - lo
    if span <= 0:
        return {k: 1.0 for k in scores}
    return {k: (v - lo) / span for k, v in scores.items()}


def fuse(bm25: dict[str, float], knn: dict[str, float], method: str = "rrf", bm25_weight: float = 0.5) -> dict[str, float]:
    """Fused score per paper id.

    - `rrf`: sum of 1/(60 + rank) over the lists a paper appears in (weights ignored).
    - `linear`: bm25_weight * minmax(bm25) + (1 - bm25_weight) * minmax(knn).
    - `bm25` / `knn`: one list alone (the other only adds papers at the bottom).
    """
    if method not in FUSION_METHODS:
        raise ParameterError(f"unknown fusion {method!r}; choose one of {', '.join(FUSION_METHODS)}")
    ids = set(bm25) | set(knn)
    if method == "rrf":
        out = dict.fromkeys(ids, 0.0)
        for scores in (bm25, knn):
            for rank, pid in enumerate(sorted(scores, key=lambda p: -scores[p]), start=1):
                out[pid] += 1.0 / (RRF_K + rank)
        return out
    if method == "linear":
        nb, nk = _minmax(bm25), _minmax(knn)
        return {p: bm25_weight * nb.get(p, 0.0) + (1 - bm25_weight) * nk.get(p, 0.0) for p in ids}
    primary, secondary = (bm25, knn) if method == "bm25" else (knn, bm25)
    # the other list only orders the papers the primary list missed, below all of them
    floor = min(primary.values(), default=0.0) - 1.0
    ns = _minmax(secondary)
    return {p: primary[p] if p in primary else floor - 1.0 + ns.get(p, 0.0) for p in ids}


def top_k(scores: dict[str, float], k: int) -> list[tuple[str, float]]:
    """Best k (id, score), ties broken by id so rankings are deterministic."""
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
