"""The query pipeline: query sentences -> first stage (BM25 + kNN, fused) -> rescorer -> ranked hits.

A query is a paper (from the index, or given as text) and either a facet (Definition 1: the
sentences labelled with it) or chosen sentence indices (Definition 2: no labels needed).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import numpy as np

from ..backends.base import Backend
from ..core import deadline
from ..core.filters import MetadataFilter
from ..domain import (
    QUERY_FACETS,
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    Paper,
    normalize_label,
)
from ..errors import UserError
from ..ingest.sentences import split_sentences
from ..rescore.batches import CandidateBatch, QueryBatch, RescoreContext
from ..rescore.registry import make_rescorer
from ..settings.config import Settings
from ..settings.table import BM25_TEXTS, CANDIDATE_FACET_MODES  # noqa: E402
from .centering import corpus_directions
from .result_json import result_json

#: the class order of the tagger's soft labels (`Paper.metadata["facet_probs"]`)
SOFT_FACET_ORDER = ("background", "method", "result", "other")
#: the settings a `facet_settings` entry may change: how one query is ranked, nothing about the index
FACET_SETTING_KEYS = ("k", "rescorer", "rescorer_params", "rescore_depth", "knn_k", "bm25_k", "fusion",
                      "fusion_bm25_weight", "candidate_facet", "facet_penalty", "final_bm25_weight", "abstract_weight",
                      "bm25_text", "query_facet_threshold", "vector_centering")


class QueryError(UserError, ValueError):
    """The query cannot be answered as asked (unknown paper, facet absent, bad sentence index)."""


class PaperNotFoundError(QueryError):
    """The query paper is not in the index."""

    http_status: ClassVar[int] = 404


class EmptyIndexError(QueryError):
    """Nothing is indexed yet."""

    http_status: ClassVar[int] = 409


class QueryTooLargeError(QueryError):
    """The query text is past a cap of `esqbe.core.limits`."""

    http_status: ClassVar[int] = 413


def query_sentences(text: str | Sequence[str]) -> list[str]:
    """A query text (one string, or its sentences) as sentences, refused past the caps of `esqbe.core.limits`
    before any splitting or tokenizing: a megabyte of text must not hold a reader for seconds."""
    from ..core.limits import MAX_QUERY_CHARS, MAX_QUERY_SENTENCE_CHARS

    parts = [text] if isinstance(text, str) else [str(s) for s in text]
    total = sum(len(s) for s in parts)
    if total > MAX_QUERY_CHARS:
        raise QueryTooLargeError(f"the query text has {total} characters; at most {MAX_QUERY_CHARS} per query")
    sents = split_sentences(text) if isinstance(text, str) else [s for s in parts if s.strip()]
    longest = max((len(s) for s in sents), default=0)
    if longest > MAX_QUERY_SENTENCE_CHARS:
        raise QueryTooLargeError(f"a query sentence has {longest} characters; at most {MAX_QUERY_SENTENCE_CHARS} "
                                 "per sentence (is the text missing its sentence ends?)")
    return sents


@dataclass
class MatchedPair:
    query_index: int
    query_sentence: str
    candidate_index: int
    candidate_sentence: str
    candidate_facet: str
    weight: float


@dataclass
class Hit:
    """One ranked paper.

    `similarity` is the rescorer's own score for the query (e.g. summax: the mean over query sentences
    of the best cosine), comparable across queries; None with rescorer `none` or when the candidate
    has no sentence the rescorer may match. `score` is what the ranking sorts by: the similarity fused
    with BM25 (each min-max scaled over this query's candidates, weight `final_bm25_weight`), so it is
    only meaningful within one query; with `final_bm25_weight` 0 it equals the similarity.
    """

    rank: int
    paper_id: str
    title: str
    score: float
    first_stage_score: float
    bm25: float
    knn: float
    matches: list[MatchedPair] = field(default_factory=list)
    #: the paper's stored metadata (year, venue, authors, external ids, ...; see esqbe.ingest.readers)
    metadata: dict = field(default_factory=dict)
    similarity: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        first = ("rank", "paper_id", "title", "similarity", "score")
        return {**{k: d[k] for k in first}, **{k: v for k, v in d.items() if k not in first}}


@dataclass
class QuerySentence:
    """One sentence of the query and why it is in it."""

    index: int
    text: str
    #: its facet label (given, or predicted by the tagger)
    facet: str
    #: the tagger's probability that it has the query's facet (None: no facet asked, or labels were given)
    probability: float | None
    #: why it is in the query: "label" (labelled with the facet), "probability" (predicted probability of the
    #: facet >= the threshold), "most_probable" (none reached it: the most probable one), "chosen", "all"
    why: str


@dataclass
class QuerySelection:
    """Which sentences form a query, and the rule that chose them."""

    #: "facet", "sentences" (chosen by index) or "all"
    by: str
    #: the rule in words, e.g. "sentences whose predicted p(method) >= 0.3 (query_facet_threshold)"
    rule: str
    sentences: list[QuerySentence]
    #: query_facet_threshold where it chose them (a facet query on predicted labels), else None
    threshold: float | None = None


@dataclass
class QueryResult:
    query_paper_id: str | None
    facet: str | None
    query_sentences: list[tuple[int, str]]
    hits: list[Hit]
    rescorer: str
    timings: dict = field(default_factory=dict)
    #: the metadata conditions the candidates were restricted to (esqbe.core.filters), as dicts
    filters: list = field(default_factory=list)
    #: facet label of each query sentence (same order as `query_sentences`)
    query_facets: list[str] = field(default_factory=list)
    #: the query paper's title (a text query's given title)
    query_title: str = ""
    #: the rescorer's parameters the query ran with
    rescorer_params: dict = field(default_factory=dict)
    #: which sentences form the query and why (set by `Index.query`; None from a bare `run_query`)
    selection: QuerySelection | None = None
    #: each query sentence's probability of every facet where esqbe's tagger labelled it (same order as
    #: `query_sentences`; set by `Index.query`; None where the labels were given)
    query_probabilities: list[dict[str, float]] | None = None

    def to_dict(self, papers: Mapping[str, Paper] | None = None) -> dict:
        """The one JSON shape of a query result, `esqbe query --json`'s and HTTP POST /query's (esqbe.query.result_json);
        with `papers` (paper id -> Paper), each hit among them gets its sentences."""
        return result_json(self, papers)


def select_query_sentences(paper: IndexedPaper | Paper, facet: str | None, sentences: Sequence[int] | None,
                           threshold: float | None = None) -> list[int]:
    """Which of the paper's sentences form the query (facet labels, chosen indices, or all).

    `threshold` (> 0): a paper with soft labels (tagger probabilities) contributes every sentence whose
    probability of the facet reaches it (at least its most probable one), not just those whose
    predicted label is the facet; papers with given labels are unaffected. 0 or None: hard labels."""
    p = paper.paper if isinstance(paper, IndexedPaper) else paper
    if uses_probabilities(p, facet, sentences, threshold):
        assert facet is not None and threshold is not None
        probs = facet_probability(p, normalize_label(facet))
        return [i for i in range(len(probs)) if probs[i] >= float(threshold)] or [int(np.argmax(probs))]
    if facet is not None and sentences is not None:
        raise QueryError("give either a facet or sentence indices, not both")
    if sentences is not None:
        chosen = list(dict.fromkeys(int(i) for i in sentences))
        bad = [i for i in chosen if not 0 <= i < len(p.sentences)]
        if bad or not chosen:
            raise QueryError(
                f"paper {p.paper_id} has sentences 0..{len(p.sentences) - 1}; "
                f"{'no sentence chosen' if not chosen else 'no sentence ' + ', '.join(map(str, bad))}"
            )
        return chosen
    if facet is None:
        return list(range(len(p.sentences)))
    facet = normalize_label(facet)
    if facet not in QUERY_FACETS:
        raise QueryError(f"facet must be one of {', '.join(QUERY_FACETS)} (got {facet!r})")
    chosen = p.facet_indices(facet)
    if not chosen:
        if not p.is_labeled:
            raise QueryError(
                f"paper {p.paper_id} has no facet labels (it was indexed without labels and without the tagger); "
                "query it with --sentences, or re-index it with labels or `--facets predict`"
            )
        present = sorted(set(p.facets) - {"unlabeled"})
        raise QueryError(f"paper {p.paper_id} has no sentence labelled {facet!r}; its facets: {', '.join(present)}")
    return chosen


def uses_probabilities(paper: Paper, facet: str | None, sentences: Sequence[int] | None, threshold: float | None) -> bool:
    """Whether `select_query_sentences` chooses the paper's facet sentences by the tagger's probabilities."""
    return bool(threshold) and facet is not None and sentences is None and normalize_label(facet) in QUERY_FACETS \
        and has_soft_labels(paper) and len(facet_probability(paper, normalize_label(facet))) > 0


def explain_selection(paper: Paper, facet: str | None, sentences: Sequence[int] | None, threshold: float | None,
                      indices: Sequence[int]) -> QuerySelection:
    """Why `select_query_sentences` chose `indices` of `paper`: each sentence's label, its probability of the
    facet where the tagger gave one, and the rule."""
    if sentences is not None:
        return QuerySelection("sentences", "the sentences chosen by index",
                              [QuerySentence(i, paper.sentences[i], paper.facets[i], None, "chosen") for i in indices])
    if facet is None:
        return QuerySelection("all", "every sentence (no facet asked)",
                              [QuerySentence(i, paper.sentences[i], paper.facets[i], None, "all") for i in indices])
    facet = normalize_label(facet)
    if uses_probabilities(paper, facet, sentences, threshold):
        assert threshold is not None
        probs = facet_probability(paper, facet)
        rule = (f"sentences whose predicted p({facet}) >= {float(threshold):g} (query_facet_threshold; the labels were "
                f"predicted by the tagger), or the most probable one if none reaches it")
        return QuerySelection("facet", rule, [
            QuerySentence(i, paper.sentences[i], paper.facets[i], round(float(probs[i]), 4),
                          "probability" if probs[i] >= float(threshold) else "most_probable") for i in indices],
            threshold=float(threshold))
    return QuerySelection("facet", f"sentences labelled {facet}",
                          [QuerySentence(i, paper.sentences[i], paper.facets[i], None, "label") for i in indices])


def facet_selections(paper: Paper, settings: Settings) -> dict[str, QuerySelection]:
    """For each facet a query of `paper` can ask for, the sentences that query would use and why (what the page
    marks before the query runs); a facet the paper cannot be queried by is absent."""
    out = {}
    for facet in QUERY_FACETS:
        threshold = settings_for_facet(settings, facet).query_facet_threshold
        try:
            indices = select_query_sentences(paper, facet, None, threshold)
        except QueryError:
            continue
        out[facet] = explain_selection(paper, facet, None, threshold, indices)
    return out


def numbered_sentences(paper: Paper, facet: str | None = None, width: int = 60) -> str:
    """The paper's sentences as `[i] label (p(facet) 0.12) "text…"`, for a message that must say which to pick."""
    probs = facet_probability(paper, facet) if facet and has_soft_labels(paper) else None
    out = []
    for i, (text, label) in enumerate(zip(paper.sentences, paper.facets)):
        short = text if len(text) <= width else text[: width - 1] + "…"
        p = f" (p({facet}) {float(probs[i]):.2f})" if probs is not None else ""
        out.append(f'[{i}] {label}{p} "{short}"')
    return "; ".join(out)


def facet_view(paper: IndexedPaper, facet: str | None) -> tuple[IndexedPaper, list[int]]:
    """The candidate as the rescorer sees it, and which of its sentences those are.

    With a facet (candidate_facet=same) only the candidate's sentences labelled with it take part,
    as in the first stage's kNN filter; a candidate with none of them gets the lowest rescorer
    score (BM25 fusion can still lift it). Without a facet, every sentence takes part.
    """
    n = len(paper.paper.sentences)
    keep = [i for i, f in enumerate(paper.paper.facets) if f == facet] if facet else list(range(n))
    if len(keep) == n:
        return paper, keep
    p = paper.paper
    view = Paper(p.paper_id, p.title, [p.sentences[i] for i in keep], [p.facets[i] for i in keep], p.metadata)
    return IndexedPaper(view, paper.vectors[np.asarray(keep, dtype=np.int64)]), keep


def has_soft_labels(paper: Paper) -> bool:
    """Whether the paper's labels came from esqbe's tagger (it stored their probabilities beside them)."""
    probs = (paper.metadata or {}).get("facet_probs")
    return probs is not None and len(probs) == len(paper.sentences)


def _candidate_views(candidates, facet: str | None, settings: Settings):
    """The candidates as the rescorer sees them (`facet_view`), and the cosine bias of their sentences.

    candidate_facet `same`: a facet query sees the candidate's sentences of that facet; `all`: every
    sentence; `soft`: every sentence, one of another facet losing facet_penalty x (1 - its probability
    of the query's facet); `auto` (the default): `soft` for a candidate whose labels the tagger predicted
    (a mislabelled sentence still counts, a little less), `same` for one with given labels.
    """
    mode = settings.candidate_facet
    facet = normalize_label(facet) if facet else None
    if not facet or mode == "all":
        return [facet_view(c.paper, None) for c in candidates], None
    if mode == "same":
        return [facet_view(c.paper, facet) for c in candidates], None
    penalty = float(settings.facet_penalty)
    if not penalty >= 0:
        raise QueryError(f"facet_penalty must be a number >= 0 (got {settings.facet_penalty!r})")
    views, bias = [], []
    for c in candidates:
        soft = mode == "soft" or has_soft_labels(c.paper.paper)
        view = facet_view(c.paper, None if soft else facet)
        views.append(view)
        bias.append(-penalty * (1.0 - facet_probability(view[0].paper, facet)) if soft
                    else np.zeros(len(view[1]), dtype=np.float32))
    return views, bias


def settings_for_facet(settings: Settings, facet: str | None) -> Settings:
    """`settings` with its `facet_settings` entry for `facet` applied (unchanged without a facet or entry)."""
    table = settings.facet_settings or {}
    if not isinstance(table, dict):
        raise QueryError(f"facet_settings must map a facet to settings (got {type(table).__name__})")
    unknown_facets = sorted(set(table) - set(QUERY_FACETS))
    if unknown_facets:
        raise QueryError(f"facet_settings: unknown facet(s) {', '.join(unknown_facets)}; facets: {', '.join(QUERY_FACETS)}")
    if facet is None:
        return settings
    entry = table.get(normalize_label(facet)) or {}
    if not isinstance(entry, dict):
        raise QueryError(f"facet_settings.{facet}: expected a mapping of settings (got {entry!r})")
    bad = sorted(set(entry) - set(FACET_SETTING_KEYS))
    if bad:
        raise QueryError(f"facet_settings.{facet}: {', '.join(bad)} cannot be set per facet; "
                         f"per-facet settings: {', '.join(FACET_SETTING_KEYS)}")
    return settings.replace(**entry) if entry else settings


def abstract_similarity(query_vectors: np.ndarray, papers: Sequence[IndexedPaper | None]) -> np.ndarray:
    """Cosine between the mean of the query's sentence vectors and the mean of each candidate's
    (all its sentences): whole-abstract similarity from the stored vectors, no second model.
    A candidate without sentences gets -1 (the lowest cosine)."""
    q = np.asarray(query_vectors, dtype=np.float32).mean(axis=0)
    q = q / max(float(np.linalg.norm(q)), 1e-12)
    out = np.full(len(papers), -1.0)
    for i, p in enumerate(papers):
        if p is not None and len(p.vectors):
            c = p.vectors.mean(axis=0)
            out[i] = float(c @ q) / max(float(np.linalg.norm(c)), 1e-12)
    return out


def _final_weights(settings: Settings) -> tuple[float, float]:
    w, a = float(settings.final_bm25_weight or 0.0), float(settings.abstract_weight or 0.0)
    if not (0.0 <= w <= 1.0 and 0.0 <= a <= 1.0 and w + a <= 1.0):
        raise QueryError(f"final_bm25_weight ({w:g}) and abstract_weight ({a:g}) must each be in 0..1 and sum to at most 1")
    return w, a


def facet_probability(paper: Paper, facet: str) -> np.ndarray:
    """Per sentence, the probability that it has `facet`: the tagger's soft label where the paper has
    one (`metadata["facet_probs"]`, esqbe classes background, method, result, other), else 1 for
    sentences labelled `facet` and 0 for the rest."""
    probs = (paper.metadata or {}).get("facet_probs")
    if facet in SOFT_FACET_ORDER and probs is not None and len(probs) == len(paper.sentences):
        try:
            return np.asarray(probs, dtype=np.float64)[:, SOFT_FACET_ORDER.index(facet)]
        except (TypeError, ValueError, IndexError):
            pass  # malformed soft labels: fall back to the hard ones
    return np.array([1.0 if f == facet else 0.0 for f in paper.facets])


def _minmax(x: np.ndarray) -> np.ndarray:
    """Scaled to 0..1 over this query's candidates; all equal (a lone candidate) is 1, not 0 (ranks the same)."""
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return np.ones_like(x) if hi <= lo else (x - lo) / (hi - lo)


def run_query(
    backend: Backend,
    query: IndexedPaper,
    indices: list[int],
    settings: Settings,
    *,
    facet: str | None = None,
    exclude: Sequence[str] = (),
    restrict_to: Sequence[str] | None = None,
    context: RescoreContext | None = None,
    filter: MetadataFilter | None = None,
) -> QueryResult:
    """Rank papers by similarity to the chosen sentences of `query` (among those `filter` allows).

    It runs on the calling thread's own BLAS/OpenMP settings: a process that answers queries limits them once
    (`esqbe.core.threads.limit_for_query`), the library never flips them per call."""
    return _run_query(backend, query, indices, settings, facet=facet, exclude=exclude, restrict_to=restrict_to,
                      context=context, filter=filter)


def _run_query(backend: Backend, query: IndexedPaper, indices: list[int], settings: Settings, *, facet: str | None,
               exclude: Sequence[str], restrict_to: Sequence[str] | None, context: RescoreContext | None,
               filter: MetadataFilter | None) -> QueryResult:
    if settings.candidate_facet not in CANDIDATE_FACET_MODES:
        raise QueryError(f"candidate_facet must be one of {', '.join(CANDIDATE_FACET_MODES)}")
    if settings.bm25_text not in BM25_TEXTS:
        raise QueryError(f"bm25_text must be one of {', '.join(BM25_TEXTS)} (got {settings.bm25_text!r})")
    timings = {}
    t0 = time.perf_counter()
    q_sentences = [query.paper.sentences[i] for i in indices]
    q_vectors = query.vectors[indices]
    restrict = frozenset(map(str, restrict_to)) if restrict_to is not None else None
    depth = max(settings.rescore_depth, settings.k)
    if restrict is not None:
        depth = max(depth, len(restrict))  # re-ranking a given pool: every member gets rescored
    request = FirstStageRequest(
        text=" ".join(q_sentences),
        vectors=q_vectors,
        facet=normalize_label(facet) if (facet and settings.candidate_facet in ("same", "auto")) else None,
        k=depth,
        knn_k=max(settings.knn_k, depth if restrict is not None else 0),
        bm25_k=max(settings.bm25_k, depth if restrict is not None else 0),
        exclude=frozenset({query.paper_id, *map(str, exclude)}),
        restrict_to=restrict,
        fusion=settings.fusion,
        bm25_weight=settings.fusion_bm25_weight,
        filter=filter if filter else None,
        bm25_facet=normalize_label(facet) if (facet and settings.bm25_text == "facet" and backend.facet_text) else None,
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
    first = np.array([c.score for c in candidates], dtype=np.float64)
    matches: list[list[tuple[int, int, float]]] = [[] for _ in candidates]
    similarity = np.full(len(candidates), np.nan)  # the rescorer's own score, before any fusion
    if rescorer is not None and candidates:
        views, bias = _candidate_views(candidates, facet, settings)
        q_rescore = q_vectors
        if settings.vector_centering != "none":  # the rescorer compares centred vectors (esqbe.query.centering)
            try:
                directions = corpus_directions(backend, settings.vector_centering)
            except ValueError as e:
                raise QueryError(str(e)) from None
            q_rescore = directions.apply(q_vectors)
            views = [(IndexedPaper(v.paper, directions.apply(v.vectors)), keep) for v, keep in views]
        batch = CandidateBatch.from_papers([v for v, _ in views], bias=bias)
        result = rescorer(QueryBatch(q_rescore, q_sentences), batch)
        if settings.prf_docs and settings.prf_weight:  # Rocchio feedback from the first ranking's top papers
            from .prf import feedback_queries

            q_rescore = feedback_queries(q_rescore, batch, np.asarray(result.scores, dtype=np.float64),
                                         docs=int(settings.prf_docs), weight=float(settings.prf_weight))
            result = rescorer(QueryBatch(q_rescore, q_sentences), batch)
        scores = np.asarray(result.scores, dtype=np.float64)
        finite = np.isfinite(scores)
        similarity = np.where(finite, scores, np.nan)
        if not finite.all():  # candidates with nothing to match (no sentences) go last
            scores = np.where(finite, scores, (scores[finite].min() if finite.any() else 0.0) - 1.0)
        if result.matches:  # back to the candidates' own sentence numbers
            matches = [[(qi, views[n][1][ci], w) for qi, ci, w in ms if ci < len(views[n][1]) and np.isfinite(w)]
                       for n, ms in enumerate(result.matches)]
    else:
        scores = first.copy()
    w, a = _final_weights(settings)
    if (w or a) and candidates:
        bm25 = np.array([c.bm25 for c in candidates], dtype=np.float64)
        fused = (1 - w - a) * _minmax(scores) + w * _minmax(bm25)
        if a:
            fused += a * _minmax(abstract_similarity(q_vectors, [c.paper for c in candidates]))
        scores = fused
    timings["rescore"] = round(1000 * (time.perf_counter() - t1), 2)

    order = sorted(range(len(candidates)), key=lambda i: (-scores[i], candidates[i].paper_id))
    hits = []
    limit = len(order) if restrict is not None else settings.k
    for rank, i in enumerate(order[:limit], start=1):
        c = candidates[i]
        pairs = []
        for qi, ci, w in matches[i]:
            assert c.paper is not None  # a candidate with matches was rescored: it carries its paper
            pairs.append(MatchedPair(indices[qi], q_sentences[qi], ci, c.paper.paper.sentences[ci], c.paper.paper.facets[ci],
                                     float(w)))
        if not pairs and c.paper is not None and len(c.paper.paper.sentences):
            # first-stage order only: still show the best sentence pair, by cosine
            sims = q_vectors @ c.paper.vectors.T
            qi, ci = map(int, np.unravel_index(int(np.argmax(sims)), sims.shape))
            pairs.append(MatchedPair(indices[qi], q_sentences[qi], ci, c.paper.paper.sentences[ci], c.paper.paper.facets[ci],
                                     float(sims[qi, ci])))
        sim = float(similarity[i]) if np.isfinite(similarity[i]) else None
        hits.append(Hit(rank, c.paper_id, c.paper.paper.title if c.paper else "", float(scores[i]), c.score, c.bm25, c.knn, pairs,
                        dict(c.paper.paper.metadata) if c.paper else {}, similarity=sim))
    return QueryResult(query.paper_id, normalize_label(facet) if facet else None, list(zip(indices, q_sentences)), hits,
                       settings.rescorer or "none", timings,
                       [c.to_dict() for c in filter.conditions] if filter else [],
                       query_facets=[query.paper.facets[i] for i in indices], query_title=query.paper.title,
                       rescorer_params=dict(settings.rescorer_params or {}))
