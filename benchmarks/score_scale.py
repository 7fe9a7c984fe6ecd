""" how a hit's similarity and BM25 are brought to one scale without looking at the other candidates,
measured on CSFCube dev (given labels) through the product's own query path, offline.

For each fold1_dev query: the query as `esqbe eval csfcube` runs it (restricted to its pool) with final_bm25_weight 0,
giving each candidate's rescorer similarity and BM25; the query text's best BM25 over the whole index (nothing
excluded: for a paper query, usually the paper itself) and the query paper's own BM25 (its self-score). Then each rule
ranks the pool and is scored by the collection's NDCG%20 as the evaluation scores it. The rule `minmax` is the
pool-dependent fusion shipped before the one score (it reproduces `esqbe eval csfcube`'s figure).

    PYTHONPATH=. .venv/bin/python benchmarks/score_scale.py INDEX [--data ../shared/data/csfcube-dev] [--cache F]

INDEX: the CSFCube dev index that `esqbe eval csfcube --index-path INDEX` builds (given labels).
"""
import argparse
import os
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from esqbe.domain import FirstStageRequest  # noqa: E402
from esqbe.evaluation.csfcube import load_csfcube, split_qid  # noqa: E402
from esqbe.evaluation.metrics import aggregate, evaluate_run  # noqa: E402
from esqbe.index.api import open_index  # noqa: E402
from esqbe.query.results import QueryError  # noqa: E402
from esqbe.settings.config import Settings  # noqa: E402


def best_bm25(backend, text: str, dim: int, restrict=None) -> float:
    request = FirstStageRequest(text=text, vectors=np.zeros((0, dim), np.float32), k=1, knn_k=0, bm25_k=1,
                                fusion="bm25", with_papers=False, restrict_to=restrict)
    found = backend.first_stage(request)
    return float(found[0].bm25) if found else 0.0


def collect(data: str, path: str) -> dict:
    cube = load_csfcube(data)
    splits = cube.scorable_splits()
    qids = list(dict.fromkeys(q for s in splits for q in cube.query_ids(s)))
    out = {"splits": cube.splits, "scorable": splits, "qrels": cube.qrels, "q": {}}
    with open_index(path, settings=Settings(backend="embedded", path=path)) as index:
        dim = index.backend.meta().dim
        for qid in qids:
            pid, facet = split_qid(qid)
            try:
                r = index.query(pid, facet=facet, restrict_to=cube.pools[qid], place_hits=False, final_bm25_weight=0.0)
            except QueryError:
                r = index.query(pid, restrict_to=cube.pools[qid], place_hits=False, final_bm25_weight=0.0)
            text = " ".join(s for _, s in r.query_sentences)
            out["q"][qid] = {"hits": [(h.paper_id, h.similarity, h.bm25) for h in r.hits],
                             "top": best_bm25(index.backend, text, dim),
                             "self": best_bm25(index.backend, text, dim, frozenset([pid]))}
    return out


def mm(x):
    lo, hi = float(np.min(x)), float(np.max(x))
    return np.ones_like(x) if hi <= lo else (x - lo) / (hi - lo)


def score(D: dict, rule) -> dict:
    run = {}
    for qid, d in D["q"].items():
        ids = [h[0] for h in d["hits"]]
        sim = np.array([np.nan if h[1] is None else h[1] for h in d["hits"]], dtype=np.float64)
        bm = np.array([h[2] for h in d["hits"]], dtype=np.float64)
        s = rule(sim, bm, d)
        run[qid] = sorted(zip(ids, s.tolist()), key=lambda x: (-x[1], x[0]))
    per = evaluate_run(run, D["qrels"])
    return {s: aggregate(per, D["splits"], s) for s in D["scorable"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("--data", default="../shared/data/csfcube-dev")
    ap.add_argument("--cache")
    a = ap.parse_args()
    if a.cache and os.path.exists(a.cache):
        D = pickle.loads(Path(a.cache).read_bytes())
    else:
        D = collect(a.data, a.index)
        if a.cache:
            Path(a.cache).write_bytes(pickle.dumps(D))

    def floor_rows(sim, floor):
        return np.where(np.isfinite(sim), sim, floor)

    def minmax(w):  # shipped before  non-finite one below the lowest, each min-max over the pool
        return lambda sim, bm, d: (1 - w) * mm(floor_rows(sim, np.nanmin(sim) - 1.0)) + w * mm(bm)

    def over(w, key, floor=-1.0):  # similarity as is, BM25 over a per-query reference that sees no other candidate
        return lambda sim, bm, d: (1 - w) * floor_rows(sim, floor) + w * bm / max(d[key], 1e-9)

    def const(w, c, floor=-1.0):  # BM25 over one index-wide constant
        return lambda sim, bm, d: (1 - w) * floor_rows(sim, floor) + w * bm / c

    tops = np.array([d["top"] for d in D["q"].values()])
    rules = [("minmax w0.1 (shipped before)", minmax(0.1)), ("similarity alone", over(0.0, "top"))]
    for w in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3):
        rules.append((f"sim + BM25/best-in-index w{w:g}", over(w, "top")))
    for w in (0.1, 0.2, 0.3):
        rules.append((f"sim + BM25/self w{w:g}", over(w, "self")))
    for w in (0.1, 0.2):
        c = float(np.median(tops))
        rules.append((f"sim + BM25/{c:.1f} (median best) w{w:g}", const(w, c)))
    print(f"best BM25 in the index per query: median {np.median(tops):.1f}, min {tops.min():.1f}, max {tops.max():.1f}")
    print("| rule | background | method | result | all | all MAP |")
    print("|---|---|---|---|---|---|")
    for name, rule in rules:
        res = score(D, rule)
        split = next(iter(res))
        t = res[split]
        print(f"| {name} | {t['background']['NDCG%20']:.2f} | {t['method']['NDCG%20']:.2f} | {t['result']['NDCG%20']:.2f} "
              f"| {t['all']['NDCG%20']:.2f} | {t['all']['MAP']:.2f} |")


if __name__ == "__main__":
    main()
