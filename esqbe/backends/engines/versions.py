"""Engine versions and what each can do: version parsing (also from an index's `index.version.created`), the
feature matrix behind docs/engines.md, `EngineInfo`, and the kNN score -> cosine conversion, which depends on
the engine, its vector library and its version."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: oldest engine versions with kNN over nested vectors filtered on a parent field
MIN_VERSIONS = {"elasticsearch": (8, 11), "opensearch": (2, 12)}


def parse_version(number: str) -> tuple[int, int, int]:
    parts = [int(x) for x in re.findall(r"\d+", str(number).split("-")[0])[:3]]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)  # type: ignore[return-value]


#: (engine, feature) -> first version that has it; the source of docs/engines.md's matrix
FEATURE_SINCE: dict[tuple[str, str], tuple[int, int]] = {
    ("elasticsearch", "nested_knn"): (8, 11),  # top-level knn on a nested dense_vector, one hit per parent
    ("elasticsearch", "knn_parent_filter"): (8, 11),  # knn.filter over parent fields (paper_id)
    ("elasticsearch", "knn_query_dsl"): (8, 12),  # `knn` as a query clause (nested{knn})
    ("elasticsearch", "knn_inner_hits"): (8, 13),
    ("elasticsearch", "source_exclude_vectors_param"): (9, 1),  # also 8.19
    ("elasticsearch", "vectors_out_of_source_by_default"): (9, 2),
    ("elasticsearch", "knn_nested_filter"): (9, 2),
    ("opensearch", "nested_knn"): (2, 12),
    ("opensearch", "knn_parent_filter"): (2, 12),  # term/terms on a parent field inside a nested knn filter
    ("opensearch", "hybrid_query"): (2, 10),
    ("opensearch", "expand_nested_docs"): (2, 19),
    ("opensearch", "rrf_processor"): (2, 19),
    ("opensearch", "unified_cosine_score"): (2, 19),  # (1 + cos) / 2 for every engine, not only lucene
    ("opensearch", "knn_nested_filter_wrapped"): (3, 5),  # nested-field filters must be wrapped in nested{}
    ("opensearch", "knn_method_parameters"): (2, 16),  # `method_parameters.ef_search` in the knn query (k-NN #1783)
}


#: the features the request bodies of this module use (the contract tests check bodies against this)
FEATURES_USED = {
    "elasticsearch": frozenset({"nested_knn", "knn_parent_filter"}),
    "opensearch": frozenset({"nested_knn", "knn_parent_filter"}),
}


#: features the bodies use only on versions that have them (with a fallback elsewhere)
FEATURES_WHERE_SUPPORTED = {
    "elasticsearch": frozenset(),
    "opensearch": frozenset({"knn_method_parameters"}),
}


def version_from_created_setting(engine: str, created: Any) -> tuple[int, int, int] | None:
    """The engine version an index was created with, from its `index.version.created` setting: a lower
    bound of the cluster's version when `GET /` is not allowed (a key without the `monitor` privilege).

    OpenSearch ids are `major*1e6 + minor*1e4 + revision*100 + build` xor 0x08000000 (2.11.0 -> 136327827).
    Elasticsearch ids follow the same pattern up to 8.10; from 8.11 they count independently of releases
    (8.11+ indexes: 8_500_000 and up; 9.x: 9_000_000 and up), so only the major (and "8.11 or newer") is read."""
    try:
        vid = int(str(created))
    except (TypeError, ValueError):
        return None
    if engine == "opensearch":
        vid ^= 0x08000000
        return (vid // 1_000_000, vid // 10_000 % 100, vid // 100 % 100)
    major = vid // 1_000_000
    if major >= 9:
        return (major, 0, 0)
    if major == 8 and vid % 1_000_000 >= 500_000:
        return (8, 11, 0)
    return (major, vid // 10_000 % 100, vid // 100 % 100)


@dataclass(frozen=True)
class EngineInfo:
    engine: str  # "elasticsearch" | "opensearch"
    version: tuple[int, int, int]
    number: str
    #: False when `GET /` was refused (403: no `monitor` privilege): `version` is then a lower bound (the
    #: index's creation version, or the oldest supported one) and features are used only if it has them
    exact: bool = True

    def has(self, feature: str) -> bool:
        since = FEATURE_SINCE.get((self.engine, feature))
        if since is None:
            raise KeyError(f"unknown {self.engine} feature {feature!r}")
        if self.engine == "elasticsearch" and feature == "source_exclude_vectors_param" and self.version[:2] == (8, 19):
            return True
        return self.version[:2] >= since

    def __str__(self) -> str:
        return f"{self.engine} {self.number}"


UNKNOWN_VERSION_HINT = (
    "the credentials may not read the cluster version (GET / needs the `monitor` cluster privilege); "
    "esqbe goes on without the version check, assuming at least {floor} (the {source})"
)


def cosine_from_score(score: float, engine: str, space_engine: str = "lucene", version: tuple[int, ...] = (99,)) -> float:
    """Cosine similarity back from a kNN hit's score (vectors indexed with a cosine similarity).

    - Elasticsearch `dense_vector`, `similarity: cosine`: score = (1 + cos) / 2.
    - OpenSearch `cosinesimil`, by the engine behind the field (read from the mapping, `_vector_space`) and
      the version answering the query:
      - lucene (what esqbe creates): Lucene's own (1 + cos) / 2, on every version;
      - nmslib: 1 / (1 + (1 - cos)) = 1 / (2 - cos) before 2.19 (SpaceType.COSINESIMIL.scoreTranslation was
        `1 / (1 + rawScore)` with rawScore = 1 - cos), (1 + cos) / 2 from 2.19 ("Use one formula to calculate
        cosine similarity", k-NN #2357);
      - faiss: `cosinesimil` exists only from 2.19 (k-NN #2376, earlier faiss had l2 and innerproduct only),
        and scores (1 + cos) / 2 there.
    """
    score = float(score)
    if engine == "opensearch" and space_engine == "nmslib" and tuple(version)[:2] < (2, 19):
        cos = 2.0 - 1.0 / score if score > 0 else -1.0
    else:
        cos = 2.0 * score - 1.0
    return min(1.0, max(-1.0, cos))


def _setting(settings: dict, dotted: str) -> Any:
    """A setting from a `settings.index` object however it is nested (`index.knn: true` beside
    `index.knn.space_type` is rendered as a `knn.space_type` key next to `knn`)."""
    node: Any = settings
    parts = dotted.split(".")
    for i in range(len(parts)):
        if not isinstance(node, dict):
            return None
        rest = ".".join(parts[i:])
        if rest in node and not isinstance(node[rest], dict):
            return node[rest]
        node = node.get(parts[i])
    return node if not isinstance(node, dict) else None


def opensearch_vector_space(vector: dict, created: tuple[int, int, int] | None, settings: dict | None = None) -> tuple[str, str]:
    """(engine, space type) of an OpenSearch `knn_vector` mapping, as the k-NN plugin resolves them.

    The engine is `method.engine`, else the top-level `engine` (3.x); with neither it is the plugin's default
    when the index was created (EngineResolver): lucene for `compression_level: 4x`, faiss for `mode: on_disk`
    or other compressions, else faiss from 2.18 (k-NN #2221) and nmslib before. The space type is
    `method.space_type`, else the top-level `space_type`, else the legacy index setting `index.knn.space_type`,
    else l2."""
    method = vector.get("method") or {}
    engine = method.get("engine") or vector.get("engine")
    if not engine:
        compression, mode = vector.get("compression_level"), vector.get("mode")
        if compression == "4x":
            engine = "lucene"
        elif mode == "on_disk" or compression not in (None, "1x"):
            engine = "faiss"
        else:
            engine = "faiss" if created is not None and created[:2] >= (2, 18) else "nmslib"
    legacy_space = _setting(settings or {}, "knn.space_type")
    space = method.get("space_type") or vector.get("space_type") or legacy_space or "l2"
    return str(engine), str(space)
