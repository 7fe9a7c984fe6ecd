"""Asymmetric partial matching (Ricci et al., cited text identification), shared by `esqbe cite`,
`esqbe eval clscisumm` and the `asym_token` rescorer.

For a query text S_q and candidate text S_c, both multisets of unit token vectors:

    sim(S_q, S_c) = sum over query tokens w of W(w) * max over candidate tokens w' of sigma(cos(w, w')),
    W(w) = alpha / (alpha + p(w)),  sigma(x) = max(x, 0)^d

(the candidate must cover the query; its extra words cost nothing). Candidates are ranked by
their own score (top K, not greedy coverage). Scores here are divided by the query's total
weight, which leaves every ranking unchanged and puts sim in [0, 1].

Everything is batched: the tokens of many texts lie back to back (`TokenSet`), one float32
matmul per chunk gives every (query token, candidate token) cosine, `np.maximum.reduceat`
takes per-candidate maxima and one matrix product pools them into per-query scores.

Also here: the text preparation the paper found to matter (citation-marker removal, truncation,
casing, stop words), the symmetric baseline (cosine of mean word vectors) and Okapi BM25 over
the candidate sentences, all over the same `TokenSet`s.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: the lowercased stop-word list of Ricci et al. (appendix E), as published
STOP_WORDS = frozenset("""
@-@ = <eos> <unk> disambiguation etc etc. - @card@ ~ _ @ ; & * < > ( ) \\ | { } ] [ : ' " / ? ! , 't 'd 'll 's 'm 've
a about above after again against all am an and any are aren as at be because been before being below between both
but by can cannot could couldn did didn do does doesn doing don down during each few for from further had hadn has
hasn have haven having he her here hers herself him himself his how i if in into is isn it its itself let me more
most mustn my myself no nor not of off on once only or other ought our ours ourselves out over own same she should
shouldn so some such than that the their theirs them themselves then there these they this those through to too
under until up very was wasn we were weren what when where which while who whom why with won would wouldn you your
yours yourself yourselves
""".split())

# --- text preparation ---------------------------------------------------------------------------------

#: "(Author, 2010)", "(Author et al., 2010; Other and Else, 2011a)", "(e.g., Author, 2010)", "(Liu 1986a, 1986b)".
#: Each item is an atomic group: without it a long list that never closes (a sentence cut inside the
#: parentheses) backtracks exponentially (minutes for one CL-SciSumm citance).
_YEAR = r"(?:19|20)\d{2}[a-z]?"
_AUTHOR_YEAR = rf"(?>[A-Z][^()\[\];]*?,?\s*{_YEAR}(?:\s*,\s*(?:and\s+)?{_YEAR})*)"
_CITATION_MARKERS = re.compile(
    rf"\(\s*(?:(?:e\.g\.|i\.e\.|see|cf\.)[,\s]+)?{_AUTHOR_YEAR}(?:\s*;\s*{_AUTHOR_YEAR})*+\s*\)"
    r"|\(\s*(?:19|20)\d{2}[a-z]?(?:\s*[,;]\s*(?:19|20)\d{2}[a-z]?)*\s*\)"  # "Author et al. (2010)"
    r"|\[\s*\d+(?:\s*[-\u2013,;]\s*\d+)*\s*\]"  # "[12]", "[3, 5-7]"
)
#: "Tillmann and Ney (2000)", "Och et al. (2001)", "Sproat et al." before a year in parentheses.
#: A name is at most 40 letters (a run of them is a name start at every hyphen: unbounded, "A-" * 10000
#: took 13 s, each start scanning the rest); years at most 20. Every pattern here is linear in its text.
_NAME = r"[A-Z][A-Za-z'\-]{0,40}+"
_NARRATIVE = re.compile(
    rf"\b{_NAME}(?:\s+(?:and|&)\s+{_NAME}|\s+et\s+al\.?)?\s*\(\s*{_YEAR}(?:\s*[,;]\s*{_YEAR}){{0,20}}+\s*\)"
)
#: space before punctuation (the lookbehind starts a match only where a run of spaces starts: linear)
_SPACE_BEFORE_PUNCT = re.compile(r"(?<!\s)\s++([,.;:)])")


def strip_citation_markers(text: str, *, narrative: bool = False) -> str:
    """Drop citation markers ("(Author, 2010)", "(2010)", "[12]"): names and years are not content
    and would match other papers' citations of the same work. With `narrative`, "Author et al.
    (2010)" loses the names too (the cited-text matcher's default)."""
    if narrative:
        text = _NARRATIVE.sub(" ", text)
    text = _CITATION_MARKERS.sub(" ", text)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return " ".join(text.split())


_TOKEN = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:-\w+)*|'\w+|[^\w\s]")


