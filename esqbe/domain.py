"""Papers as esqbe sees them: an id, a title, and sentences each carrying a facet label.

Every input format is turned into `Paper` by `esqbe.ingest.readers`; everything downstream (encoder,
backends, query pipeline) only ever sees this shape.
"""
from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .core.filters import MetadataFilter
from .core.textsafe import NOT_IN_ID
from .errors import DataError, ModelMismatchError, ParameterError

#: facets a user can query by (CSFCube's three; `objective` is folded into `background`)
QUERY_FACETS = ("background", "method", "result")
#: every label a stored sentence can carry
FACET_LABELS = ("background", "method", "result", "other", "unlabeled")
#: the five raw labels of CSAbstruct / the CSFCube tagger
RAW_LABELS = ("background", "objective", "method", "result", "other")

_LABEL_ALIASES = {
    "background": "background",
    "objective": "background",
    "method": "method",
    "methods": "method",
    "result": "result",
    "results": "result",
    "other": "other",
    "unlabeled": "unlabeled",
    "unlabelled": "unlabeled",
    "none": "unlabeled",
}


def normalize_label(label: str | None, raw: bool = False) -> str:
    """Map a label as it arrives (`background_label`, `Objective`, `methods`) to an esqbe facet.

    With `raw=True` `objective` stays apart from `background` (the five CSAbstruct labels).
    Raises ValueError for a label we do not know, so bad input is reported, not guessed.
    """
    if label is None:
        return "unlabeled"
    key = str(label).strip().lower()
    if key.endswith("_label"):
        key = key[: -len("_label")]
    if raw and key == "objective":
        return "objective"
    try:
        return _LABEL_ALIASES[key]
    except KeyError:
        raise ParameterError(f"unknown facet label {label!r} (expected one of {', '.join(RAW_LABELS)})") from None


#: what one paper read from input may carry, at most: generous for real papers (an abstract has tens of
#: sentences, a full S2ORC abstract span a few thousand characters), small enough that one hostile record
#: cannot take the indexer's memory, SQLite's rows or the text index with it. A record past one is refused
#: as `file:line: field: reason`, like any malformed record.
LIMITS = {
    "id_chars": 512,  # a paper id
    "title_chars": 4_000,
    "sentences": 1_000,  # sentences of one abstract
    "abstract_chars": 100_000,  # the abstract's text, before it is split into sentences
    "metadata_bytes": 1_000_000,  # the metadata as JSON
    "metadata_depth": 16,  # nesting of objects and lists in the metadata
}


def _metadata_problem(value, path: str, depth: int) -> tuple[str, str] | None:
    if depth > LIMITS["metadata_depth"]:
        return path or "metadata", f"nested deeper than {LIMITS['metadata_depth']} levels"
    if isinstance(value, float) and not math.isfinite(value):
        return path or "metadata", f"{value!r} is not a finite number (NaN, Infinity and numbers past 1.8e308 are refused)"
    if isinstance(value, dict):
        for k, v in value.items():
            found = _metadata_problem(v, f"{path}.{k}" if path else str(k), depth + 1)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _metadata_problem(v, f"{path}[{i}]", depth + 1)
            if found:
                return found
    return None


def metadata_problem(metadata) -> tuple[str, str] | None:
    """(field, reason) for metadata that cannot be stored as it is (not an object, a non-finite number,
    past LIMITS), or None. The field is the dotted key path (`year`, `external_ids.doi`)."""
    if not isinstance(metadata, dict):
        return "metadata", f"expected an object, got {type(metadata).__name__}"
    found = _metadata_problem(metadata, "", 0)
    if found:
        return found
    try:
        size = len(json.dumps(metadata, ensure_ascii=False, allow_nan=False, default=str).encode("utf-8"))
    except (TypeError, ValueError) as e:
        return "metadata", f"not storable as JSON: {e}"
    if size > LIMITS["metadata_bytes"]:
        return "metadata", f"{size} bytes as JSON; at most {LIMITS['metadata_bytes']}"
    return None


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def id_problem(pid: str) -> str | None:
    """Why `pid` cannot be a paper's id, or None. An id is one line of text everywhere it goes (an export's record, a
    terminal, a TSV listing), so no control character or line break; and it is typed as it is read, so no format
    character (Unicode Cf: a bidirectional control shows `sec4-\\u202e54321` as `sec4-12345`, another paper's id; a
    zero-width one is not seen at all)."""
    bad = NOT_IN_ID.search(pid)
    if not bad:
        return None
    c = bad.group()
    if ord(c) >= 0xA0 and c not in "\u2028\u2029":
        name = unicodedata.name(c, "")
        return (f"invisible or bidirectional format character U+{ord(c):04X}{f' ({name})' if name else ''} at position "
                f"{bad.start()}; an id reads as it is typed")
    return f"control character U+{ord(c):04X} at position {bad.start()}; an id is one line of printable text"


