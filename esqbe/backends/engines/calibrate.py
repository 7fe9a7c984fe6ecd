"""The engines' kNN calibrated for a recall target: Elasticsearch's `num_candidates` and OpenSearch's
`ef_search` (or k, before 2.16; see `OpenSearchBackend._knn_body`) are both `num_candidates_factor x k` in esqbe's
bodies, so calibration chooses that factor per facet, as the embedded index chooses its IVF's nprobe.

A seeded sample of the index's papers are the queries (`Backend.sample_papers`); per facet, each sample paper's
sentences of that facet are searched as a query does (the first stage's facet kNN alone: papers, k = 100, the paper
left out) at factor 1, 2, 3, 4, 6, 8, ... and exactly (`exact_knn`: a nested `script_score` over every document,
esqbe.backends.engines.exact), and the smallest factor whose recall@100 (mean, or 10th percentile, per
`knn_recall_statistic`) reaches `knn_recall_target` is kept. It is stored in the index mapping's `_meta`
(`knn_calibration`; an attached index: under `_meta.esqbe`), used by every query unless the caller fixed
`num_candidates_factor` on the backend, and shown by `esqbe stats`. A writer calibrates when the index has none or
has doubled in papers since (the exact side reads every document, so it is not repeated on every write)."""
from __future__ import annotations

import time

import numpy as np

from ...domain import FirstStageRequest

#: the factors calibration tries, in order (num_candidates = factor x k, at most 10,000)
FACTOR_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 100)
CALIBRATION_QUERIES = 32
FACETS = ("background", "method", "result")
META_KEY = "knn_calibration"


def _statistic(values: list[float], statistic: str) -> float:
    a = np.asarray(values, dtype=float)
    return float(a.mean() if statistic == "mean" else np.percentile(a, 10))


def _top(scores: dict[str, float], n: int) -> set[str]:
    return {pid for pid, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:n]}


def calibrate(backend, *, target: float, statistic: str = "mean", queries: int = CALIBRATION_QUERIES, seed: int = 0,
              k: int = 100) -> dict:
    """Per facet with sentences among the sampled papers: {"num_candidates_factor", "recall" (the statistic at that
    factor), "statistic", "mean", "p10", "target", "queries", "papers", "seconds"}. Leaves `backend`'s own
    factors as they were."""
    ids, total = backend.sample_papers(queries, seed)
    papers = backend.get(ids)
    out: dict[str, dict] = {}
    saved = dict(backend._factor_overrides)  # a dict of the backend's (CalibrationMixin)
    try:
        for facet in FACETS:
            t0 = time.perf_counter()
            cases = []
            for pid in ids:
                paper = papers.get(pid)
                rows = paper.paper.facet_indices(facet) if paper is not None else []
                if rows:
                    q = np.ascontiguousarray(paper.vectors[rows], dtype=np.float32)
                    truth = _top(backend.exact_knn(q, k, facet=facet, exclude=frozenset({pid})), k)
                    if truth:
                        cases.append((pid, q, truth))
            if not cases:
                continue
            chosen, recalls = FACTOR_LADDER[-1], [1.0]
            for factor in FACTOR_LADDER:
                backend._factor_overrides[facet] = factor
                recalls = []
                for pid, q, truth in cases:
                    found = backend.first_stage(FirstStageRequest(text="", vectors=q, facet=facet, k=k, knn_k=k, bm25_k=0,
                                                                  exclude=frozenset({pid}), fusion="knn", with_papers=False))
                    recalls.append(len(truth & {c.paper_id for c in found}) / len(truth))
                if _statistic(recalls, statistic) >= target:
                    chosen = factor
                    break
            out[facet] = {"num_candidates_factor": int(chosen), "recall": round(_statistic(recalls, statistic), 4),
                          "statistic": statistic, "mean": round(_statistic(recalls, "mean"), 4),
                          "p10": round(_statistic(recalls, "p10"), 4), "target": target, "queries": len(cases),
                          "papers": int(total), "seconds": round(time.perf_counter() - t0, 2)}
    finally:
        backend._factor_overrides.clear()
        backend._factor_overrides.update(saved)
    return out