def word_tokens(text: str, *, cased: bool = True) -> list[str]:
    """Words, numbers and punctuation marks ("BBN's" -> BBN 's; "word-by-word" stays one token)."""
    tokens = _TOKEN.findall(text)
    return tokens if cased else [t.lower() for t in tokens]


def is_stop_word(token: str) -> bool:
    return token.lower() in STOP_WORDS


def token_frequency_weights(tokens: Sequence[str], counts: dict[str, int], total: int, alpha: float) -> np.ndarray:
    """W(w) = alpha / (alpha + p(w)), p(w) = count / total: frequent tokens count less (SIF weights).
    A token the counts never saw gets p = 0, weight 1."""
    p = np.fromiter((counts.get(t, 0) for t in tokens), dtype=np.float64, count=len(tokens)) / max(int(total), 1)
    return alpha / (alpha + p)


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# --- token sets -----------------------------------------------------------------------------------------


@dataclass
class TokenSet:
    """The tokens of S texts back to back: text s owns rows starts[s]:starts[s] + lengths[s].

    vectors: (N, d) float32, unit rows (zero rows for tokens without a vector);
    ids: (N,) int64 token ids shared by the sets compared in one call (equal ids = the same token
    string), used for exact matching and BM25."""

    tokens: list[str]
    vectors: np.ndarray
    ids: np.ndarray
    lengths: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        if not len(self.lengths):
            return np.zeros(0, np.int64)
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    @property
    def owner(self) -> np.ndarray:
        """(N,) which text each token belongs to."""
        return np.repeat(np.arange(len(self.lengths)), self.lengths)

    def text_tokens(self, s: int) -> list[str]:
        a = int(self.starts[s])
        return self.tokens[a : a + int(self.lengths[s])]

    @classmethod
    def build(cls, per_text: Sequence[tuple[list[str], np.ndarray]], vocab: dict[str, int], dim: int) -> TokenSet:
        tokens = [t for toks, _ in per_text for t in toks]
        vecs = [v for toks, v in per_text if len(toks)]
        vectors = np.concatenate(vecs).astype(np.float32, copy=False) if vecs else np.zeros((0, dim), np.float32)
        ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in tokens), dtype=np.int64, count=len(tokens))
        return cls(tokens, unit_rows(vectors) if len(vectors) else vectors, ids,
                   np.array([len(toks) for toks, _ in per_text], dtype=np.int64))


