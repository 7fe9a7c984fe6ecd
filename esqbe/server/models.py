"""The HTTP request and response models (pydantic): what `/query`, `/search`, `/papers` and the errors
accept and answer; the OpenAPI schema comes from them."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from ..core.limits import (
    MAX_AVOID,
    MAX_EXAMPLE_SENTENCES,
    MAX_EXAMPLES,
    MAX_FILTER_BYTES,
    MAX_FILTER_VALUES,
    MAX_QUERY_CHARS,
    MAX_QUERY_SENTENCE_CHARS,
    MAX_QUERY_SENTENCES,
)
from ..index.rerank import MAX_PAPER_ID_CHARS, MAX_RERANK_DOCUMENTS, MAX_RERANK_QUERY_CHARS
from ..query.graph import MAX_GRAPH_HITS
from ..query.graph_formats import GRAPH_FORMATS
from ..query.results import QueryError
from ..rescore.rescorers import available_rescorers, rescorer_params
from ..settings.generate import http_fields, overrides_from_http
from ..settings.table import FACET_MODES, RECORD_FORMATS
from .options import WORDS_NAME

#: the input formats POST /papers reads (the readers') and what happens to facet labels (the table's)
InputFormat = Literal[RECORD_FORMATS]
FacetMode = Literal[FACET_MODES]



class _FirstStageBase(BaseModel):
    # optional fields default to None (unset) but accept no explicit null: what the schema says is what is accepted
    model_config = ConfigDict(extra="forbid")


#: the first-stage fields: the settings whose HTTP field is `first_stage.*` (esqbe.settings.table)
FirstStageOptions = create_model(
    "FirstStageOptions", __base__=_FirstStageBase, __module__=__name__,
    __doc__="The first stage (BM25 + sentence kNN, fused) before rescoring. Unset fields use the server's settings.",
    **http_fields("first_stage"))


class FilterCondition(BaseModel):
    """One metadata condition, the structured form of a filter string such as `year>=2019` (esqbe.core.filters)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(..., min_length=1, max_length=200,
                     description="a dotted metadata key: year, venue, authors.name, external_ids.doi")
    op: Literal["=", "!=", "<", "<=", ">", ">=", "in", "not in", "exists", "not exists", "~=", "^="] = Field(
        ..., description="~= equals ignoring case, ^= starts with ignoring case (text values)")
    value: str | float | int | Annotated[list[str | float | int], Field(max_length=MAX_FILTER_VALUES)] = Field(
        None, description=f"the value (a list for in / not in, of at most {MAX_FILTER_VALUES} values and "
                          f"{MAX_FILTER_BYTES} bytes of text together; absent for exists / not exists)")

    @model_validator(mode="after")
    def _bounded(self):
        """A value list's bytes bounded here, before anything reads it (its count by the schema above)."""
        if isinstance(self.value, list):
            size = sum(len(v.encode("utf-8", "surrogatepass")) if isinstance(v, str) else len(str(v)) for v in self.value)
            if size > MAX_FILTER_BYTES:
                raise ValueError(f"{size} bytes of values; at most {MAX_FILTER_BYTES} (filter_max_bytes)")
        return self


def _rescorer_params_model() -> type[BaseModel]:
    """The parameters a client may set, from the rescorers' declarations (esqbe.rescore.rescorers.Param): each with its
    type and bounds, so the schema shows them and anything else is refused (422). Which ones the chosen
    rescorer takes is checked when it is made (400 naming them). `words` is a name of the server's
    (`ServeOptions.words`), never a directory."""
    declared: dict[str, tuple] = {}
    for name in available_rescorers():
        for p in rescorer_params(name):
            if p.http:
                declared.setdefault(p.name, (p, []))[1].append(name)
    fields: dict[str, Any] = {}
    for key, (p, owners) in declared.items():
        help_text = f"{', '.join(owners)}: {p.help}"
        if p.type in (int, float):
            fields[key] = (p.type, Field(None, ge=p.low, le=p.high, strict=True, description=help_text))
        elif p.type is str and p.choices:
            fields[key] = (Literal[p.choices], Field(None, description=help_text))
        else:
            fields[key] = (p.type, Field(None, description=help_text))
    fields["words"] = (str, Field(None, pattern=WORDS_NAME, description=(
        "asym_token: word vectors by the name the server was started with (`esqbe serve --words NAME=DIR`); "
        "default: the encoder's token vectors")))
    return create_model("RescorerParams", __config__=ConfigDict(extra="forbid"), **fields)


