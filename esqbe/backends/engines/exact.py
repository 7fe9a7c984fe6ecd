"""Exact kNN on Elasticsearch and OpenSearch: the reference `esqbe check recall` measures the engines'
approximate kNN against. Per query sentence and facet path, a nested `script_score` over every document scores each
paper by its best sentence's cosine (Elasticsearch: painless `cosineSimilarity(...) + 1.0`; OpenSearch: the k-NN
plugin's `knn_score` script with `cosinesimil`, also 1 + cosine), so the score model is the first stage's: per query
sentence the k best papers, a paper's score the mean over query sentences of its best cosine."""
from __future__ import annotations

import numpy as np

from .bodies import facet_paths


def exact_knn_body(engine: str, path: str, vector: list[float], size: int) -> dict:
    """One query sentence's exact search over the sentences under `path` (a facet's nested path)."""
    if engine == "opensearch":
        script = {"source": "knn_score", "lang": "knn",
                  "params": {"field": f"{path}.vector", "query_value": vector, "space_type": "cosinesimil"}}
    else:
        script = {"source": f"cosineSimilarity(params.query_vector, '{path}.vector') + 1.0",
                  "params": {"query_vector": vector}}
    return {"size": size, "_source": False,
            "query": {"nested": {"path": path, "score_mode": "max",
                                 "query": {"script_score": {"query": {"match_all": {}}, "script": script}}}}}


def exact_knn_searches(engine: str, vectors: np.ndarray, k: int, facet: str | None,
                       exclude: frozenset[str]) -> list[tuple[int, dict]]:
    """(query sentence, body) of every search an exact kNN sends in one `_msearch`; excluded papers are dropped
    on the client (as the first stage does), so each asks for as many more."""
    size = min(10_000, k + len(exclude))
    return [(i, exact_knn_body(engine, path, [float(x) for x in vec], size))
            for i, vec in enumerate(np.atleast_2d(np.asarray(vectors, dtype=np.float32))) for path in facet_paths(facet)]


def parse_exact(searches: list[tuple[int, dict]], responses: list[dict], m: int, k: int,
                exclude: frozenset[str]) -> dict[str, float]:
    """paper id -> mean over the m query sentences of the best cosine, each query sentence keeping its k best."""
    best: dict[int, dict[str, float]] = {}
    for (qi, _), resp in zip(searches, responses):
        row = best.setdefault(qi, {})
        for hit in resp.get("hits", {}).get("hits", []):
            pid = str(hit["_id"])
            if pid in exclude or hit.get("_score") is None:
                continue
            cos = float(hit["_score"]) - 1.0
            if cos > row.get(pid, -2.0):
                row[pid] = cos
    out: dict[str, float] = {}
    for row in best.values():
        for pid, cos in sorted(row.items(), key=lambda kv: (-kv[1], kv[0]))[:k]:
            out[pid] = out.get(pid, 0.0) + cos / m
    return out
