"""Corpus directions: the components every sentence vector of a corpus shares, removed before rescoring.

Sentence encoders put all of a corpus's sentences in a narrow cone: a common mean, and a few dominant
directions that carry register ("a sentence of a CS abstract") more than content. Subtracting the
corpus mean and projecting out the top principal directions ("all-but-the-top", Mu & Viswanath,
ICLR 2018) leaves cosines that weigh what sentences say. `vector_centering` chooses it:

    none    raw cosines (the default)
    mean    subtract the corpus's mean sentence vector
    topK    also remove its K principal directions (K = 1..4)

The statistics come from the index itself: a seeded sample of up to `SAMPLE_PAPERS` papers' sentence
vectors (every paper of a smaller index), drawn and read through the backend interface
(`sample_papers`, `get`), so every backend (embedded, Elasticsearch, OpenSearch) is centred alike.
They are computed the first time a query needs them and kept while the backend object lives,
until the papers written through it since (`written`, which an `Index` calls) exceed 10% of the
index they were estimated from: a common direction of a corpus moves little when it grows by less.
Only the rescorer sees centred vectors: the first stage's kNN keeps the index's own.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError
from ..settings.table import CENTRING_MODES as MODES  # noqa: E402

#: papers whose sentences estimate the mean and directions (CSFCube's 4,205 abstracts: all of them)
SAMPLE_PAPERS = 5000
_CHUNK = 500

_cache: weakref.WeakKeyDictionary[object, dict[tuple[int, int], CorpusDirections]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass(frozen=True)
class CorpusDirections:
    mean: np.ndarray  # (d,)
    top: np.ndarray  # (k, d), orthonormal rows
    papers: int  # papers sampled
    sentences: int  # sentence vectors they held
    corpus: int = 0  # papers in the index when they were estimated

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """Centred, common directions removed, unit length again; any leading shape (..., d)."""
        x = np.asarray(vectors, dtype=np.float32) - self.mean
        if len(self.top):
            x = x - (x @ self.top.T) @ self.top
        norm = np.linalg.norm(x, axis=-1, keepdims=True)
        return x / np.maximum(norm, 1e-12)


def components(mode: str) -> int:
    """How many principal directions `mode` removes (mean: 0); ValueError for an unknown mode."""
    if mode not in MODES or mode == "none":
        raise ParameterError(f"vector_centering must be one of {', '.join(MODES)} (got {mode!r})")
    return 0 if mode == "mean" else int(mode[3:])


def estimate(vectors: np.ndarray, k: int, papers: int = 0) -> CorpusDirections:
    """Mean and top-k principal directions of sentence vectors (n, d), from their covariance."""
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim != 2 or not len(x):
        raise ValueError("no sentence vectors to estimate corpus directions from")
    mean = x.mean(axis=0, dtype=np.float64)
    top = np.zeros((0, x.shape[1]))
    if k:
        c = x - mean.astype(np.float32)
        # the (d, d) scatter in float32 (4x faster than float64 for 35K x 768; the top direction is the same to
        # ~1e-6), its eigenvectors in float64
        _, vecs = np.linalg.eigh((c.T @ c).astype(np.float64))  # ascending eigenvalues
        top = vecs[:, ::-1][:, :k].T
    return CorpusDirections(mean.astype(np.float32), top.astype(np.float32), papers, len(x))


def corpus_directions(backend, mode: str, *, sample: int = SAMPLE_PAPERS, seed: int = 0) -> CorpusDirections:
    """The index's corpus directions for `mode` (cached per backend object; see the module's docstring)."""
    k = components(mode)
    with _lock:
        hit = _cache.get(backend, {}).get((k, sample))
    if hit is not None:
        return hit
    ids, corpus = backend.sample_papers(sample, seed)
    parts = []
    for start in range(0, len(ids), _CHUNK):
        got = backend.get(ids[start : start + _CHUNK])
        parts += [got[i].vectors for i in ids[start : start + _CHUNK] if i in got and len(got[i].vectors)]
    if not parts:
        raise ParameterError("the index holds no sentence vectors to centre by")
    found = estimate(np.concatenate(parts), k, papers=len(parts))
    directions = CorpusDirections(found.mean, found.top, found.papers, found.sentences, corpus)
    with _lock:
        _cache.setdefault(backend, {})[(k, sample)] = directions
        _written[backend] = 0
    return directions


_written: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()


def written(backend, papers: int) -> None:
    """`papers` were added, replaced or deleted through `backend`: past 10% of the corpus the cached
    directions were estimated from, they are dropped (the next centred query estimates them again)."""
    if papers <= 0:
        return
    with _lock:
        cached = _cache.get(backend)
        if not cached:
            return
        _written[backend] = _written.get(backend, 0) + papers
        if _written[backend] > 0.1 * max(d.corpus for d in cached.values()):
            _cache.pop(backend, None)
            _written.pop(backend, None)
