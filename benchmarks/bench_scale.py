"""The embedded index at 10K, 100K and 1M papers: load, disk, memory, cold and warm queries, recall, writes.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py --sizes 10000,100000 --work /tmp/esqbe-scale
    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py --sizes 1000000 --work /tmp/esqbe-scale
    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py --corpus hard --sizes 100000,1000000 --keep --work W
    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py _query W/1000000/index 200 ""   # warm queries again, alone
    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py _query W/1000000/index 200 "" host  # ... host threads

For each size: a seeded synthetic corpus written as pre-encoded Parquet (the `esqbe encode`
schema): ~7.5 real sentences per paper (3..12, drawn with their facet labels from the CSAbstruct and
CSFCube abstracts under ../shared), titles from CSFCube, 384-d unit vectors clustered around one
topic per paper (N/500 topics, cosine to the topic ~0.6), stored as float16-exact float32. Then:

- load: `esqbe index PARQUET...` as a fresh process (wall time incl. the ANN build at the end, peak RSS)
- disk: bytes of the index directory, and per paper
- cold query: `esqbe query --paper ID --facet F --json` as a fresh process (median / max wall of 5)
- warm query: `Index.query(paper, facet)` in one process limited as `esqbe serve` limits itself
  (`esqbe.core.threads.limit_for_query`: one BLAS thread in numpy and in faiss; `_query ... host` keeps the
  host's thread counts, as a library caller that sets none), after two warm-up queries per facet, default rescorer (summax), 100 rescored: p50 / p99 over the queries;
  peak RSS of that process
- recall@100: first-stage kNN (papers) at the default setting against exact brute force, the 100 best by
  score on each side as `esqbe check recall` counts (and, as `recall_all_hits`, over every paper knn()
  returns, a stricter figure for a query of several sentences), same run, in a process of its own (the exact pass
  maps the whole vector file; its peak RSS is reported apart)
- upsert: `esqbe index` of 1,000 new papers into the full index, then a query that returns one of
  them: wall time from the start of the write to that result; then `esqbe delete` of 10 papers and
  a query that must not return them
Prints one table row per size (markdown) and the JSON of every figure. The machine may be shared:
the figures say what this machine did while the benchmark ran.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("ESQBE_SHARED", REPO.parent / "shared"))
DIM = 384
SHARD = 100_000  # papers per Parquet file


# --- corpus ----------------------------------------------------------------------------------------
def sentence_pool():
    """Real sentences with their facet labels, and real titles."""
    from esqbe.ingest.readers import read_papers

    sents, labels, titles = [], [], []
    sources = [SHARED / "data" / "csabstruct" / f"{s}.jsonl" for s in ("train", "dev", "test")]
    sources.append(SHARED / "data" / "csfcube-dev" / "abstracts-csfcube-preds.jsonl")
    for src in sources:
        for p in read_papers(str(src)):
            sents.extend(p.sentences)
            labels.extend(p.facets)
            if p.title:
                titles.append(p.title)
    return np.array(sents, dtype=object), np.array(labels, dtype=object), np.array(titles, dtype=object)


def write_corpus(out: Path, n: int, seed: int, prefix: str = "p", start: int = 0) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from esqbe.domain import IndexMeta
    from esqbe.ingest.encoded import arrow_schema

    out.mkdir(parents=True, exist_ok=True)
    sents, labels, titles = sentence_pool()
    sents_pa, labels_pa, titles_pa = pa.array(list(sents)), pa.array(list(labels)), pa.array(list(titles))
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((max(50, (start + n) // 500), DIM), dtype=np.float32)
    topics /= np.linalg.norm(topics, axis=1, keepdims=True)
    schema = arrow_schema(IndexMeta("synthetic-minilm-384", DIM, "contextual"))
    files = []
    for lo in range(0, n, SHARD):
        hi = min(n, lo + SHARD)
        m = hi - lo
        counts = rng.integers(3, 13, size=m)
        total = int(counts.sum())
        offsets = np.r_[0, np.cumsum(counts)].astype(np.int32)
        pick = rng.integers(0, len(sents), size=total)
        topic = np.repeat(rng.integers(0, len(topics), size=m), counts)
        vec = rng.standard_normal((total, DIM), dtype=np.float32) * np.float32(1.33 / np.sqrt(DIM))
        vec += topics[topic]
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        vec = vec.astype(np.float16).astype(np.float32)  # what the index stores: loading is lossless
        inner = pa.ListArray.from_arrays(pa.array(np.arange(0, total * DIM + 1, DIM, dtype=np.int32)), pa.array(vec.reshape(-1)))
        ids = pa.array([f"{prefix}{i:07d}" for i in range(start + lo, start + hi)])
        table = pa.Table.from_arrays(
            [
                ids,
                titles_pa.take(pa.array(rng.integers(0, len(titles), size=m))),
                pa.ListArray.from_arrays(pa.array(offsets), sents_pa.take(pa.array(pick))),
                pa.ListArray.from_arrays(pa.array(offsets), labels_pa.take(pa.array(pick))),
                pa.ListArray.from_arrays(pa.array(offsets), inner),
                pa.nulls(m, pa.string()),
            ],
            schema=schema,
        )
        path = out / f"{prefix}-{start + lo:08d}.parquet"
        pq.write_table(table, path, row_group_size=8192, compression={"paper_id": "zstd", "title": "zstd", "sentences": "zstd",
                                                                      "facets": "zstd", "vectors": "none", "metadata": "zstd"})
        files.append(path)
    return files


# --- measuring -------------------------------------------------------------------------------------
def timed(cmd: list[str], env=None, cpu: list | None = None) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (GB) and stdout of a fresh process (its CPU seconds appended to `cpu`)."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *cmd], capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    rss_kb, user, system = proc.stderr.strip().splitlines()[-1].split()
    if cpu is not None:
        cpu.append(float(user) + float(system))
    return wall, int(rss_kb) / 1024**2, proc.stdout


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


def _queries(backend, n: int, count: int, seed: int) -> list[tuple[str, str]]:
    """`count` seeded (paper, facet) queries: papers drawn from the corpus, a facet each paper has."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i:07d}" for i in rng.choice(n, size=count, replace=False)]
    facets = ("background", "method", "result")
    out = []
    for pid in ids:
        got = backend.get([pid]).get(pid)
        if got is None:  # deleted by an earlier run's upsert/delete step (a kept index queried again)
            continue
        paper = got.paper
        present = [f for f in facets if f in paper.facets]
        if present:
            out.append((pid, present[int(rng.integers(len(present)))]))
    return out


