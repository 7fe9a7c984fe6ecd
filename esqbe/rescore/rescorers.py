"""Rescorers: score the first stage's top candidates against the query's sentences, in Python.

Each rescorer is a function over arrays, batched over all candidates at once (padded tensors,
no per-pair Python loops), and returns which sentences matched so a hit can be explained.
Higher score = more similar, for every rescorer.

Register new ones with `@register("name")`; the query pipeline and `esqbe eval` find them by name.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..core import deadline
from ..errors import ParameterError
from .batches import (
    CandidateBatch,
    Match,
    QueryBatch,
    RescoreContext,
    Rescorer,
    RescoreResult,
)
from .registry import Param, available_rescorers, check_param, register, rescorer_params  # noqa: F401  (the server imports them from here)


def _cosines(query_vectors: np.ndarray, cand_vectors: np.ndarray) -> np.ndarray:
    """(n, m, L) dot products of unit vectors, one float32 matmul (several times faster than einsum here)."""
    n, width, dim = cand_vectors.shape
    if n == 0:  # CandidateBatch.from_papers([]) has no dimension to match
        return np.zeros((0, len(query_vectors), width), dtype=np.float32)
    flat = np.asarray(cand_vectors, dtype=np.float32).reshape(n * width, dim)
    return (flat @ np.asarray(query_vectors, dtype=np.float32).T).reshape(n, width, -1).transpose(0, 2, 1)


def cosine_matrix(query: QueryBatch, cands: CandidateBatch) -> np.ndarray:
    """(n, m, L) cosine similarities; masked candidate slots are -inf."""
    sims = _cosines(query.vectors, cands.vectors)
    if cands.bias is not None:
        sims = sims + cands.bias[:, None, :]
    return np.where(cands.mask[:, None, :], sims, -np.inf)


def _top_matches(sims: np.ndarray, limit: int | None = 3) -> list[list[Match]]:
    """Per candidate, each query sentence's best candidate sentence, strongest pairs first."""
    best_j = sims.argmax(axis=2)  # (n, m)
    best_s = np.take_along_axis(sims, best_j[..., None], axis=2)[..., 0]  # (n, m)
    out = []
    for i in range(sims.shape[0]):
        order = np.argsort(-best_s[i])[:limit]
        out.append([(int(q), int(best_j[i, q]), float(best_s[i, q])) for q in order])
    return out


@register("ts")
def rescore_ts(context: RescoreContext) -> Rescorer:
    """Single best match (tsAspire): the best cosine over all (query sentence, candidate sentence) pairs."""

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        sims = cosine_matrix(query, cands)
        scores = sims.reshape(len(cands), -1).max(axis=1)
        return RescoreResult(scores=scores, matches=_top_matches(sims, limit=1))

    return score


@register("summax")
def rescore_summax(context: RescoreContext) -> Rescorer:
    """Mean over query sentences of the best cosine to any candidate sentence (every query sentence must find a match)."""

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        sims = cosine_matrix(query, cands)
        scores = sims.max(axis=2).mean(axis=1)
        return RescoreResult(scores=scores, matches=_top_matches(sims))

    return score


def _bool(rescorer: str, name: str, value) -> bool:
    """A boolean parameter given as a bool or as text (true/false, yes/no, on/off, 1/0)."""
    return check_param(rescorer, Param(name, bool, None, ""), value)


def _finite_matches(matches: list[list[Match]]) -> list[list[Match]]:
    """Drop the placeholder pairs `_top_matches` reports for candidates without sentences."""
    return [[mt for mt in row if np.isfinite(mt[2])] for row in matches]


def _check_query(rescorer: str, query: QueryBatch) -> None:
    if len(query.vectors) == 0:
        raise ParameterError(f"{rescorer}: the query has no sentences")


# --- optimal transport (otAspire) -----------------------------------------------------------------


def pairwise_l2(query_vectors: np.ndarray, cand_vectors: np.ndarray) -> np.ndarray:
    """(n, m, L) L2 distances between m query vectors and each candidate's L vectors, in float64.

    Vectors are unit-norm (the index stores them so), hence ||q - c|| = sqrt(2 - 2 cos).
    """
    cos = _cosines(np.asarray(query_vectors, dtype=np.float32), np.asarray(cand_vectors, dtype=np.float32))
    return np.sqrt(np.maximum(2.0 - 2.0 * cos.astype(np.float64), 0.0))


