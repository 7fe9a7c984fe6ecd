"""Metadata filters on Elasticsearch and OpenSearch: the filterable copy of the metadata in each
document, and the filter clauses in BM25 and kNN request bodies (pre-filtering, as docs/engines.md says).

- Documents: `metadata` stays a stored, unindexed object (what hits show); its leaves are also written to
  `meta_kw.<path>` (keyword) and `meta_num.<path>` (double) by `esqbe.core.filters.flatten_for_engine`, mapped
  by two dynamic templates, so any key can be filtered without declaring it and a key holding numbers
  in one paper and text in another never breaks the mapping.
- BM25: the clauses go into `bool.filter`.
- kNN: into the kNN's own `filter` (ES top-level `knn.filter`, any query, parent-level since 8.11;
  OpenSearch `knn.<field>.filter`), so the engine searches only allowed papers (exact search when they
  are few). OpenSearch before 3.5 runs only term/terms as a parent-field filter inside a nested kNN
  (k-NN #2222, fixed by #2990 in 3.5): there the filter is first resolved to the ids it allows
  (`ids_body`, at most `MAX_RESOLVED_IDS`), then sent as a `terms` on `paper_id` like a re-ranking pool.

A user's own clause (`engine_filter`) goes to the engine as given from the CLI and the Python API; from
other people (`esqbe serve`) it must first pass `check_safe_clause`: the clause types in `SAFE_CLAUSES`
over plain field names, bounded in depth and size.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from ...core.filters import (
    ENGINE_KEYWORD_ROOT,
    ENGINE_NUMBER_ROOT,
    FilterError,
    MetadataFilter,
    flatten_for_engine,
    only_terms,
    to_query_dsl,
)

#: clause types an untrusted engine_filter may use, each with the options its per-field object may carry
SAFE_CLAUSES: dict[str, frozenset[str]] = {
    "term": frozenset({"value", "boost", "case_insensitive"}),
    "terms": frozenset(),  # {"field": [values]} (a terms *lookup* into another index is refused)
    "range": frozenset({"gt", "gte", "lt", "lte", "format", "boost"}),
    "exists": frozenset(),  # {"field": "name"}
    "match": frozenset({"query", "operator", "minimum_should_match", "boost"}),
    "prefix": frozenset({"value", "boost", "case_insensitive"}),
    "bool": frozenset({"must", "should", "filter", "must_not", "minimum_should_match", "boost"}),
}
SAFE_MAX_DEPTH = 8
SAFE_MAX_CLAUSES = 64
SAFE_MAX_VALUES = 1024  # values in all terms lists together
SAFE_MAX_STRING = 1000
#: a document field a user may name: letters, digits, _ - . (dotted paths), not starting with _ (the engine's own
#: _index, _id, _routing, _source ... are not the user's fields) and no wildcard patterns
_FIELD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")

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


def check_safe_clause(clause) -> None:
    """Refuse an engine_filter from someone untrusted unless it is made only of `SAFE_CLAUSES` (term, terms,
    range, exists, match, prefix, bool) over plain field names, at most `SAFE_MAX_DEPTH` deep and
    `SAFE_MAX_CLAUSES` clauses: no scripts, wrapper queries, terms lookups into other indices, query_string,
    joins or anything else the engine can do. A FilterError names the clause refused and where it is."""
    budget = {"clauses": 0, "values": 0}
    _check_clause(clause, "engine_filter", 1, budget)


def _check_clause(clause, where: str, depth: int, budget: dict) -> None:
    if depth > SAFE_MAX_DEPTH:
        raise FilterError(f"{where}: nested deeper than {SAFE_MAX_DEPTH} clauses")
    budget["clauses"] += 1
    if budget["clauses"] > SAFE_MAX_CLAUSES:
        raise FilterError(f"engine_filter: more than {SAFE_MAX_CLAUSES} clauses")
    if not isinstance(clause, dict) or len(clause) != 1:
        raise FilterError(f"{where}: expected one clause, a JSON object with one key such as {{\"term\": {{...}}}}")
    (kind, body), = clause.items()
    where = f"{where}.{kind}"
    if kind not in SAFE_CLAUSES:
        raise FilterError(f"{where}: the clause type {kind!r} is not allowed here; allowed: "
                          + ", ".join(SAFE_CLAUSES))
    if not isinstance(body, dict):
        raise FilterError(f"{where}: expected an object")
    if kind == "bool":
        for key, value in body.items():
            if key not in SAFE_CLAUSES["bool"]:
                raise FilterError(f"{where}: {key!r} is not allowed in bool")
            if key in ("minimum_should_match", "boost"):
                _check_scalar(value, f"{where}.{key}", budget)
                continue
            for i, sub in enumerate(value if isinstance(value, list) else [value]):
                _check_clause(sub, f"{where}.{key}[{i}]", depth + 1, budget)
        return
    if kind == "exists":
        if set(body) != {"field"}:
            raise FilterError(f"{where}: expected {{\"field\": NAME}}")
        _check_field(body["field"], where)
        return
    fields = [k for k in body if k != "boost"]
    if len(fields) != 1:
        raise FilterError(f"{where}: expected one field, {{FIELD: ...}}")
    field = fields[0]
    _check_field(field, where)
    value = body[field]
    if kind == "terms":
        if not isinstance(value, list):
            raise FilterError(f"{where}.{field}: expected a list of values (a terms lookup into another index is not allowed)")
        budget["values"] += len(value)
        if budget["values"] > SAFE_MAX_VALUES:
            raise FilterError(f"{where}.{field}: more than {SAFE_MAX_VALUES} values")
        for v in value:
            _check_scalar(v, f"{where}.{field}", budget)
        return
    if isinstance(value, dict):
        for key, v in value.items():
            if key not in SAFE_CLAUSES[kind]:
                raise FilterError(f"{where}.{field}: {key!r} is not allowed in {kind}")
            _check_scalar(v, f"{where}.{field}.{key}", budget)
    elif kind == "range":
        raise FilterError(f"{where}.{field}: expected an object such as {{\"gte\": 2019}}")
    else:
        _check_scalar(value, f"{where}.{field}", budget)


def _check_field(field, where: str) -> None:
    if not isinstance(field, str) or not _FIELD.match(field):
        raise FilterError(f"{where}: {field!r} is not a field name a filter may use (letters, digits, _ - ., "
                          "not starting with _ and no wildcards)")


def _check_scalar(value, where: str, budget: dict) -> None:
    if isinstance(value, str):
        if len(value) > SAFE_MAX_STRING:
            raise FilterError(f"{where}: a value over {SAFE_MAX_STRING} characters")
    elif not isinstance(value, (int, float, bool)) or value is None:
        raise FilterError(f"{where}: expected a string, number or boolean")
