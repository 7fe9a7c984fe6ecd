"""Reading a search body as the engines would: the fields it names, its query vectors, the version-gated features it
uses, the Lucene clauses it becomes, and `_source` filtering as the engines apply it. Pure functions over the JSON the
real clients send (tests/fakes/engines.py answers with them; the contract tests assert with them)."""
from __future__ import annotations

import json
import re

from esqbe.backends.engines.mapping import VECTOR_FIELDS


def lucene_clauses(node) -> int:
    """Leaf clauses a search body becomes in Lucene, counted as the engines' analyzer would split the text
    (one term clause per token and field of a match/multi_match; repeats counted, as the builder sees them)."""
    if isinstance(node, list):
        return sum(lucene_clauses(x) for x in node)
    if not isinstance(node, dict):
        return 0
    total = 0
    for key, value in node.items():
        if key == "multi_match":
            total += len(re.findall(r"[^\W_]+", value["query"])) * len(value["fields"])
        elif key == "match":
            (spec,) = value.values()
            total += len(re.findall(r"[^\W_]+", spec["query"] if isinstance(spec, dict) else spec))
        else:
            total += lucene_clauses(value)
    return total


def filter_source(src: dict, includes, excludes: set, omit_vectors: bool) -> dict:
    """`_source` filtering as the engines do it (top-level and `path.leaf` includes/excludes); `omit_vectors`:
    ES 9.2+ leaving dense_vector values out."""
    src = json.loads(json.dumps(src))
    if includes:
        wanted = {}
        for field in includes:
            path, _, leaf = field.partition(".")
            if path not in src:
                continue
            if not leaf:
                wanted[path] = src[path]
            elif isinstance(src[path], dict):  # an object's key (metadata.facet_probs)
                if leaf in src[path]:
                    wanted.setdefault(path, {})[leaf] = src[path][leaf]
            else:
                rows = wanted.setdefault(path, [{} for _ in src[path]])
                for row, full in zip(rows, src[path]):
                    if leaf in full:
                        row[leaf] = full[leaf]
        src = wanted
    for field in set(excludes) | (set(VECTOR_FIELDS) if omit_vectors else set()):
        path, _, leaf = field.partition(".")
        if not leaf:  # a top-level field
            src.pop(path, None)
            continue
        for row in src.get(path) or ():
            row.pop(leaf, None)
    return src


def is_bm25(body: dict) -> bool:
    return "multi_match" in json.dumps(body.get("query", {}))


def mapping_fields(mapping: dict) -> dict[str, dict]:
    """Flattened field name -> field mapping (nested paths included)."""
    out = {}

    def walk(props, prefix):
        for name, spec in props.items():
            full = f"{prefix}{name}"
            out[full] = spec
            if "properties" in spec:
                walk(spec["properties"], full + ".")

    walk(mapping["properties"], "")
    return out


def referenced_fields(node, out=None) -> set[str]:
    """Every field name a search body refers to."""
    out = set() if out is None else out
    if isinstance(node, list):
        for x in node:
            referenced_fields(x, out)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "knn" and isinstance(value, dict) and "field" in value:  # ES top-level knn
                out.add(value["field"])
                referenced_fields(value.get("filter"), out)
            elif key == "knn" and isinstance(value, dict):  # OpenSearch knn query: {field: {...}}
                for field, spec in value.items():
                    out.add(field)
                    referenced_fields(spec.get("filter"), out)
            elif key == "nested" and isinstance(value, dict):
                out.add(value["path"])
                referenced_fields(value.get("query"), out)
            elif key in ("term", "terms", "match", "match_phrase", "range", "prefix"):
                out.update(k for k in value if k not in ("boost", "_name"))
            elif key == "multi_match":
                out.update(f.split("^")[0] for f in value["fields"])
            elif key == "exists":
                out.add(value["field"])
            else:
                referenced_fields(value, out)
    return out


def vectors_in(node, out=None) -> list[tuple[str, list]]:
    """(field, query vector) pairs in a search body."""
    out = [] if out is None else out
    if isinstance(node, list):
        for x in node:
            vectors_in(x, out)
    elif isinstance(node, dict):
        if isinstance(node.get("knn"), dict) and "query_vector" in node["knn"]:
            out.append((node["knn"]["field"], node["knn"]["query_vector"]))
        elif isinstance(node.get("knn"), dict):
            for field, spec in node["knn"].items():
                if isinstance(spec, dict) and "vector" in spec:
                    out.append((field, spec["vector"]))
        for v in node.values():
            vectors_in(v, out)
    return out


def features_in(body: dict, engine: str) -> set[str]:
    """Version-gated engine features a search body uses (see FEATURE_SINCE)."""
    text = json.dumps(body)
    used = set()
    knn_filters = []
    if engine == "elasticsearch":
        if "knn" in body:
            used.add("nested_knn")
            knn_filters = [body["knn"].get("filter")]
            if "inner_hits" in body["knn"]:
                used.add("knn_inner_hits")
        if '"knn"' in json.dumps(body.get("query", {})):
            used.add("knn_query_dsl")
        if "exclude_vectors" in text:
            used.add("source_exclude_vectors_param")
    else:
        if '"knn"' in text:
            used.add("nested_knn")
        if "expand_nested_docs" in text:
            used.add("expand_nested_docs")
        if '"hybrid"' in text:
            used.add("hybrid_query")
        if "method_parameters" in text:
            used.add("knn_method_parameters")
        knn_filters = [spec.get("filter") for _, spec in os_knn_specs(body)]
    for flt in knn_filters:
        if flt is None:
            continue
        fields = referenced_fields(flt)  # parent fields are top-level names; nested ones are dotted paths
        if any("." in f for f in fields) or '"nested"' in json.dumps(flt):
            used.add("knn_nested_filter" if engine == "elasticsearch" else "knn_nested_filter_wrapped")
        if any("." not in f for f in fields):
            used.add("knn_parent_filter")
    if "retriever" in body or "rank" in body:
        used.add("rrf_retriever")
    return used


def os_knn_specs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "knn" and isinstance(value, dict):
                yield from ((f, s) for f, s in value.items() if isinstance(s, dict))
            else:
                yield from os_knn_specs(value)
    elif isinstance(node, list):
        for x in node:
            yield from os_knn_specs(x)
