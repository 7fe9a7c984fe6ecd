"""Request bodies both engines share: BM25 over title + abstract within the clause limit, the stats and sample
searches, and the nested paths a kNN searches."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ...domain import normalize_label
from .mapping import BM25_FIELDS, FACET_PATHS

#: Lucene's clause limit as both engines set it at its lowest: OpenSearch `indices.query.bool.max_clause_count`
#: (default 1024); Elasticsearch 8+ derives it from heap and thread pool, 1024 at least
BM25_MAX_CLAUSES = 1024


#: the `esqbe_en` tokenizer (`[^\p{L}\p{N}]+` splits): runs of letters and digits (`\w` minus `_` is exactly that in Python)
_WORD = re.compile(r"[^\W_]+")


#: `esqbe_max_39`: the engines' `length` filter counts UTF-16 code units
MAX_TOKEN_UTF16 = 39


def utf16_len(token: str) -> int:
    return len(token.encode("utf-16-le")) // 2


def analyzed_tokens(text: str) -> list[str]:
    """The query tokens the engines' `esqbe_en` analyzer makes, before stemming: one clause per token and field."""
    return [t.lower() for t in _WORD.findall(text) if utf16_len(t) <= MAX_TOKEN_UTF16]


def bm25_query(text: str, max_clauses: int = BM25_MAX_CLAUSES) -> dict:
    """BM25 over title + abstract (`most_fields`: the sum of both fields' scores), within the clause limit.

    A `multi_match` makes one term clause per analysed token and field, so a long query text (about 510+
    tokens over two fields) fails the whole search with too_many_clauses. Beyond the limit, each distinct
    token becomes one `multi_match` boosted by its count: BM25 is linear in the boost, so the scores are the
    same as the full query's while every token fits. If even the distinct tokens do not fit, the most frequent
    ones are kept (then the longest, a rough stand-in for rarity), within the limit."""
    plain = {"multi_match": {"query": text, "fields": list(BM25_FIELDS), "type": "most_fields"}}
    tokens = analyzed_tokens(text)
    per_token = len(BM25_FIELDS)
    if len(tokens) * per_token <= max_clauses:
        return plain
    counts = Counter(tokens)
    first = {t: i for i, t in reversed(list(enumerate(tokens)))}
    keep = sorted(counts, key=lambda t: (-counts[t], -utf16_len(t), first[t]))[: max(1, max_clauses // per_token)]
    keep.sort(key=first.__getitem__)  # in text order: a readable body
    should = []
    for token in keep:
        clause: dict[str, Any] = {"query": token, "fields": list(BM25_FIELDS), "type": "most_fields"}
        if counts[token] > 1:
            clause["boost"] = float(counts[token])
        should.append({"multi_match": clause})
    return {"bool": {"should": should}}


def bm25_body(text: str, size: int, restrict_to: Iterable[str] | None, exclude: Iterable[str],
              max_clauses: int = BM25_MAX_CLAUSES) -> dict:
    query: dict[str, Any] = {"must": [bm25_query(text, max_clauses)]}
    if restrict_to is not None:
        query["filter"] = [{"terms": {"paper_id": sorted(restrict_to)}}]
    if exclude:
        query["must_not"] = [{"terms": {"paper_id": sorted(exclude)}}]
    return {"size": size, "_source": False, "track_total_hits": False, "query": {"bool": query}}


def stats_body() -> dict:
    return {
        "size": 0,
        "track_total_hits": True,
        "aggs": {facet: {"nested": {"path": path}} for facet, path in FACET_PATHS.items()},
    }


def sample_body(n: int, seed: int) -> dict:
    """`n` documents in a seeded random order (random_score over `_seq_no`: the same order for the same
    seed while the index is unchanged), ids only, and the total count."""
    return {
        "size": n,
        "_source": False,
        "track_total_hits": True,
        "query": {"function_score": {"query": {"match_all": {}},
                                     "functions": [{"random_score": {"seed": seed, "field": "_seq_no"}}],
                                     "boost_mode": "replace"}},
    }


def facet_paths(facet: str | None) -> list[str]:
    """Nested paths a kNN searches: the facet's own, or all of them (no facet filter)."""
    if facet is None:
        return list(FACET_PATHS.values())
    label = normalize_label(facet)
    return [FACET_PATHS[label]]
