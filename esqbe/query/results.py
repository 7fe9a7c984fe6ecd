"""A query's result: the types every part of the query path passes around, and their one JSON shape.

The errors a query raises, the query's examples (`Example`: a paper and which of its sentences speak for it;
`ExampleSpec`: one as asked for), the ranked hits (`Hit`, `MatchedPair`, `AvoidedMatch`), why the query's sentences
were chosen (`QuerySelection`, `QuerySentence`) and the `QueryResult`; and the one JSON shape of a query result,
shared by `esqbe query --json` and HTTP `POST /query` (`QueryResult.to_dict()` calls `result_json`). Strict JSON:
a non-finite number is null (a similarity) or 0.0 (the other scores), metadata goes through a JSON round trip.

    {"version": 1,
     "query": {"paper_id", "title", "facet", "filters": [{key, op, value}],
               "sentences": [{index, text, facet (its label), probability (the tagger's p(query facet), or null),
                              why ("label", "probability", "most_probable", "chosen", "all"),
                              probabilities ({facet: p} where the tagger labelled it, or null)}],
               "selection": {"by" ("facet", "sentences", "all"), "rule" (in words), "threshold" (or null)},
               "examples": [{paper_id (null: a text), title, facet, sentences: [{index, text, facet}], selection}],
               "avoid": [the same, for the papers to avoid]},
     "rescorer", "rescorer_params", "similarity" (what a hit's similarity is), "match_weight" (what a pair's
     weight is), "scale" (what the hits' percentile and band are placed on: esqbe.index.scale; null from a bare
     run_query), "score" (how a hit's score is made: {formula (in words), rescorer, similarity_weight, bm25_weight,
     abstract_weight, bm25_reference}; null from an older answer),
     "hits": [{"rank" (null: a likely version, listed after the numbered hits), "paper_id", "title", "score" (the one
               number: it orders the hits, and the percentile and band place it), "similarity", "first_stage_score",
               "bm25", "knn",
               "percentile" (of the score among the index's own matches; null on the fixed scale), "band" (strong,
               fair, weak or null), "parts" ({similarity, avoid_penalty, bm25, bm25_scaled, abstract_similarity}:
               what the score is made of),
               "matches": [{query_index, query_sentence, candidate_index, candidate_sentence, candidate_facet,
                            weight, example (which example the query sentence is of)}],
               "example_similarities" (per example, its similarity to the hit),
               "avoided": [{paper_id, similarity, penalty (taken off the score), avoid_index, avoid_sentence,
                            candidate_index, candidate_sentence}],
               "metadata", "sentences" (null unless the papers are given),
               "likely_version_of" (the paper whose sentences the hit's nearly are: an example's id, "(text)" or a
               better-ranked hit's; else null), "version_overlap" (their sentence overlap: esqbe.query.versions)}],
     "rescoring": {where (backend: the engine's own MaxSim with engine_facet_vectors; python; none), why,
                   in_backend, in_python} (null from an older answer),
     "notes": [what to know of this answer, in words: e.g. why it has fewer hits than the k asked],
     "timings_ms": {stage: milliseconds}}

`version` changes when a key is renamed or removed (not when one is added)."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..core.filter_check import INTERNAL_KEYS
from ..domain import IndexedPaper, Paper
from ..errors import UserError


class QueryError(UserError, ValueError):
    """The query cannot be answered as asked (unknown paper, facet absent, bad sentence index)."""


class PaperNotFoundError(QueryError):
    """The query paper is not in the index."""

    http_status: ClassVar[int] = 404


class FacetNotFoundError(QueryError):
    """The query (a paper or a text) has no sentence of the facet asked for: a rerank falls back on it
    (esqbe.index.rerank), an interactive query says what to do instead."""


class SentenceIndexError(QueryError):
    """Chosen sentence indices outside the query paper's sentences."""


class EmptyIndexError(QueryError):
    """Nothing is indexed yet."""

    http_status: ClassVar[int] = 409


class QueryTooLargeError(QueryError):
    """The query text is past a cap of `esqbe.core.limits`."""

    http_status: ClassVar[int] = 413



@dataclass
class MatchedPair:
    query_index: int
    query_sentence: str
    candidate_index: int
    candidate_sentence: str
    candidate_facet: str
    weight: float
    #: which example of the query the query sentence is of (0: the first, the only one of a single-paper query)
    example: int = 0


