"""Single-paper query latency of one checkout on a given index: N seeded method queries after 5 warm-up ones,
printed as p50 / p99 / mean (ms). Run it from each checkout to compare two (alternate them, quiet):
    cd CHECKOUT && HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/bench_query_ab.py INDEX N SEED"""
import json
import random
import statistics
import sys
import time

import esqbe
from esqbe.errors import EsqbeError

path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with esqbe.open_index(path, create=False) as ix:
    ids = sorted(ix.backend.paper_ids())
    rng = random.Random(seed)
    qs = rng.sample(ids, n + 5)

    def one(pid):
        t = time.perf_counter()
        try:
            ix.query(pid, facet="method", k=10)
        except EsqbeError:  # a paper without a method sentence: not a query
            return None
        return 1000 * (time.perf_counter() - t)

    for pid in qs[:5]:
        one(pid)  # warm-up
    xs = [x for x in (one(p) for p in qs[5:]) if x is not None]
    xs.sort()
    print(json.dumps({"n": len(xs), "p50": round(xs[len(xs) // 2], 2), "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2),
                      "mean": round(statistics.mean(xs), 2)}))