def query_worker(path: str, n_queries: int, seed: int, upsert_file: str | None) -> dict:
    """Runs in its own process (so its peak RSS is the query side's): warm latency, upsert-to-visible."""
    import esqbe

    index = esqbe.open_index(path)
    backend = index.backend
    queries = _queries(backend, backend.stats()["papers"], n_queries + 40, seed)
    # warm-up: two queries of each facet (the second search of a facet reads its ANN lists into memory)
    seen: dict = {}
    for pid, facet in queries[:40]:
        if seen.get(facet, 0) < 2:
            index.query(pid, facet=facet)
            seen[facet] = seen.get(facet, 0) + 1
    lat = []
    for pid, facet in queries[40 : 40 + n_queries]:
        t0 = time.perf_counter()
        index.query(pid, facet=facet)
        lat.append(1000 * (time.perf_counter() - t0))
    out = {
        "warm_p50_ms": float(np.percentile(lat, 50)),
        "warm_p99_ms": float(np.percentile(lat, 99)),
        "warm_queries": len(lat),
    }
    if upsert_file:
        new = json.loads(Path(upsert_file + ".probe.json").read_text())
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        t0 = time.perf_counter()
        subprocess.run(cli("index", "--path", path, "--quiet", "--json", upsert_file), check=True, capture_output=True, env=env, cwd=REPO)
        t_write = time.perf_counter() - t0
        got = backend.knn(np.asarray(new["vectors"], dtype=np.float32), 10)
        visible = new["paper_id"] in got and max(got, key=got.get) == new["paper_id"]
        result = index.query(new["paper_id"], facet=new["facet"])  # the new paper is queryable, with hits
        out["upsert_1000_write_s"] = t_write
        out["upsert_1000_visible_s"] = time.perf_counter() - t0
        out["upsert_visible"] = bool(visible and result.hits)
        victims = [h.paper_id for h in result.hits[:10]]
        t0 = time.perf_counter()
        subprocess.run(cli("delete", "--path", path, *victims), check=True, capture_output=True, env=env, cwd=REPO)
        again = index.query(new["paper_id"], facet=new["facet"])
        out["delete_10_visible_s"] = time.perf_counter() - t0
        out["deletes_gone"] = not (set(victims) & {h.paper_id for h in again.hits})
    return out


