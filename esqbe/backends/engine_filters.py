"""Metadata filters on Elasticsearch and OpenSearch: the filterable copy of the metadata in each
document, and the filter clauses in BM25 and kNN request bodies (pre-filtering, as docs/engines.md says).

- Documents: `metadata` stays a stored, unindexed object (what hits show); its leaves are also written to
  `meta_kw.<path>` (keyword) and `meta_num.<path>` (double) by `esqbe.filters.flatten_for_engine`, mapped
  by two dynamic templates, so any key can be filtered without declaring it and a key holding numbers
  in one paper and text in another never breaks the mapping.
- BM25: the clauses go into `bool.filter`.
- kNN: into the kNN's own `filter` (ES top-level `knn.filter`, any query, parent-level since 8.11;
  OpenSearch `knn.<field>.filter`), so the engine searches only allowed papers (exact search when they
  are few). OpenSearch before 3.5 runs only term/terms as a parent-field filter inside a nested kNN
  (k-NN #2222, fixed by #2990 in 3.5): there the filter is first resolved to the ids it allows
  (`ids_body`, at most `MAX_RESOLVED_IDS`), then sent as a `terms` on `paper_id` like a re-ranking pool.
"""
from __future__ import annotations

import copy
from typing import Any

from ..filters import ENGINE_KEYWORD_ROOT, ENGINE_NUMBER_ROOT, MetadataFilter, flatten_for_engine, only_terms, to_query_dsl

#: OpenSearch before 3.5: a filter matching more papers than this is applied after the kNN instead
MAX_RESOLVED_IDS = 10_000

FILTER_MAPPING_PROPERTIES: dict[str, dict] = {
    ENGINE_KEYWORD_ROOT: {"type": "object", "dynamic": "true"},
    ENGINE_NUMBER_ROOT: {"type": "object", "dynamic": "true"},
}
FILTER_DYNAMIC_TEMPLATES: list[dict] = [
    {"esqbe_meta_kw": {"path_match": f"{ENGINE_KEYWORD_ROOT}.*", "match_mapping_type": "string",
                       "mapping": {"type": "keyword", "ignore_above": 1024}}},
    {"esqbe_meta_num_double": {"path_match": f"{ENGINE_NUMBER_ROOT}.*", "match_mapping_type": "double",
                               "mapping": {"type": "double"}}},
    {"esqbe_meta_num_long": {"path_match": f"{ENGINE_NUMBER_ROOT}.*", "match_mapping_type": "long",
                             "mapping": {"type": "double"}}},
]


def add_filter_mapping(mapping: dict) -> dict:
    """The index mapping with the filterable metadata fields (idempotent; `mapping` is changed in place)."""
    mapping.setdefault("properties", {}).update(copy.deepcopy(FILTER_MAPPING_PROPERTIES))
    templates = mapping.setdefault("dynamic_templates", [])
    names = {next(iter(t)) for t in templates}
    templates.extend(copy.deepcopy(t) for t in FILTER_DYNAMIC_TEMPLATES if next(iter(t)) not in names)
    return mapping


def filter_fields(metadata: dict) -> dict[str, Any]:
    """`meta_kw` / `meta_num` of one document (empty objects left out)."""
    kw, num = flatten_for_engine(metadata)
    out: dict[str, Any] = {}
    if kw:
        out[ENGINE_KEYWORD_ROOT] = kw
    if num:
        out[ENGINE_NUMBER_ROOT] = {k: [float(x) for x in v] for k, v in num.items()}
    return out


def filter_clauses(flt: MetadataFilter | None, resolve=None) -> list[dict]:
    if not flt:
        return []
    return to_query_dsl(flt) if resolve is None else to_query_dsl(flt, resolve)


def knn_needs_ids(engine: str, version: tuple[int, ...], clauses: list[dict]) -> bool:
    """Whether this engine version cannot run these clauses as a parent filter inside a nested kNN."""
    return engine == "opensearch" and tuple(version)[:2] < (3, 5) and bool(clauses) and not only_terms(clauses)


def ids_body(clauses: list[dict], size: int = MAX_RESOLVED_IDS) -> dict:
    """One search listing the ids (`_id`) a filter allows, no scoring, no source: for OpenSearch < 3.5's kNN."""
    return {"size": size, "_source": False, "track_total_hits": size + 1, "query": {"bool": {"filter": clauses}}}


def add_to_bm25(body: dict, clauses: list[dict]) -> dict:
    if clauses:
        bool_q = body.setdefault("query", {}).setdefault("bool", {})
        existing = bool_q.get("filter", [])
        bool_q["filter"] = (existing if isinstance(existing, list) else [existing]) + list(clauses)
    return body


def add_to_knn(engine: str, body: dict, clauses: list[dict], *, post: bool = False) -> dict:
    """The clauses as the kNN's own (pre-)filter; with `post`, around the kNN query instead (OpenSearch
    < 3.5 with a filter too wide to resolve to ids)."""
    if not clauses:
        return body
    if engine == "elasticsearch":
        knn = body["knn"]
        existing = knn.get("filter", [])
        knn["filter"] = (existing if isinstance(existing, list) else [existing]) + list(clauses)
        return body
    if post:
        body["query"] = {"bool": {"must": [body["query"]], "filter": list(clauses)}}
        return body
    for spec in _os_knn_specs(body):
        existing = spec.get("filter")
        parts = ([existing] if existing else []) + list(clauses)
        spec["filter"] = parts[0] if len(parts) == 1 else {"bool": {"filter": parts}}
    return body


def _os_knn_specs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "knn" and isinstance(value, dict):
                yield from (s for s in value.values() if isinstance(s, dict))
            else:
                yield from _os_knn_specs(value)
    elif isinstance(node, list):
        for x in node:
            yield from _os_knn_specs(x)
