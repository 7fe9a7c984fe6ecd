"""The one small interface every backend (embedded, elasticsearch, opensearch) implements.

The model follows the engines' nested layout: a document per paper, holding per-sentence
objects (index, facet label, text, vector). The core pipeline talks only to `Backend`; nothing
engine-specific crosses this line.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..papers import Paper


class BackendError(RuntimeError):
    """A backend cannot do what was asked (unreachable engine, missing index, bad state)."""


class ModelMismatchError(BackendError):
    """The index was built with another encoder than the one asked to query or extend it."""


@dataclass(frozen=True)
class IndexMeta:
    """What an index was built with; checked before any write or query."""

    model: str
    dim: int
    encoder_mode: str = "contextual"  # "contextual" | "independent"

    def check(self, other: "IndexMeta") -> None:
        if (self.model, self.dim, self.encoder_mode) != (other.model, other.dim, other.encoder_mode):
            raise ModelMismatchError(
                f"index was built with model {self.model!r} ({self.dim}-d, {self.encoder_mode} vectors) "
                f"but this run uses {other.model!r} ({other.dim}-d, {other.encoder_mode} vectors); "
                "query with the index's model, or rebuild the index into a new path"
            )

    def to_dict(self) -> dict:
        return {"model": self.model, "dim": self.dim, "encoder_mode": self.encoder_mode}

    @classmethod
    def from_dict(cls, d: dict) -> "IndexMeta":
        return cls(d["model"], int(d["dim"]), d.get("encoder_mode", "contextual"))


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
            raise ValueError(
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
    #: BM25 over the candidates' sentences of this facet instead of title + abstract (None: title + abstract)
    bm25_facet: str | None = None


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

    def __iadd__(self, other: "UpsertResult") -> "UpsertResult":
        self.added += other.added
        self.replaced += other.replaced
        self.unchanged += other.unchanged
        self.errors.extend(other.errors)
        return self


class Backend(ABC):
    """Storage + first-stage retrieval for one index."""

    name: str = "backend"
    #: whether BM25 can score a paper's sentences of one facet (`FirstStageRequest.bm25_facet`);
    #: without it, `bm25_text: facet` scores title + abstract
    facet_text: bool = False

    @abstractmethod
    def meta(self) -> IndexMeta | None:
        """What the index was built with, or None if the index does not exist yet."""

    @abstractmethod
    def ensure(self, meta: IndexMeta) -> None:
        """Create the index for `meta` if absent; raise ModelMismatchError if it exists with another."""

    @abstractmethod
    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        """Stored `Paper.content_hash()` of those ids that exist (lets re-runs skip unchanged papers before encoding)."""

    @abstractmethod
    def upsert(self, papers: Sequence[IndexedPaper]) -> UpsertResult:
        """Insert or replace papers by id, durably (a crash after return loses nothing)."""

    @abstractmethod
    def delete(self, paper_ids: Iterable[str]) -> int:
        """Delete papers by id; returns how many existed."""

    @abstractmethod
    def get(self, paper_ids: Sequence[str]) -> dict[str, IndexedPaper]:
        """Fetch stored papers with their sentence vectors (missing ids are absent from the result)."""

    @abstractmethod
    def first_stage(self, request: FirstStageRequest) -> list[Candidate]:
        """BM25 + facet-filtered sentence kNN, fused; best first, at most `request.k`."""

    @abstractmethod
    def stats(self) -> dict:
        """Counts for humans and scripts: papers, sentences, per-facet sentences, model, backend details."""

    def token_counts(self) -> tuple[dict[str, int], int] | None:
        """Corpus token frequencies kept up to date on upsert/delete: (token -> count, total tokens),
        or None when the backend keeps none (rescorers then estimate from the candidates)."""
        return None

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
