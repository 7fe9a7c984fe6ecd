"""What the calibration's bound costs: on an embedded index with IVFs, per facet, the nprobe calibration
chooses for knn_recall_target when it bounds the sample's mean recall@100 and when it bounds its 10th percentile
(esqbe.backends.embedded.recall.calibrate_nprobe, same seeded sample), then, for seeded query papers of the index
(not the calibration's sample), the first stage's kNN at each of the two nprobe values against exact search:
recall@100 per query paper (mean, p10, min) and the kNN's latency (p50 / p99). The exact side runs once per query.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_recall_bound.py INDEX_DIR --queries 60

Latency is the kNN alone (`Backend.first_stage`, knn fusion, no BM25, no rescoring), one query at a time in this
process after one warm-up pass; report it only from a quiet run (nothing else on the machine).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index")
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--calibration-only", action="store_true",
                    help="only the two calibrations per facet (no exact search of query papers: cheap at any size)")
    args = ap.parse_args()

    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import calibrate_nprobe
    from esqbe.domain import FirstStageRequest

    out: dict = {"index": args.index, "target": args.target, "facets": {}}
    with EmbeddedBackend(args.index, create=False) as b:
        st = b._state()
        ids, total = b.sample_papers(args.queries, args.seed)
        papers = b.get(ids)
        out["papers"] = total
        for facet in ("background", "method", "result"):
            index = b._ann(st, _FACET_CODES[facet])
            if index is None:
                continue
            cal = {s: calibrate_nprobe(st, _FACET_CODES[facet], index, target=args.target, oversample=4, statistic=s)
                   for s in ("mean", "p10")}
            if args.calibration_only:
                out["facets"][facet] = {s: {"nprobe": c["nprobe"], "nlist": int(index.nlist),
                                            "calibration": {k: c[k] for k in ("recall", "mean", "p10", "queries", "seconds")}}
                                        for s, c in cal.items()}
                print(facet, json.dumps(out["facets"][facet]), file=sys.stderr, flush=True)
                continue
            cases = []
            for pid in ids:
                rows = papers[pid].paper.facet_indices(facet)
                if rows:
                    q = np.ascontiguousarray(papers[pid].vectors[rows], dtype=np.float32)
                    exact = b.exact_knn(q, 100, facet=facet, exclude=frozenset({pid}))
                    truth = {p for p, _ in sorted(exact.items(), key=lambda kv: (-kv[1], kv[0]))[:100]}
                    cases.append((pid, q, truth))
            row = {}
            for s, c in cal.items():
                b._overrides["nprobe"] = c["nprobe"]
                rec, lat = [], []
                for rnd in range(2):  # the first pass warms the lists up; the second is timed
                    for pid, q, truth in cases:
                        t0 = time.perf_counter()
                        found = b.first_stage(FirstStageRequest(text="", vectors=q, facet=facet, k=100, knn_k=100, bm25_k=0,
                                                                exclude=frozenset({pid}), fusion="knn", with_papers=False))
                        if rnd:
                            lat.append(1000 * (time.perf_counter() - t0))
                            rec.append(len(truth & {x.paper_id for x in found}) / max(1, len(truth)))
                a = np.asarray(rec)
                row[s] = {"nprobe": c["nprobe"], "calibration": {k: c[k] for k in ("recall", "mean", "p10", "queries")},
                          "recall_at_100": {"mean": round(float(a.mean()), 4), "p10": round(float(np.percentile(a, 10)), 4),
                                            "min": round(float(a.min()), 4)},
                          "knn_ms": {"p50": round(float(np.percentile(lat, 50)), 2), "p99": round(float(np.percentile(lat, 99)), 2)},
                          "queries": len(rec)}
                b._overrides.pop("nprobe", None)
            out["facets"][facet] = row
            print(facet, json.dumps(row), file=sys.stderr, flush=True)
    if args.calibration_only:
        print(json.dumps(out))
        return
    print("| facet | bound | nprobe | calibration sample mean / p10 | query papers recall@100 mean / p10 / min | kNN p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for facet, row in out["facets"].items():
        for s, r in row.items():
            c, q, t = r["calibration"], r["recall_at_100"], r["knn_ms"]
            print(f"| {facet} | {s} | {r['nprobe']} | {c['mean']:.3f} / {c['p10']:.3f} | {q['mean']:.3f} / {q['p10']:.3f} / "
                  f"{q['min']:.2f} | {t['p50']:.1f} / {t['p99']:.1f} |")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