def paper_problem(paper: Paper, labels: tuple[str, ...] = FACET_LABELS) -> tuple[str, str] | None:
    """(field, reason) for a paper no index may store (wrong types, unknown labels, past LIMITS), or None.

    Every reader checks its records with this, and every backend checks what it is asked to write: what
    reaches storage is always what the text index and the metadata columns can take."""
    pid = paper.paper_id
    if not isinstance(pid, str) or not pid.strip():
        return "paper_id", "missing or empty"
    if len(pid) > LIMITS["id_chars"]:
        return "paper_id", f"{len(pid)} characters; at most {LIMITS['id_chars']}"
    problem = id_problem(pid)
    if problem:
        return "paper_id", problem
    if not isinstance(paper.title, str):
        return "title", f"expected a string, got {type(paper.title).__name__}"
    if len(paper.title) > LIMITS["title_chars"]:
        return "title", f"{len(paper.title)} characters; at most {LIMITS['title_chars']}"
    sentences, facets = paper.sentences, paper.facets
    if not isinstance(sentences, (list, tuple)):
        return "sentences", f"expected a list of strings, got {type(sentences).__name__}"
    if len(sentences) > LIMITS["sentences"]:
        return "sentences", f"{len(sentences)} sentences; at most {LIMITS['sentences']}"
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            return "sentences", f"sentence {i} is {'null' if s is None else type(s).__name__}, expected a string"
        if not s.strip():
            return "sentences", f"sentence {i} is empty"
    for name, text in (("paper_id", pid), ("title", paper.title), *(("sentences", s) for s in sentences)):
        if not _storable(text):
            return name, "not valid Unicode (a lone surrogate)"
    chars = sum(map(len, sentences))
    if chars > LIMITS["abstract_chars"]:
        return "sentences", f"{chars} characters of abstract; at most {LIMITS['abstract_chars']}"
    if not isinstance(facets, (list, tuple)) or len(facets) != len(sentences):
        return "facets", f"{len(facets) if isinstance(facets, (list, tuple)) else 'no'} labels for {len(sentences)} sentences"
    for i, f in enumerate(facets):
        if f not in labels:
            return "facets", (f"label {i} is {'null' if f is None else repr(f)}; esqbe labels are {', '.join(labels)}")
    return metadata_problem(paper.metadata)


#: metadata keys esqbe writes for itself (not part of a paper's content hash); facet_probs: the
#: tagger's soft labels, written beside its predicted labels (which do count)
#: (`sources`: where a paper was read from: the same paper read from another file is unchanged)
INTERNAL_METADATA_KEYS = frozenset({"facets_predicted", "facet_probs", "sources"})