def _masked_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, restricted to `mask`; masked entries get 0 (rows need one True)."""
    x = np.where(mask, logits, -np.inf)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ot_marginals(dist: np.ndarray, mask: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """otAspire's sentence weights: x_q = softmax(-s_q / tau), s_q[i] = min_j D[i, j], and
    x_c = softmax(-s_c / tau), s_c[j] = min_i D[i, j], so sentences with a close partner carry
    more mass (tau -> inf: uniform). dist (n, m, L), mask (n, L); padded slots get 0 mass."""
    masked = np.where(mask[:, None, :], dist, np.inf)
    s_q = masked.min(axis=2)  # (n, m)
    s_c = masked.min(axis=1)  # (n, L), inf on padding
    x_q = _masked_softmax(-s_q / tau, np.ones_like(s_q, dtype=bool))
    x_c = _masked_softmax(-np.where(mask, s_c, 0.0) / tau, mask)
    return x_q, x_c


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return np.log(np.exp(x - top).sum(axis=axis)) + np.squeeze(top, axis=axis)


def _log_sinkhorn_steps(log_a, log_b, log_k, f, g, steps):
    """`steps` plain log-domain Sinkhorn iterations on the potentials (exact logsumexp: never
    under- or overflows). Absent slots have -inf potentials and a finite log_k."""
    for _ in range(steps):
        f = log_a - _logsumexp(log_k + g[:, None, :], axis=2)
        g = log_b - _logsumexp(log_k + f[:, :, None], axis=1)
    return f, g


def sinkhorn_batched(a, b, M, reg, *, numItermax: int = 1000, stopThr: float = 1e-4, check_every: int = 10,
                     method: str = "stabilized", log: bool = False):
    """Entropic OT plans for n problems at once: `ot.sinkhorn(a[k], b[k], M[k], reg)` for every k.

    a (n, m), b (n, L): histograms, each summing to 1; zero entries are absent slots (padding),
    so problems of different sizes share one padded tensor. M (n, m, L): costs.

    Log-domain potentials f, g (P = exp(f_i + g_j - M_ij / reg)). method="stabilized" (default)
    absorbs them into a kernel every `check_every` iterations and runs the iterations in between
    as scaling updates (two batched mat-vecs each, much cheaper than a logsumexp); a problem whose
    scalings under- or overflow redoes that block with exact log-domain steps, so any reg is safe.
    method="log": exact log-domain steps throughout (slower; same fixed point).
    A problem stops when its row marginals are within `stopThr` in L1 (columns are exact after
    every step), checked every `check_every` iterations (5x that once at most 32 problems are
    left), or after `numItermax`; converged problems leave the batch, so a slow one costs only itself.
    Returns plans (n, m, L), and with `log=True` also {"niter": per problem, "err": per problem}.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    M = np.asarray(M, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or b.shape[0] != a.shape[0] or M.shape != (a.shape[0], a.shape[1], b.shape[1]):
        raise ValueError(f"sinkhorn_batched: expected a (n, m), b (n, L), M (n, m, L); got {a.shape}, {b.shape}, {M.shape}")
    if not ((a > 0).any(axis=1).all() and (b > 0).any(axis=1).all()):
        raise ValueError("sinkhorn_batched: every problem needs mass on both sides")
    if method not in ("stabilized", "log"):
        raise ValueError(f"sinkhorn_batched: method must be 'stabilized' or 'log' (got {method!r})")
    a_live, b_live = a > 0, b > 0
    log_k = -np.where(a_live[:, :, None] & b_live[:, None, :], M, 0.0) / reg  # finite everywhere
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)
    # start from the c-transforms of zero: every live row and column of the first kernel holds a 1
    f = np.where(a_live, -np.where(b_live[:, None, :], log_k, -np.inf).max(axis=2), -np.inf)
    g = np.where(b_live, -np.where(a_live[:, :, None], log_k + f[:, :, None], -np.inf).max(axis=1), -np.inf)

    n = len(a)
    niter = np.zeros(n, dtype=np.int64)
    err = np.full(n, np.inf)
    active = np.arange(n)
    done_iters = 0
    while active.size and done_iters < numItermax:
        deadline.check()  # a request past its deadline stops between blocks
        # the few slow problems left run longer blocks: less per-block overhead, slightly coarser stops
        steps = min(int(check_every) * (1 if len(active) > 32 else 5), int(numItermax) - done_iters)
        A, B, LA, LB, LK, F, G = a[active], b[active], log_a[active], log_b[active], log_k[active], f[active], g[active]
        if method == "log":
            F, G = _log_sinkhorn_steps(LA, LB, LK, F, G, steps)
            rows = np.exp(F + _logsumexp(LK + G[:, None, :], axis=2))
        else:
            with np.errstate(all="ignore"):
                # the current plan; 1 on absent slots so their scalings come out 0 / positive = 0
                K = np.where((A > 0)[:, :, None] & (B > 0)[:, None, :], np.exp(LK + F[:, :, None] + G[:, None, :]), 1.0)
                if len(active) > 32:  # einsum is the faster mat-vec for big batches ...
                    v = (B > 0).astype(np.float64)
                    for _ in range(steps):
                        u = A / np.einsum("nml,nl->nm", K, v)
                        v = B / np.einsum("nml,nm->nl", K, u)
                    rows = u * np.einsum("nml,nl->nm", K, v)
                else:  # ... matmul for the few slow problems left
                    KT, A3, v3 = np.ascontiguousarray(K.transpose(0, 2, 1)), A[:, :, None], (B > 0).astype(np.float64)[:, :, None]
                    for _ in range(steps):
                        u3 = A3 / (K @ v3)
                        v3 = B[:, :, None] / (KT @ u3)
                    u, v = u3[:, :, 0], v3[:, :, 0]
                    rows = u * (K @ v3)[:, :, 0]
                log_u, log_v = np.log(np.where(A > 0, u, 1.0)), np.log(np.where(B > 0, v, 1.0))
            bad = ~(np.isfinite(log_u).all(axis=1) & np.isfinite(log_v).all(axis=1) & np.isfinite(rows).all(axis=1))
            F, G = F + log_u, G + log_v
            if bad.any():  # scalings left float range: redo this block exactly for those problems
                Fb, Gb = _log_sinkhorn_steps(LA[bad], LB[bad], LK[bad], f[active[bad]], g[active[bad]], steps)
                F[bad], G[bad] = Fb, Gb
                rows[bad] = np.exp(Fb + _logsumexp(LK[bad] + Gb[:, None, :], axis=2))
        done_iters += steps
        f[active], g[active] = F, G
        err[active] = np.abs(rows - A).sum(axis=1)
        niter[active] = done_iters
        active = active[err[active] >= stopThr]
    plans = np.exp(log_k + f[:, :, None] + g[:, None, :])
    if log:
        return plans, {"niter": niter, "err": err}
    return plans


