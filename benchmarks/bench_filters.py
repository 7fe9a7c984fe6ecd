"""Time to evaluate metadata filters over a corpus: the embedded backend's columns (esqbe.core.filters.MetadataColumns,
numpy per metadata path) against the per-paper Python evaluation (esqbe.core.filters.allowed_ids), same run, same data.

    .venv/bin/python benchmarks/bench_filters.py [--papers 100000] [--repeat 5]

Synthetic S2ORC-like metadata (year, venue, three authors, a DOI on half the papers). Prints the one-off
build time of the columns, then per filter: allowed papers, median ms per query for both, and the ratio.
Asserts only that both give the same papers.
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from esqbe.core.filters import MetadataColumns, allowed_ids, coerce_filters  # noqa: E402

FILTERS = [["year>=2019"], ["venue in (ACL, EMNLP)", "year>=2019"], ["author=A5"], ["author!=A5"],
           ["venue>=EMNLP"], ["external_ids.doi exists"]]


def corpus(n: int, seed: int = 0):
    rng = random.Random(seed)
    venues = ["ACL", "EMNLP", "NAACL", "Nature", "ICML", None]
    for i in range(n):
        meta = {"format": "s2orc", "year": 1990 + i % 35, "authors": [{"name": f"A{rng.randrange(5000)}"} for _ in range(3)]}
        venue = rng.choice(venues)
        if venue:
            meta["venue"] = venue
        if i % 2:
            meta["external_ids"] = {"doi": f"10.1000/{i}"}
        yield str(i), meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = list(corpus(args.papers))
    t = time.perf_counter()
    cols = MetadataColumns([r[0] for r in rows], [r[1] for r in rows])
    print(f"{args.papers:,} papers; columns built in {1000 * (time.perf_counter() - t):.0f} ms (once per index generation)")
    print(f"{'filter':40} {'allowed':>8} {'columns ms':>11} {'python ms':>10} {'ratio':>7}")
    for f in FILTERS:
        conds = coerce_filters(f)
        a = b = None
        tc, tp = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            a = cols.allowed(conds)
            tc.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = allowed_ids(rows, conds)
            tp.append(time.perf_counter() - t)
        assert a == b, f
        c_ms, p_ms = 1000 * statistics.median(tc), 1000 * statistics.median(tp)
        print(f"{'; '.join(f):40} {len(a):>8} {c_ms:>11.1f} {p_ms:>10.1f} {p_ms / c_ms:>6.1f}x")


if __name__ == "__main__":
    main()
