"""What the one score costs a query: the two BM25 look-ups it adds (each candidate's own BM25 where the first
stage did not give it, and the query text's best BM25 in the whole index) against the whole query, in one run on one
index: N seeded single-paper queries per facet after 5 warm-up ones; prints the look-ups' share of the query time
and their p50 / p99 (ms). Run it quiet (nothing else on the machine):
    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/bench_score_lookups.py INDEX N SEED"""
import json
import random
import statistics
import sys

import esqbe
from esqbe.errors import EsqbeError

path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with esqbe.open_index(path, create=False) as ix:
    ids = sorted(ix.backend.paper_ids())
    rng = random.Random(seed)
    out = {}
    for facet in ("background", "method", "result"):
        qs = rng.sample(ids, n + 5)
        rows = []
        for i, pid in enumerate(qs):
            try:
                t = ix.query(pid, facet=facet, k=10).timings
            except EsqbeError:  # a paper without a sentence of that facet: not a query
                continue
            if i >= 5 and "bm25_lookups" in t:
                rows.append((t["bm25_lookups"], sum(v for k, v in t.items() if k in ("encode", "first_stage", "rescore"))))
        lookups = sorted(r[0] for r in rows)
        out[facet] = {"queries": len(rows), "lookups_share": round(sum(lookups) / sum(r[1] for r in rows), 4),
                      "lookups_p50_ms": round(lookups[len(lookups) // 2], 2),
                      "lookups_p99_ms": round(lookups[min(len(lookups) - 1, int(0.99 * len(lookups)))], 2),
                      "query_mean_ms": round(statistics.mean(r[1] for r in rows), 2)}
    print(json.dumps({"index": path, "papers": len(ids), **out}, indent=1))
