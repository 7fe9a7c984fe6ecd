""" what the engine-side MaxSim costs per candidate, against esqbe's Python summax rescorer, at
100 and 1,000 candidates, on a real embedded index's vectors (candidates cycle through its papers to reach the
count). Three timings, each the median of --repeat runs:

- `python`: esqbe's summax rescorer (rescore_summax) on a CandidateBatch of the candidates' facet sentences, one
  batched float32 matmul: what esqbe does today after fetching the vectors;
- `emulated-per-doc`: the engines' documented semantics evaluated per document, as script_score does (one call per
  candidate, numpy per call): an upper-bound-ish stand-in for a Painless loop, NOT the engine's own timing;
- the same with the conversion of JSON-like lists to arrays per document (lateInteractionScore reads _source lists).

    python benchmarks/bench_maxsim.py --index esqbe-index --facet method
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import esqbe
from esqbe.backends.engines.maxsim import doc_fields, emulate_es, emulate_os, mv_field, unit
from esqbe.domain import IndexedPaper, Paper
from esqbe.rescore.batches import CandidateBatch, QueryBatch, RescoreContext
from esqbe.rescore.rescorers import rescore_summax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--facet", default="method")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with esqbe.open_index(args.index, config=None, create=False) as index:
        papers = list(index.backend.get([p.paper.paper_id for p in index.iter_papers()]).values())
    views = []
    for p in papers:
        idx = [i for i, f in enumerate(p.paper.facets) if f == args.facet]
        if idx:
            views.append(IndexedPaper(Paper(p.paper.paper_id, "", [p.paper.sentences[i] for i in idx],
                                            [args.facet] * len(idx)), unit(p.vectors[idx])))
    # what the setting adds to each engine document (JSON as sent in _bulk), beside the whole document
    import json

    from esqbe.backends.engines.documents import paper_to_doc
    from esqbe.domain import normalize_label

    added = [len(json.dumps(doc_fields([normalize_label(f) for f in p.paper.facets], p.vectors))) for p in papers]
    whole = [len(json.dumps(paper_to_doc(p))) for p in papers]
    sents = sum(len(p.paper.sentences) for p in papers) / len(papers)
    print(f"engine_facet_vectors: +{statistics.mean(added) / 1024:.1f} KB of JSON per paper ({sents:.1f} sentences, "
          f"each vector at most twice: its facet's field and all_mv) on a {statistics.mean(whole) / 1024:.1f} KB document; "
          f"as stored float32 by rank_vectors: {4 * 2 * sents * papers[0].vectors.shape[1] / 1024:.1f} KB")
    query, pool = views[0], views[1:]
    qv = query.vectors
    print(f"{len(papers)} papers, {len(pool)} with {args.facet} sentences; query: {len(qv)} sentences, "
          f"dim {qv.shape[1]}; mean candidate sentences {np.mean([len(v.vectors) for v in pool]):.1f}")
    for n in (100, 1000):
        cands = [pool[i % len(pool)] for i in range(n)]
        stored = [doc_fields(c.paper.facets, c.vectors)[mv_field(args.facet)] for c in cands]
        arrays = [np.asarray(s, dtype=np.float32) for s in stored]
        qlist = qv.tolist()

        def python():
            rescore_summax(RescoreContext())(QueryBatch(qv, query.paper.sentences), CandidateBatch.from_papers(cands))

        def per_doc():
            for a in arrays:
                emulate_es(qv, a)

        def per_doc_lists():
            for s in stored:
                emulate_os(qlist, s)

        for name, fn in (("python summax (batched)", python), ("emulated per doc (arrays)", per_doc),
                         ("emulated per doc (from lists)", per_doc_lists)):
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            print(f"{n:>5} candidates  {name:<31} {1000 * med:8.2f} ms total  {1e6 * med / n:8.1f} us/candidate")


if __name__ == "__main__":
    main()