@dataclass
class Paper:
    """One paper: `facets[i]` is the facet label of `sentences[i]` (`unlabeled` when unknown)."""

    paper_id: str
    title: str
    sentences: list[str]
    facets: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        self.paper_id = str(self.paper_id)
        self.title = self.title or ""
        if not self.facets:
            self.facets = ["unlabeled"] * len(self.sentences)
        if len(self.facets) != len(self.sentences):
            raise DataError(
                f"paper {self.paper_id}: {len(self.sentences)} sentences but {len(self.facets)} facet labels"
            )

    @property
    def abstract(self) -> str:
        return " ".join(self.sentences)

    @property
    def is_labeled(self) -> bool:
        return any(f != "unlabeled" for f in self.facets)

    def facet_indices(self, facet: str) -> list[int]:
        """Indices of the sentences labelled `facet` (`objective` counts as `background`)."""
        facet = normalize_label(facet)
        return [i for i, f in enumerate(self.facets) if f == facet]

    def content_hash(self) -> str:
        """Hash of what the index stores for this paper: equal hash means an upsert changes nothing.

        Metadata counts (a corrected year or venue is written on the next run), except esqbe's own
        bookkeeping keys (INTERNAL_METADATA_KEYS)."""
        meta = {k: v for k, v in self.metadata.items() if k not in INTERNAL_METADATA_KEYS}
        payload = json.dumps([self.title, self.sentences, self.facets] + ([meta] if meta else []), ensure_ascii=False,
                             sort_keys=True, default=str)
        return hashlib.sha1(payload.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict:
        return {
            "paper_id": self.paper_id,
            "title": self.title,
            "sentences": list(self.sentences),
            "facets": list(self.facets),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Paper:
        return cls(d["paper_id"], d.get("title", ""), list(d["sentences"]), list(d.get("facets") or []),
                   dict(d.get("metadata") or {}))


#: an encoder runtime (how an index's vectors were computed, `IndexMeta.runtime`) -> the `encoder_backend` that makes it
RUNTIME_BACKENDS = {"torch-fp32": "torch", "torch-fp16": "torch", "torch-bf16": "torch", "torch-int8": "torch-int8",
                    "onnx-fp32": "onnx", "onnx-int8": "onnx-int8"}


def runtime_backend(runtime: str) -> str:
    """The `encoder_backend` (and --encoder-backend) that encodes with `runtime`."""
    return RUNTIME_BACKENDS.get(runtime, runtime)


@dataclass(frozen=True)
class IndexMeta:
    """What an index was built with; checked before any write or query.

    A model is identified by `fingerprint` (a hash of the files that determine its vectors, see
    `esqbe.encode.identity.fingerprint_dir`) with `model` as its human name beside it, and `model_source`
    (an absolute directory, a package or a hub name) so queries can load it without `--model`.
    Indexes written before fingerprints have only the name: they are compared by name.

    `runtime` is how the vectors were computed (`esqbe.encode.identity.runtime_name`: torch-fp32, onnx-int8, ...):
    runtimes give slightly different vectors (int8 against fp32: cosine ~0.99), so writes are checked against it.
    An index written before runtimes were recorded has None, and is taken as torch-fp32 (the only runtime then).
    A requested meta with runtime None (a query, a check before the model is loaded) is not checked for it.
    """

    model: str
    dim: int
    encoder_mode: str = "contextual"  # "contextual" | "independent"
    fingerprint: str | None = None
    model_source: str | None = None
    runtime: str | None = None
    adapter: str | None = None  # the encoder adapter's name (esqbe.encode.adapter) merged into the model; None: none
    #: a model `esqbe adapt` distilled: its teacher, data and recipe in one line (not compared: the fingerprint is)
    distilled: str | None = None

    #: what an index that does not record its runtime was written with
    ASSUMED_RUNTIME: ClassVar[str] = "torch-fp32"

    @property
    def effective_runtime(self) -> str:
        return self.runtime or self.ASSUMED_RUNTIME

    def same_model(self, other: IndexMeta) -> bool:
        if self.fingerprint and other.fingerprint:
            return self.fingerprint == other.fingerprint
        return self.model == other.model

    def describe(self) -> str:
        fp = f", fingerprint {self.fingerprint[:19]}" if self.fingerprint else ""
        adapter = f", adapter {self.adapter}" if self.adapter else ""
        return f"{self.model!r} ({self.dim}-d, {self.encoder_mode} vectors{adapter}{fp})"

    def check(self, other: IndexMeta) -> None:
        if not self.same_model(other) or (self.dim, self.encoder_mode) != (other.dim, other.encoder_mode):
            raise ModelMismatchError(
                f"index was built with model {self.describe()} but this run uses {other.describe()}; "
                "query with the index's model" + (f" (--adapter {self.adapter or 'none'})" if self.adapter != other.adapter
                                                   and (self.adapter or other.adapter) else "")
                + ", or rebuild the index into a new path"
            )
        if other.runtime is not None and other.runtime != self.effective_runtime:
            stored = self.effective_runtime + ("" if self.runtime else " (assumed: the index predates recorded runtimes)")
            raise ModelMismatchError(
                f"index was built with encoder runtime {stored} but this run encodes with {other.runtime}; their "
                f"vectors differ slightly and are not mixed in one index: add to it with --encoder-backend "
                f"{runtime_backend(self.effective_runtime)} (or ESQBE_ENCODER_BACKEND, or `encoder_backend:` in the "
                "config file), or build a new index for the other runtime"
            )

    def to_dict(self) -> dict:
        d = {"model": self.model, "dim": self.dim, "encoder_mode": self.encoder_mode}
        if self.fingerprint:
            d["fingerprint"] = self.fingerprint
        if self.model_source:
            d["model_source"] = self.model_source
        if self.runtime:
            d["runtime"] = self.runtime
        if self.adapter:
            d["adapter"] = self.adapter
        if self.distilled:
            d["distilled"] = self.distilled
        return d

    @classmethod
    def from_dict(cls, d: dict) -> IndexMeta:
        return cls(d["model"], int(d["dim"]), d.get("encoder_mode", "contextual"), d.get("fingerprint") or None,
                   d.get("model_source") or None, d.get("runtime") or None, d.get("adapter") or None,
                   str(d["distilled"]) if d.get("distilled") else None)


@dataclass
class IndexedPaper:
    """A paper with one L2-normalised vector per sentence: `vectors.shape == (len(sentences), dim)`."""

    paper: Paper
    vectors: np.ndarray
    #: wordpiece token -> count in this paper's sentences (the encoder's tokenizer); feeds corpus token frequencies
    token_counts: dict[str, int] | None = None

    def __post_init__(self):
        self.vectors = np.asarray(self.vectors, dtype=np.float32)
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.paper.sentences):
            raise DataError(
                f"paper {self.paper.paper_id}: {len(self.paper.sentences)} sentences but vectors of shape {self.vectors.shape}"
            )

    @property
    def paper_id(self) -> str:
        return self.paper.paper_id


@dataclass
class FirstStageRequest:
    """One query's first stage: BM25 over title+abstract and kNN per query sentence, fused.

    `facet` filters the *candidate* sentences the kNN may match (None: all sentences).
    `restrict_to` limits candidates to a set of paper ids (CSFCube's re-ranking pools).
    `filter` restricts BM25 and kNN alike to papers whose metadata satisfies it, before ranking
    (esqbe.core.filters: conditions on stored metadata, plus the user's own DSL on engine backends).
    """

    text: str
    vectors: np.ndarray
    facet: str | None = None
    k: int = 100
    knn_k: int = 100
    bm25_k: int = 100
    exclude: frozenset[str] = frozenset()
    restrict_to: frozenset[str] | None = None
    fusion: str = "rrf"
    bm25_weight: float = 0.5
    with_papers: bool = True
    filter: MetadataFilter | None = None
    #: BM25 over the candidates' sentences of this facet instead of title + abstract (None: title + abstract)
    bm25_facet: str | None = None
    #: the share of the ANN's calibrated effort each query sentence gets (the embedded IVF's nprobe x this, at least
    #: 1 list); a query of several examples searches with less (Settings.examples_ann_effort). Engines ignore it
    ann_effort: float = 1.0


@dataclass
class Candidate:
    """A first-stage hit. `knn` is the mean over query sentences of the best cosine found (0 if none);
    `paper` carries sentences, facets and vectors for the Python rescorers (when asked for)."""

    paper_id: str
    score: float
    bm25: float = 0.0
    knn: float = 0.0
    paper: IndexedPaper | None = None


@dataclass
class UpsertResult:
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    errors: list[str] = field(default_factory=list)

    def __iadd__(self, other: UpsertResult) -> UpsertResult:
        self.added += other.added
        self.replaced += other.replaced
        self.unchanged += other.unchanged
        self.errors.extend(other.errors)
        return self