RescorerParams = _rescorer_params_model()


#: a free text of a request, as the schema bounds it: one string (its sentences counted when it is split: the route's
#: 413) or its sentences; the characters and sentences of all of a request's texts together are bounded the same
#: (esqbe.query.search.query_texts)
QueryText = Annotated[str, Field(max_length=MAX_QUERY_CHARS,
                                 json_schema_extra={"x-maxSentences": MAX_QUERY_SENTENCES})] | Annotated[
    list[Annotated[str, Field(max_length=MAX_QUERY_SENTENCE_CHARS)]], Field(max_length=MAX_QUERY_SENTENCES)]
_TEXT_BOUNDS = (f"at most {MAX_QUERY_SENTENCES} sentences, counted whole whichever are chosen, and {MAX_QUERY_CHARS} "
                "characters, all of the request's texts together (the server may allow fewer sentences: 413)")
#: a sentence index a request may choose (a stored abstract has at most esqbe.domain.LIMITS["sentences"])
SentenceIndex = Annotated[int, Field(ge=0, le=100_000)]


class ExampleRequest(BaseModel):
    """One example of a query of several: a paper of the index or a pasted text, and its facet or chosen sentences
    (neither: the request's `facet`, else every sentence)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["paper_id"]}, {"required": ["text"]}], "not": {"required": ["facet", "sentences"]}})

    paper_id: str = Field(None, min_length=1, max_length=512, description="a paper in the index")
    text: QueryText = Field(
        None, description="a paper not in the index: its abstract, or its sentences (" + _TEXT_BOUNDS + ")")
    title: str = Field("", max_length=2000, description="title of the `text` paper")
    facet: Literal["background", "method", "result"] = Field(None, description="use its sentences of this facet")
    sentences: list[SentenceIndex] = Field(
        None, min_length=1, max_length=MAX_EXAMPLE_SENTENCES, description="use these of its sentences (0-based)")

    @model_validator(mode="after")
    def _one(self):
        if (self.paper_id is None) == (self.text is None):
            raise ValueError("an example is exactly one of paper_id or text")
        if self.facet is not None and self.sentences is not None:
            raise ValueError("an example gives either facet or sentences, not both")
        return self


class AvoidRequest(BaseModel):
    """A paper the hits should not resemble: its sentences of `facet` (else the request's facet, else all)."""

    model_config = ConfigDict(extra="forbid")

    paper_id: str = Field(..., min_length=1, max_length=512, description="a paper in the index")
    facet: Literal["background", "method", "result"] = Field(None, description="compare with its sentences of this facet")


class _QueryInputBase(BaseModel):
    """What a query asks: a paper from the index (`paper_id`) or a text, and which of its sentences form the query
    (a `facet`, chosen `sentences`, or all of them); or several `examples` and papers to `avoid`; the filters and
    the rescorer's parameters (POST /query and POST /graph alike)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # exactly one of paper_id / text; facet and sentences exclude each other
        "oneOf": [{"required": ["paper_id"]}, {"required": ["text"]}, {"required": ["examples"]}],
        "not": {"required": ["facet", "sentences"]},
        "examples": [
            {"paper_id": "csabstruct-train-0000", "facet": "method", "k": 10},
            {"paper_id": "csabstruct-train-0000", "sentences": [0, 2], "rescorer": "ot"},
            {"text": "We propose a parser. It is evaluated on treebanks.", "title": "A parser", "facet": "method"},
            {"examples": [{"paper_id": "csabstruct-train-0000"}, {"paper_id": "csabstruct-train-0001",
                                                                 "sentences": [1, 3]}],
             "avoid": [{"paper_id": "csabstruct-train-0002"}], "facet": "method"},
        ]})

    paper_id: str = Field(None, min_length=1, max_length=512, description="a paper in the index")
    text: QueryText = Field(
        None, description="a paper not in the index: its abstract, or its sentences as a list (encoded now; "
                          "facet labels predicted when a facet is asked for; " + _TEXT_BOUNDS + ")")
    title: str = Field("", max_length=2000, description="title of the `text` paper (helps contextual vectors)")
    facet: Literal["background", "method", "result"] = Field(
        None, description="use the query paper's sentences labelled with this facet")
    sentences: list[SentenceIndex] = Field(
        None, min_length=1, max_length=MAX_QUERY_SENTENCES,
        description="use these sentences of the query paper or text (0-based)")
    examples: list[ExampleRequest] = Field(
        None, min_length=1, max_length=MAX_EXAMPLES, description="a query of several examples instead of one paper "
        "or text (the request's facet is the default of each); none of them is a hit")
    avoid: list[AvoidRequest] = Field(
        None, max_length=MAX_AVOID, description="papers the hits should not resemble (never hits themselves); "
        "see avoid_rule and avoid_weight")
    rescorer_params: RescorerParams = Field(
        None, description='rescorer parameters, e.g. {"tau": 0.5} for ot or {"d": 4} for asym')
    first_stage: FirstStageOptions = Field(None, description="first-stage options")
    with_sentences: bool = Field(False, description="include every sentence (and facet) of each hit")
    filters: list[Annotated[str, Field(min_length=1, max_length=1000)] | FilterCondition] = Field(
        None, max_length=64, description="metadata conditions the candidates must all satisfy, applied before ranking: "
                                         "grammar strings ('year>=2019', 'venue in (ACL, EMNLP)') or {key, op, value} objects")
    engine_filter: dict[str, Any] = Field(
        None, description="Elasticsearch/OpenSearch only: one query DSL clause the candidates must also match, "
                          'e.g. {"term": {"lang": "en"}}')

    @model_validator(mode="after")
    def _one_query(self):
        if self.examples is not None:
            if self.paper_id is not None or self.text is not None or self.sentences is not None:
                raise ValueError("give examples, or paper_id or text (with sentences), not both")
            return self
        if (self.paper_id is None) == (self.text is None):
            raise ValueError("give exactly one of paper_id, text or examples")
        if self.facet is not None and self.sentences is not None:
            raise ValueError("give either facet or sentences, not both")
        return self

    def overrides(self, words: dict[str, str] | None = None) -> dict:
        """Settings fields this request changes (the Python API's `Index.query(**overrides)`); a `words`
        name becomes its directory in `words` (the server's), an unknown name is an error."""
        out: dict[str, Any] = overrides_from_http(self)
        if self.rescorer_params is not None:
            params = self.rescorer_params.model_dump(exclude_unset=True)
            if "words" in params:
                name, words = params["words"], words or {}
                if name not in words:
                    raise QueryError(f"no word vectors named {name!r} on this server; " + (
                        f"it offers {', '.join(sorted(words))}" if words else
                        "it offers none (the operator names them with esqbe serve --words NAME=DIR)"))
                params["words"] = words[name]
            out["rescorer_params"] = params
        elif self.rescorer is not None:
            out["rescorer_params"] = {}  # another rescorer than the configured one: not the configured one's params
        return {key: value for key, value in out.items() if value is not None}


class _QueryRequestBase(_QueryInputBase):
    """A query: a paper from the index (`paper_id`) or a text, and which of its sentences form the query
    (a `facet`, chosen `sentences`, or all of them)."""

    format: Literal["json", "csv", "bibtex", "ris", "csl-json"] = Field(
        "json", description="json (default): the result; csv, bibtex, ris or csl-json: the hits as a file to download "
                            "(Content-Disposition: attachment), from their metadata and abstracts")
    with_scores: bool = Field(False, description="an export (`format`) with each hit's rank, score and similarity")


#: the query: the hand-written fields above plus the settings a client may set (the table's HTTP fields:
#: k, rescorer, bm25_weight, facet_penalty, ...), with the table's ranges and choices
QueryRequest = create_model("QueryRequest", __base__=_QueryRequestBase, __module__=__name__,
                            __doc__=_QueryRequestBase.__doc__, **http_fields(""))


class _GraphRequestBase(_QueryInputBase):
    """A query's hits as a graph (esqbe.query.graph): what POST /query takes, at most MAX_GRAPH_HITS hits, as JSON,
    GraphML or SVG."""

    format: Literal[GRAPH_FORMATS] = Field(
        "json", description="json (default): the graph (nodes, edges with their sentence pairs, groups, positions) and "
                            "the query's result; graphml (Gephi, Cytoscape) or svg: a file to download")


#: POST /graph: the query's fields, with k bounded by the graph's own limit (its pairs grow as k squared)
GraphRequest = create_model(
    "GraphRequest", __base__=_GraphRequestBase, __module__=__name__, __doc__=_GraphRequestBase.__doc__,
    **{**http_fields(""), "k": (int, Field(http_fields("")["k"][1].default, ge=1, le=MAX_GRAPH_HITS, description=(
        f"Number of hits: the graph's nodes, at most {MAX_GRAPH_HITS}")))})


class Sentence(BaseModel):
    index: int
    text: str
    facet: str


class LabelledSentence(Sentence):
    """A stored sentence: with the tagger's probabilities where it labelled the paper."""

    probabilities: dict[str, float] | None = Field(
        description="where esqbe's tagger labelled the sentence: its probability of each facet (else null)")


class MatchedPair(BaseModel):
    query_index: int = Field(description="index of the query sentence in the query paper")
    query_sentence: str
    candidate_index: int = Field(description="index of the sentence in the hit's paper")
    candidate_sentence: str
    candidate_facet: str
    weight: float = Field(description="how strongly they match (see the response's match_weight)")
    example: int = Field(0, description="which of the query's examples the query sentence is of (0-based)")


class AvoidedMatch(BaseModel):
    paper_id: str = Field(description="a paper the query asked to avoid")
    similarity: float | None = Field(description="the rescorer's similarity of the hit to it")
    penalty: float = Field(description="what it took off the hit's score before fusion (0: nothing)")
    avoid_index: int | None = Field(None, description="the avoided paper's sentence the hit resembles most")
    avoid_sentence: str | None = None
    candidate_index: int | None = Field(None, description="the hit's sentence that resembles it")
    candidate_sentence: str | None = None


class ScoreParts(BaseModel):
    """What a hit's score is made of (the response's `score` says how they are weighed)."""

    similarity: float | None = Field(description="the rescorer's similarity to the examples, before papers to avoid")
    avoid_penalty: float = Field(description="what the papers to avoid took off it")
    bm25: float = Field(description="BM25 of the query text against the paper")
    bm25_scaled: float | None = Field(description="that BM25 over the query's best BM25 in the index (0..1); null "
                                                  "where BM25 has no weight")
    abstract_similarity: float | None = Field(description="cosine of the mean vectors; null where it has no weight")


class Hit(BaseModel):
    rank: int | None = Field(description="its place in the numbered ranking (1: the best); null for a likely version "
                                         "of another paper (`likely_version_of`), listed after the numbered hits")
    paper_id: str
    title: str
    similarity: float | None = Field(description="the rescorer's own similarity: comparable across queries "
                                                 "(see the response's `similarity`)")
    score: float = Field(description="the one number of a hit: what the hits are ordered by, and what `percentile` "
                                     "and `band` place; the query and this paper alone decide it (the response's "
                                     "`score` says how it is made)")
    first_stage_score: float
    bm25: float
    knn: float = Field(description="first stage: mean over query sentences of the best cosine the kNN found")
    matches: list[MatchedPair]
    example_similarities: list[float | None] = Field(
        default_factory=list, description="per example of the query (in order), the hit's similarity to it")
    avoided: list[AvoidedMatch] = Field(default_factory=list,
                                        description="per paper to avoid, how much it pulled the hit down")
    percentile: float | None = Field(None, description="where the score stands among this index's own matches "
                                     "(0..100: higher than that share of them; see the response's `scale`); null on "
                                     "the fixed scale or without one")
    band: Literal["strong", "fair", "weak"] | None = Field(None, description="the score's band on the response's "
                                                           "`scale` (null: no scale for this rescorer)")
    parts: ScoreParts | None = Field(None, description="what the score is made of")
    likely_version_of: str | None = Field(None, description="the paper whose sentences this hit's nearly are (an "
                                          "example's id, \"(text)\" or a better-ranked hit's): a likely version of it, "
                                          "out of the numbered ranking; null otherwise")
    version_overlap: float | None = Field(None, description="their sentence overlap (the smaller of each abstract's "
                                          "mean best cosine with the other's sentences)")
    metadata: dict[str, Any] = Field(default_factory=dict,
                                     description="the paper's stored metadata (year, venue, authors, ids, ...)")
    sentences: list[LabelledSentence] | None = None


class QuerySentence(Sentence):
    facet: str = Field(description="its facet label (given, or predicted by the tagger)")
    probability: float | None = Field(None, description="the tagger's probability that it has the query's facet "
                                                        "(null: no facet asked, or the labels were given)")
    why: Literal["label", "probability", "most_probable", "chosen", "all"] | None = Field(
        None, description="why it is in the query: labelled with the facet, predicted probability of the facet >= "
                          "the threshold, the most probable one (none reached it), chosen by index, or all sentences")
    probabilities: dict[str, float] | None = Field(
        None, description="where esqbe's tagger labelled it (a text query, a paper indexed without labels): its "
                          "probability of each facet (else null)")


class QuerySelection(BaseModel):
    by: Literal["facet", "sentences", "all"]
    rule: str = Field(description="the rule that chose the query's sentences, in words")
    threshold: float | None = Field(None, description="query_facet_threshold, where it chose them")


class QueryExample(BaseModel):
    paper_id: str | None = Field(description="the example's paper (null: a pasted text)")
    title: str
    facet: str | None = Field(description="the facet its sentences speak for (null: chosen sentences, or all)")
    sentences: list[Sentence]
    selection: QuerySelection | None = None


class QueryInfo(BaseModel):
    paper_id: str | None
    title: str | None = None
    facet: str | None
    filters: list[dict[str, Any]] = Field(default_factory=list,
                                          description="the metadata conditions applied, as {key, op, value}")
    sentences: list[QuerySentence] = Field(description="exactly the sentences that form the query, and why")
    selection: QuerySelection | None = None
    examples: list[QueryExample] = Field(default_factory=list, description="the query's examples (the first is "
                                         "the query paper above) and their sentences")
    avoid: list[QueryExample] = Field(default_factory=list, description="the papers the hits were kept unlike")


class SimilarityScale(BaseModel):
    """Where a hit's score stands (esqbe.index.scale): this index's own matches, or the shipped fixed scale."""

    source: Literal["index", "fixed", "none"] = Field(
        description="index: the similarities of the top-10 hits of facet queries by a sample of the index's own "
                    "papers; fixed: the shipped scale (an index of fewer than 20 papers, or while its own is being "
                    "measured); none: no scale for this rescorer")
    rescorer: str
    description: str = Field(description="the scale in words")
    papers: int = Field(description="papers in the index when it was measured (index)")
    queries: int = Field(description="facet queries measured (index)")
    matches: int = Field(description="similarities measured (index)")
    percentiles: dict[str, float] | None = Field(description="p5, p25, p50, p75, p95 of the index's matches (index)")
    cuts: dict[str, float] | None = Field(description="the fixed scale's similarity from which a hit is fair, strong")
    measuring: bool = Field(description="the index's own scale is being measured (again) now")
    bands: dict[str, str] | None = Field(description="each band's percentiles (index)")


class ScoreFormula(BaseModel):
    """How the hits' score is made: a function of the query and each paper alone (esqbe.query.results)."""

    formula: str = Field(description="the score in words, with its weights")
    rescorer: str
    similarity_weight: float
    bm25_weight: float
    abstract_weight: float
    bm25_reference: float | None = Field(description="the query text's best BM25 over the whole index (what a hit's "
                                                     "BM25 is divided by); null where BM25 has no weight")


class QueryResponse(BaseModel):
    """A query result in the one JSON shape `esqbe query --json` prints too (esqbe.query.results)."""

    version: int = Field(description="the shape's version: it changes when a key is renamed or removed")
    query: QueryInfo
    rescorer: str
    rescorer_params: dict[str, Any]
    similarity: str = Field(description="what a hit's similarity is for this rescorer")
    match_weight: str = Field(description="what a matched pair's weight is for this rescorer")
    scale: SimilarityScale | None = Field(None, description="what the hits' percentile and band are placed on")
    score: ScoreFormula | None = Field(None, description="how a hit's score is made")
    hits: list[Hit]
    rescoring: dict[str, Any] | None = Field(None, description="where the hits' similarity was computed: `where` "
                                             "(backend: the engine's own MaxSim with engine_facet_vectors; python; "
                                             "none), `why` in words, and how many candidates each scored "
                                             "(`in_backend`, `in_python`)")
    notes: list[str] = Field(default_factory=list, description="what to know of this answer, in words: e.g. why it "
                                                               "has fewer hits than the k asked")
    timings_ms: dict[str, float]


class GraphPair(BaseModel):
    source_index: int = Field(description="the source hit's sentence (index in its paper; -1: none)")
    source_sentence: str | None
    target_index: int = Field(description="the target hit's sentence (-1: none)")
    target_sentence: str | None
    cosine: float | None = Field(description="their cosine (with the soft-facet bias where the ranking has one)")


class GraphNode(BaseModel):
    """A hit of the query: its rank, score and band exactly as the list has them."""

    id: str = Field(description="the hit's paper id")
    rank: int
    title: str
    score: float
    similarity: float | None
    band: Literal["strong", "fair", "weak"] | None
    percentile: float | None
    year: int | None = Field(description="the paper's year, where its metadata has one")
    group: int | None = Field(description="its group (an index into `groups`), null: in none")
    x: float = Field(description="the seeded layout's position, 0..1")
    y: float
    degree: int = Field(description="how many edges it has in the graph")
    sentences: list[int] = Field(description="how many of its sentences take part: as a query, as a candidate")
    truncated: bool = Field(description="it has more sentences of the facet than a query may (64): the first took part")
    metadata: dict[str, Any]


class GraphEdge(BaseModel):
    source: str
    target: str
    weight: float = Field(description="the rescorer's similarity each way, averaged: of the two papers alone")
    band: Literal["strong", "fair", "weak"] | None = Field(description="where the weight stands on the index's scale")
    forward: float = Field(description="the target's similarity to a query by the source's sentences")
    backward: float = Field(description="the source's similarity to a query by the target's sentences")
    pair: GraphPair = Field(description="the sentence pair that makes the edge: the one of highest cosine, either way")


class GraphGroup(BaseModel):
    id: int
    size: int
    members: list[str]
    name: str = Field(description="the sentence its members share most (a member's, closest on average to the rest)")
    name_paper: str
    name_index: int


class GraphAnchor(BaseModel):
    """One of the query's examples or papers to avoid, marked in the drawing (not a hit)."""

    id: str
    role: Literal["example", "avoid"]
    paper_id: str | None = Field(description="null: a pasted text")
    title: str
    facet: str | None
    x: float
    y: float


class GraphAnchorLink(BaseModel):
    anchor: str
    target: str
    weight: float = Field(description="the hit's own similarity to the example or paper to avoid (as the list has it)")
    band: Literal["strong", "fair", "weak"] | None


class GraphResponse(BaseModel):
    """A query's hits as a graph (esqbe.query.graph), `esqbe graph --json`'s shape."""

    version: int
    query: QueryInfo
    rescorer: str
    similarity: str = Field(description="what an edge's forward and backward similarities are")
    scale: SimilarityScale | None
    edge_rule: dict[str, Any] = Field(description="which edges are kept, in words (`rule`) and figures")
    nodes: list[GraphNode] = Field(description="exactly the query's numbered hits, in their order")
    edges: list[GraphEdge]
    groups: list[GraphGroup]
    grouping: dict[str, Any] = Field(description="whether the hits split into groups (`status`: grouped, too_few, "
                                                 "no_split), why in words (`note`), and the figures")
    anchors: list[GraphAnchor]
    anchor_links: list[GraphAnchorLink]
    layout: dict[str, Any]
    result: QueryResponse = Field(description="the query's result, in POST /query's shape")
    timings_ms: dict[str, float]
    versions: list[dict[str, Any]] = Field(default_factory=list, description="the hits that are likely versions of "
                                           "an example or of a node (`id`, `likely_version_of`, `version_overlap`): "
                                           "in `result`, not drawn")


class FacetQuery(QuerySelection):
    sentences: list[QuerySentence] = Field(description="the sentences a query by this facet uses, and why")


class Paper(BaseModel):
    paper_id: str
    title: str
    sentences: list[LabelledSentence]
    facets_predicted: bool = Field(False, description="facet labels come from esqbe's tagger, not the input")
    metadata: dict[str, Any]
    facet_queries: dict[str, FacetQuery] = Field(
        default_factory=dict, description="per facet this paper can be queried by: the sentences that query uses, and why")


class SearchHit(BaseModel):
    paper_id: str
    title: str
    score: float = Field(description="BM25 over title and abstract")
    match: Literal["id", "identifier", "author", "words"]
    sentences: int
    first_sentence: str


class SearchResponse(BaseModel):
    query: str
    hits: list[SearchHit]


class PapersRequest(BaseModel):
    """Records in any input format `esqbe index` reads (detected per record unless `format` is given)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"records": [{"id": "p1", "title": "A parser", "abstract": "We propose a parser. It is fast."}]},
    ]})

    records: list[dict[str, Any]] = Field(min_length=1, description="one JSON object per paper")
    format: InputFormat = Field(None, description="input format (default: detected per record)")
    facets: FacetMode = Field(
        None, description="keep: given labels, tag papers without (default); predict: tag all; none: never tag")


class RecordOutcome(BaseModel):
    record: int = Field(description="0-based position in the request")
    paper_id: str | None
    status: Literal["indexed", "replaced", "unchanged", "superseded", "skipped", "error"]
    field: str | None = None
    reason: str | None = None
    merged_into: str | None = Field(None, description=(
        "the paper this record names by the same DOI, arXiv id or PubMed id (an earlier record of the request, or a "
        "paper in the index): the record updated it, under its id; the status is that paper's"))


class PapersResponse(BaseModel):
    read: int
    indexed: int
    replaced: int
    unchanged: int
    skipped: int
    errors: int
    records: list[RecordOutcome]
    seconds: float


class DeleteResponse(BaseModel):
    deleted: str


class Health(BaseModel):
    status: Literal["ok", "warming", "unavailable"]
    backend: str
    detail: str | None = None


class ErrorBody(BaseModel):
    status: int
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class WatchRequest(QueryRequest):
    """A query (as POST /query takes it: one paper or text, or several `examples` and papers to `avoid`) saved as a
    watch: papers indexed from now on whose score reaches `min_score` (default: what the index's own scale calls a
    strong match) and that rank within its k are what `esqbe watch run` reports.
    The watch keeps its own copy of every example's and avoided paper's query sentences and vectors."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
                      description="the watch's name: letters, digits, _ and -; its feed is /watches/NAME.atom")
    min_score: float | None = Field(None, ge=-1.0, le=1.0, allow_inf_nan=False,
                                    description="report a new paper when its score (the number hits show and are "
                                                "ordered by) is at least this; null: the index's strong matches")
    min_sim: float | None = Field(None, ge=-1.0, le=1.0, allow_inf_nan=False,
                                  description="min_score's old name (the same threshold, on the score)")


class RerankRequest(BaseModel):
    """POST /rerank: what a search engine's reranker connector sends (esqbe.backends.engines.reranker builds the
    templates): the query in esqbe's rerank grammar (esqbe.index.rerank) and the candidates' paper ids."""

    model_config = ConfigDict(extra="forbid")

    # the bounds the schema publishes are the server's: the lengths checked here (422 past one, before any work);
    # an empty list and each id by the route's own check (esqbe.index.rerank.check_documents: 400 naming the item)
    query: str = Field(..., min_length=1, max_length=MAX_RERANK_QUERY_CHARS,
                       description="paper:ID facet:NAME | paper:ID sentences:0,2 | facet:NAME text | text (a text of "
                                   f"at most {MAX_QUERY_SENTENCES} sentences, counted as a query's: 413 past it)",
                       json_schema_extra={"x-maxSentences": MAX_QUERY_SENTENCES})
    documents: list[Any] = Field(..., max_length=MAX_RERANK_DOCUMENTS,
                                 description="the candidates' esqbe paper ids, in the engine's order, each 1 to "
                                             f"{MAX_PAPER_ID_CHARS} printable characters without spaces",
                                 json_schema_extra={"minItems": 1, "items": {"type": ["string", "integer"], "minLength": 1,
                                                                             "maxLength": MAX_PAPER_ID_CHARS}})
    top_n: int | None = Field(None, ge=0, le=100_000, description="accepted (the Cohere rerank shape has it; "
                                                                 "connectors installed by older esqbe versions send it) "
                                                                 "and ignored: every document gets a score")


class RerankResult(BaseModel):
    index: int = Field(description="the document's position in the request")
    relevance_score: float


class RerankResponse(BaseModel):
    """Every document's score, in input order (the Cohere rerank shape both engines' parsers read)."""

    results: list[RerankResult]
    unknown: int = Field(description="documents not in the index (scored below every known one)")