def round_to_marginals(plans: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The nearest-feasible fix of approximate plans (Altschuler, Weed & Rigollet 2017, Alg. 2): scale
    down rows over a and columns over b, then spread the missing mass as a rank-one term, so the
    marginals hold exactly while the plan moves by at most twice Sinkhorn's marginal error.
    Sinkhorn stopped early (slow near-diagonal problems) thus still yields a transport plan."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = plans.sum(axis=2)
        plans = plans * np.where(rows > a, a / rows, 1.0)[:, :, None]
        cols = plans.sum(axis=1)
        plans = plans * np.where(cols > b, b / cols, 1.0)[:, None, :]
    miss_a = np.maximum(a - plans.sum(axis=2), 0.0)
    miss_b = np.maximum(b - plans.sum(axis=1), 0.0)
    total = miss_a.sum(axis=1)
    return plans + miss_a[:, :, None] * miss_b[:, None, :] / np.where(total > 0, total, 1.0)[:, None, None]


def emd_loop(a, b, M) -> np.ndarray:
    """Exact OT plans with POT's network simplex, one problem at a time (the reference for Sinkhorn).
    Same padded layout as `sinkhorn_batched`: zero-mass slots are left out of each problem."""
    import ot

    plans = np.zeros(np.shape(M), dtype=np.float64)
    for k in range(len(plans)):
        deadline.check()
        rows, cols = np.flatnonzero(a[k] > 0), np.flatnonzero(b[k] > 0)
        plans[k][np.ix_(rows, cols)] = ot.emd(
            np.ascontiguousarray(a[k][rows], dtype=np.float64),
            np.ascontiguousarray(b[k][cols], dtype=np.float64),
            np.ascontiguousarray(M[k][np.ix_(rows, cols)], dtype=np.float64),
        )
    return plans


def plan_matches(plans: np.ndarray, mask: np.ndarray, *, min_mass: float = 1e-4) -> list[list[Match]]:
    """Per candidate, the (query sentence, candidate sentence, mass) pairs of its plan, heaviest first.

    Keeps at most m + k - 1 pairs (the most an exact plan between m and k sentences uses) and
    drops crumbs under `min_mass` that entropic smoothing spreads everywhere.
    """
    n, m, width = plans.shape
    flat = plans.reshape(n, -1)
    top = min(m + width - 1, flat.shape[1])
    if n == 0 or top <= 0:
        return [[] for _ in range(n)]
    order = np.argsort(-flat, axis=1, kind="stable")[:, :top]
    mass = np.take_along_axis(flat, order, axis=1)
    keep = np.minimum(np.maximum(m + mask.sum(axis=1) - 1, 0), (mass >= min_mass).sum(axis=1))
    rows, cols, mass, keep = (order // width).tolist(), (order % width).tolist(), mass.tolist(), keep.tolist()
    return [list(zip(rows[i][: keep[i]], cols[i][: keep[i]], mass[i][: keep[i]])) for i in range(n)]


# Bounds: a worst-case request (1000 candidates of 40 sentences, 64 query sentences) must take seconds, not
# hours: Sinkhorn costs max_iter x n x m x L, and lam far beyond the distances' scale only makes every block
# fall back to exact log-domain steps (several times slower) for no better plans.
OT_PARAMS = (
    Param("tau", float, 0.5, "temperature of the nearest-neighbour marginals (large: uniform)", low=1e-3, high=1e6),
    Param("lam", float, 20.0, "entropic regularisation 1/reg of Sinkhorn", low=1e-2, high=200.0),
    Param("exact", bool, False, "POT's exact ot.emd per candidate instead of Sinkhorn (slow; the reference)"),
    Param("max_iter", int, 1000, "Sinkhorn iterations at most", low=1, high=2000),
    Param("tol", float, 1e-4, "Sinkhorn's stopping rule: row marginals within tol in L1", low=1e-8, high=1.0),
)


@register("ot", OT_PARAMS)
def rescore_ot(context: RescoreContext, *, tau=0.5, lam=20.0, exact=False, max_iter=1000, tol=1e-4) -> Rescorer:
    """Multi-match (otAspire): score = -<D, P>, P the optimal transport plan between query and candidate
    sentences under L2 distances D, with otAspire's nearest-neighbour marginals (`ot_marginals`, tau).

    Several query sentences can be matched at once, and extra candidate sentences take mass away
    from good matches (OT penalises what the query does not cover; see `asym` for the opposite).
    lam: entropic regularisation 1/reg of the batched Sinkhorn (max_iter, tol: its stopping rule);
    exact=true: POT's exact `ot.emd` per candidate instead (slow; the reference).
    Sinkhorn's plans are rounded onto the marginals (`round_to_marginals`), so every plan is an
    exact transport plan even when a slow problem stops at max_iter.
    The plans come back in `RescoreResult.plans`; `matches` lists each plan's heaviest pairs.
    """
    reg = 1.0 / lam

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        _check_query("ot", query)
        n, m = len(cands), len(query.vectors)
        if n == 0:
            return RescoreResult(scores=np.zeros(0), matches=[], plans=np.zeros((0, m, 0)))
        dist = pairwise_l2(query.vectors, cands.vectors)
        if cands.bias is not None:
            dist = dist - cands.bias[:, None, :].astype(np.float64)
        full = cands.mask.any(axis=1)  # candidates with at least one sentence
        plans = np.zeros_like(dist)
        if full.any():
            x_q, x_c = ot_marginals(dist[full], cands.mask[full], tau)
            if exact:
                plans[full] = emd_loop(x_q, x_c, dist[full])
            else:
                approx = sinkhorn_batched(x_q, x_c, dist[full], reg, numItermax=max_iter, stopThr=tol)
                plans[full] = round_to_marginals(approx, x_q, x_c)
        scores = np.where(full, -np.einsum("nml,nml->n", dist, plans), -np.inf)
        return RescoreResult(scores=scores, matches=plan_matches(plans, cands.mask), plans=plans)

    return score


# --- asymmetric partial matching --------------------------------------------------------------------


def _query_weights(query: QueryBatch) -> np.ndarray:
    m = len(query.vectors)
    if query.weights is None:
        return np.full(m, 1.0 / m)
    w = np.asarray(query.weights, dtype=np.float64)
    if w.shape != (m,) or (w < 0).any() or w.sum() <= 0:
        raise ParameterError(f"query weights must be {m} non-negative numbers, not all zero (got shape {w.shape})")
    return w / w.sum()


_D = Param("d", float, 4.0, "exponent of the cosines (1: plain coverage; larger rewards near-exact matches)",
           low=1e-2, high=100.0)


@register("asym", (_D,))
def rescore_asym(context: RescoreContext, *, d=4.0) -> Rescorer:
    """Asymmetric partial matching over the stored sentence vectors: score = sum over query sentences
    of weight x max over candidate sentences of max(cos, 0)^d.

    The candidate must cover the query; its extra sentences cost nothing (unlike `ot`).
    d = 1 is plain coverage (summax with weights); larger d rewards near-exact matches more.
    Weights: `QueryBatch.weights` (normalised to sum 1), uniform 1/m when absent.
    Candidates without sentences score -inf.
    """
    power = d

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        _check_query("asym", query)
        weights = _query_weights(query)
        sims = cosine_matrix(query, cands).astype(np.float64)  # (n, m, L), -inf on padding
        scaled = np.where(cands.mask[:, None, :], np.maximum(sims, 0.0) ** power, -np.inf)
        best = scaled.max(axis=2) if scaled.shape[2] else np.full(scaled.shape[:2], -np.inf)
        scores = np.where(cands.mask.any(axis=1), np.maximum(best, 0.0) @ weights, -np.inf)
        return RescoreResult(scores=scores, matches=_finite_matches(_top_matches(scaled, limit=None)) if len(cands) else [])

    return score


# the token-level matcher is shared with `esqbe cite` / `esqbe eval clscisumm` (esqbe.rescore.asym); these names stay
# importable here
from .asym import (  # noqa: E402,F401
    TokenSet,
    asym_scores,
    segment_max_cosines,
    strip_citation_markers,
    token_frequency_weights,
)
from .asym import unit_rows as _unit_rows  # noqa: E402,F401

ASYM_TOKEN_PARAMS = (
    _D,
    Param("alpha", float, 1e-4, "token weights alpha / (alpha + p(w)): smaller favours rare tokens more", low=1e-12, high=1e3),
    Param("max_tokens", int, 100, "tokens per sentence at most", low=1, high=510),
    # a directory: a pickle is loaded from it, so only the local user (CLI, config, Python API) names one;
    # a client of `esqbe serve` picks one of the server's named word vectors (`esqbe serve --words NAME=DIR`)
    Param("words", str, None, "word-vector directory from `esqbe train-words` (default: the encoder's token vectors)",
          http=False),
)


@register("asym_token", ASYM_TOKEN_PARAMS)
def rescore_asym_token(context: RescoreContext, *, d=4.0, alpha=1e-4, max_tokens=100, words=None) -> Rescorer:
    """Asymmetric partial matching over token vectors, as in cited-text identification.

    For query sentence S_q and candidate sentence S_c:
        sim = sum over query tokens w of W(w) * max over candidate tokens w' of max(cos(w, w')^d, 0),
    divided by the sum of W over S_q so sentences of any length compare (sim in [0, 1]);
    W(w) = alpha / (alpha + p(w)). Paper score = mean over query sentences of their best
    candidate sentence's sim (as in summax); candidates without sentences score -inf.
    The matching itself is `esqbe.rescore.asym.asym_scores`, the function `esqbe cite` uses.

    Token vectors: with `words=DIR` (from `esqbe train-words`), in-domain word vectors, p(w) from
    that corpus's counts, and identical words match exactly (a word without a vector still
    matches itself). Otherwise from `context.encoder.token_vectors` at query time (each sentence
    encoded alone after stripping citation markers, cut at `max_tokens`, unit-normalised, each
    distinct text once per call); they are not stored in the index. p(w) then comes from
    `context.backend.token_counts()`; when there is no backend or it keeps no counts, p(w) is
    estimated from the tokens of this call's query and candidate sentences (each distinct
    sentence once), which is a small sample: rare-token weights are then less reliable.
    """
    power = d
    vectors = None
    if words not in (None, "", "encoder"):
        from .words import WordVectors

        vectors = WordVectors.load(str(words))
    encoder = getattr(context, "encoder", None)
    if encoder is None and vectors is None:
        raise ParameterError("asym_token needs an encoder for token vectors (RescoreContext(encoder=...)) or words=DIR")
    backend = getattr(context, "backend", None)

    def encode(texts: list[str]) -> list[tuple[list[str], np.ndarray]]:
        if vectors is not None:
            out = []
            for t in texts:
                toks = vectors.tokens(t, markers=False)[:max_tokens]
                out.append((toks, vectors.vectors(toks)[0]))
            return out
        assert encoder is not None  # checked when the rescorer was made (no words, so an encoder)
        nonempty = [k for k, t in enumerate(texts) if t]  # a sentence that was only a citation has no tokens
        encoded: list = [([], None)] * len(texts)
        for k, out in zip(nonempty, encoder.token_vectors([texts[k] for k in nonempty], max_tokens=max_tokens)):
            encoded[k] = out
        dim = next((vecs.shape[-1] for _, vecs in encoded if vecs is not None), 1)
        return [(toks, vecs if vecs is not None else np.zeros((0, dim), np.float32)) for toks, vecs in encoded]

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        m, n = len(query.sentences), len(cands)
        if m == 0:
            raise ParameterError("asym_token: the query has no sentences")
        width = cands.mask.shape[1] if n else 0
        # every distinct (cleaned) text once: query sentences first, then candidate sentences
        texts: dict[str, int] = {}
        q_ids = [texts.setdefault(strip_citation_markers(t), len(texts)) for t in query.sentences]
        slot_ids = np.zeros((n, width), dtype=np.int64)
        for i, sents in enumerate(cands.sentences):
            slot_ids[i, : len(sents)] = [texts.setdefault(strip_citation_markers(t), len(texts)) for t in sents]
        encoded = encode(list(texts))
        dim = next((vecs.shape[-1] for _, vecs in encoded if vecs.ndim == 2), 1)

        counts_total: tuple[dict[str, int], int] | None
        if vectors is not None:
            counts_total = vectors.counts()
        else:
            counts_total = backend.token_counts() if backend is not None else None
        if counts_total is None:
            counts = Counter(t for toks, _ in encoded for t in toks)
            counts_total = (counts, sum(counts.values()))

        vocab: dict[str, int] = {}
        q_set = TokenSet.build([encoded[k] for k in q_ids], vocab, dim)
        all_set = TokenSet.build(encoded, vocab, dim)  # every distinct text as a candidate segment
        q_weights = token_frequency_weights(q_set.tokens, *counts_total, alpha)
        sent_sims = asym_scores(q_set, q_weights, all_set, power, exact=vectors is not None)  # (m, distinct texts)

        sims = sent_sims[:, slot_ids].transpose(1, 0, 2)
        if cands.bias is not None:
            sims = sims + cands.bias[:, None, :]
        sims = np.where(cands.mask[:, None, :], sims, -np.inf)  # (n, m, L)
        has = np.asarray(cands.mask.any(axis=1))
        best_per_q = sims.max(axis=2) if width else np.full((n, m), -np.inf)
        scores = np.where(has, np.where(has[:, None], best_per_q, 0.0).mean(axis=1), -np.inf)
        return RescoreResult(scores=scores, matches=_finite_matches(_top_matches(sims, limit=None)) if n else [])

    return score
