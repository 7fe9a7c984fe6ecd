"""`esqbe watch run`'s cost: N new papers against W watches on the index it is given, timed.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_watch_run.py INDEX --new 1000 --watches 50 --min-sim 0.5

It WRITES TO INDEX and puts it back: it adds W watches (`bench-watch-NNN`, each the method sentences, else all the
sentences, of a paper drawn with --seed), then N "new" papers, copies of drawn papers under new ids (`bench-new-NNNNN`:
their stored sentences and vectors upserted again, so no model runs and the papers are new to the watches with
realistic content; a copy ranks next to its original), times one `run_watches` over all watches (under the write
lock, as `esqbe watch run`), then deletes the copies and removes the watches. Use a copy of the index if it must not
change at all (the deletes leave retired rows until it is compacted, as any delete does).

It prints the run's seconds, the new papers and matches, how many watches ran the whole-index rank check (one query each), and the
index size; the cost should follow N and the watches that new papers pass, not the index's papers.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index", help="an embedded index directory (written to, then put back)")
    ap.add_argument("--new", type=int, default=1000, help="new papers (default 1000)")
    ap.add_argument("--watches", type=int, default=50, help="watches (default 50)")
    ap.add_argument("--min-sim", type=float, default=0.5, help="each watch's threshold (default 0.5)")
    ap.add_argument("-k", type=int, default=10, help="each watch's k (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import esqbe
    from esqbe.domain import IndexedPaper, Paper
    from esqbe.index.watches import add_watch, remove_watch, run_watches

    with esqbe.open_index(args.index, config=None, create=False, max_watches=max(100, args.watches + 10)) as index:
        backend = index.backend
        drawn, total = backend.sample_papers(args.watches + args.new, seed=args.seed)
        if len(drawn) < args.watches + 1:
            sys.exit(f"the index has {total} papers; it needs more than --watches")
        queries, sources = drawn[: args.watches], drawn[args.watches :] or drawn
        names = []
        t0 = time.perf_counter()
        for i, pid in enumerate(queries):
            name = f"bench-watch-{i:03d}"
            paper = index.get([pid])[pid]
            facet = "method" if "method" in paper.facets else None
            add_watch(index, name, paper_id=pid, facet=facet, min_sim=args.min_sim, k=args.k)
            names.append(name)
        t_add = time.perf_counter() - t0
        copies = []
        for n in range(args.new):
            src = sources[n % len(sources)]
            ip = backend.get([src])[src]
            p = ip.paper
            copies.append(IndexedPaper(Paper(f"bench-new-{n:05d}", p.title, p.sentences, p.facets, p.metadata), ip.vectors))
        t0 = time.perf_counter()
        for i in range(0, len(copies), 256):
            backend.upsert(copies[i : i + 256])
        t_upsert = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            runs = run_watches(index, names)
            t_run = time.perf_counter() - t0
        finally:
            index.delete([c.paper_id for c in copies])
            for name in names:
                remove_watch(index, name)
    matches = sum(len(r.matches) for r in runs)
    print(json.dumps({
        "index_papers": total, "new_papers": args.new, "watches": len(names), "min_sim": args.min_sim, "k": args.k,
        "run_s": round(t_run, 3), "per_watch_ms": round(1000 * t_run / max(len(names), 1), 1), "matches": matches,
        "watches_with_matches": sum(1 for r in runs if r.matches),
        "rank_checks": sum(1 for r in runs if r.passed), "passed_threshold": sum(r.passed for r in runs), "refused": [r.refused for r in runs if r.refused],
        "add_watches_s": round(t_add, 3), "upsert_new_s": round(t_upsert, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
