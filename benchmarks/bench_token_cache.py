"""asym_token's token vectors kept by text (esqbe.encode.encoder.TOKEN_CACHE_BYTES) against encoding every candidate
sentence at every query (the cache off: token_cache_bytes = 0), in one process on one real index.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_token_cache.py --papers 100 --work /tmp/esqbe-token-cache

An embedded index of the first N CSAbstruct sample abstracts (built once, the default runtime), then for each side,
the cache emptied first: (1) the index's scale measured for asym_token as a first query does it (esqbe.index.scale:
facet queries by a sample of its papers, no time budget), (2) the same method query asked 5 times (median). Prints
the seconds and the ratio off / on. The machine may be shared: the figures say what it did while this ran.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    import esqbe
    from esqbe.index.scale import measure
    from esqbe.rescore.batches import RescoreContext
    from esqbe.settings.config import Settings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=100)
    ap.add_argument("--sample", type=int, default=20, help="papers whose facet queries measure the scale")
    ap.add_argument("--work", default="/tmp/esqbe-token-cache")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"papers-{args.papers}.jsonl"
    lines = (REPO / "samples" / "csabstruct-sample.jsonl").read_text().splitlines()[: args.papers]
    src.write_text("\n".join(lines) + "\n")
    path = work / f"index-{args.papers}"
    with esqbe.open_index(str(path), config=None) as index:
        if index.backend.meta() is None:
            index.index_files([str(src)])
    qid = json.loads(lines[0])["paper_id"]
    figures = {}
    with esqbe.open_index(str(path), config=None, create=False) as index:
        encoder = index.encoder
        settings = Settings().replace(rescorer="asym_token")
        context = RescoreContext(encoder=encoder, backend=index.backend)
        for side, bound in (("off", 0), ("on", encoder.token_cache_bytes)):
            encoder.token_cache_bytes = bound
            encoder.forget_token_vectors()
            t = time.perf_counter()
            scale = measure(index.backend, settings, context=context, sample=args.sample, budget_s=1e9)
            measured = time.perf_counter() - t
            times = []
            for _ in range(5):
                t = time.perf_counter()
                index.query(qid, facet="method", rescorer="asym_token", place_hits=False)
                times.append(time.perf_counter() - t)
            figures[side] = {"scale_s": round(measured, 2), "scale_queries": scale.queries,
                             "query_median_s": round(statistics.median(times), 3),
                             "first_query_s": round(times[0], 3)}
    off, on = figures["off"], figures["on"]
    print(f"papers {args.papers}, scale sample {args.sample}, runtime {encoder.runtime}")
    print("| cache | scale measurement (s) | queries | first query (s) | median of 5 (s) |")
    print("|---|---|---|---|---|")
    for side in ("off", "on"):
        f = figures[side]
        print(f"| {side} | {f['scale_s']} | {f['scale_queries']} | {f['first_query_s']} | {f['query_median_s']} |")
    print(f"ratio off/on: scale {off['scale_s'] / on['scale_s']:.1f}x, repeated query "
          f"{off['query_median_s'] / on['query_median_s']:.1f}x")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
