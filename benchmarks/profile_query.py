"""Where the warm query's time goes on a kept index: bench_scale's own warm worker's queries
(same seed, same warm-up), each timed whole and in parts by timers wrapped around the embedded backend's steps.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_query.py INDEX [--queries 200] [--passes 2] [--json OUT]

Parts per query (ms): `first_stage` and `rescore` (the query's own timings), inside the first stage `knn` (the
whole kNN call), `ann_search` (faiss searches, summed over facets), `delta` (each facet's exact delta), `exact`
(the exact re-score of the ANN's candidates: `_exact_best`) of which `read_rows` (pread of their float16 rows), and
`bm25` (the BM25 worker, which runs beside the kNN on the other core), `get` (the stored papers the first stage
hands to rescoring, and any other `get`). The process limits its threads as `esqbe serve` does (`--host-threads`:
the host's counts, as a library caller). Also per query: the query sentences (m), the
facet, the candidate papers re-scored. The last pass is reported (the earlier ones warm the page cache); the
report gives, for all queries and for the slowest 5% / 1%, the mean of each part, and the correlation of the total
with m. The timers are the benchmark's instrumentation: the library code runs unchanged.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def instrument(backend, parts: dict):
    """Wrap the backend's steps (on the instance, and the module function the kNN calls) with timers adding into
    `parts`."""
    from esqbe.backends.embedded import knn as knn_mod

    def timer(name, fn):
        def wrapped(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                parts[name] += 1000 * (time.perf_counter() - t0)
        return wrapped

    orig_search = knn_mod._search_ann_threads
    knn_mod._search_ann_threads = timer("ann_search", orig_search)
    orig_exact = backend._exact_best

    def exact_best(st, pnos, *a, **kw):
        parts["candidates"] += len(np.unique(pnos))
        return orig_exact(st, pnos, *a, **kw)

    backend._exact_best = timer("exact", exact_best)
    backend._read_rows = timer("read_rows", backend._read_rows)
    backend._delta = timer("delta_rows", backend._delta)
    backend._bm25 = timer("bm25", backend._bm25)
    backend.knn = timer("knn", backend.knn)
    backend.get = timer("get", backend.get)


def main():
    import bench_scale

    import esqbe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--host-threads", action="store_true",
                    help="keep the host's BLAS thread counts (a library caller); default: limited as `esqbe serve` is")
    args = ap.parse_args()
    if not args.host_threads:
        from esqbe.core.threads import limit_for_query

        limit_for_query()
    index = esqbe.open_index(args.index)
    backend = index.backend
    queries = bench_scale._queries(backend, backend.stats()["papers"], args.queries + 40, 7)
    seen: dict = {}
    for pid, facet in queries[:40]:  # bench_scale's warm-up
        if seen.get(facet, 0) < 2:
            index.query(pid, facet=facet)
            seen[facet] = seen.get(facet, 0) + 1
    parts: dict = defaultdict(float)
    instrument(backend, parts)
    for _ in range(args.passes):
        rows = []
        for pid, facet in queries[40 : 40 + args.queries]:
            parts.clear()
            t0 = time.perf_counter()
            res = index.query(pid, facet=facet)
            total = 1000 * (time.perf_counter() - t0)
            timed = dict(parts)
            m = sum(1 for f in backend.get([pid])[pid].paper.facets if f == facet)
            rows.append({"paper": pid, "facet": facet, "m": m, "total": total, **timed,
                         "first_stage": res.timings.get("first_stage", 0.0), "rescore": res.timings.get("rescore", 0.0)})
    report = summarise(rows)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"report": report, "rows": rows}, indent=1))


def summarise(rows: list[dict]) -> dict:
    keys = ["total", "first_stage", "knn", "ann_search", "exact", "read_rows", "delta_rows", "bm25", "get", "rescore", "m",
            "candidates"]
    tot = np.array([r["total"] for r in rows])
    order = np.argsort(-tot)

    def mean_of(sel):
        return {k: round(float(np.mean([rows[i].get(k, 0.0) for i in sel])), 2) for k in keys}

    out = {"queries": len(rows), "p50_ms": round(float(np.percentile(tot, 50)), 1),
           "p99_ms": round(float(np.percentile(tot, 99)), 1),
           "all": mean_of(range(len(rows))),
           "slowest_5pct": mean_of(order[: max(1, len(rows) // 20)]),
           "slowest_1pct": mean_of(order[: max(1, len(rows) // 100)]),
           "near_p50": mean_of(order[len(rows) // 2 - 5 : len(rows) // 2 + 5])}
    ms = np.array([r["m"] for r in rows], dtype=float)
    out["corr_total_m"] = round(float(np.corrcoef(tot, ms)[0, 1]), 3)
    ann = np.array([r.get("ann_search", 0.0) for r in rows])
    out["ann_ms_per_query_sentence_median"] = round(float(np.median(ann / np.maximum(ms, 1))), 2)
    by_facet = {}
    for f in sorted({r["facet"] for r in rows}):
        sel = [i for i, r in enumerate(rows) if r["facet"] == f]
        by_facet[f] = {"n": len(sel), "p50": round(float(np.percentile(tot[sel], 50)), 1), **mean_of(sel)}
    out["by_facet"] = by_facet
    out["slowest"] = [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in rows[i].items()} for i in order[:5]]
    return out


if __name__ == "__main__":
    main()