@dataclass
class AvoidedMatch:
    """How much one paper to avoid pulled a hit down, and the sentence pair that made the hit resemble it."""

    paper_id: str
    #: the rescorer's similarity of the hit to the avoided paper (None: nothing to compare)
    similarity: float | None
    #: what it took off the hit's score before fusion (esqbe.query.combine; 0: nothing)
    penalty: float
    avoid_index: int | None = None
    avoid_sentence: str | None = None
    candidate_index: int | None = None
    candidate_sentence: str | None = None


@dataclass
class ScoreParts:
    """What a hit's score is made of (`ScoreFormula` says how): the explanation beside the one number."""

    #: the rescorer's similarity to the examples (aggregated over several), before any paper to avoid
    similarity: float | None
    #: what the papers to avoid took off it
    avoid_penalty: float = 0.0
    #: BM25 of the query text against the paper
    bm25: float = 0.0
    #: that BM25 over the query's reference (`ScoreFormula.bm25_reference`), 0..1; None where BM25 has no weight
    bm25_scaled: float | None = None
    #: cosine of the mean query vector with the paper's mean vector; None where it has no weight
    abstract_similarity: float | None = None


@dataclass
class ScoreFormula:
    """How a query's hits are scored: score = similarity_weight x (similarity - avoid_penalty) + bm25_weight x
    bm25 / bm25_reference + abstract_weight x abstract_similarity, each part of the query and that paper alone (the
    reference is the query text's best BM25 in the whole index), so a paper scores the same whatever else was found.
    With rescorer `none` the score is the first stage's fused score (an order, not a measure): weights all 0."""

    rescorer: str
    similarity_weight: float = 1.0
    bm25_weight: float = 0.0
    abstract_weight: float = 0.0
    bm25_reference: float | None = None

    def describe(self) -> str:
        if self.rescorer == "none" or not self.similarity_weight:
            return "the first stage's fused score (rescorer none: an order within this query, not a measure)"
        parts = [f"{self.similarity_weight:g} x similarity (less what papers to avoid take off)"]
        if self.bm25_weight:
            ref = f"{self.bm25_reference:.4g}" if self.bm25_reference else "none: no word of the query is indexed"
            parts.append(f"{self.bm25_weight:g} x BM25 / the query's best BM25 in the index ({ref})")
        if self.abstract_weight:
            parts.append(f"{self.abstract_weight:g} x abstract similarity")
        return " + ".join(parts)

    def to_dict(self) -> dict:
        return {"formula": self.describe(), "rescorer": self.rescorer, "similarity_weight": self.similarity_weight,
                "bm25_weight": self.bm25_weight, "abstract_weight": self.abstract_weight,
                "bm25_reference": finite(self.bm25_reference)}


@dataclass
class Hit:
    """One ranked paper.

    `score` is the one number of a hit: what the ranking sorts by, and what its percentile and band place
    (`QueryResult.score` says how it is made: `ScoreFormula`). It is a function of the query and this paper alone (and
    the index's own statistics), so it is the same in a query, a rerank of any candidates, a watch and a filtered
    page. `parts` are what it is made of; `similarity` is the rescorer's own score (e.g. summax: the mean over query
    sentences of the best cosine; of several examples and papers to avoid, the combined one less the penalty), None
    with rescorer `none` or when the candidate has no sentence the rescorer may match.
    """

    #: its place in the numbered ranking (1 = best); None for a likely version of another paper, listed after them
    rank: int | None
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
    #: per example of the query, the rescorer's similarity of this hit to it (same order as `QueryResult.examples`)
    example_similarities: list[float | None] = field(default_factory=list)
    #: per paper to avoid, how much it pulled this hit down (same order as `QueryResult.avoid`)
    avoided: list[AvoidedMatch] = field(default_factory=list)
    #: where the score stands among the index's own matches: its percentile (0..100; None on the fixed scale)
    #: and band, "strong", "fair" or "weak" (None: no scale), on `QueryResult.scale` (set by `Index.query`)
    percentile: float | None = None
    band: str | None = None
    #: what the score is made of
    parts: ScoreParts | None = None
    #: the paper (an example's id, "(text)", or a better-ranked hit's) whose sentences this hit's nearly are: a likely
    #: version of it (esqbe.query.versions), out of the numbered ranking; and their sentence overlap
    likely_version_of: str | None = None
    version_overlap: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        first = ("rank", "paper_id", "title", "score", "similarity")
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
    #: the query's examples (esqbe.query.results.Example; the first is `query_paper_id`'s) and the papers to avoid
    examples: list[Example] = field(default_factory=list)
    avoid: list[Example] = field(default_factory=list)
    #: what the hits' percentiles and bands are placed on (esqbe.index.scale.SimilarityScale.public; set by
    #: `Index.query`, None from a bare `run_query`)
    scale: dict | None = None
    #: how the hits' score is made
    score: ScoreFormula | None = None
    #: where the similarity was computed: {"where": "backend" | "python" | "none", "why": in words, "in_backend": n,
    #: "in_python": n} (esqbe.query.combine: summax in the engine with engine_facet_vectors)
    rescoring: dict | None = None
    #: what the user should know of this answer, in words (e.g. why it has fewer hits than the k asked)
    notes: list[str] = field(default_factory=list)

    def to_dict(self, papers: Mapping[str, Paper] | None = None) -> dict:
        """The one JSON shape of a query result, `esqbe query --json`'s and HTTP POST /query's (esqbe.query.results);
        with `papers` (paper id -> Paper), each hit among them gets its sentences."""
        return result_json(self, papers)