def recall_worker(path: str, n_recall: int, seed: int) -> dict:
    """Its own process (an exact search over every row maps the whole vector file, which is not what a
    query process holds): first-stage kNN at the default setting against exact brute force."""
    import esqbe
    from esqbe.index.recall import _top

    backend = esqbe.open_index(path).backend
    recalls, hit_recalls, exact_ms, ann_ms = [], [], [], []
    for pid, facet in _queries(backend, backend.stats()["papers"], n_recall, seed + 1):
        qp = backend.get([pid])[pid]
        q = qp.vectors[[i for i, f in enumerate(qp.paper.facets) if f == facet]]
        excl = frozenset({pid})
        t0 = time.perf_counter()
        a = backend.knn(q, 100, facet=facet, exclude=excl)
        ann_ms.append(1000 * (time.perf_counter() - t0))
        t0 = time.perf_counter()
        e = backend.knn(q, 100, facet=facet, exclude=excl, exact=True)
        exact_ms.append(1000 * (time.perf_counter() - t0))
        # recall@100 as `esqbe check recall` counts it: the 100 best papers by the first stage's score
        top_a, top_e = _top(a, 100), _top(e, 100)
        recalls.append(len(set(top_a) & set(top_e)) / max(1, len(top_e)))
        # and over every paper knn() returns (each query sentence's top 100, up to 100 x its sentences), a stricter
        # figure than recall@100 for a query of several sentences
        hit_recalls.append(len(set(a) & set(e)) / max(1, len(e)))
    return {
        "recall_at_100": float(np.mean(recalls)),
        "recall_min": float(np.min(recalls)),
        "recall_p10": float(np.percentile(recalls, 10)),
        "recall_queries": len(recalls),
        "recall_all_hits": float(np.mean(hit_recalls)),
        "knn_ann_ms_median": float(np.median(ann_ms)),
        "knn_exact_ms_median": float(np.median(exact_ms)),
    }


