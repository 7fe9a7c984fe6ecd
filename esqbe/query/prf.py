"""Pseudo-relevance feedback on sentence vectors (Rocchio): each query sentence moved toward the sentences that
match it best in the first ranking's top papers, then the candidates rescored with the moved sentences.

    q' = normalise(q + weight * mean over the top `docs` papers of (their sentence closest to q))

Only the sentences the rescorer may match (the candidate's facet view, centred where the ranking centres) take
part. `prf_docs: 0` (the default) leaves the ranking as it was."""
from __future__ import annotations

import numpy as np

from ..rescore.batches import CandidateBatch


def feedback_queries(queries: np.ndarray, batch: CandidateBatch, scores: np.ndarray, *, docs: int,
                     weight: float) -> np.ndarray:
    """The moved query vectors (L2-normalised); `queries` unchanged when `docs` or `weight` is 0 or no
    candidate has a finite score."""
    finite = np.isfinite(scores)
    if docs <= 0 or weight <= 0 or not finite.any() or len(queries) == 0:
        return queries
    order = [i for i in np.argsort(-np.where(finite, scores, -np.inf), kind="stable") if finite[i]][:docs]
    top = batch.vectors[order]  # (m, L, d)
    sims = np.einsum("qd,mld->qml", queries, top)
    sims = np.where(batch.mask[order][None, :, :], sims, -np.inf)
    best = sims.argmax(axis=2)  # (q, m): each top paper's sentence closest to each query sentence
    centroid = top[np.arange(len(order))[None, :], best].mean(axis=1)  # (q, d)
    moved = queries + weight * centroid
    return (moved / np.maximum(np.linalg.norm(moved, axis=1, keepdims=True), 1e-12)).astype(queries.dtype)
