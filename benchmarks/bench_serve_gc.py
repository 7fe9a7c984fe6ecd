"""The warm server's garbage collector: the same HTTP app with and without ServeOptions.freeze_gc, each in a
server process of its own on 127.0.0.1, answering the same bounded sequence of paper+facet queries one at a time from
this process. Prints per run the latency p50 / p99 / p99.9 / max and the server's own collections per generation (count,
longest, total ms, from gc.callbacks in the server process).

    .venv/bin/python benchmarks/bench_serve_gc.py INDEX [--queries 1000] [--rounds 2] [--seed 0]

Queries: seeded paper ids drawn from the index's own (the server is asked for its papers first), facets in turn.
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SERVER = r"""
import collections, gc, json, sys, time
sys.path.insert(0, sys.argv[1])
import uvicorn
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions
stats = collections.defaultdict(list); t0 = [0.0]
def cb(phase, info):
    if phase == "start": t0[0] = time.perf_counter()
    else: stats[info["generation"]].append(1000 * (time.perf_counter() - t0[0]))
app = create_app(sys.argv[2], options=ServeOptions(host="127.0.0.1", port=int(sys.argv[3]), freeze_gc=sys.argv[4] == "1"))
@app.post("/__bench_reset")
def reset():
    stats.clear(); gc.callbacks[:] = [c for c in gc.callbacks if c is not cb]; gc.callbacks.append(cb); return {}
@app.get("/__bench_gc")
def report():
    return {g: [len(v), max(v), sum(v)] for g, v in stats.items()}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(index: str, freeze: bool, queries: list[dict]) -> dict:
    import httpx

    port = _port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(REPO), index, str(port), "1" if freeze else "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            deadline = time.time() + 300
            while True:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"the server did not start: {proc.stderr.read() if proc.stderr else ''}")
                time.sleep(0.5)
            for q in queries[:20]:  # warm-up, not timed
                c.post("/query", json=q)
            if c.post("/__bench_reset", json={}).status_code != 200:
                raise SystemExit("the benchmark server did not install its garbage-collector counters")
            lat = []
            for q in queries:
                t = time.perf_counter()
                r = c.post("/query", json=q)
                lat.append(1000 * (time.perf_counter() - t))
                if r.status_code != 200:
                    raise SystemExit(f"{r.status_code}: {r.text[:300]}")
            collections = c.get("/__bench_gc").json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"lat": lat, "gc": collections}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import esqbe

    with esqbe.open_index(args.index, create=False) as index:
        ids = index.backend.paper_ids()
        rng = random.Random(args.seed)
        picked = [ids[rng.randrange(len(ids))] for _ in range(4 * args.queries)]
        del ids
        found = index.get(picked)
    facets = ("background", "method", "result")
    queries = []
    for i, pid in enumerate(picked):
        facet = facets[i % 3]
        if pid in found and facet in found[pid].facets:
            queries.append({"paper_id": pid, "facet": facet, "k": 10})
        if len(queries) == args.queries:
            break
    print(f"{args.index}: {len(queries)} paper+facet queries, one at a time, per run; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'run':<22}{'p50 ms':>8}{'p99':>8}{'p99.9':>8}{'max':>8}   server's collections: gen (count, longest ms, total ms)")
    for r in range(args.rounds):
        for freeze in ((False, True) if r % 2 == 0 else (True, False)):
            res = run(args.index, freeze, queries)
            lat = res["lat"]
            gcs = "  ".join(f"gen{g} ({v[0]}, {v[1]:.1f}, {v[2]:.0f})" for g, v in sorted(res["gc"].items()))
            print(f"{('freeze_gc' if freeze else 'as before') + f' (round {r + 1})':<22}"
                  f"{np.percentile(lat, 50):>8.1f}{np.percentile(lat, 99):>8.1f}{np.percentile(lat, 99.9):>8.1f}"
                  f"{max(lat):>8.1f}   {gcs}")
    print(json.dumps({"load_average_after": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