def stored(meta: dict) -> dict:
    """The calibration kept in an index's `_meta` (esqbe's part of it: see `esqbe_meta`), or {}."""
    cal = meta.get(META_KEY) if isinstance(meta, dict) else None
    return {f: c for f, c in (cal or {}).items() if isinstance(c, dict)}


def due(meta: dict, papers: int, target: float, statistic: str) -> bool:
    """Whether a writer should calibrate: none stored, another target or statistic, or twice the papers since."""
    cal = stored(meta)
    if not cal:
        return papers > 0
    first = next(iter(cal.values()))
    return (first.get("target") != target or first.get("statistic", "mean") != statistic
            or papers >= 2 * max(1, int(first.get("papers", 0))))


class CalibrationMixin:
    """The calibrated factor on an engine backend (mixed into EngineBackend; an attached index keeps it under
    `_meta.esqbe`, see AttachedMixin). Uses the backend's `_index_mapping`, `_call`, `client`, `index`, `stats`."""

    num_candidates_factor: int
    _mapping: dict | None

    def _calibration_home(self) -> dict:
        """The part of the mapping's `_meta` that holds esqbe's keys (the whole `_meta` on esqbe's own layout)."""
        return self._index_mapping().get("_meta") or {}  # type: ignore[attr-defined]

    def _meta_with(self, cal: dict) -> dict:
        """The mapping's whole `_meta` with `cal` stored (engines replace `_meta` as a whole on a mapping update)."""
        return {**(self._index_mapping().get("_meta") or {}), META_KEY: cal}  # type: ignore[attr-defined]

    def knn_calibration(self) -> dict:
        try:
            return stored(self._calibration_home())
        except Exception:  # no index yet, or not readable: nothing calibrated
            return {}

    def candidates_factor(self, facet: str | None) -> tuple[int, str]:
        """(num_candidates / k for a kNN of `facet`, how it was set): being calibrated, fixed on this backend
        (`num_candidates_factor` set on it), calibrated (the mapping's `_meta`), or the class default. A kNN
        over every facet uses the largest calibrated factor."""
        overrides = self._factor_overrides
        if facet in overrides:
            return int(overrides[facet]), "calibrating"
        if "num_candidates_factor" in vars(self):
            return int(self.num_candidates_factor), "fixed"
        cal = self.knn_calibration()
        if facet in cal:
            return int(cal[facet]["num_candidates_factor"]), "calibrated"
        if facet is None and cal:
            return max(int(c["num_candidates_factor"]) for c in cal.values()), "calibrated"
        return int(self.num_candidates_factor), "default"

    @property
    def _factor_overrides(self) -> dict:
        return self.__dict__.setdefault("_factor_overrides_", {})

    def knn_setting(self, facet: str) -> str:
        factor, how = self.candidates_factor(facet)
        return f"num_candidates {factor} x k ({how})"

    def calibrate_knn(self, target: float, statistic: str = "mean", *, force: bool = False,
                      progress=None) -> dict | None:
        """Calibrate and store the factor when due (see `due`) or `force`d; returns what was stored, else None."""
        papers = int(self.stats()["papers"])  # type: ignore[attr-defined]
        if not (force or due(self._calibration_home(), papers, target, statistic)):
            return None
        if progress:
            progress(f"calibrating the kNN's num_candidates for recall@100 ({statistic}) >= {target}")
        cal = calibrate(self, target=target, statistic=statistic)
        if not cal:
            return None
        body = {"_meta": self._meta_with(cal)}
        try:
            self._call(self.client.indices.put_mapping, index=self.index, body=body)  # type: ignore[attr-defined]
        except Exception as exc:
            raise self._error("storing the kNN calibration in the mapping's _meta", exc) from exc  # type: ignore[attr-defined]
        self._mapping = None
        return cal
