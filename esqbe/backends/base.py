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

from ..filters import MetadataFilter
from ..papers import Paper


class BackendError(RuntimeError):
    """A backend cannot do what was asked (unreachable engine, missing index, bad state)."""


class StorageError(BackendError):
    """The index cannot be read or written (disk full, read-only, I/O error); `.report` says what a run
    had committed before it (an IndexReport), when there was a run."""


class WriteLockBusy(BackendError):
    """Another handle kept the index's write lock past the time a writer was willing to wait; `holder`
    is what the lock file says of it (a pid), or "?"."""

    def __init__(self, message: str, holder: str = "?"):
        super().__init__(message)
        self.holder = holder


class ModelMismatchError(BackendError):
    """The index was built with another encoder than the one asked to query or extend it."""


@dataclass(frozen=True)
class IndexMeta:
    """What an index was built with; checked before any write or query.

    A model is identified by `fingerprint` (a hash of the files that determine its vectors, see
    `esqbe.encoder.fingerprint_dir`) with `model` as its human name beside it, and `model_source`
    (an absolute directory, a package or a hub name) so queries can load it without `--model`.
    Indexes written before fingerprints have only the name: they are compared by name.
    """

    model: str
    dim: int
    encoder_mode: str = "contextual"  # "contextual" | "independent"
    fingerprint: str | None = None
    model_source: str | None = None

    def same_model(self, other: "IndexMeta") -> bool:
        if self.fingerprint and other.fingerprint:
            return self.fingerprint == other.fingerprint
        return self.model == other.model

    def describe(self) -> str:
        fp = f", fingerprint {self.fingerprint[:19]}" if self.fingerprint else ""
        return f"{self.model!r} ({self.dim}-d, {self.encoder_mode} vectors{fp})"

    def check(self, other: "IndexMeta") -> None:
        if not self.same_model(other) or (self.dim, self.encoder_mode) != (other.dim, other.encoder_mode):
            raise ModelMismatchError(
                f"index was built with model {self.describe()} but this run uses {other.describe()}; "
                "query with the index's model, or rebuild the index into a new path"
            )

    def to_dict(self) -> dict:
        d = {"model": self.model, "dim": self.dim, "encoder_mode": self.encoder_mode}
        if self.fingerprint:
            d["fingerprint"] = self.fingerprint
        if self.model_source:
            d["model_source"] = self.model_source
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "IndexMeta":
        return cls(d["model"], int(d["dim"]), d.get("encoder_mode", "contextual"), d.get("fingerprint") or None,
                   d.get("model_source") or None)


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
    `filter` restricts BM25 and kNN alike to papers whose metadata satisfies it, before ranking
    (esqbe.filters: conditions on stored metadata, plus the user's own DSL on engine backends).
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
    filter: "MetadataFilter | None" = None
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

    def search_text(self, text: str, k: int = 10) -> list[tuple[str, float]]:
        """Papers whose title/abstract match the words best (BM25): (paper id, score), best first.

        Every backend has this through its first stage (BM25 alone, no vectors); a backend may
        override it with something cheaper."""
        meta = self.meta()
        if meta is None or not text.strip() or k <= 0:
            return []
        request = FirstStageRequest(text=text, vectors=np.zeros((0, meta.dim), dtype=np.float32), k=k, knn_k=0,
                                    bm25_k=k, fusion="bm25", with_papers=False)
        return [(c.paper_id, c.bm25) for c in self.first_stage(request) if c.bm25 > 0]

    def paper_ids(self) -> list[str]:
        """Every paper id in the index (for whole-index jobs such as `esqbe train-words --index-path`)."""
        raise BackendError(f"the {self.name} backend cannot list its papers")

    def sample_papers(self, n: int, seed: int = 0) -> tuple[list[str], int]:
        """Up to `n` paper ids drawn at random (the same ones for the same seed and papers), and how many
        papers the index holds: corpus statistics estimated from a sample (esqbe.centering)."""
        import random

        ids = sorted(self.paper_ids())
        return (sorted(random.Random(seed).sample(ids, n)) if len(ids) > n else ids), len(ids)

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
