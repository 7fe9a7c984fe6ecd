"""A query of 5 example papers with 1 paper to avoid against the single-paper query, side by side in one run on
the index given (item 4: at most 2x the single-paper query's warm p50 and p99).

    .venv/bin/python benchmarks/bench_examples.py PATH [--facet method] [--queries 50] [--seed 0] [--k 10]

Seeded query papers that have sentences of the facet; each composed query takes the paper and 4 others that
have the facet as examples and a sixth to avoid. Both kinds run interleaved (one of each per round, order
alternating), after a warm-up round, each through `Index.query` in this process. Prints per kind p50, p99 and
the mean, each stage's median (`QueryResult.timings`), the ratios, and the first-stage requests each kind made (one per query for both: the union of the
examples' sentences goes in one request).
"""
import argparse
import gc
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


def sample_groups(index, facet: str, groups: int, seed: int) -> tuple[int, list[str]]:
    """(papers in the index, seeded papers that have sentences of `facet`, 6 per group: a query paper or 5 examples
    and 1 to avoid). The index's ids, a Python list (1M strings at hard 1M), are dropped before anything is timed:
    held, every full garbage collection walked them (~20 ms pauses, which landed in the p99)."""
    ids = index.backend.paper_ids()
    random.Random(seed).shuffle(ids)
    have: list[str] = []
    for start in range(0, len(ids), 256):
        found = index.get(ids[start:start + 256])
        have += [p for p in ids[start:start + 256] if p in found and facet in found[p].facets]
        if len(have) >= 6 * groups:
            break
    n_papers = len(ids)
    del ids
    gc.collect()
    return n_papers, have


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--facet", default="method", choices=("background", "method", "result"))
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for the composed query only, e.g. examples_ann_effort=1 (the pre-issue-36-fix effort)")
    args = ap.parse_args()
    extra = {}
    for item in args.set:
        name, _, value = item.partition("=")
        extra[name] = float(value) if value.replace(".", "", 1).isdigit() else value
    from esqbe.core.threads import limit_for_query

    limit_for_query()  # as `esqbe serve` and `esqbe query` answer: one BLAS thread
    with esqbe.open_index(args.path, create=False) as index:
        n_papers, have = sample_groups(index, args.facet, args.queries + 1, args.seed)
        if len(have) < 6 * (args.queries + 1):
            sys.exit(f"{args.path}: {len(have)} papers with {args.facet} sentences; need {6 * (args.queries + 1)}")
        calls = {"single": 0, "examples": 0}
        kind = ["single"]
        first_stage = index.backend.first_stage

        def counted(request):  # the real first stage, counted in the timed rounds (round 0 may also measure the
            if kind[0] in calls:  # index's similarity scale: esqbe.index.scale, a few hundred first stages once)
                calls[kind[0]] += 1
            return first_stage(request)

        index.backend.first_stage = counted  # type: ignore[method-assign]
        times: dict[str, list[float]] = {"single": [], "examples": []}
        stages: dict[str, dict[str, list[float]]] = {"single": {}, "examples": {}}
        for r in range(args.queries + 1):
            group = have[6 * r: 6 * r + 6]
            runs = [("single", dict(paper_id=group[0])),
                    ("examples", dict(examples=group[:5], avoid=group[5:], **extra))]
            for name, q in runs if r % 2 else runs[::-1]:
                kind[0] = name if r else "warm-up"
                t = time.perf_counter()
                result = index.query(facet=args.facet, k=args.k, **q)
                if r:  # round 0 warms up
                    times[name].append(1000 * (time.perf_counter() - t))
                    for stage, ms in result.timings.items():
                        stages[name].setdefault(stage, []).append(ms)
    n = len(times["single"])
    print(f"{args.path}: {n_papers:,} papers, facet {args.facet}, {n} queries of each kind, k {args.k}"
          + (f"; composed query with {', '.join(args.set)}" if args.set else ""))
    print(f"{'query':<28}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'first-stage requests':>22}")
    for name, label in (("single", "1 paper"), ("examples", "5 examples + 1 avoided")):
        t = times[name]
        print(f"{label:<28}{pct(t, 50):>9.1f}{pct(t, 99):>9.1f}{statistics.mean(t):>9.1f}{calls[name] / n:>22.2f}")
    for name in times:
        print(f"  {name}: median ms per stage " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in stages[name].items()))
    print(f"ratio (5+1 / 1): p50 {pct(times['examples'], 50) / pct(times['single'], 50):.2f}x, "
          f"p99 {pct(times['examples'], 99) / pct(times['single'], 99):.2f}x")


if __name__ == "__main__":
    main()