def segment_max_cosines(query_tokens: np.ndarray, cand_tokens: np.ndarray, starts: np.ndarray, *,
                        query_ids: np.ndarray | None = None, cand_ids: np.ndarray | None = None,
                        max_cells: int = 1 << 24) -> np.ndarray:
    """(Mq, S): for every query token, its best cosine within each of S candidate segments.

    query_tokens (Mq, d) unit-norm; cand_tokens (Nc, d) any norm, the S non-empty segments back
    to back, segment s starting at starts[s]. One matmul per chunk of segments, sized so a chunk's
    cosines stay under `max_cells` floats, scaled by the candidate tokens' inverse norms (cheaper
    than normalising the big matrix); `np.maximum.reduceat` takes the per-segment maxima.
    With `query_ids`/`cand_ids`, identical tokens count as cosine 1 (exact matching: a word
    without a vector still matches itself).
    """
    n_q, n_c, n_seg = len(query_tokens), len(cand_tokens), len(starts)
    out = np.empty((n_q, n_seg), dtype=np.float32)
    bounds = np.append(starts, n_c)
    per_chunk = max(max_cells // max(n_q, 1), 1)
    exact = query_ids is not None and cand_ids is not None
    s = 0
    while s < n_seg:
        # segments s..e-1, at least one, their tokens under per_chunk unless one alone is bigger
        e = max(int(np.searchsorted(bounds, bounds[s] + per_chunk, side="right")) - 1, s + 1)
        e = min(e, n_seg)
        lo, hi = bounds[s], bounds[e]
        chunk = np.asarray(cand_tokens[lo:hi], dtype=np.float32)
        inv_norms = 1.0 / np.maximum(np.sqrt(np.einsum("ij,ij->i", chunk, chunk)), 1e-12)
        cos = (np.asarray(query_tokens, dtype=np.float32) @ chunk.T) * inv_norms[None, :]
        if exact:
            assert query_ids is not None and cand_ids is not None  # what `exact` says
            cos = np.where(query_ids[:, None] == cand_ids[None, lo:hi], np.float32(1.0), cos)
        out[:, s:e] = np.maximum.reduceat(cos, starts[s:e] - lo, axis=1)
        s = e
    return out


def asym_scores(query: TokenSet, query_weights: np.ndarray, cands: TokenSet, power: float, *,
                exact: bool = False, pool: np.ndarray | None = None) -> np.ndarray:
    """(m, S) asymmetric scores of m query texts against S candidate texts, each in [0, 1]:
    sum over a query's tokens of W * max(cos to the candidate's tokens, 0)^power, over the sum of W.

    query_weights (Mq,): W per query token. `pool` (m, Mq) overrides how token terms are summed into
    query scores (default: each text's tokens, weighted by W / sum W). A text without tokens scores 0.
    """
    m, n_seg = len(query.lengths), len(cands.lengths)
    if pool is None:
        owner = query.owner
        totals = np.bincount(owner, weights=query_weights, minlength=m)
        pool = np.zeros((m, len(query_weights)))
        pool[owner, np.arange(len(query_weights))] = query_weights / np.maximum(totals[owner], 1e-300)
    out = np.zeros((pool.shape[0], n_seg))
    nonempty = np.flatnonzero(cands.lengths > 0)
    if len(nonempty) and len(query.tokens):
        # the non-empty segments are already back to back in token order
        starts = cands.starts[nonempty]
        best = segment_max_cosines(query.vectors, cands.vectors, starts,
                                   query_ids=query.ids if exact else None, cand_ids=cands.ids if exact else None)
        out[:, nonempty] = pool @ (np.maximum(best.astype(np.float64), 0.0) ** power)
    return out


def best_partners(query_vecs: np.ndarray, query_ids: np.ndarray, cand_vecs: np.ndarray, cand_ids: np.ndarray,
                  exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """For each query token, its best candidate token (index, cosine) within one candidate text."""
    cos = np.asarray(query_vecs, np.float32) @ np.asarray(cand_vecs, np.float32).T
    if exact:
        cos = np.where(query_ids[:, None] == cand_ids[None, :], np.float32(1.0), cos)
    j = cos.argmax(axis=1)
    return j, cos[np.arange(len(j)), j]


def symm_scores(query: TokenSet, cands: TokenSet) -> np.ndarray:
    """(m, S) cosine between mean token vectors (the symmetric baseline; texts without vectors score 0)."""

    def means(ts: TokenSet) -> np.ndarray:
        sums = np.zeros((len(ts.lengths), ts.vectors.shape[1] if ts.vectors.ndim == 2 else 0), np.float64)
        if len(ts.tokens):
            np.add.at(sums, ts.owner, ts.vectors)
        return unit_rows(sums)

    return (means(query) @ means(cands).T).astype(np.float64)


def bm25_scores(query: TokenSet, cands: TokenSet, *, k1: float = 1.2, b: float = 0.75,
                of_ceiling: bool = False) -> np.ndarray:
    """(m, S) Okapi BM25 of each query text against the S candidate texts as the collection
    (IDF ln(1 + (N - df + 0.5) / (df + 0.5)) over the S texts; each query token occurrence counts). `of_ceiling`:
    each row over its query's ceiling, sum of IDF x (k1 + 1) over its tokens (what a text holding every query word
    without end would score), so in [0, 1) and a function of the query, the text and the collection only."""
    m, n_seg = len(query.lengths), len(cands.lengths)
    if not len(cands.tokens) or not len(query.tokens):
        return np.zeros((m, n_seg))
    vocab = int(max(query.ids.max(initial=-1), cands.ids.max(initial=-1))) + 1
    tf = np.zeros((vocab, n_seg))
    np.add.at(tf, (cands.ids, cands.owner), 1.0)
    df = (tf > 0).sum(axis=1)
    idf = np.log1p((n_seg - df + 0.5) / (df + 0.5))
    lengths = cands.lengths.astype(np.float64)
    norm = k1 * (1.0 - b + b * lengths / max(lengths.mean(), 1e-12))
    weight = idf[:, None] * tf * (k1 + 1.0) / (tf + norm[None, :])  # (V, S)
    qtf = np.zeros((m, vocab))
    np.add.at(qtf, (query.owner, query.ids), 1.0)
    if of_ceiling:
        ceiling = qtf @ (idf * (k1 + 1.0))
        return (qtf @ weight) / np.where(ceiling > 0, ceiling, 1.0)[:, None]
    return qtf @ weight
