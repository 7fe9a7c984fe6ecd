"""Time per query of the batched `ot` and `asym` rescorers against a per-pair POT loop.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rescore.py [--candidates 100] [--repeat 20]

Everything runs on one core (thread counts pinned below, before numpy loads). Two set-ups:
`random`: 100 candidates x 8 sentences of random unit vectors (d=384; all distances ~ sqrt 2,
so Sinkhorn converges at once); `real-ish`: 3..20 sentences per candidate (padded to 20) and
vectors around a shared topic, some candidates holding paraphrases of the query sentences,
so cosines spread over ~0.1..1 as with real sentence vectors. Prints figures; asserts nothing.
"""
import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import ot  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from esqbe.rescore.batches import CandidateBatch, QueryBatch, RescoreContext  # noqa: E402
from esqbe.rescore.registry import make_rescorer  # noqa: E402
from esqbe.rescore.rescorers import ot_marginals, pairwise_l2, sinkhorn_batched  # noqa: E402

DIM = 384


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def random_case(rng, m, n, width=8):
    query = unit(rng.normal(size=(m, DIM)))
    vectors = unit(rng.normal(size=(n, width, DIM)))
    return query, vectors, np.ones((n, width), dtype=bool)


def realish_case(rng, m, n, max_width=20):
    topic = rng.normal(size=DIM)
    query = unit(topic + 1.2 * rng.normal(size=(m, DIM)))
    sizes = rng.integers(3, max_width + 1, size=n)
    vectors = unit(topic + 1.2 * rng.normal(size=(n, max_width, DIM)))
    for i in range(0, n, 5):  # every fifth candidate paraphrases some query sentences
        k = rng.integers(1, m + 1)
        vectors[i, :k] = unit(query[:k] + 0.05 * rng.normal(size=(k, DIM)))
    mask = np.arange(max_width)[None, :] < sizes[:, None]
    vectors[~mask] = 0.0
    return query, vectors, mask


def batch(query, vectors, mask):
    n, width = mask.shape
    q = QueryBatch(vectors=query, sentences=[f"q{i}" for i in range(len(query))])
    c = CandidateBatch(ids=[str(i) for i in range(n)], vectors=vectors, mask=mask,
                       sentences=[[f"c{i}.{j}" for j in range(int(mask[i].sum()))] for i in range(n)],
                       facets=[["unlabeled"] * int(mask[i].sum()) for i in range(n)])
    return q, c


def per_pair_pot(query, vectors, mask, tau=0.5, reg=0.05, stop=1e-4, solver="sinkhorn"):
    """The straightforward way: one POT call per candidate (distances, marginals, plan, score)."""
    scores = np.empty(len(vectors))
    for i in range(len(vectors)):
        cand = vectors[i][mask[i]].astype(np.float64)
        dist = ot.dist(query.astype(np.float64), cand, metric="euclidean")
        s_q, s_c = dist.min(axis=1), dist.min(axis=0)
        a = np.exp(-(s_q - s_q.min()) / tau)
        b = np.exp(-(s_c - s_c.min()) / tau)
        a, b = a / a.sum(), b / b.sum()
        plan = ot.sinkhorn(a, b, dist, reg, stopThr=stop) if solver == "sinkhorn" else ot.emd(a, b, dist)
        scores[i] = -(dist * plan).sum()
    return scores


def timed(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def sinkhorn_iterations(query, vectors, mask):
    dist = pairwise_l2(query, vectors)
    a, b = ot_marginals(dist, mask, 0.5)
    niter = sinkhorn_batched(a, b, dist, 0.05, stopThr=1e-4, log=True)[1]["niter"]
    return f"{int(np.median(niter))}/{int(niter.max())}"


class PrecomputedTokens:
    """Stands in for the encoder: fixed random token vectors per text, so only the matching is timed."""

    def __init__(self, rng, tokens_per_sentence=25):
        self.rng, self.size, self.cache = rng, tokens_per_sentence, {}

    def token_vectors(self, texts, *, max_tokens=100):
        out = []
        for t in texts:
            if t not in self.cache:
                k = int(self.rng.integers(self.size // 2, 2 * self.size))
                self.cache[t] = ([f"w{int(i)}" for i in self.rng.integers(0, 5000, size=k)], self.rng.normal(size=(k, DIM)).astype(np.float32))
            out.append(self.cache[t])
        return out


def bench_asym_token(rng, n, repeat):
    """asym_token's matching alone (token vectors given): real use adds encoding every distinct sentence."""
    print(f"\nasym_token matching only (token vectors given, ~25 tokens per sentence, 8 sentences per candidate; "
          f"real use adds encoding the ~{n * 8} distinct sentences)")
    encoder = PrecomputedTokens(rng)
    token_counts = ({f"w{i}": int(c) for i, c in enumerate(rng.integers(1, 1000, size=5000))}, 2_500_000)
    backend = type("Counts", (), {"token_counts": lambda self: token_counts})()
    rescorer = make_rescorer("asym_token", RescoreContext(encoder=encoder, backend=backend))
    for m in (1, 3, 5):
        query, vectors, mask = random_case(rng, m, n)
        q, c = batch(query, vectors, mask)
        print(f"  m={m}: {timed(lambda: rescorer(q, c), repeat):7.2f} ms per query")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    ot_batched = make_rescorer("ot", RescoreContext())
    ot_exact = make_rescorer("ot", RescoreContext(), exact=True)
    asym = make_rescorer("asym", RescoreContext())
    print(f"n={args.candidates} candidates, d={DIM}, one thread, median of {args.repeat} runs, ms per query")
    print(f"{'set-up':9} {'m':>2} {'L':>3} {'iters':>8} {'ot':>7} {'asym':>7} {'POT loop':>9} {'loop/ot':>8} {'emd loop':>9}")
    for name, make in (("random", random_case), ("real-ish", realish_case)):
        for m in range(1, 6):
            query, vectors, mask = make(rng, m, args.candidates)
            q, c = batch(query, vectors, mask)
            t_ot = timed(lambda: ot_batched(q, c), args.repeat)
            t_asym = timed(lambda: asym(q, c), args.repeat)
            t_loop = timed(lambda: per_pair_pot(query, vectors, mask), max(args.repeat // 4, 3))
            t_emd = timed(lambda: ot_exact(q, c), max(args.repeat // 4, 3))
            iters = sinkhorn_iterations(query, vectors, mask)
            print(f"{name:9} {m:>2} {mask.shape[1]:>3} {iters:>8} {t_ot:7.2f} {t_asym:7.2f} {t_loop:9.2f} {t_loop / t_ot:7.1f}x {t_emd:9.2f}")
    print("ot: the rescorer (batched stabilised Sinkhorn, lam=20, tol=1e-4; distances, marginals, plans, matches);"
          " iters: Sinkhorn iterations per candidate, median/max;")
    print("POT loop: ot.dist + marginals + ot.sinkhorn(stopThr=1e-4) per candidate; emd loop: the rescorer with exact=true")
    bench_asym_token(rng, args.candidates, args.repeat)


if __name__ == "__main__":
    main()
