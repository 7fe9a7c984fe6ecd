"""What a lower ANN effort per sentence changes in a query of several examples: for the
composed queries bench_examples.py times (5 examples + 1 avoided, seeded), each effort's kNN recall@100 against an
exact kNN of the same sentences, and its final top 10 against effort 1 (and, with --exact-final, against the query
whose first stage is exact: slow, ~6 s a query at hard 1M).

    .venv/bin/python benchmarks/examples_effort.py PATH [--facet method] [--queries 50] [--efforts 1,0.75,0.5,0.375,0.25]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import esqbe  # noqa: E402
from benchmarks.bench_examples import sample_groups  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--facet", default="method", choices=("background", "method", "result"))
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--efforts", default="1,0.75,0.5,0.375,0.25")
    ap.add_argument("--exact-final", action="store_true")
    args = ap.parse_args()
    efforts = [float(e) for e in args.efforts.split(",")]
    from esqbe.core.threads import limit_for_query

    limit_for_query()
    with esqbe.open_index(args.path, create=False) as index:
        b = index.backend
        _, have = sample_groups(index, args.facet, args.queries + 1, args.seed)  # bench_examples.py's papers
        groups = [have[6 * r: 6 * r + 6] for r in range(1, args.queries + 1)]
        requests = []
        first_stage = b.first_stage

        def run(effort: float, record: bool = False) -> list[list[str]]:
            def spy(request):
                if record:
                    requests.append(request)
                return first_stage(request)

            b.first_stage = spy
            try:
                return [[h.paper_id for h in index.query(facet=args.facet, k=10, examples=g[:5], avoid=g[5:],
                                                         examples_ann_effort=effort, place_hits=False).hits]
                        for g in groups]
            finally:
                b.first_stage = first_stage

        def top100(found: dict) -> set:
            return set(sorted(found, key=found.get, reverse=True)[:100])

        full = run(1.0, record=True)
        exact_knn = [top100(b.knn(r.vectors, r.knn_k, facet=r.facet, exclude=r.exclude, exact=True)) for r in requests]
        exact_final = None
        if args.exact_final:
            knn = b.knn
            b.knn = lambda *a, **kw: knn(*a, **{**kw, "exact": True})  # type: ignore[method-assign]
            try:
                exact_final = run(1.0)
            finally:
                b.knn = knn  # type: ignore[method-assign]
        print(f"{args.path}: {len(groups)} composed queries (5 examples + 1 avoided), facet {args.facet}; "
              f"sentences per query: median {int(np.median([len(r.vectors) for r in requests]))}")
        print(f"{'effort':>7}{'kNN recall@100':>16}{'top 10 vs effort 1':>20}{'identical':>11}"
              + (f"{'top 10 vs exact first stage':>29}" if exact_final else ""))
        for effort in efforts:
            tops = full if effort == 1.0 else run(effort)
            recalls = []
            for r, want in zip(requests, exact_knn):
                got = top100(b.knn(r.vectors, r.knn_k, facet=r.facet, exclude=r.exclude, effort=effort))
                recalls.append(len(got & want) / max(1, min(100, len(want))))
            same = [len(set(a) & set(c)) / max(1, len(a)) for a, c in zip(full, tops)]
            line = f"{effort:>7}{np.mean(recalls):>16.3f}{np.mean(same):>20.3f}{sum(s == 1 for s in same):>8}/{len(same)}"
            if exact_final:
                line += f"{np.mean([len(set(a) & set(c)) / max(1, len(a)) for a, c in zip(exact_final, tops)]):>29.3f}"
            print(line)


if __name__ == "__main__":
    main()