@dataclass
class Example:
    """One example of a query (or one paper to avoid): a paper and which of its sentences speak for it."""

    paper: IndexedPaper
    indices: list[int]
    #: the facet its sentences were chosen by, which also chooses the candidates' sentences it is matched with
    facet: str | None = None
    #: why those sentences (set by `Index.query`)
    selection: QuerySelection | None = None
    #: False for a pasted text (its paper id is not an id in the index)
    indexed: bool = True

    @property
    def paper_id(self) -> str:
        return self.paper.paper_id

    @property
    def sentences(self) -> list[str]:
        return [self.paper.paper.sentences[i] for i in self.indices]


@dataclass(frozen=True)
class ExampleSpec:
    """An example as asked for (`Index.query(examples=[...], avoid=[...])`): a paper in the index (`paper_id`) or a
    pasted `text`, and its `facet` or chosen `sentences` (neither: the query's facet, else every sentence)."""

    paper_id: str | None = None
    facet: str | None = None
    sentences: tuple[int, ...] | None = None
    text: str | tuple[str, ...] | None = None
    title: str = ""

    @classmethod
    def of(cls, value) -> ExampleSpec:
        """A spec from a paper id (str), a mapping of the fields, or a spec."""
        if isinstance(value, ExampleSpec):
            spec = value
        elif isinstance(value, str):
            spec = cls(paper_id=value)
        elif isinstance(value, dict):
            unknown = sorted(set(value) - {"paper_id", "facet", "sentences", "text", "title"})
            if unknown:
                raise QueryError(f"an example has unknown field(s) {', '.join(map(str, unknown))}; "
                                 "fields: paper_id, facet, sentences, text, title")
            sents = value.get("sentences")
            text = value.get("text")
            spec = cls(None if value.get("paper_id") is None else str(value["paper_id"]), value.get("facet"),
                       None if sents is None else tuple(int(i) for i in sents),
                       text if text is None or isinstance(text, str) else tuple(str(t) for t in text),
                       str(value.get("title") or ""))
        else:
            raise QueryError(f"an example is a paper id, a mapping or an ExampleSpec (got {type(value).__name__})")
        if (spec.paper_id is None) == (spec.text is None):
            raise QueryError("an example is exactly one of a paper id or a text")
        if spec.facet is not None and spec.sentences is not None:
            raise QueryError(f"example {spec.name}: give either a facet or sentence indices, not both")
        return spec

    @property
    def name(self) -> str:
        return self.paper_id if self.paper_id is not None else "(text)"


RESULT_JSON_VERSION = 1

#: what a hit's `similarity` is, per rescorer (comparable across queries of one rescorer)
SIMILARITY = {
    "ts": "best cosine of any query sentence with any candidate sentence (-1..1)",
    "summax": "mean over query sentences of the best cosine with a candidate sentence (-1..1)",
    "ot": "minus the optimal-transport cost between query and candidate sentences (L2 distances; 0 is identical)",
    "asym": "weighted mean over query sentences of the best max(cos, 0)^d (0..1)",
    "asym_token": "mean over query sentences of token-level coverage by a candidate sentence (0..1)",
    "none": "no rescorer: null (first-stage order; see knn and bm25)",
}
#: what the weight of a matched sentence pair is, per rescorer
MATCH_WEIGHT = {
    "ts": "cosine", "summax": "cosine", "ot": "transport plan mass", "asym": "max(cos, 0)^d",
    "asym_token": "token coverage", "none": "cosine",
}


def finite(x) -> float | None:
    """`x` as a float, None when it is not finite (strict JSON has no NaN or Infinity)."""
    if x is None:
        return None
    x = float(x)
    return x if np.isfinite(x) else None


