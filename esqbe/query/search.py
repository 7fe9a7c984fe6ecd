"""Which sentences form a query, and how a candidate is seen by the rescorer: the parts of one query that the
composition (esqbe.query.combine) puts together.

A query is a paper (from the index, or given as text) and either a facet (Definition 1: the sentences labelled with
it) or chosen sentence indices (Definition 2: no labels needed). Here: the query text's caps, the choice of sentences
and why (`select_query_sentences`, `explain_selection`), the per-facet settings, the candidates' facet views, and the
whole-abstract similarity.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..domain import (
    QUERY_FACETS,
    IndexedPaper,
    Paper,
    normalize_label,
)
from ..ingest.sentences import split_sentences
from ..settings.config import Settings
from .results import (
    SOFT_FACET_ORDER,
    FacetNotFoundError,
    QueryError,
    QuerySelection,
    QuerySentence,
    QueryTooLargeError,
    SentenceIndexError,
)

#: the settings a `facet_settings` entry may change: how one query is ranked, nothing about the index
FACET_SETTING_KEYS = ("k", "rescorer", "rescorer_params", "rescore_depth", "knn_k", "bm25_k", "fusion",
                      "fusion_bm25_weight", "candidate_facet", "facet_penalty", "final_bm25_weight", "abstract_weight",
                      "bm25_text", "query_facet_threshold", "vector_centering")


def query_texts(texts: Sequence[str | Sequence[str]], *, max_sentences: int | None = None) -> list[list[str]]:
    """A request's free texts (each one string, or its sentences) as sentences: the one check every route and field
    that takes free text goes through (a query text, each example's, a watch's, a rerank query's; `--text`/`--file`),
    before any tagging or encoding. Refused (QueryTooLargeError, 413) past the caps of `esqbe.core.limits`: the
    characters of all texts together (before anything is split), a sentence's characters, and the sentences of all
    texts together past `max_sentences` (default MAX_QUERY_SENTENCES), each text counted whole: every sentence of a
    text is tagged and encoded, whichever of them the request then chooses."""
    from ..core.limits import MAX_QUERY_CHARS, MAX_QUERY_SENTENCE_CHARS, MAX_QUERY_SENTENCES

    limit = MAX_QUERY_SENTENCES if max_sentences is None else int(max_sentences)
    parts = [[text] if isinstance(text, str) else [str(s) for s in text] for text in texts]
    total = sum(len(s) for p in parts for s in p)
    if total > MAX_QUERY_CHARS:
        what = "the query text has" if len(parts) == 1 else f"the query's {len(parts)} texts have"
        raise QueryTooLargeError(f"{what} {total} characters; at most {MAX_QUERY_CHARS} per query")
    out: list[list[str]] = []
    count = 0
    for text, p in zip(texts, parts):
        sents = split_sentences(text) if isinstance(text, str) else [s for s in p if s.strip()]
        longest = max((len(s) for s in sents), default=0)
        if longest > MAX_QUERY_SENTENCE_CHARS:
            raise QueryTooLargeError(f"a query sentence has {longest} characters; at most {MAX_QUERY_SENTENCE_CHARS} "
                                     "per sentence (is the text missing its sentence ends?)")
        count += len(sents)
        out.append(sents)
    if count > limit:
        what = "the query text has" if len(parts) == 1 else f"the query's {len(parts)} texts have"
        raise QueryTooLargeError(f"{what} {count} sentences; at most {limit} per query, counted whole whichever "
                                 "sentences are chosen (each is tagged and encoded)")
    return out


def query_sentences(text: str | Sequence[str], *, max_sentences: int | None = None) -> list[str]:
    """One query text as its sentences, refused past the caps before any tagging or encoding (`query_texts`)."""
    return query_texts([text], max_sentences=max_sentences)[0]


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
            raise SentenceIndexError(
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
            raise FacetNotFoundError(
                f"paper {p.paper_id} has no facet labels (it was indexed without labels and without the tagger); "
                "query it with --sentences, or re-index it with labels or `--facets predict`"
            )
        present = sorted(set(p.facets) - {"unlabeled"})
        raise FacetNotFoundError(f"paper {p.paper_id} has no sentence labelled {facet!r}; its facets: {', '.join(present)}")
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
