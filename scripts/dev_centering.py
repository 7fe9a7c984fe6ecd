"""Vector-centring levers on the CSFCube dev split, from an index `esqbe eval csfcube` built, in seconds.

    python scripts/dev_centering.py --index .esqbe-eval/csfcube-all-mpnet-base-v2-contextual-given
    python scripts/dev_centering.py --index ... --kinds none:0,mean:0,top:1,pool:1

Re-ranks each dev query's pool with `scripts/dev_levers.py`'s numpy summax after transforming every
sentence vector: `mean` removes the index's mean sentence vector, `facet` each label's mean, `top:K` the
mean and the top K principal directions (`esqbe.query.centering.estimate`, over every sentence of the index: the
`vector_centering` setting samples up to 5,000 papers, all of CSFCube), `pool:K` the same estimated from the
query's own candidate pool. Fused with 0.1 BM25 (title+abstract) or 0.1 / 0.2 BM25 over the candidate's
facet text. Prints one row per lever, then leave-one-query-out estimates of choosing among them and each
lever's per-query wins and losses against raw vectors: with 8 queries per facet, in-sample gains under
about a point are noise.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dev_levers import Dev, mm  # noqa: E402

from esqbe.evaluation.csfcube import split_qid  # noqa: E402
from esqbe.query.centering import estimate  # noqa: E402

FUSIONS = (("+0.1 BM25", "abstract", 0.1), ("+0.1 BM25 facet", "facet", 0.1), ("+0.2 BM25 facet", "facet", 0.2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/csfcube-dev")
    ap.add_argument("--index", required=True, help="an index built by `esqbe eval csfcube`")
    ap.add_argument("--kinds", default="none:0,mean:0,facet:0,top:1,top:2,top:4,top:8",
                    help="comma-separated KIND:K (none, mean, facet, top, pool)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="esqbe-centring-"))
    try:
        dev = Dev(args.data, args.index, None, tmp)
        Q = dev.qids
        orig = {p: ip.vectors.copy() for p, ip in dev.papers.items()}
        dim = next(iter(orig.values())).shape[1]
        rows = np.fromfile(Path(args.index) / "vectors.f16", dtype=np.float16).reshape(-1, dim).astype(np.float32)
        by_label = defaultdict(list)
        for p, ip in dev.papers.items():
            for f, v in zip(ip.paper.facets, orig[p]):
                by_label[f].append(v)
        label_mean = {f: np.mean(v, axis=0) for f, v in by_label.items()}
        bm25 = {"abstract": {q: dev.bm25(q, ("title", "abstract")) for q in Q}, "facet": {q: dev.bm25(q, ("facet",)) for q in Q}}

        def set_vectors(papers, fn):
            for p in papers:
                v = fn(p, orig[p])
                dev.papers[p].vectors = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

        def restore():
            for p in dev.papers:
                dev.papers[p].vectors = orig[p]

        def pool_scores(q, k, penalty):
            pid = split_qid(q)[0]
            cands = [c for c in dev.cube.pools[q] if c != pid and c in dev.papers]
            d = estimate(np.concatenate([orig[c] for c in cands]), k)
            set_vectors([pid, *cands], lambda p, v: d.apply(v))
            out = dev.summax(q, penalty=penalty)
            restore()
            return out

        per_query, names = [], []
        print("| vectors | candidate sentences | BM25 | bg NDCG%20 | method NDCG%20 | result NDCG%20 | all MAP | all NDCG%20 |")
        print("|---|---|---|---|---|---|---|---|")
        for spec in args.kinds.split(","):
            kind, k = spec.split(":")
            k = int(k)
            if kind == "mean" or kind == "top":
                d = estimate(rows, k if kind == "top" else 0)
                set_vectors(dev.papers, lambda p, v: d.apply(v))
            elif kind == "facet":
                set_vectors(dev.papers, lambda p, v: v - np.stack([label_mean[f] for f in dev.papers[p].paper.facets]))
            elif kind not in ("none", "pool"):
                raise SystemExit(f"unknown kind {kind!r}")
            for cand, penalty in (("same", np.inf), ("soft 0.2", 0.2)):
                s = {q: pool_scores(q, k, penalty) for q in Q} if kind == "pool" else {q: dev.summax(q, penalty=penalty) for q in Q}
                for label, text, w in FUSIONS:
                    pq, t = dev.evaluate({q: (1 - w) * mm(s[q]) + w * mm(bm25[text][q]) for q in Q})
                    names.append(f"{kind}{k or ''} {cand} {label}")
                    per_query.append([pq[q]["NDCG%20"] for q in Q])
                    print(f"| {kind}{k or ''} | {cand} | {label[1:]} | {t['background']['NDCG%20']:.2f} | {t['method']['NDCG%20']:.2f} | "
                          f"{t['result']['NDCG%20']:.2f} | {t['all']['MAP']:.2f} | {t['all']['NDCG%20']:.2f} |", flush=True)
            restore()
        nd = np.array(per_query)
        for facet in ("background", "method", "result", None):
            cols = [i for i, q in enumerate(Q) if facet is None or q.endswith(facet)]
            held = [nd[int(np.argmax(nd[:, [c for c in cols if c != h]].mean(1))), h] for h in cols]
            best = int(np.argmax(nd[:, cols].mean(1)))
            print(f"{facet or 'all (one global choice)'}: best in-sample {100 * nd[best, cols].mean():.2f} ({names[best]}), "
                  f"leave-one-query-out {100 * np.mean(held):.2f}")
        for i, name in enumerate(names):
            base = names.index("none " + name.split(" ", 1)[1]) if ("none " + name.split(" ", 1)[1]) in names else None
            if base is not None and base != i:
                diff = 100 * (nd[i] - nd[base])
                print(f"{name} vs raw: {diff.mean():+.2f} per query, better/worse {(diff > 1e-9).sum()}/{(diff < -1e-9).sum()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