def jsonable(value) -> Any:
    """`value` through a strict JSON round trip (unknown types as str); {} when it holds NaN or Infinity."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=str))
    except ValueError:
        return {}


#: metadata esqbe keeps for itself, left out of results: the tagger's flag and soft labels (given per sentence,
#: named, as `probabilities`), the hash of the input a paper was tagged from
HIDDEN_METADATA_KEYS = INTERNAL_KEYS
#: the class order of the tagger's soft labels (`Paper.metadata["facet_probs"]`)
SOFT_FACET_ORDER = ("background", "method", "result", "other")


def public_metadata(metadata: dict | None) -> dict:
    """A paper's metadata as a user reads it: esqbe's internals left out (and each source's record hash, which
    esqbe.index.merge keeps to find an unchanged re-run)."""
    return without_record_hashes({k: v for k, v in (metadata or {}).items() if k not in HIDDEN_METADATA_KEYS})


def without_record_hashes(metadata: dict) -> dict:
    """`metadata` with its sources' record hashes left out (esqbe.index.merge keeps them for itself)."""
    if not isinstance(metadata.get("sources"), list):
        return metadata
    return {**metadata, "sources": [{k: v for k, v in s.items() if k != "record"} if isinstance(s, dict) else s
                                    for s in metadata["sources"]]}

#: metadata keys whose values are paths on the machine that indexed the paper: Zotero's attachments (the indexer
#: reads an attached PDF when the paper is read; the index keeps the paths for its own user: `esqbe show`), and the
#: input files a paper was read from (`sources`: [{"file": path, "format": ...}], esqbe.index.merge)
PATH_KEYS = ("attachments", "sources")
#: how a path in PATH_KEYS may begin that is not a directory: Zotero's prefixes, a file URL
_PATH_PREFIXES = ("attachments:", "storage:", "file://")


def file_names_only(metadata: dict | None) -> dict:
    """`metadata` with each path under PATH_KEYS (an attachment, a source's `file`) cut to its file name, without
    directories (`/home/me/Zotero/storage/ABCD2345/x.pdf`, `C:\\Users\\me\\x.pdf`, `attachments:Papers/x.pdf` ->
    `x.pdf`): what a server shows a reader who is not its operator (`esqbe serve` without `--show-paths`). An
    attachment that is not a path is left out, and so is the `file` field of a BibTeX entry kept as written."""
    out = dict(metadata or {})
    kept = out.get("bibtex")  # an entry as written (esqbe.ingest.library.AS_WRITTEN): its `file` field holds paths
    if isinstance(kept, dict) and isinstance(kept.get("fields"), dict):
        out["bibtex"] = {**kept, "fields": {k: v for k, v in kept["fields"].items() if str(k).lower() != "file"}}
    if isinstance(out.get("sources"), list):  # the files a paper was read from: each file's name, its format kept
        out["sources"] = [{**s, "file": _file_name(s["file"])} if isinstance(s.get("file"), str) else s
                          for s in out["sources"] if isinstance(s, dict)]
    for key in PATH_KEYS:
        if key not in out or key == "sources":
            continue
        values = out[key] if isinstance(out[key], list) else [out[key]]
        names = [_file_name(v) for v in values if isinstance(v, str)]
        out[key] = [n for n in names if n]
        if not out[key]:
            del out[key]
    return out


def _source_names(metadata: dict) -> dict:
    """A hit's metadata with each source's file as its name: the same hit wherever it is answered (the CLI, a server
    that hides paths, the CLI through a warm server); the paths stay in the paper's own view (`esqbe show`)."""
    if not isinstance(metadata.get("sources"), list):
        return metadata
    return {**metadata, "sources": file_names_only({"sources": metadata["sources"]})["sources"]}


def _file_name(path: str) -> str:
    for prefix in _PATH_PREFIXES:
        if path.lower().startswith(prefix):
            path = path[len(prefix):]
    return re.split(r"[\\/]", path)[-1].strip()



def soft_probabilities(paper: Paper) -> list[dict[str, float]] | None:
    """Each sentence's probability of every facet, {facet: p}, where esqbe's tagger labelled the paper; else None."""
    probs = (paper.metadata or {}).get("facet_probs")
    if probs is None or len(probs) != len(paper.sentences):
        return None
    return [{name: round(float(p), 4) for name, p in zip(SOFT_FACET_ORDER, row)} for row in probs]


