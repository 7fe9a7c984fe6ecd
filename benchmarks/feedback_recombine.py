"""Rules for a query of several examples and papers to avoid, recombined offline (docs/results.md, "Tried and not
kept"): for each CSFCube dev query,
the baseline's first 10 hits read as `esqbe eval csfcube --feedback` reads them (up to 3 relevant, 1 non-relevant
marked), each part's own query (the query paper, each marked paper) over the pool, its similarity and BM25 per
candidate, and the shipped query's joined-text BM25 for P = 1..3; then, for each P,N, rules combining them over
the residual pool of that run (the pool less its own marks), scored by the collection's NDCG%20 against the
residual baseline, exactly as the evaluation scores them. The rules fuse with the per-query min-max shipped before
the one score (its "shipped" row reproduced the product's figures then, not since): read the rows against each other.

    .venv/bin/python benchmarks/feedback_recombine.py INDEX [--data ../shared/data/csfcube-dev] [--cache parts.pkl]
        [--config configs/quality.yaml]

INDEX: the CSFCube dev index `esqbe eval csfcube --index-path INDEX [--config FILE]` builds (given labels); --config:
the same settings file, so that each part is queried as that evaluation queries (default: the default settings).
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
from esqbe.settings.config import Settings, load_settings  # noqa: E402


def collect(data: str, path: str, config: str | None = None) -> dict:
    cube = load_csfcube(data)
    splits = cube.scorable_splits()
    qids = list(dict.fromkeys(q for s in splits for q in cube.query_ids(s)))
    out = {"splits": cube.splits, "scorable": splits, "qrels": cube.qrels, "q": {}}
    base = load_settings(config, env={}) if config else Settings()
    with open_index(path, settings=base.replace(backend="embedded", path=path)) as index:
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


def mm(x):
    lo, hi = np.min(x), np.max(x)
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def z(x):
    return (x - np.mean(x)) / (np.std(x) + 1e-9)


def residual_runs(D: dict, P: int, N: int, rule) -> tuple[dict, dict]:
    """Per-query NDCG%20 etc. of `rule` at P,N on each query's residual pool (rule None: the residual baseline)."""
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
    return evaluate_run(run, qrels), qrels


def ndcg(D: dict, P: int, N: int, rule, per_query: dict | None = None) -> dict:
    """NDCG%20 per facet and all of `rule` at P,N (or of `per_query`'s figures), as the evaluation aggregates them."""
    if per_query is None:
        per_query, _ = residual_runs(D, P, N, rule)
    a = aggregate(per_query, D["splits"], D["scorable"][0], rounded=False)
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


def weighted(alpha: float, bm25: float, avoid: float):
    """The composition with free weights: alpha x the query paper's z-scored query + (1 - alpha) x the marked
    papers' (each (1 - bm25) x z(similarity) + bm25 x z(BM25)), less avoid x the margin in z units."""
    def rule(S, B, ex, bad):
        def each(e):
            return (1 - bm25) * z(S[e]) + bm25 * z(B[e])
        s = alpha * each("q") + (1 - alpha) * (np.mean([each(e) for e in ex[1:]], axis=0) if ex[1:] else each("q"))
        if bad and avoid:
            raw = np.mean([S[e] for e in ex], axis=0)
            s = s - avoid * np.maximum(0, np.max([S[b] for b in bad], axis=0) - raw) / (np.std(raw) + 1e-9)
        return s
    return rule


SETTINGS = [(1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1)]


def table(D: dict) -> None:
    rules = {"shipped (joined-text BM25)": shipped("joined"), "BM25 of the query paper alone": shipped("query"),
             "mean of each example's own BM25": shipped("mean"), "each example's query z-scored, averaged": composed(z),
             "the same, min-max": composed(mm), "z-scored similarities, joined-text BM25": zsim_joined}
    base = {pn: ndcg(D, *pn, None) for pn in SETTINGS}
    print(f"{D['scorable'][0]}: {len(D['q'])} queries; residual baseline NDCG%20 (all) per P,N: "
          + ", ".join(f"{p},{n} {base[(p, n)]['all']:.2f}" for p, n in SETTINGS))
    print(f"{'rule':<44}" + "".join(f"{f'{p},{n}':>8}" for p, n in SETTINGS) + "   2,1 background / method / result")
    for name, rule in rules.items():
        got = {pn: ndcg(D, *pn, rule) for pn in SETTINGS}
        d21 = {f: got[(2, 1)][f] - base[(2, 1)][f] for f in ("background", "method", "result")}
        print(f"{name:<44}" + "".join(f"{got[pn]['all'] - base[pn]['all']:>+8.2f}" for pn in SETTINGS)
              + f"   {d21['background']:+.2f} / {d21['method']:+.2f} / {d21['result']:+.2f}")


def ceiling(D: dict) -> None:
    """How far weights alone can take the composition: the best of a grid of fixed weights chosen on these very
    queries (an in-sample optimum, so an overestimate of what a rule fixed in advance gives), and each query's own
    best weights chosen with its judgments (an oracle no user's query has)."""
    grid = [(a, b, v) for a in (0.0, 0.2, 1 / 3, 0.5, 0.7, 1.0) for b in (0.0, 0.1, 0.2, 0.3) for v in (0.0, 0.5, 1.0)]
    print(f"{D['scorable'][0]}: {len(D['q'])} queries; {len(grid)} weight settings (alpha, bm25, avoid) of the "
          "z-scored composition; all facets, NDCG%20 over the residual baseline")
    for P, N in SETTINGS:
        base, _ = residual_runs(D, P, N, None)
        runs = [residual_runs(D, P, N, weighted(*g))[0] for g in grid]
        fixed = [ndcg(D, P, N, None, r)["all"] for r in runs]
        oracle = {q: max((r[q] for r in runs), key=lambda m: m["NDCG%20"]) for q in base}
        b = ndcg(D, P, N, None, base)["all"]
        k = int(np.argmax(fixed))
        print(f"{P},{N}: baseline {b:.2f}; best fixed weights {tuple(round(x, 2) for x in grid[k])} {fixed[k] - b:+.2f}"
              f" (chosen on these queries); each query's own best (oracle) {ndcg(D, P, N, None, oracle)['all'] - b:+.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index")
    ap.add_argument("--data", default=os.path.join(os.environ.get("ESQBE_SHARED", "../shared"), "data", "csfcube-dev"))
    ap.add_argument("--cache", help="a pickle of the collected parts: written if absent, read if present")
    ap.add_argument("--config", help="the YAML settings file the index was evaluated with (default: the defaults)")
    ap.add_argument("--ceiling", action="store_true",
                    help="instead of the rules: the best fixed weights of the composition chosen on these queries, and "
                         "each query's own best weights (an oracle)")
    args = ap.parse_args()
    if args.cache and Path(args.cache).exists():
        with open(args.cache, "rb") as f:
            D = pickle.load(f)  # noqa: S301  (the script's own file)
    else:
        D = collect(args.data, args.index, args.config)
        if args.cache:
            with open(args.cache, "wb") as f:
                pickle.dump(D, f)
    if args.ceiling:
        ceiling(D)
    else:
        table(D)


if __name__ == "__main__":
    main()
