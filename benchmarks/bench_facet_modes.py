"""Warm query time of the facet-matching modes and of vector centring, against `same` in the same run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_facet_modes.py --index PATH [--queries 200] [--config FILE]

Opens an existing index (e.g. one `esqbe eval csfcube --labels predict` built: its papers carry the
tagger's soft labels, so `auto` matches them softly), draws `--queries` (paper, facet) pairs with a fixed
seed among papers that have a sentence of the facet, and runs each through `Index.query` once untimed
(its pages in memory) and then once per configuration, in an order rotated from query to query, so that
neither a cold page cache nor load on the machine falls on one configuration more than another. Prints p50 / p90 per configuration and the p50 ratio to `same`. Asserts nothing.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import esqbe  # noqa: E402

CONFIGS = {
    "same": {"candidate_facet": "same"},
    "auto (default)": {"candidate_facet": "auto"},
    "soft": {"candidate_facet": "soft"},
    "auto + centred top1": {"candidate_facet": "auto", "vector_centering": "top1"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--config", help="YAML settings the configurations start from")
    args = ap.parse_args()
    with esqbe.open_index(args.index, config=args.config, create=False) as index:
        ids = sorted(index.backend.paper_ids())
        rng = random.Random(0)
        pairs = []
        while len(pairs) < args.queries:
            pid = rng.choice(ids)
            facet = rng.choice(("background", "method", "result"))
            if facet in index.backend.get([pid])[pid].paper.facets:
                pairs.append((pid, facet))
        for _name, over in CONFIGS.items():  # warm: the model-free query path, the centring statistics
            index.query(pairs[0][0], facet=pairs[0][1], **over)
        times = {name: [] for name in CONFIGS}
        names = list(CONFIGS)
        for n, (pid, facet) in enumerate(pairs):
            index.query(pid, facet=facet)  # untimed: brings this query's pages into memory for every configuration
            for name in names[n % len(names):] + names[: n % len(names)]:  # rotated: no configuration always first
                t0 = time.perf_counter()
                index.query(pid, facet=facet, **CONFIGS[name])
                times[name].append(1000 * (time.perf_counter() - t0))
        stats = index.stats()
    base = statistics.median(times["same"])
    print(f"index {args.index}: {stats['papers']} papers, {stats['sentences']} sentences; {args.queries} facet queries each")
    print("| configuration | p50 ms | p90 ms | p50 / same |")
    print("|---|---|---|---|")
    for name, t in times.items():
        t = sorted(t)
        print(f"| {name} | {statistics.median(t):.1f} | {t[int(0.9 * (len(t) - 1))]:.1f} | {statistics.median(t) / base:.2f} |")


if __name__ == "__main__":
    main()
