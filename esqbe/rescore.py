"""Rescorers: score the first stage's top candidates against the query's sentences, in Python.

Each rescorer is a function over arrays, batched over all candidates at once (padded tensors,
no per-pair Python loops), and returns which sentences matched so a hit can be explained.
Higher score = more similar, for every rescorer.

Register new ones with `@register("name")`; the query pipeline and `esqbe eval` find them by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .backends.base import IndexedPaper


@dataclass
class QueryBatch:
    """The query side: m sentence vectors (L2-normalised) and their texts."""

    vectors: np.ndarray  # (m, d)
    sentences: list[str]


@dataclass
class CandidateBatch:
    """n candidates padded to L sentences: `mask[i, j]` is True where candidate i has sentence j."""

    ids: list[str]
    vectors: np.ndarray  # (n, L, d), zeros where masked out
    mask: np.ndarray  # (n, L) bool
    sentences: list[list[str]]
    facets: list[list[str]]

    @classmethod
    def from_papers(cls, papers: Sequence[IndexedPaper]) -> "CandidateBatch":
        n = len(papers)
        dim = papers[0].vectors.shape[1] if n else 0
        width = max((len(p.paper.sentences) for p in papers), default=0)
        vectors = np.zeros((n, max(width, 1), dim), dtype=np.float32)
        mask = np.zeros((n, max(width, 1)), dtype=bool)
        for i, p in enumerate(papers):
            k = len(p.paper.sentences)
            vectors[i, :k] = p.vectors
            mask[i, :k] = True
        return cls(
            ids=[p.paper_id for p in papers],
            vectors=vectors,
            mask=mask,
            sentences=[list(p.paper.sentences) for p in papers],
            facets=[list(p.paper.facets) for p in papers],
        )

    def __len__(self) -> int:
        return len(self.ids)


Match = tuple[int, int, float]  # (query sentence index, candidate sentence index, weight)


@dataclass
class RescoreResult:
    scores: np.ndarray  # (n,) higher is better
    matches: list[list[Match]] = field(default_factory=list)  # per candidate, strongest first


@dataclass
class RescoreContext:
    """What some rescorers need beyond vectors: the encoder (token vectors) and the index (token statistics)."""

    encoder: object | None = None
    backend: object | None = None


Rescorer = Callable[[QueryBatch, CandidateBatch], RescoreResult]
_REGISTRY: dict[str, Callable[..., Rescorer]] = {}


def register(name: str):
    """Register a rescorer factory `factory(context, **params) -> Rescorer` under `name`."""

    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def available_rescorers() -> list[str]:
    return ["none", *sorted(_REGISTRY)]


def make_rescorer(name: str, context: RescoreContext | None = None, **params) -> Rescorer | None:
    """The rescorer called `name` with its parameters; `none` keeps the first-stage order."""
    if name in (None, "none"):
        return None
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown rescorer {name!r}; choose one of {', '.join(available_rescorers())}") from None
    return factory(context or RescoreContext(), **params)


def cosine_matrix(query: QueryBatch, cands: CandidateBatch) -> np.ndarray:
    """(n, m, L) cosine similarities; masked candidate slots are -inf."""
    sims = np.einsum("md,nld->nml", query.vectors.astype(np.float32), cands.vectors, optimize=True)
    return np.where(cands.mask[:, None, :], sims, -np.inf)


def _top_matches(sims: np.ndarray, limit: int = 3) -> list[list[Match]]:
    """Per candidate, each query sentence's best candidate sentence, strongest pairs first."""
    best_j = sims.argmax(axis=2)  # (n, m)
    best_s = np.take_along_axis(sims, best_j[..., None], axis=2)[..., 0]  # (n, m)
    out = []
    for i in range(sims.shape[0]):
        order = np.argsort(-best_s[i])[:limit]
        out.append([(int(q), int(best_j[i, q]), float(best_s[i, q])) for q in order])
    return out


@register("ts")
def rescore_ts(context: RescoreContext, **params) -> Rescorer:
    """Single best match (tsAspire): the best cosine over all (query sentence, candidate sentence) pairs."""
    if params:
        raise ValueError(f"ts takes no parameters (got {', '.join(params)})")

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        sims = cosine_matrix(query, cands)
        scores = sims.reshape(len(cands), -1).max(axis=1)
        return RescoreResult(scores=scores, matches=_top_matches(sims, limit=1))

    return score


@register("summax")
def rescore_summax(context: RescoreContext, **params) -> Rescorer:
    """Mean over query sentences of the best cosine to any candidate sentence (every query sentence must find a match)."""
    if params:
        raise ValueError(f"summax takes no parameters (got {', '.join(params)})")

    def score(query: QueryBatch, cands: CandidateBatch) -> RescoreResult:
        sims = cosine_matrix(query, cands)
        scores = sims.max(axis=2).mean(axis=1)
        return RescoreResult(scores=scores, matches=_top_matches(sims))

    return score
