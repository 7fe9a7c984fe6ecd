"""`esqbe graph`'s speed: `Index.graph` warm, step by step (the query, the fetch of the hits' vectors, the pairs, the
edges, the groups, the layout), and the pairs step alone at the sizes that bound it.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_graph.py sample --k 30 --queries 30        # the bundled sample
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graph.py index PATH --k 30 --queries 30    # any embedded index
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graph.py synthetic --size 100000 --work W  # bench_scale's corpus
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graph.py pairs                              # the pairs step alone

`sample` indexes samples/csabstruct-sample.jsonl (300 abstracts, the default model) into a temporary directory;
`synthetic` writes benchmarks/bench_scale.py's synthetic corpus of --size papers (real sentences, seeded 384-d vectors
clustered by topic) as Parquet and loads it with `esqbe index`, then measures it as `index` does (W/SIZE/index is kept
for another run). Graphs: one per seeded (paper, facet) query of papers drawn from the index, after --warm of them;
the process limits its threads as `esqbe serve` does (esqbe.core.threads.limit_for_query). `pairs`: synthetic unit
vectors, k hits of n sentences on each side (the graph's bound: k <= 100, n <= 64), what `build_graph` does before
the edges are chosen (best_per_hit, directed_similarities, best_pairs), best of 5. Prints one JSON line per measurement.
The machine may be shared: the figures say what it did while the benchmark ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
STEPS = ("query", "fetch", "pairs", "edges", "groups", "layout", "total")


def graphs(path: str, k: int, queries: int, warm: int, seed: int = 0) -> dict:
    import esqbe
    from esqbe.core.threads import limit_for_query
    from esqbe.query.results import QueryError

    limit_for_query()
    index = esqbe.open_index(path, create=False)
    ids = index.backend.paper_ids()
    rng = np.random.default_rng(seed)
    picks = [ids[i] for i in rng.choice(len(ids), size=min(len(ids), 3 * (queries + warm)), replace=False)]
    asked, times = 0, {s: [] for s in STEPS}
    edges, grouped, papers = [], 0, len(ids)
    for pid in picks:
        paper = index.backend.get([pid])[pid].paper
        facets = [f for f in ("method", "background", "result") if f in paper.facets]
        if not facets:
            continue
        try:
            g = index.graph(pid, facet=facets[int(rng.integers(len(facets)))], k=k)
        except QueryError:
            continue
        asked += 1
        if asked <= warm or len(g.nodes) < k:
            continue
        for s in STEPS:
            times[s].append(g.timings[s])
        edges.append(len(g.edges))
        grouped += g.grouping["status"] == "grouped"
        if len(times["total"]) >= queries:
            break
    index.close()
    out = {"what": "graph", "index": path, "papers": papers, "k": k, "pairs": k * (k - 1) // 2, "graphs": len(times["total"]),
           "edges_mean": round(float(np.mean(edges)), 1), "grouped": grouped}
    for s in STEPS:
        out[f"{s}_p50_ms"] = round(float(np.percentile(times[s], 50)), 1)
        out[f"{s}_p90_ms"] = round(float(np.percentile(times[s], 90)), 1)
    out["total_max_ms"] = round(float(max(times["total"])), 1)
    return out


def pairs(k: int, n: int, seed: int = 0) -> dict:
    from esqbe.core.threads import limit_for_query
    from esqbe.query.graph import HitSides, best_pairs, best_per_hit, directed_similarities

    limit_for_query()
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(2 * k * n, 384)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    owner = np.repeat(np.arange(k), n)
    index = np.tile(np.arange(n), k)
    sides = HitSides(v[: k * n], owner, index, v[k * n:], owner, index, np.zeros(k * n, np.float32), [False] * k, [], None,
                     [list(range(n))] * k, [])
    best_s = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        best, which = best_per_hit(sides, k)
        directed_similarities(sides, best, k, "summax")
        best_pairs(sides, best, which, k)
        best_s = min(best_s, time.perf_counter() - t)
    return {"what": "pairs", "k": k, "sentences_per_side": n, "pairs": k * (k - 1) // 2, "best_of_5_ms": round(1000 * best_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("sample", "index", "synthetic", "pairs"))
    ap.add_argument("path", nargs="?", help="index: the embedded index directory")
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--queries", type=int, default=30, help="graphs timed")
    ap.add_argument("--warm", type=int, default=5, help="graphs asked before the timed ones")
    ap.add_argument("--size", type=int, default=100_000, help="synthetic: papers")
    ap.add_argument("--work", default="/tmp/esqbe-graph-bench", help="synthetic: where the corpus and index go")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    if args.mode == "pairs":
        for k in (30, 100):
            for n in (8, 64):
                print(json.dumps(pairs(k, n)), flush=True)
        return
    if args.mode == "index":
        print(json.dumps(graphs(args.path, args.k, args.queries, args.warm)), flush=True)
        return
    if args.mode == "sample":
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "cli", "index", "--path", f"{tmp}/ix", "--quiet",
                            str(REPO / "samples" / "csabstruct-sample.jsonl")], check=True, env=env, cwd=REPO)
            print(json.dumps(graphs(f"{tmp}/ix", args.k, args.queries, args.warm)), flush=True)
        return
    from bench_scale import write_corpus

    base = Path(args.work) / str(args.size)
    ix = base / "index"
    if not ix.exists():
        t = time.perf_counter()
        files = write_corpus(base / "parquet", args.size, seed=args.size)
        subprocess.run([sys.executable, "-m", "cli", "index", "--path", str(ix), "--quiet", *map(str, files)], check=True,
                       env=env, cwd=REPO)
        print(json.dumps({"what": "built", "papers": args.size, "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    print(json.dumps(graphs(str(ix), args.k, args.queries, args.warm)), flush=True)


if __name__ == "__main__":
    main()