def run_size(n: int, work: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    base = work / str(n)
    if base.exists():
        shutil.rmtree(base)
    t0 = time.perf_counter()
    if args.corpus == "hard":
        import hard_corpus

        cache = Path(args.hard_cache)
        files = hard_corpus.write_corpus(cache, base / "parquet", n, seed=n)
        upsert = hard_corpus.write_corpus(cache, base / "upsert", 1000, seed=n + 1, prefix="p", start=n)[0]
    else:
        files = write_corpus(base / "parquet", n, seed=n)
        upsert = write_corpus(base / "upsert", 1000, seed=n + 1, prefix="p", start=n)[0]
    probe = _probe(upsert)
    Path(str(upsert) + ".probe.json").write_text(json.dumps(probe))
    gen_s = time.perf_counter() - t0
    print(f"[{n}] corpus written in {gen_s:.0f}s", file=sys.stderr, flush=True)
    ix = base / "index"
    load_cpu = []
    load_s, load_rss, out = timed(cli("index", "--path", str(ix), "--quiet", "--json", *map(str, files)), env, load_cpu)
    summary = json.loads(out)
    print(f"[{n}] loaded in {load_s:.0f}s: {summary}", file=sys.stderr, flush=True)
    disk = sum(p.stat().st_size for p in ix.rglob("*") if p.is_file())
    cold, cold_cpu = [], []
    rng = np.random.default_rng(1)
    from esqbe.backends.embedded.backend import EmbeddedBackend

    with EmbeddedBackend(ix, create=False) as b:
        picks = [f"p{i:07d}" for i in rng.choice(n, size=40, replace=False)]
        found = b.get(picks)
        picks = [p for p in picks if "method" in found[p].paper.facets][:5]
    for pid in picks:
        wall, rss, _ = timed(cli("query", "--path", str(ix), "--paper", pid, "--facet", "method", "--json"), env, cold_cpu)
        cold.append((wall, rss))
    print(f"[{n}] cold queries {[round(c[0], 2) for c in cold]}", file=sys.stderr, flush=True)
    # the warm process runs as a library user's would (no thread settings in the environment)
    wall, rss, out = timed([sys.executable, __file__, "_query", str(ix), str(args.queries), str(upsert)], env)
    q = json.loads(out)
    _, recall_rss, out = timed([sys.executable, __file__, "_recall", str(ix), str(args.recall_queries)], env)
    q.update(json.loads(out), recall_process_peak_rss_gb=recall_rss)
    row = {
        "papers": n,
        "sentences": summary.get("indexed") and None,
        "load_s": load_s,
        "load_papers_per_s": n / load_s,
        "load_peak_rss_gb": load_rss,
        "disk_gb": disk / 1e9,
        "disk_bytes_per_paper": disk / n,
        "cold_query_s_median": statistics.median(c[0] for c in cold),
        "cold_query_s_max": max(c[0] for c in cold),
        "cold_query_cpu_s_median": statistics.median(cold_cpu),
        "load_cpu_s": load_cpu[0],
        "load_avg_1min_at_end": os.getloadavg()[0],
        "cold_query_peak_rss_gb": max(c[1] for c in cold),
        "query_process_peak_rss_gb": rss,
        **q,
        "corpus_generation_s": gen_s,
    }
    from esqbe.backends.embedded.backend import EmbeddedBackend

    b = EmbeddedBackend(ix, create=False)
    stats = b.stats()
    b.close()
    row["sentences"] = stats["sentences"]
    row["knn"] = stats["knn"]
    row["knn_calibration"] = stats.get("knn_calibration")
    if not args.keep:
        shutil.rmtree(base)
    return row


def _probe(path: Path) -> dict:
    """One paper of the upsert file with a facet, and its vectors of that facet (to look it up by kNN)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path).slice(0, 50).to_pylist()
    for r in t:
        for f in ("method", "background", "result"):
            rows = [i for i, x in enumerate(r["facets"]) if x == f]
            if rows:
                return {"paper_id": r["paper_id"], "facet": f, "vectors": [r["vectors"][i] for i in rows]}
    raise RuntimeError("no paper with a facet in the upsert file")


def fmt_row(r: dict) -> str:
    return (
        f"| {r['papers']:,} ({r['sentences']:,}) | {r['load_papers_per_s']:,.0f} papers/s ({r['load_s']:.0f} s) | "
        f"{r['disk_gb']:.2f} GB ({r['disk_bytes_per_paper'] / 1000:.1f} kB/paper) | "
        f"{r['load_peak_rss_gb']:.1f} GB build / {max(r['query_process_peak_rss_gb'], r['cold_query_peak_rss_gb']):.1f} GB query | "
        f"{r['cold_query_s_median']:.2f} s (max {r['cold_query_s_max']:.2f}; CPU {r['cold_query_cpu_s_median']:.2f} s) | "
        f"{r['warm_p50_ms']:.1f} / {r['warm_p99_ms']:.1f} ms | {r['recall_at_100']:.3f} (min {r['recall_min']:.2f}, p10 {r.get('recall_p10', float('nan')):.2f}) | "
        f"{r['upsert_1000_visible_s']:.1f} s{'' if r['upsert_visible'] else ' (NOT visible)'}; deletes {r['delete_10_visible_s']:.1f} s{'' if r['deletes_gone'] else ' (NOT gone)'} |"
    )


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_query":
        path, nq, upsert = sys.argv[2:5]
        if sys.argv[5:6] != ["host"]:  # as `esqbe serve` answers queries
            from esqbe.core.threads import limit_for_query

            limit_for_query()
        print(json.dumps(query_worker(path, int(nq), 7, upsert)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_recall":
        path, nr = sys.argv[2:4]
        print(json.dumps(recall_worker(path, int(nr), 7)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--work", default="/tmp/esqbe-scale")
    ap.add_argument("--queries", type=int, default=200, help="warm queries timed per size")
    ap.add_argument("--recall-queries", type=int, default=50, help="queries whose kNN is compared with exact search")
    ap.add_argument("--keep", action="store_true", help="keep the corpus and index directories")
    ap.add_argument("--corpus", choices=("synthetic", "hard"), default="synthetic",
                    help="synthetic: clustered random vectors (above); hard: real encoded sentences of ../shared/data, "
                         "extended (benchmarks/hard_corpus.py, which builds the cache first)")
    ap.add_argument("--hard-cache", default=".esqbe-bench/hard", help="--corpus hard: the cache hard_corpus.py build made")
    args = ap.parse_args()
    rows = []
    print("| papers (sentences) | load | disk | peak RSS | cold CLI query | warm p50 / p99 | kNN recall@100 | 1,000-paper upsert to visible |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for n in (int(x) for x in args.sizes.split(",")):
        row = run_size(n, Path(args.work), args)
        rows.append(row)
        print(fmt_row(row), flush=True)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
