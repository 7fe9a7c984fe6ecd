"""Issue 36's feedback rules recombined offline (docs/results.md, "Issue 36, session 16"): for each CSFCube dev query,
the baseline's first 10 hits read as `esqbe eval csfcube --feedback` reads them (up to 3 relevant, 1 non-relevant
marked), each part's own query (the query paper, each marked paper) over the pool, its similarity and BM25 per
candidate, and the shipped query's joined-text BM25 for P = 1..3; then, for each P,N, rules combining them over
the residual pool of that run (the pool less its own marks), scored by the collection's NDCG%20 against the
residual baseline, exactly as the evaluation scores them (the shipped rule's row reproduces its figures).

    .venv/bin/python benchmarks/feedback_recombine.py INDEX [--data ../shared/data/csfcube-dev] [--cache parts.pkl]

INDEX: the CSFCube dev index `esqbe eval csfcube --index-path INDEX` builds (default settings, given labels).
"""
import argparse
import os
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from esqbe.evaluation.csfcube import load_csfcube, split_qid  # noqa: E402
from esqbe.evaluation.feedback import _facet_sentences, baseline_query, simulated_marks  # noqa: E402
from esqbe.evaluation.metrics import aggregate, evaluate_run  # noqa: E402
from esqbe.index.api import open_index  # noqa: E402
from esqbe.settings.config import Settings  # noqa: E402


