"""Cited text identification: which sentences of a paper does a citing sentence point to?

`CitedTextMatcher` ranks a paper's sentences for citing sentences with the asymmetric partial
matching of `esqbe.rescore.asym` (as published by Ricci et al.), the symmetric baseline, Okapi BM25, or
the asymmetric score fused with BM25. Its options (`CiteOptions`, given as `--param KEY=VALUE`
or a YAML file) are the paper's design choices:

    method      asym (default) | symm (cosine of mean word vectors) | bm25
    d           4      sigma(x) = max(x, 0)^d; d = 1 is plain soft coverage
    alpha       1e-4   query word weights alpha / (alpha + p(w)); p(w) from the word counts
    weights     true   false: every query word weighs 1
    words       DIR    word vectors from `esqbe train-words` (default: the encoder's token vectors)
    max_tokens  100    truncate each text after this many tokens (0: no truncation)
    markers     true   remove citation markers ("(Author, 2010)", "Author et al. (2010)", "[3]")
    stopwords   true   drop the paper's stop words from both sides
    min_count   0      words seen fewer times in the word-vector corpus get no vector (as if trained with that
                       min count; the published setting is 35)
    exact       auto   identical tokens match with cosine 1 (a word without a vector still matches
                       itself); auto = true with word vectors, false with the encoder's (contextual) tokens
    bm25_weight 0      > 0: add BM25 (over its citance's ceiling, in [0, 1)) to the asym (or symm) score with this
                       weight: (1 - w) x asym + w x BM25 / ceiling, each sentence scored on its own

Token vectors: with `words`, the words of the `train-words` directory (its casing and counts);
otherwise the encoder's final-layer wordpiece vectors, each text encoded alone, with p(w) from
the index's wordpiece counts (or, without an index, from the texts being matched).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..errors import ParameterError
from ..rescore.asym import (
    TokenSet,
    asym_scores,
    best_partners,
    bm25_scores,
    is_stop_word,
    strip_citation_markers,
    symm_scores,
    token_frequency_weights,
    word_tokens,
)

METHODS = ("asym", "symm", "bm25")


def _bool(name: str, value) -> bool:
    from ..rescore.rescorers import (
        _bool as parse_bool,  # the rescorers' parameter parsing, one definition
    )

    return parse_bool("cite", name, value)


def _number(name: str, value, *, minimum: float = 0.0, strict: bool = True, whole: bool = False):
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"cite: {name} must be a number (got {value!r})") from None
    if not np.isfinite(x) or (x <= minimum if strict else x < minimum):
        raise ParameterError(f"cite: {name} must be {'greater than' if strict else 'at least'} {minimum:g} (got {value!r})")
    if whole:
        if x != int(x):
            raise ParameterError(f"cite: {name} must be a whole number (got {value!r})")
        return int(x)
    return x


@dataclass(frozen=True)
class CiteOptions:
    method: str = "asym"
    d: float = 4.0
    alpha: float = 1e-4
    weights: bool = True
    words: str | None = None
    max_tokens: int = 100
    markers: bool = True
    stopwords: bool = True
    min_count: int = 0
    exact: bool | None = None
    bm25_weight: float = 0.0

    @classmethod
    def from_params(cls, params: dict | None = None, **more) -> CiteOptions:
        """Options from `--param` pairs / a YAML mapping (strings are coerced; unknown keys are errors)."""
        params = {**(params or {}), **{k: v for k, v in more.items() if v is not None}}
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ParameterError(f"cite: unknown option(s) {', '.join(unknown)}; known: {', '.join(known)}")
        out = {}
        for key, value in params.items():
            if key == "method":
                if value not in METHODS:
                    raise ParameterError(f"cite: method must be one of {', '.join(METHODS)} (got {value!r})")
                out[key] = value
            elif key in ("d", "alpha"):
                out[key] = _number(key, value)
            elif key == "bm25_weight":
                out[key] = _number(key, value, strict=False)
                if out[key] > 1:
                    raise ParameterError(f"cite: bm25_weight must be between 0 and 1 (got {value!r})")
            elif key in ("max_tokens", "min_count"):
                out[key] = _number(key, value, strict=False, whole=True)
            elif key == "exact":
                out[key] = None if value in (None, "auto") else _bool(key, value)
            elif key == "words":
                out[key] = None if value in (None, "", "encoder") else str(value)
            else:
                out[key] = _bool(key, value)
        return cls(**out)

    def to_params(self) -> dict:
        """The options that differ from the defaults (what a command line must say)."""
        default = CiteOptions()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}

    @property
    def exact_matching(self) -> bool:
        return self.words is not None if self.exact is None else self.exact


@dataclass
class WordMatch:
    query_word: str
    matched_word: str
    cosine: float
    weight: float  # the query word's share of the score: W(w) / sum W


@dataclass
class CitedSentence:
    rank: int
    index: int  # position among the paper's sentences
    sentence_id: str
    text: str
    score: float
    matches: list[WordMatch] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CiteResult:
    paper_id: str
    text: str
    method: str
    hits: list[CitedSentence]

    def to_dict(self) -> dict:
        return {"paper_id": self.paper_id, "text": self.text, "method": self.method, "hits": [h.to_dict() for h in self.hits]}


CountsFn = Callable[[], "tuple[dict[str, int], int] | None"]


class CitedTextMatcher:
    """Scores citing sentences against candidate sentences, all at once (see the module docstring).

    encoder: needed when `words` is not set (token vectors); counts: a function returning the
    corpus wordpiece counts for the encoder path (e.g. the index's `token_counts`)."""

    def __init__(self, options: CiteOptions | None = None, *, encoder=None, counts: CountsFn | None = None):
        self.options = options or CiteOptions()
        self.encoder = encoder
        self._counts_fn = counts
        self.words = None
        if self.options.method != "bm25":
            if self.options.words:
                from ..rescore.words import WordVectors

                self.words = WordVectors.load(self.options.words)
            elif encoder is None:
                raise ParameterError("cite: without word vectors (words=DIR) the matcher needs an encoder for token vectors")

    # --- text -> tokens ---------------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        return strip_citation_markers(text, narrative=True) if self.options.markers else text

    def _cut(self, tokens: list[str]) -> list[str]:
        n = self.options.max_tokens
        tokens = tokens[:n] if n else tokens
        return [t for t in tokens if not is_stop_word(t)] if self.options.stopwords else tokens

    def token_vectors(self, texts: Sequence[str]) -> list[tuple[list[str], np.ndarray]]:
        """Per text: its tokens after preparation and their unit vectors (zero rows: no vector)."""
        if self.words is not None:
            out = []
            for text in texts:
                toks = self._cut(self.words.tokens(text, markers=self.options.markers))
                vecs, known = self.words.vectors(toks)
                if self.options.min_count > 1:
                    counts = self.words.counts()[0]
                    rare = np.array([counts.get(t, 0) < self.options.min_count for t in toks], dtype=bool)
                    known = known & ~rare
                    vecs[rare] = 0.0
                if not self.options.exact_matching:  # published: words without a vector are <unk>, a stop word
                    toks, vecs = [t for t, k in zip(toks, known) if k], vecs[known]
                out.append((toks, vecs))
            return out
        cleaned = [self._clean(t) for t in texts]
        keep = [i for i, t in enumerate(cleaned) if t.strip()]
        out = [([], np.zeros((0, self.encoder.dim), np.float32)) for _ in texts]
        limit = self.options.max_tokens or 10_000
        for i, (toks, vecs) in zip(keep, self.encoder.token_vectors([cleaned[i] for i in keep], max_tokens=limit)):
            sel = [j for j, t in enumerate(toks) if not (self.options.stopwords and is_stop_word(t))]
            out[i] = ([toks[j] for j in sel], np.asarray(vecs, np.float32)[sel])
        return out

    def bm25_tokens(self, texts: Sequence[str]) -> list[tuple[list[str], np.ndarray]]:
        out = []
        for text in texts:
            toks = word_tokens(self._clean(text), cased=False)
            toks = [t for t in toks if not is_stop_word(t) and any(c.isalnum() for c in t)]
            out.append((toks, np.zeros((len(toks), 0), np.float32)))
        return out

    def counts(self, token_lists: Sequence[list[str]]) -> tuple[dict[str, int], int]:
        if self.words is not None:
            return self.words.counts()
        found = self._counts_fn() if self._counts_fn is not None else None
        if found is None:
            from collections import Counter

            c = Counter(t for toks in token_lists for t in toks)
            found = (c, sum(c.values()))
        return found

    # --- scoring ------------------------------------------------------------------------------------
    def score(self, queries: Sequence[str], sentences: Sequence[str]) -> np.ndarray:
        """(len(queries), len(sentences)) scores, higher = more likely cited."""
        o = self.options
        vocab: dict[str, int] = {}
        if o.method == "bm25" or o.bm25_weight > 0:
            bq = TokenSet.build(self.bm25_tokens(queries), vocab, 0)
            bm25 = bm25_scores(bq, TokenSet.build(self.bm25_tokens(sentences), vocab, 0), of_ceiling=o.method != "bm25")
            if o.method == "bm25":
                return bm25
        vocab = {}
        q_per, c_per = self.token_vectors(queries), self.token_vectors(sentences)
        dim = self.words.dim if self.words is not None else self.encoder.dim
        q, c = TokenSet.build(q_per, vocab, dim), TokenSet.build(c_per, vocab, dim)
        if o.method == "symm":
            scores = symm_scores(q, c)
        else:
            scores = asym_scores(q, self.query_weights(q, c_per), c, o.d, exact=o.exact_matching)
        if o.bm25_weight > 0:
            # each part on its own fixed scale: a sentence's score never depends on the paper's other
            # sentences' scores (asym's soft coverage and symm's cosine as they are, BM25 over its query's ceiling)
            scores = (1.0 - o.bm25_weight) * scores + o.bm25_weight * bm25
        return scores

    def query_weights(self, q: TokenSet, others: Sequence[tuple[list[str], np.ndarray]] = ()) -> np.ndarray:
        if not self.options.weights:
            return np.ones(len(q.tokens))
        counts, total = self.counts([q.tokens, *(toks for toks, _ in others)])
        return token_frequency_weights(q.tokens, counts, total, self.options.alpha)

    def explain(self, query: str, sentence: str, limit: int = 6) -> list[WordMatch]:
        """The query words that carry a sentence's score: each with its best partner in the sentence."""
        if self.options.method == "bm25":
            q, s = self.bm25_tokens([query])[0][0], set(self.bm25_tokens([sentence])[0][0])
            return [WordMatch(t, t, 1.0, 0.0) for t in dict.fromkeys(q) if t in s][:limit]
        (q_toks, q_vecs), (c_toks, c_vecs) = self.token_vectors([query, sentence])
        if not q_toks or not c_toks:
            return []
        vocab: dict[str, int] = {}
        q_ids = np.array([vocab.setdefault(t, len(vocab)) for t in q_toks])
        c_ids = np.array([vocab.setdefault(t, len(vocab)) for t in c_toks])
        j, cos = best_partners(q_vecs, q_ids, c_vecs, c_ids, self.options.exact_matching)
        w = self.query_weights(TokenSet(q_toks, q_vecs, q_ids, np.array([len(q_toks)])), [(c_toks, c_vecs)])
        share = w / max(w.sum(), 1e-300)
        power = self.options.d if self.options.method == "asym" else 1.0
        contrib = share * np.maximum(cos, 0.0) ** power
        order = np.argsort(-contrib, kind="stable")[:limit]
        return [WordMatch(whole_word(q_toks[i], query), whole_word(c_toks[j[i]], sentence), round(float(cos[i]), 4),
                          round(float(share[i]), 4)) for i in order if contrib[i] > 0]

    def rank(self, queries: Sequence[str], sentences: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Per query, the top `k` (sentence index, score), best first (ties: document order)."""
        scores = self.score(queries, sentences)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[(int(j), float(scores[i, j])) for j in row] for i, row in enumerate(order)]


def whole_word(token: str, text: str) -> str:
    """The word of `text` a wordpiece belongs to, for people (`##ego` in "...in San Diego..." -> `Diego`): a word
    equal to the token, else one starting with it, else (a `##` piece) one containing it; the token if none."""
    import re

    piece = token[2:] if token.startswith("##") else token
    if not piece:
        return token
    words = re.findall(r"\w[\w\-']*", text)
    low = piece.lower()
    if not token.startswith("##"):
        for pick in (lambda w: w.lower() == low, lambda w: w.lower().startswith(low)):
            found = next((w for w in words if pick(w)), None)
            if found:
                return found
        return token
    found = next((w for w in words if low in w.lower()[1:]), None)
    return found or token