def sentences_json(paper: Paper) -> list[dict]:
    """Each sentence with its facet and, where esqbe's tagger labelled it, `probabilities` {facet: p}."""
    soft = soft_probabilities(paper)
    return [{"index": i, "text": s, "facet": f, "probabilities": soft[i] if soft else None}
            for i, (s, f) in enumerate(zip(paper.sentences, paper.facets))]


def _example_json(example) -> dict:
    """One example of the query (or paper to avoid, esqbe.query.results.Example): which sentences, and why."""
    paper, sel = example.paper.paper, example.selection
    return {"paper_id": paper.paper_id if example.indexed else None, "title": paper.title, "facet": example.facet,
            "sentences": [{"index": i, "text": paper.sentences[i], "facet": paper.facets[i]} for i in example.indices],
            "selection": {"by": sel.by, "rule": sel.rule, "threshold": sel.threshold} if sel else None}


def result_json(result: QueryResult, papers: Mapping[str, Paper] | None = None) -> dict:
    """The JSON of a query result; with `papers` (paper id -> Paper), each hit among them gets its sentences."""
    hits = []
    for h in result.hits:
        hits.append({
            "rank": h.rank, "paper_id": h.paper_id, "title": h.title, "score": finite(h.score) or 0.0,
            "similarity": finite(h.similarity), "first_stage_score": finite(h.first_stage_score) or 0.0,
            "bm25": finite(h.bm25) or 0.0, "knn": finite(h.knn) or 0.0,
            "matches": [dict(query_index=m.query_index, query_sentence=m.query_sentence,
                             candidate_index=m.candidate_index, candidate_sentence=m.candidate_sentence,
                             candidate_facet=m.candidate_facet, weight=finite(m.weight) or 0.0, example=m.example)
                        for m in h.matches],
            "example_similarities": [finite(x) for x in h.example_similarities],
            "avoided": [dict(paper_id=a.paper_id, similarity=finite(a.similarity), penalty=finite(a.penalty) or 0.0,
                             avoid_index=a.avoid_index, avoid_sentence=a.avoid_sentence,
                             candidate_index=a.candidate_index, candidate_sentence=a.candidate_sentence)
                        for a in h.avoided],
            "percentile": finite(h.percentile), "band": h.band,
            "parts": {"similarity": finite(h.parts.similarity), "avoid_penalty": finite(h.parts.avoid_penalty) or 0.0,
                      "bm25": finite(h.parts.bm25) or 0.0, "bm25_scaled": finite(h.parts.bm25_scaled),
                      "abstract_similarity": finite(h.parts.abstract_similarity)} if h.parts else None,
            "metadata": jsonable(_source_names(public_metadata(h.metadata))),
            "sentences": sentences_json(papers[h.paper_id]) if papers and h.paper_id in papers else None,
            "likely_version_of": h.likely_version_of, "version_overlap": finite(h.version_overlap),
        })
    facets = result.query_facets or ["unlabeled"] * len(result.query_sentences)
    why = {s.index: s for s in result.selection.sentences} if result.selection else {}
    soft = result.query_probabilities
    sentences = []
    for j, ((i, t), f) in enumerate(zip(result.query_sentences, facets)):
        known = why.get(i)
        sentences.append({"index": i, "text": t, "facet": f,
                          "probability": finite(known.probability) if known else None,
                          "why": known.why if known else None,
                          "probabilities": soft[j] if soft and j < len(soft) else None})
    sel = result.selection
    rescorer = result.rescorer
    return {
        "version": RESULT_JSON_VERSION,
        "query": {"paper_id": result.query_paper_id,
                  "title": result.query_title,
                  "facet": result.facet,
                  "filters": list(result.filters),
                  "sentences": sentences,
                  "selection": {"by": sel.by, "rule": sel.rule, "threshold": sel.threshold} if sel else None,
                  "examples": [_example_json(e) for e in result.examples],
                  "avoid": [_example_json(e) for e in result.avoid]},
        "rescorer": rescorer,
        "rescorer_params": jsonable(result.rescorer_params or {}) if rescorer != "none" else {},
        "similarity": SIMILARITY.get(rescorer, "the rescorer's score"),
        "match_weight": MATCH_WEIGHT.get(rescorer, "weight"),
        "scale": jsonable(result.scale) if result.scale is not None else None,
        "score": result.score.to_dict() if result.score is not None else None,
        "hits": hits,
        "rescoring": dict(result.rescoring) if result.rescoring is not None else None,
        "notes": list(result.notes),
        "timings_ms": dict(result.timings),
    }