def collect(data: str, path: str) -> dict:
    cube = load_csfcube(data)
    splits = cube.scorable_splits()
    qids = list(dict.fromkeys(q for s in splits for q in cube.query_ids(s)))
    out = {"splits": cube.splits, "scorable": splits, "qrels": cube.qrels, "q": {}}
    with open_index(path, settings=Settings().replace(backend="embedded", path=path)) as index:
        for qid in qids:
            pid, facet = split_qid(qid)
            judged, pool = cube.qrels[qid], cube.pools[qid]
            first, query = baseline_query(index, pid, facet, pool)
            good, bad = simulated_marks([(h.paper_id, h.score) for h in first.hits], judged, 3, 1)
            rest = list(pool)  # each part's query never returns itself; each run drops its own marks below
            parts = {}
            for name, ex in [("q", query)] + [(p, _facet_sentences(index, p, facet)) for p in good + bad]:
                r = index.query(examples=[ex], facet=facet, restrict_to=rest, place_hits=False)
                parts[name] = {h.paper_id: (h.similarity, h.bm25) for h in r.hits}
            joined = {}
            for n in range(1, len(good) + 1):
                r = index.query(examples=[query, *(_facet_sentences(index, g, facet) for g in good[:n])], facet=facet,
                                restrict_to=rest, place_hits=False)
                joined[n] = {h.paper_id: h.bm25 for h in r.hits}
            out["q"][qid] = {"good": good, "bad": bad, "parts": parts, "joined": joined,
                             "baseline": [(h.paper_id, h.score) for h in first.hits]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index")
    ap.add_argument("--data", default=os.path.join(os.environ.get("ESQBE_SHARED", "../shared"), "data", "csfcube-dev"))
    ap.add_argument("--cache", help="a pickle of the collected parts: written if absent, read if present")
    args = ap.parse_args()
    if args.cache and Path(args.cache).exists():
        with open(args.cache, "rb") as f:
            D = pickle.load(f)  # noqa: S301  (the script's own file)
    else:
        D = collect(args.data, args.index)
        if args.cache:
            with open(args.cache, "wb") as f:
                pickle.dump(D, f)
    split = D["scorable"][0]

    def mm(x):
        lo, hi = np.min(x), np.max(x)
        return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)

    def z(x):
        return (x - np.mean(x)) / (np.std(x) + 1e-9)

    def ndcg(P, N, rule):
        """NDCG%20 per facet of `rule` at P,N on each query's residual pool; rule None: the residual baseline."""
        run, qrels = {}, {}
        for qid, d in D["q"].items():
            good, bad = d["good"][:P], d["bad"][:N]
            marked = set(good) | set(bad)
            qrels[qid] = {c: g for c, g in D["qrels"][qid].items() if c not in marked}
            if rule is None or not marked:  # the baseline's ranking less the marks (no mark: the run is the baseline)
                run[qid] = [(h, s) for h, s in d["baseline"] if h not in marked]
                continue
            parts = d["parts"]
            cands = sorted(c for c in parts["q"] if c not in marked)

            def col(name, i):
                return np.array([parts[name].get(c, (None, None))[i] for c in cands], dtype=float)

            S = {n: col(n, 0) for n in parts}
            S = {n: np.where(np.isnan(v), np.nanmin(v) - 1, v) for n, v in S.items()}
            B = {n: np.nan_to_num(col(n, 1)) for n in parts}
            joined = d["joined"].get(len(good)) if good else None
            B["joined"] = np.array([joined.get(c, 0.0) for c in cands]) if joined else B["q"]
            run[qid] = sorted(zip(cands, rule(S, B, ["q", *good], bad)), key=lambda t: (-t[1], t[0]))
        a = aggregate(evaluate_run(run, qrels), D["splits"], split, rounded=False)
        return {f: a[f]["NDCG%20"] for f in a}

    def margin(s, S, ex, bad, scale=1.0):
        if not bad:
            return s
        raw = np.mean([S[e] for e in ex], axis=0)
        return s - 0.5 * np.maximum(0, np.max([S[b] for b in bad], axis=0) - raw) * scale

    def shipped(bm25):
        def rule(S, B, ex, bad):
            s = margin(np.mean([S[e] for e in ex], axis=0), S, ex, bad)
            b = B["joined"] if bm25 == "joined" else B["q"] if bm25 == "query" else np.mean([B[e] for e in ex], axis=0)
            return 0.9 * mm(s) + 0.1 * mm(b)
        return rule

    def composed(norm):
        def rule(S, B, ex, bad):
            s = np.mean([0.9 * norm(S[e]) + 0.1 * norm(B[e]) for e in ex], axis=0)
            raw = np.mean([S[e] for e in ex], axis=0)
            return margin(s, S, ex, bad, 1.0 / (np.std(raw) + 1e-9) if norm is z else 1.0 / (np.ptp(raw) + 1e-9))
        return rule

    def zsim_joined(S, B, ex, bad):
        raw = np.mean([S[e] for e in ex], axis=0)
        s = margin(np.mean([z(S[e]) for e in ex], axis=0), S, ex, bad, 1.0 / (np.std(raw) + 1e-9))
        return 0.9 * mm(s) + 0.1 * mm(B["joined"])

    rules = {"shipped (joined-text BM25)": shipped("joined"), "BM25 of the query paper alone": shipped("query"),
             "mean of each example's own BM25": shipped("mean"), "each example's query z-scored, averaged": composed(z),
             "the same, min-max": composed(mm), "z-scored similarities, joined-text BM25": zsim_joined}
    settings = [(1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1)]
    base = {pn: ndcg(*pn, None) for pn in settings}
    print(f"{split}: {len(D['q'])} queries; residual baseline NDCG%20 (all) per P,N: "
          + ", ".join(f"{p},{n} {base[(p, n)]['all']:.2f}" for p, n in settings))
    print(f"{'rule':<44}" + "".join(f"{f'{p},{n}':>8}" for p, n in settings) + "   2,1 background / method / result")
    for name, rule in rules.items():
        got = {pn: ndcg(*pn, rule) for pn in settings}
        d21 = {f: got[(2, 1)][f] - base[(2, 1)][f] for f in ("background", "method", "result")}
        print(f"{name:<44}" + "".join(f"{got[pn]['all'] - base[pn]['all']:>+8.2f}" for pn in settings)
              + f"   {d21['background']:+.2f} / {d21['method']:+.2f} / {d21['result']:+.2f}")


if __name__ == "__main__":
    main()
