"""POST /rerank's latency per call for 50, 100 and 500 candidates on the index given: what esqbe
adds to an engine's search when the engine calls it as its reranker.

    .venv/bin/python benchmarks/bench_rerank.py PATH [--docs 50,100,500] [--calls 30] [--facet method] [--seed 0]

A real `esqbe serve` app (uvicorn, in a thread of this process, on 127.0.0.1) over the index at PATH; per round a
seeded query paper that has the facet and N seeded candidates (all in the index), sent as Elasticsearch's `custom`
service sends them (the body built from the installed template, esqbe.backends.engines.reranker). For each N it
prints the HTTP call's p50 / p95 / mean (what the engine waits for), and beside it the same reranking in this process
through the library (`esqbe.index.rerank.rerank`: the query restricted to the candidates), so the HTTP skin's share
shows. The two run interleaved, call by call on the same query and candidates (which goes first alternates), so
neither is measured on a colder cache than the other. One warm-up round per N first. Timings from a machine shared
with other work are contended: say so.
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import esqbe  # noqa: E402


def pct(xs, q):
    """The q-th percentile of `xs`, one of its values (nearest rank)."""
    return float(np.percentile(xs, q, method="nearest"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--docs", default="50,100,500", help="candidates per call, comma separated")
    ap.add_argument("--calls", type=int, default=30, help="timed calls per size")
    ap.add_argument("--facet", default="method", choices=("background", "method", "result"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sizes = [int(x) for x in args.docs.split(",")]

    import httpx

    from esqbe.backends.engines.reranker import es_inference_body, es_request_body
    from esqbe.core.threads import limit_for_query
    from esqbe.index.rerank import rerank
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import LiveServer  # the tests' real server on a free loopback port

    limit_for_query()
    rng = random.Random(args.seed)
    with esqbe.open_index(args.path, create=False) as index:
        ids = index.backend.paper_ids()
        if len(ids) < max(sizes) + 1:
            sys.exit(f"the index has {len(ids)} papers; --docs needs {max(sizes) + 1}")
        rng.shuffle(ids)
        queries = []
        for start in range(0, len(ids), 256):
            found = index.get(ids[start:start + 256])
            queries += [p for p in ids[start:start + 256] if p in found and args.facet in found[p].facets]
            if len(queries) >= args.calls + 1:
                break
        pool = max(sizes) * 4  # candidates are drawn from the first `pool` shuffled ids other than the query
        plan = {n: [(q, rng.sample([i for i in ids[: pool + 1] if i != q][:pool], n)) for q in queries[: args.calls + 1]]
                for n in sizes}
        local: dict[int, list[float]] = {n: [] for n in sizes}
        http: dict[int, list[float]] = {n: [] for n in sizes}
        token = "bench-rerank-token-0123"
        app = create_app(args.path, config=None, options=ServeOptions(host="127.0.0.1", token=token))
        with LiveServer(app) as url, httpx.Client(timeout=120) as client:
            body = es_inference_body(url, token)
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}

            def by_http(q: str, docs: list[str]) -> float:
                payload = es_request_body(body, f"paper:{q} facet:{args.facet}", docs)
                t0 = time.perf_counter()
                r = client.post(url + "/rerank", content=payload, headers=headers)
                ms = 1000 * (time.perf_counter() - t0)
                r.raise_for_status()
                assert len(r.json()["results"]) == len(docs)
                return ms

            def by_library(q: str, docs: list[str]) -> float:
                t0 = time.perf_counter()
                rerank(index, f"paper:{q} facet:{args.facet}", docs)
                return 1000 * (time.perf_counter() - t0)

            for n in sizes:
                for i, (q, docs) in enumerate(plan[n]):  # call 0 of each size warms up
                    runs = [(http, by_http), (local, by_library)]
                    for out, call in runs if i % 2 else runs[::-1]:
                        ms = call(q, docs)
                        if i:
                            out[n].append(ms)
    print(f"index {args.path}: {len(ids)} papers; facet {args.facet}; {args.calls} timed calls per size (ms)")
    print(f"{'docs':>6} {'http p50':>9} {'http p95':>9} {'http mean':>10} {'lib p50':>8} {'lib p95':>8}")
    for n in sizes:
        h, lo = http[n], local[n]
        print(f"{n:>6} {pct(h, 50):>9.1f} {pct(h, 95):>9.1f} {statistics.mean(h):>10.1f} {pct(lo, 50):>8.1f} "
              f"{pct(lo, 95):>8.1f}")


if __name__ == "__main__":
    main()
