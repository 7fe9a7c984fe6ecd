"""Versions of a paper told apart: a hit whose sentences are, nearly, those of the query paper, of another example
or of a better-ranked hit (a preprint and its journal version, the same abstract under another title) is marked
`likely_version_of` that paper and listed after the numbered hits, not among them.

Two abstracts' **sentence overlap** is the smaller of its two directions, each the mean over one abstract's sentences
of the best cosine with a sentence of the other (the abstracts' stored sentence vectors, every sentence, whatever
the query's facet): 1 for the same sentences, high only when each abstract's sentences nearly all have a twin in the
other. A hit is a likely version at `VERSION_OVERLAP` (0.88) or more, chosen on data (`benchmarks/bench_versions.py`;
docs/results.md, "Versions of a paper"): on CSFCube dev, every copy of an abstract under another title reaches 0.906
or more, and three in four copies with light edits besides (words changed, a sentence dropped) reach 0.88, a rewrite
none; every pair of the collection's own abstracts at 0.88 or more is, read one by one, one work twice (a conference
and a journal version, two arXiv versions, one abstract under two ids), and the most alike pair of two distinct works
found is at 0.864.

Only the presentation depends on the other hits (which of them a hit repeats); no score does: a hit's score is the
query's and that paper's alone (esqbe.query.results.ScoreFormula), marked or not.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: the sentence overlap from which a hit is a likely version of a paper (chosen on CSFCube dev: the module's docstring)
VERSION_OVERLAP = 0.88
#: the hits compared with each other (a version of a better-ranked hit among the first this many is found; past them
#: a hit is compared with the examples only): the cost grows with its square, and a version scores close to its paper
AMONG_HITS = 100


def _segments(vectors: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The papers' sentence vectors stacked, each paper's first row, and its number of rows (papers without a
    sentence are left to the caller)."""
    lengths = np.array([len(v) for v in vectors], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.concatenate([np.asarray(v, dtype=np.float32) for v in vectors]), starts, lengths


def overlap_matrix(papers: Sequence[np.ndarray], others: Sequence[np.ndarray], *, chunk: int = 4096) -> np.ndarray:
    """(len(papers), len(others)): the sentence overlap of each paper with each other paper (unit sentence vectors,
    one (sentences, d) array each); -1 where either has no sentence. Batched: one product per slice of `chunk`
    sentences of `papers`."""
    out = np.full((len(papers), len(others)), -1.0)
    keep_p = [i for i, v in enumerate(papers) if len(v)]
    keep_o = [j for j, v in enumerate(others) if len(v)]
    if not keep_p or not keep_o:
        return out
    o_rows, o_starts, o_lens = _segments([others[j] for j in keep_o])
    at = 0
    while at < len(keep_p):  # slices of whole papers, about `chunk` sentences each
        stop, rows = at, 0
        while stop < len(keep_p) and (rows == 0 or rows + len(papers[keep_p[stop]]) <= chunk):
            rows += len(papers[keep_p[stop]])
            stop += 1
        part = keep_p[at:stop]
        p_rows, p_starts, p_lens = _segments([papers[i] for i in part])
        sims = p_rows @ o_rows.T  # (paper sentences, other sentences)
        # each paper sentence's best twin in each other paper, averaged over the paper: paper -> other
        forward = np.add.reduceat(np.maximum.reduceat(sims, o_starts, axis=1), p_starts, axis=0) / p_lens[:, None]
        # each other paper's sentence's best twin in each paper, averaged over the other paper: other -> paper
        backward = np.add.reduceat(np.maximum.reduceat(sims, p_starts, axis=0), o_starts, axis=1) / o_lens[None, :]
        out[np.ix_(part, keep_o)] = np.minimum(forward, backward)
        at = stop
    return out


def sentence_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """The sentence overlap of two abstracts (see the module's docstring)."""
    return float(overlap_matrix([a], [b])[0, 0])


def split_versions(vectors: Sequence[np.ndarray], ids: Sequence[str], originals: Sequence[tuple[str, np.ndarray]],
                   k: int, threshold: float = VERSION_OVERLAP) -> tuple[list[int], dict[int, tuple[str, float]]]:
    """Of hits in their order (`vectors`: each one's sentence vectors; `ids`), the positions of the first `k` that
    repeat no paper (the numbered ranking) and, for each hit before the last of them that does, the paper it most
    likely is a version of and their overlap: one of `originals` ((paper id, vectors): the query's examples), or a
    better-ranked numbered hit (among the first AMONG_HITS)."""
    n = len(vectors)
    to_originals = overlap_matrix(vectors, [v for _, v in originals]) if originals else np.zeros((n, 0))
    first = list(vectors[:AMONG_HITS])
    among = overlap_matrix(first, first)
    numbered: list[int] = []
    versions: dict[int, tuple[str, float]] = {}
    names = [pid for pid, _ in originals]
    for i in range(n):
        if len(numbered) >= k:
            break
        near = [h for h in numbered if h < AMONG_HITS] if i < AMONG_HITS else []
        # its overlap with each original, then with each better numbered hit it is compared with
        overlaps = np.concatenate([to_originals[i], among[i, near] if near else np.zeros(0)])
        best = int(np.argmax(overlaps)) if len(overlaps) else -1
        if best < 0 or overlaps[best] < threshold:
            numbered.append(i)
        else:
            versions[i] = (names[best] if best < len(names) else ids[near[best - len(names)]], float(overlaps[best]))
    return numbered, versions
