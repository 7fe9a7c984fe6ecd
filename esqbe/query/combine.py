"""A query of several examples, and papers to avoid: the one query pipeline (the single-paper query is it with one
example and nothing to avoid).

    first stage   one request over the union of the examples' sentences (BM25 on their text, kNN per sentence),
                  every example and avoided paper excluded
    rescoring     the candidates batched once per facet view; the rescorer scores them against each example's
                  sentences and each avoided paper's: similarity s_e (example e), a_j (avoided paper j)
    combination   s = aggregate_e(s_e)  (example_aggregate: mean or max)
                  margin (the default): s - avoid_weight x max(0, max_j a_j - s), only a candidate closer to an
                  avoided paper than to the examples loses; rocchio: s - avoid_weight x mean_j a_j
                  (chosen on CSFCube fold1_dev with `esqbe eval csfcube --feedback`: docs/results.md)
    the score     (1 - w - x) x (s - penalty) + w x bm25 / B + x x abstract similarity, w final_bm25_weight, x
                  abstract_weight, B the query text's best BM25 in the whole index (`bm25_lookups`; the result's
                  bm25_reference: nothing excluded, restricted or filtered; for a paper query usually that paper's
                  own): a function of the query and the paper alone (and the index's statistics), whatever else the
                  first stage found, so a rerank of any subset, a watch's new papers or a filtered page score a paper
                  as the query does
                  (chosen on CSFCube fold1_dev: docs/results.md)

Each hit keeps, per example, its similarity and the sentence pairs that matched (`MatchedPair.example`), and per
avoided paper its similarity, what it took off the score and the closest sentence pair (`AvoidedMatch`)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from ..backends.base import Backend
from ..core import deadline
from ..core.filters import MetadataFilter
from ..domain import Candidate, FirstStageRequest, IndexedPaper, normalize_label
from ..rescore.batches import CandidateBatch, QueryBatch, RescoreContext
from ..rescore.registry import make_rescorer
from ..settings.config import Settings
from ..settings.table import AVOID_RULES, BM25_TEXTS, CANDIDATE_FACET_MODES, EXAMPLE_AGGREGATES
from .centering import corpus_directions
from .results import AvoidedMatch, Example, Hit, MatchedPair, QueryError, QueryResult, ScoreFormula, ScoreParts
from .search import _candidate_views, _final_weights, abstract_similarity, has_soft_labels
from .versions import split_versions


def aggregate(sims: np.ndarray, rule: str) -> np.ndarray:
    """(E, n) per-example similarities (finite) -> (n,) one per candidate. One example: itself, whatever the rule."""
    if rule not in EXAMPLE_AGGREGATES:
        raise QueryError(f"example_aggregate must be one of {', '.join(EXAMPLE_AGGREGATES)} (got {rule!r})")
    if len(sims) == 1:
        return sims[0]
    if rule == "max":
        return sims.max(axis=0)
    return sims.mean(axis=0)


def avoid_penalty(score: np.ndarray, avoided: np.ndarray, rule: str, weight: float) -> np.ndarray:
    """(n,) what the avoided papers take off `score`; `avoided` (A, n) the similarities to each avoided paper."""
    if rule not in AVOID_RULES:
        raise QueryError(f"avoid_rule must be one of {', '.join(AVOID_RULES)} (got {rule!r})")
    if not (np.isfinite(weight) and weight >= 0):
        raise QueryError(f"avoid_weight must be a number >= 0 (got {weight!r})")
    if len(avoided) == 0 or weight == 0:
        return np.zeros_like(score)
    if rule == "margin":
        return weight * np.maximum(0.0, avoided.max(axis=0) - score)
    return weight * avoided.mean(axis=0)


#: the similarity a candidate gets where the rescorer finds nothing of it to match (no sentence of the query's facet):
#: the lowest cosine, a constant, so that it does not depend on the other candidates
NO_MATCH = -1.0


def _finite_rows(x: np.ndarray) -> np.ndarray:
    """Non-finite similarities (a candidate with nothing to match) set to NO_MATCH."""
    return np.where(np.isfinite(x), x, NO_MATCH)


def bm25_lookups(request: FirstStageRequest, candidates: Sequence[Candidate]) -> list[FirstStageRequest]:
    """The BM25 look-ups of the one score, as first stages of BM25 alone on the query's text and fields:
    1. what a hit's BM25 is divided by: the query text's best BM25 over the whole index, nothing excluded, restricted
       or filtered (for a paper query that is usually the paper itself: its self-score). It depends on the query and
       the index only, never on which candidates a query or a rerank is given;
    2. where the first stage gave some candidates no BM25 (it gives it only to those within its `bm25_k` best: a
       candidate the kNN alone brought has 0 there), those candidates scored among themselves (restricted to their
       ids: the index's statistics, the same score as anywhere). Not asked where the first stage was restricted to a
       pool it scored whole, or the query has no text."""
    def bm25_only(k: int, restrict_to: frozenset[str] | None) -> FirstStageRequest:
        return FirstStageRequest(text=request.text, vectors=np.zeros((0, request.vectors.shape[1]), dtype=np.float32),
                                 k=k, knn_k=0, bm25_k=k, restrict_to=restrict_to, fusion="bm25", with_papers=False,
                                 bm25_facet=request.bm25_facet)

    out = [bm25_only(1, None)]
    whole = request.restrict_to is not None and request.bm25_k >= len(request.restrict_to)
    unscored = [c.paper_id for c in candidates if c.bm25 <= 0.0]
    if unscored and not whole and request.text.strip():
        out.append(bm25_only(len(unscored), frozenset(unscored)))
    return out


def bm25_from_lookups(candidates: Sequence[Candidate], found: Sequence[Sequence[Candidate]]) -> tuple[np.ndarray, float]:
    """(each candidate's own BM25, the reference) from the answers to `bm25_lookups`; 0 as the reference when no
    paper matches a word of the query."""
    reference = max((float(c.bm25) for c in found[0]), default=0.0)
    got = {c.paper_id: float(c.bm25) for c in found[1]} if len(found) > 1 else {}
    bm25 = np.array([got.get(c.paper_id, c.bm25) if c.bm25 <= 0.0 else c.bm25 for c in candidates], dtype=np.float64)
    return bm25, reference


def window_plan(backend: Backend, parts: Sequence[Example], settings: Settings) -> tuple[bool, str]:
    """Whether the query's summax runs where the index lives (`Backend.score_windows`) and, in words, how or why not:
    only summax, whose parameters, vectors and candidate sentences the backend's scoring reproduces (no centring,
    no feedback, no abstract similarity, a facet's sentences or every sentence, without a penalty)."""
    name = settings.rescorer or "none"
    if name != "summax":
        return False, f"rescorer {name}: only summax is scored in the backend, so it runs in Python"
    facets = {normalize_label(p.facet) if p.facet else None for p in parts}
    why = ("vector_centering" if settings.vector_centering != "none" else
           "prf_docs" if settings.prf_docs and settings.prf_weight else
           "abstract_weight (it reads every candidate's vectors)" if settings.abstract_weight else
           "candidate_facet soft (a penalty per sentence)" if settings.candidate_facet == "soft" and facets - {None} else
           "a facet without its own field" if facets - {None, "background", "method", "result"} else None)
    if why:
        return False, f"summax with {why} runs in Python"
    return backend.window_scoring()


def _view_facet(part: Example, settings: Settings) -> str | None:
    """The candidates' sentences `part` is matched with, as `_candidate_views` picks them: its facet's, or every one."""
    return normalize_label(part.facet) if part.facet and settings.candidate_facet != "all" else None


def _score_in_backend(backend: Backend, candidates: list[Candidate], examples: Sequence[Example],
                      avoid: Sequence[Example], settings: Settings, rescorer, lookups: Sequence[FirstStageRequest]):
    """Each example's and avoided paper's summax of the window, scored by the backend (`window_plan` said it can), the
    `lookups` answered in the same request: (the candidates still in the index, per example (E, n), per avoided paper
    (A, n), how many were scored in Python, the look-ups' candidates).
    A candidate the backend left unscored (written before its index carried the fields), or whose labels the tagger
    predicted under candidate_facet auto (a penalty per sentence), is scored here on its fetched vectors: the same
    summax, so a paper's score stays a function of the query and that paper alone."""
    ids = [c.paper_id for c in candidates]
    parts = [*examples, *avoid]
    got = backend.score_windows(ids, [(part.paper.vectors[part.indices], _view_facet(part, settings)) for part in parts],
                                lookups)
    if got is None or len(got.parts) != len(parts) or len(got.lookups) != len(lookups):
        raise QueryError(f"the {backend.name} backend said it scores summax, then did not")
    answers = list(got.parts)
    papers = {pid: p for got in answers for pid, p in got.papers.items()}
    auto = settings.candidate_facet == "auto"
    python = [pid for pid in ids if pid in papers and any(
        pid not in got.scores or (auto and _view_facet(part, settings) and has_soft_labels(papers[pid]))
        for part, got in zip(parts, answers))]
    full = backend.get(python) if python else {}
    kept = [c for c in candidates if c.paper_id in papers and (c.paper_id in full or c.paper_id not in python)]
    rows = np.array([[got.scores.get(c.paper_id, np.nan) for c in kept] for got in answers], dtype=np.float64)
    rows = rows.reshape(len(parts), len(kept))
    redo = [m for m, c in enumerate(kept) if c.paper_id in full]
    if redo:
        sub = [dataclasses.replace(kept[m], paper=full[kept[m].paper_id]) for m in redo]
        per, _, av, _ = _rescore_python(sub, examples, avoid, settings, rescorer, None)
        rows[:, redo] = np.concatenate([per, av]).reshape(len(parts), len(redo))
    return kept, rows[: len(examples)], rows[len(examples):], len(redo), got.lookups


def _rescore_python(candidates: list[Candidate], examples: Sequence[Example], avoid: Sequence[Example],
                    settings: Settings, rescorer, directions):
    """The rescorer run here on the candidates' vectors: per example (E, n), the matched pairs of each candidate
    (example, query sentence, candidate sentence, weight), per avoided paper (A, n) and its closest pair."""
    n = len(candidates)
    matches: list[list[tuple[int, int, int, float]]] = [[] for _ in candidates]
    per_example = np.full((len(examples), n), np.nan)
    avoided_sims = np.full((len(avoid), n), np.nan)
    avoided_pairs: list[list[tuple[int, int] | None]] = [[None] * n for _ in avoid]
    batches: dict = {}  # the candidates as one batch per facet view: built once, scored against every example

    def batch_for(view_facet: str | None):
        if view_facet not in batches:
            views, bias = _candidate_views(candidates, view_facet, settings)
            if directions is not None:
                views = [(IndexedPaper(v.paper, directions.apply(v.vectors)), keep) for v, keep in views]
            batches[view_facet] = (CandidateBatch.from_papers([v for v, _ in views], bias=bias), views)
        return batches[view_facet]

    def score(part: Example, feedback: bool):
        vectors = part.paper.vectors[part.indices]
        if directions is not None:
            vectors = directions.apply(vectors)
        batch, views = batch_for(part.facet)
        result = rescorer(QueryBatch(vectors, part.sentences), batch)
        if feedback and settings.prf_docs and settings.prf_weight:  # Rocchio feedback from the top papers
            from .prf import feedback_queries

            vectors = feedback_queries(vectors, batch, np.asarray(result.scores, dtype=np.float64),
                                       docs=int(settings.prf_docs), weight=float(settings.prf_weight))
            result = rescorer(QueryBatch(vectors, part.sentences), batch)
        pairs = [[(qi, views[n_][1][ci], w) for qi, ci, w in ms if ci < len(views[n_][1]) and np.isfinite(w)]
                 for n_, ms in enumerate(result.matches)] if result.matches else [[] for _ in candidates]
        return np.asarray(result.scores, dtype=np.float64), pairs

    if not candidates:
        return per_example, matches, avoided_sims, avoided_pairs
    for x, ex in enumerate(examples):
        per_example[x], pairs = score(ex, True)
        for m in range(n):
            matches[m] += [(x, qi, ci, w) for qi, ci, w in pairs[m]]
    for j, av in enumerate(avoid):
        avoided_sims[j], pairs = score(av, False)
        for m in range(n):
            avoided_pairs[j][m] = (pairs[m][0][0], pairs[m][0][1]) if pairs[m] else None
    if len(examples) > 1:  # strongest pairs first, whichever example they belong to
        matches = [sorted(ms, key=lambda m: -m[3]) for ms in matches]
    return per_example, matches, avoided_sims, avoided_pairs


def _rescoring_note(rescored: bool, in_backend: bool, how: str, n: int, in_python: int) -> dict:
    """Where the similarity was computed, in the result (`rescoring` in its JSON): the backend, Python, or nowhere."""
    if not rescored:
        return {"where": "none", "why": "no rescorer: the first stage's order", "in_backend": 0, "in_python": 0}
    if not in_backend:
        return {"where": "python", "why": how, "in_backend": 0, "in_python": n}
    why = how + ("" if not in_python else f"; {in_python} of the {n} candidates in Python (written before the index "
                                          "carried the fields, or labels the tagger predicted under candidate_facet "
                                          "auto); the hits' matched sentences from their fetched vectors")
    return {"where": "backend", "why": why, "in_backend": n - in_python, "in_python": in_python}


def run_examples(backend: Backend, examples: Sequence[Example], avoid: Sequence[Example], settings: Settings, *,
                 exclude: Sequence[str] = (), restrict_to: Sequence[str] | None = None,
                 context: RescoreContext | None = None, filter: MetadataFilter | None = None,
                 originals: Sequence[Example] | None = None) -> QueryResult:
    """Rank papers by similarity to the `examples` (each its chosen sentences), less their similarity to `avoid`.
    A hit that is a likely version of an example (of `originals`, where given: the whole papers the examples stand
    for) or of a better-ranked hit is marked and listed after the numbered ones (esqbe.query.versions)."""
    if not examples:
        raise QueryError("a query needs at least one example")
    if settings.candidate_facet not in CANDIDATE_FACET_MODES:
        raise QueryError(f"candidate_facet must be one of {', '.join(CANDIDATE_FACET_MODES)}")
    if settings.bm25_text not in BM25_TEXTS:
        raise QueryError(f"bm25_text must be one of {', '.join(BM25_TEXTS)} (got {settings.bm25_text!r})")
    aggregate(np.zeros((2, 0)), settings.example_aggregate)  # the rules checked before any work
    avoid_penalty(np.zeros(0), np.zeros((1, 0)), settings.avoid_rule, float(settings.avoid_weight))
    timings = {}
    in_backend, how = window_plan(backend, [*examples, *avoid], settings)
    t0 = time.perf_counter()
    q_sentences = [s for e in examples for s in e.sentences]
    q_vectors = np.concatenate([e.paper.vectors[e.indices] for e in examples])
    facets = {normalize_label(e.facet) if e.facet else None for e in examples}
    facet = facets.pop() if len(facets) == 1 else None  # one facet for all: the first stage keeps to it
    restrict = frozenset(map(str, restrict_to)) if restrict_to is not None else None
    depth = max(settings.rescore_depth, settings.k)
    if restrict is not None:
        depth = max(depth, len(restrict))  # re-ranking a given pool: every member gets rescored
    request = FirstStageRequest(
        text=" ".join(q_sentences),
        vectors=q_vectors,
        facet=facet if (facet and settings.candidate_facet in ("same", "auto")) else None,
        k=depth,
        # k past knn_k / bm25_k: each list reaches k, so that k papers can be found (a limit below k would cut the
        # hits short unsaid); a re-rank of a pool: every member
        knn_k=max(settings.knn_k, depth if restrict is not None else settings.k),
        bm25_k=max(settings.bm25_k, depth if restrict is not None else settings.k),
        exclude=frozenset({*(e.paper_id for e in (*examples, *avoid)), *map(str, exclude)}),
        restrict_to=restrict,
        fusion=settings.fusion,
        bm25_weight=settings.fusion_bm25_weight,
        filter=filter if filter else None,
        bm25_facet=facet if (facet and settings.bm25_text == "facet" and backend.facet_text) else None,
        ann_effort=float(settings.examples_ann_effort) if len(examples) > 1 else 1.0,
        with_papers=not in_backend,  # scored where the index lives: no vectors fetched for the window
    )
    candidates = backend.first_stage(request)
    if restrict is not None:
        # re-ranking a pool: members neither BM25 nor kNN reached still get ranked (below the rest)
        missing = sorted(restrict - {c.paper_id for c in candidates} - request.exclude)
        floor = min((c.score for c in candidates), default=0.0) - 1.0
        if request.filter is not None and request.filter.engine_query is not None:
            missing = []  # the engine alone can tell which pool members its query allows
        found = backend.get(missing) if missing else {}
        if request.filter is not None:  # pool members the filter rules out stay out
            found = {pid: ip for pid, ip in found.items() if request.filter.matches(ip.paper.metadata)}
        candidates += [Candidate(pid, floor, 0.0, 0.0, found[pid]) for pid in missing if pid in found]
    timings["first_stage"] = round(1000 * (time.perf_counter() - t0), 2)
    deadline.check()  # a request past its deadline does not go on to rescoring

    t1 = time.perf_counter()
    rescorer = make_rescorer(settings.rescorer, context or RescoreContext(backend=backend), **(settings.rescorer_params or {}))
    in_python = 0
    per_example = np.full((len(examples), len(candidates)), np.nan)
    avoided_sims = np.full((len(avoid), len(candidates)), np.nan)
    w, a = _final_weights(settings)
    lookups = bm25_lookups(request, candidates) if rescorer is not None and w and candidates else []
    looked_up = None  # the look-ups' answers, where they rode with the window's scoring
    if rescorer is not None and candidates and in_backend:  # summax where the index lives
        candidates, per_example, avoided_sims, in_python, looked_up = _score_in_backend(
            backend, candidates, examples, avoid, settings, rescorer, lookups)
    n = len(candidates)
    first = np.array([c.score for c in candidates], dtype=np.float64)
    # per example: (example, query sentence, candidate sentence, weight) of each candidate
    matches: list[list[tuple[int, int, int, float]]] = [[] for _ in candidates]
    similarity = np.full(n, np.nan)  # the rescorer's own score, before any fusion
    avoided_pairs: list[list[tuple[int, int] | None]] = [[None] * n for _ in avoid]
    if rescorer is not None and candidates:
        if not in_backend:
            directions = None
            if settings.vector_centering != "none":  # the rescorer compares centred vectors (esqbe.query.centering)
                try:
                    directions = corpus_directions(backend, settings.vector_centering)
                except ValueError as err:
                    raise QueryError(str(err)) from None
            per_example, matches, avoided_sims, avoided_pairs = _rescore_python(candidates, examples, avoid, settings,
                                                                                rescorer, directions)
        finite = np.isfinite(per_example).all(axis=0)
        scores = aggregate(_finite_rows(per_example), settings.example_aggregate)
        similarity = np.where(finite, scores, np.nan)
    else:
        scores = first.copy()
    penalty = np.zeros((len(avoid), n))
    if avoid and n:
        sims = _finite_rows(avoided_sims) if rescorer is not None else np.zeros((len(avoid), n))
        total = avoid_penalty(scores, sims, settings.avoid_rule, float(settings.avoid_weight))
        # each avoided paper's share of what was taken off: in proportion to how close the candidate is to it
        share = np.maximum(sims - sims.min(axis=0, keepdims=True), 0) if len(avoid) > 1 else np.ones_like(sims)
        share = np.where(share.sum(axis=0, keepdims=True) > 0, share / np.maximum(share.sum(axis=0, keepdims=True), 1e-12),
                         1.0 / len(avoid))
        penalty = share * total
        scores = scores - total
        similarity = np.where(np.isfinite(similarity), scores, np.nan) if rescorer is not None else similarity
    bm25 = np.array([c.bm25 for c in candidates], dtype=np.float64)
    scaled = np.zeros(n)
    abstract = np.full(n, np.nan)
    reference = None
    if rescorer is not None and (w or a) and candidates:  # the one score (the module's docstring); none: first stage
        if w:
            t2 = time.perf_counter()
            if looked_up is None:  # rescored here: the look-ups are first stages of their own
                looked_up = [backend.first_stage(lookup) for lookup in lookups]
            bm25, reference = bm25_from_lookups(candidates, looked_up)
            timings["bm25_lookups"] = round(1000 * (time.perf_counter() - t2), 2)  # (within "rescore")
            scaled = np.minimum(bm25 / reference, 1.0) if reference > 0 else np.zeros(n)
        if a:
            abstract = abstract_similarity(q_vectors, [c.paper for c in candidates])
        scores = (1 - w - a) * scores + w * scaled + (a * abstract if a else 0.0)

    order = sorted(range(n), key=lambda i: (-scores[i], candidates[i].paper_id))
    hits = []
    limit = len(order) if restrict is not None else settings.k
    fetched: set[int] = set()

    def fetch(window: Sequence[int]) -> None:
        """The hits shown, scored where the index lives: their vectors, and from them their matched sentences."""
        todo = [i for i in window if i not in fetched]
        fetched.update(todo)
        if not (rescorer is not None and in_backend and todo):
            return
        full = backend.get([candidates[i].paper_id for i in todo])
        shown = [i for i in todo if candidates[i].paper_id in full]
        for i in shown:
            candidates[i] = dataclasses.replace(candidates[i], paper=full[candidates[i].paper_id])
        _, top_matches, _, top_pairs = _rescore_python([candidates[i] for i in shown], examples, avoid, settings,
                                                       rescorer, None)
        for m, i in enumerate(shown):
            matches[i] = top_matches[m]
            for j in range(len(avoid)):
                avoided_pairs[j][i] = top_pairs[j][m]

    numbered, versions = _numbered(order, limit, candidates, originals if originals is not None else examples, fetch)
    timings["rescore"] = round(1000 * (time.perf_counter() - t1), 2)
    for rank, i in [*((r, i) for r, i in enumerate(numbered, start=1)), *((None, i) for i in sorted(
            versions, key=order.index))]:  # the numbered ranking, then the likely versions in their order
        c = candidates[i]
        pairs = []
        for x, qi, ci, wt in matches[i]:
            assert c.paper is not None  # a candidate with matches was rescored: it carries its paper
            ex = examples[x]
            pairs.append(MatchedPair(ex.indices[qi], ex.sentences[qi], ci, c.paper.paper.sentences[ci],
                                     c.paper.paper.facets[ci], float(wt), example=x))
        if not pairs and c.paper is not None and len(c.paper.paper.sentences):
            # first-stage order only: still show the best sentence pair, by cosine
            for x, ex in enumerate(examples):
                sims = ex.paper.vectors[ex.indices] @ c.paper.vectors.T
                qi, ci = map(int, np.unravel_index(int(np.argmax(sims)), sims.shape))
                pairs.append(MatchedPair(ex.indices[qi], ex.sentences[qi], ci, c.paper.paper.sentences[ci],
                                         c.paper.paper.facets[ci], float(sims[qi, ci]), example=x))
        avoided = []
        for j, av in enumerate(avoid):
            pair = avoided_pairs[j][i]
            avoided.append(AvoidedMatch(
                av.paper_id, float(avoided_sims[j][i]) if np.isfinite(avoided_sims[j][i]) else None,
                float(penalty[j][i]),
                av.indices[pair[0]] if pair else None, av.sentences[pair[0]] if pair else None,
                pair[1] if pair else None,
                c.paper.paper.sentences[pair[1]] if pair and c.paper is not None else None))
        sim = float(similarity[i]) if np.isfinite(similarity[i]) else None
        per = [float(x) if np.isfinite(x) else None for x in per_example[:, i]]
        parts = ScoreParts(sim if sim is None else sim + float(penalty[:, i].sum()), float(penalty[:, i].sum()),
                           float(bm25[i]), float(scaled[i]) if reference is not None else None,
                           float(abstract[i]) if np.isfinite(abstract[i]) else None)
        hits.append(Hit(rank, c.paper_id, c.paper.paper.title if c.paper else "", float(scores[i]), c.score, float(bm25[i]),
                        c.knn, pairs, dict(c.paper.paper.metadata) if c.paper else {}, similarity=sim,
                        example_similarities=per, avoided=avoided, parts=parts,
                        likely_version_of=versions[i][0] if i in versions else None,
                        version_overlap=versions[i][1] if i in versions else None))
    head = examples[0]
    notes = [] if restrict is not None or len(numbered) >= settings.k else \
        [_short_of_k(backend, request, len(numbered), settings.k)]
    return QueryResult(head.paper_id, normalize_label(head.facet) if head.facet else None,
                       list(zip(head.indices, head.sentences)), hits, settings.rescorer or "none", timings,
                       [c.to_dict() for c in filter.conditions] if filter else [],
                       query_facets=[head.paper.paper.facets[i] for i in head.indices], query_title=head.paper.paper.title,
                       rescorer_params=dict(settings.rescorer_params or {}), examples=list(examples), avoid=list(avoid),
                       score=ScoreFormula(settings.rescorer or "none", 1 - w - a if rescorer is not None else 0.0,
                                          w if rescorer is not None else 0.0, a if rescorer is not None else 0.0,
                                          reference),
                       rescoring=_rescoring_note(rescorer is not None, in_backend, how, n, in_python), notes=notes)


def _numbered(order: list[int], limit: int, candidates: list[Candidate], originals: Sequence,
              fetch) -> tuple[list[int], dict[int, tuple[str, float]]]:
    """The candidates of the numbered ranking (the first `limit` in `order` that repeat no paper) and the likely
    versions met before its end (esqbe.query.versions: of an example or of a better-ranked hit), each with the paper
    it repeats and their overlap. `originals`: the examples (or the whole papers they stand for, a watch's); `fetch`
    gives the candidates of a window their vectors where the backend scored them without."""
    refs = [(ex.paper_id if ex.indexed else "(text)", ex.paper.vectors) for ex in originals]
    window: list[int] = []
    numbered: list[int] = []
    versions: dict[int, tuple[str, float]] = {}
    while len(window) < len(order) and len(numbered) < limit:
        window = order[: len(window) + (limit - len(numbered)) + (5 if window else 0)]
        fetch(window)
        vectors = [c.paper.vectors if c.paper is not None and c.paper.vectors is not None else np.zeros((0, 1))
                   for c in (candidates[i] for i in window)]
        at, repeats = split_versions(vectors, [candidates[i].paper_id for i in window], refs, limit)
        numbered, versions = [window[j] for j in at], {window[j]: v for j, v in repeats.items()}
    return numbered, versions


def _short_of_k(backend: Backend, request: FirstStageRequest, found: int, k: int) -> str:
    """Why a query has fewer hits than the k asked, in words: what the first stage could find."""
    try:
        held = backend.paper_count()
    except Exception:  # noqa: BLE001  # the note goes on without the total
        held = None
    why = [f"the index holds {held} paper(s)" if held is not None else "",
           f"{len(request.exclude)} excluded (the query's examples, papers to avoid and --exclude)" if request.exclude
           else "", "the filters allow only some" if request.filter is not None else "",
           f"the kNN looks at {request.facet} sentences only" if request.facet else ""]
    return (f"{found} hit(s) of the {k} asked: the first stage found no more candidates ("
            + "; ".join(w for w in why if w) + f"; each list reached {min(request.knn_k, request.bm25_k)} deep)")


def run_query(backend: Backend, query: IndexedPaper, indices: list[int], settings: Settings, *,
              facet: str | None = None, exclude: Sequence[str] = (), restrict_to: Sequence[str] | None = None,
              context: RescoreContext | None = None, filter: MetadataFilter | None = None) -> QueryResult:
    """Rank papers by similarity to the chosen sentences of `query` (among those `filter` allows): the single-paper
    query, which is the query of one example and nothing to avoid.

    It runs on the calling thread's own BLAS/OpenMP settings: a process that answers queries limits them once
    (`esqbe.core.threads.limit_for_query`), the library never flips them per call."""
    return run_examples(backend, [Example(query, list(indices), facet)], [], settings, exclude=exclude,
                        restrict_to=restrict_to, context=context, filter=filter)
