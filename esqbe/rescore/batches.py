"""What a rescorer is handed and returns: the query's and the candidates' sentence vectors as padded batches,
the context it may need (encoder, backend), and its scores with the sentence pairs that matched."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..domain import IndexedPaper


@dataclass
class QueryBatch:
    """The query side: m sentence vectors (L2-normalised) and their texts."""

    vectors: np.ndarray  # (m, d)
    sentences: list[str]
    #: per-sentence importance for rescorers that weigh query sentences (asym); None = uniform 1/m
    weights: np.ndarray | None = None


@dataclass
class CandidateBatch:
    """n candidates padded to L sentences: `mask[i, j]` is True where candidate i has sentence j."""

    ids: list[str]
    vectors: np.ndarray  # (n, L, d), zeros where masked out
    mask: np.ndarray  # (n, L) bool
    sentences: list[list[str]]
    facets: list[list[str]]
    #: (n, L) added to every cosine with that candidate sentence (soft facet matching: a sentence of
    #: another facet counts less); None = no bias. `ot` subtracts it from its distances instead.
    bias: np.ndarray | None = None

    @classmethod
    def from_papers(cls, papers: Sequence[IndexedPaper], bias: Sequence[np.ndarray] | None = None) -> CandidateBatch:
        n = len(papers)
        dim = papers[0].vectors.shape[1] if n else 0
        width = max((len(p.paper.sentences) for p in papers), default=0)
        vectors = np.zeros((n, max(width, 1), dim), dtype=np.float32)
        mask = np.zeros((n, max(width, 1)), dtype=bool)
        for i, p in enumerate(papers):
            k = len(p.paper.sentences)
            vectors[i, :k] = p.vectors
            mask[i, :k] = True
        padded_bias = None
        if bias is not None:
            padded_bias = np.zeros(mask.shape, dtype=np.float32)
            for i, b in enumerate(bias):
                padded_bias[i, : len(b)] = b
        return cls(
            ids=[p.paper_id for p in papers],
            vectors=vectors,
            mask=mask,
            sentences=[list(p.paper.sentences) for p in papers],
            facets=[list(p.paper.facets) for p in papers],
            bias=padded_bias,
        )

    def __len__(self) -> int:
        return len(self.ids)


Match = tuple[int, int, float]  # (query sentence index, candidate sentence index, weight)


@dataclass
class RescoreResult:
    scores: np.ndarray  # (n,) higher is better
    matches: list[list[Match]] = field(default_factory=list)  # per candidate, strongest first
    #: (n, m, L) transport plans of the `ot` rescorer (zeros on padded slots); None for the others
    plans: np.ndarray | None = None


@dataclass
class RescoreContext:
    """What some rescorers need beyond vectors: the encoder (token vectors) and the index (token statistics)."""

    encoder: object | None = None
    backend: object | None = None


Rescorer = Callable[[QueryBatch, CandidateBatch], RescoreResult]
