"""ANN structures for one facet of a kept index, measured off-line: today's IVF-SQ8 (the
index's own file) against a finer IVF-SQ8 and IVF 4-bit PQ fast-scan, each on the facet's real rows, with the
calibration's recall@100 definition and query sample (esqbe.backends.embedded.recall: the facet's sentences drawn
with seed 0, own paper left out, per query sentence the ANN's hits folded to the best papers, which the first stage
re-scores exactly; truth by brute force over the facet).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ann_options.py INDEX --facet method \
        --options ivf-sq8-file,ivf8192-sq8,ivf2048-pq96x4fs,ivf8192-pq96x4fs --work DIR

Per option: build (train + add) seconds and the index's bytes, then for each "refine" factor r (papers re-scored per
query sentence: r x k; the ANN asked for 2 r k + 16 sentence hits, today's rule at r = 2) the smallest nprobe of the
calibration's ladder whose mean recall@100 reaches the target, its p10, and the search time per query sentence at
that nprobe, one query at a time on one OpenMP thread (as the first stage searches). The exact re-score's cost
grows with r (r k papers' rows read and scored per query sentence); benchmarks/profile_query.py gives its time
per candidate paper. The truth is cached under --work.
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


def build(option: str, vec: np.ndarray, pnos: np.ndarray, index_dir: Path, existing: Path | None):
    import faiss

    if option == "ivf-sq8-file":
        t0 = time.perf_counter()
        index = faiss.read_index(str(existing))
        return index, 0.0, existing.stat().st_size, time.perf_counter() - t0
    path = index_dir / f"{option}.faiss"
    if path.exists():  # built by an earlier run (same seed and sample): read it again
        t0 = time.perf_counter()
        return faiss.read_index(str(path)), float("nan"), path.stat().st_size, float("nan")
    nlist = int(option.split("-")[0][3:])
    kind = option.split("-")[1]
    dim = vec.shape[1]
    rng = np.random.default_rng(0)
    per_list = 40 if nlist <= 2048 else 20
    sample = np.sort(rng.choice(len(vec), size=min(len(vec), per_list * nlist), replace=False))
    train = np.ascontiguousarray(vec[sample], dtype=np.float32)
    t0 = time.perf_counter()
    if kind == "sq8":
        index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                              faiss.METRIC_INNER_PRODUCT)
    else:  # e.g. pq96x4fs
        index = faiss.index_factory(dim, f"IVF{nlist},{kind[:2].upper() + kind[2:]}", faiss.METRIC_INNER_PRODUCT)
    faiss.extract_index_ivf(index).cp.niter = 10
    faiss.omp_set_num_threads(2)
    index.train(train)
    train_s = time.perf_counter() - t0
    for lo in range(0, len(vec), 200_000):
        index.add_with_ids(np.ascontiguousarray(vec[lo : lo + 200_000], dtype=np.float32), pnos[lo : lo + 200_000])
    build_s = time.perf_counter() - t0
    faiss.omp_set_num_threads(1)
    faiss.write_index(index, str(path))
    print(f"  {option}: train {train_s:.0f}s, train+add {build_s:.0f}s", file=sys.stderr, flush=True)
    return index, build_s, path.stat().st_size, train_s


def main():
    import faiss

    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import (
        _EXACT_BUDGET,
        CALIBRATION_QUERIES,
        NPROBE_LADDER,
        ann_candidates,
        exact_top_papers,
        facet_rows,
        recall_of,
    )

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index")
    ap.add_argument("--facet", default="method")
    ap.add_argument("--options", default="ivf-sq8-file,ivf2048-pq96x4fs,ivf8192-sq8,ivf8192-pq96x4fs")
    ap.add_argument("--refine", default="2,4,8", help="papers re-scored per query sentence, as multiples of k")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--work", default=".esqbe-bench/ann-options")
    ap.add_argument("--timed", type=int, default=128, help="query sentences timed one at a time per setting")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    k = 100
    code = _FACET_CODES[args.facet]
    b = EmbeddedBackend(Path(args.index), create=False)
    st = b._state()
    entry = st.manifest[args.facet]
    rows = facet_rows(st, code)
    n_q = int(np.clip(_EXACT_BUDGET / max(1, len(rows) * st.dim), 32, CALIBRATION_QUERIES))
    picked = np.sort(np.random.default_rng(0).choice(len(rows), size=min(n_q, len(rows)), replace=False))
    q = np.ascontiguousarray(np.asarray(st.vec[rows[picked]], dtype=np.float32))
    own = np.asarray(st.pno[rows[picked]]).astype(np.int64)
    truth_file = work / f"truth-{args.facet}.npy"
    if truth_file.exists():
        truth = np.load(truth_file)
    else:
        t0 = time.perf_counter()
        truth, _ = exact_top_papers(st, rows, q, k, own)
        np.save(truth_file, truth)
        print(f"truth for {len(q)} queries over {len(rows):,} rows in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    t0 = time.perf_counter()
    vec = np.asarray(st.vec[rows])  # float16, the facet's rows in paper order
    pnos = np.asarray(st.pno[rows]).astype(np.int64)
    print(f"{args.facet}: {len(rows):,} rows read in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    results = []
    for option in args.options.split(","):
        index, build_s, nbytes, train_s = build(option, vec, pnos, work, b.path / "ann" / entry["file"])
        ivf = faiss.extract_index_ivf(index)
        nlist = int(ivf.nlist)
        ladder = [p for p in NPROBE_LADDER if p < nlist] + [nlist]
        faiss.omp_set_num_threads(1)
        for r in (int(x) for x in args.refine.split(",")):
            kk = 2 * r * k + 16
            chosen = None
            for nprobe in ladder:
                sp = faiss.SearchParametersIVF(nprobe=int(nprobe))  # type: ignore[call-arg]
                sims, ids = index.search(q, kk, params=sp)
                found = [c[c != o] for c, o in zip(ann_candidates(ids, sims, k, r), own)]
                per_query = recall_of(found, truth)
                if per_query.mean() >= args.target:
                    chosen = (nprobe, per_query)
                    break
            nprobe, per_query = chosen if chosen else (nlist, per_query)
            sp = faiss.SearchParametersIVF(nprobe=int(nprobe))  # type: ignore[call-arg]
            times = []
            for i in range(min(args.timed, len(q))):
                t1 = time.perf_counter()
                index.search(q[i : i + 1], kk, params=sp)
                times.append(1000 * (time.perf_counter() - t1))
            row = {"option": option, "nlist": nlist, "refine": r, "hits": kk, "nprobe": int(nprobe),
                   "recall_mean": round(float(per_query.mean()), 4),
                   "recall_p10": round(float(np.percentile(per_query, 10)), 3),
                   "ms_per_sentence_median": round(float(np.median(times)), 2),
                   "ms_per_sentence_mean": round(float(np.mean(times)), 2),
                   "build_s": round(build_s, 1), "train_s": round(train_s, 1), "bytes": int(nbytes),
                   "rows": int(len(rows)), "queries": int(len(q))}
            results.append(row)
            print(json.dumps(row), flush=True)
        del index
    (work / f"results-{args.facet}.json").write_text(json.dumps(results, indent=1))
    b.close()


if __name__ == "__main__":
    main()
