"""The engine index layout (`facet-nested/1`, see mappings/*.json and docs/engines.md): one document per paper,
id = paper id, with one `nested` path per facet label (`background_sentences`, `method_sentences`, ...). Each
nested object holds `idx` (position in the abstract), `facet`, `text` and the sentence `vector`. A facet filter
is then the choice of path, which works on every supported version (a kNN filter on a nested field needs ES
9.2+ and changed syntax in OpenSearch 3.5); an unfiltered kNN searches every path and keeps the best score per
paper. BM25 runs on the parent's `title` and `abstract`. Here: the layout's names, the shipped index
definitions and the `_meta` esqbe keeps in them."""
from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

from ...domain import FACET_LABELS, IndexMeta
from ...errors import BackendError
from .filters import add_filter_mapping

LAYOUT = "facet-nested/1"


#: facet label -> nested path holding that facet's sentences
FACET_PATHS: dict[str, str] = {facet: f"{facet}_sentences" for facet in FACET_LABELS}


#: the indexed vector fields; left out of fetched `_source` (the rescorers read `vectors_b64`)
VECTOR_FIELDS: tuple[str, ...] = tuple(f"{path}.vector" for path in FACET_PATHS.values())


BM25_FIELDS: tuple[str, ...] = ("title", "abstract")


#: what the fallback to indexed vectors reads: each sentence's position and vector
VECTOR_SOURCE_FIELDS: tuple[str, ...] = tuple(f"{path}.{leaf}" for path in FACET_PATHS.values() for leaf in ("idx", "vector"))


def mappings_dir() -> Path:
    """Where the index definitions are: `esqbe/mappings/` when the package ships them, else the repo's `mappings/`."""
    try:
        packaged = resources.files("esqbe") / "mappings"
        if packaged.is_dir() and (packaged / "elasticsearch.json").is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd importers
        pass
    repo = Path(__file__).resolve().parents[3] / "mappings"
    if repo.is_dir():
        return repo
    raise BackendError("index definitions not found: expected esqbe/mappings/ or mappings/ beside the package")


def load_index_template(engine: str) -> dict:
    """The index definition of `engine` as shipped (`mappings/<engine>.json`), unfilled."""
    path = mappings_dir() / f"{engine}.json"
    with open(path, encoding="utf-8") as fp:
        return json.load(fp)


def index_body(engine: str, meta: IndexMeta) -> dict:
    """`PUT /<index>` body for `meta`: the shipped definition with the model's dimension and name filled in."""
    body = copy.deepcopy(load_index_template(engine))
    mapping = body["mappings"]
    mapping["_meta"] = {"esqbe_layout": LAYOUT, **meta.to_dict()}
    dim_key = "dims" if engine == "elasticsearch" else "dimension"
    for path in FACET_PATHS.values():
        mapping["properties"][path]["properties"]["vector"][dim_key] = int(meta.dim)
    add_filter_mapping(mapping)  # meta_kw / meta_num: filterable metadata (engine_filters)
    return body


def meta_from_mapping(index: str, mapping: dict) -> IndexMeta:
    """IndexMeta from an index's `_meta`; a BackendError when the index was not made by esqbe."""
    m = mapping.get("_meta") or {}
    if "model" not in m or "dim" not in m:
        raise BackendError(f"index {index!r} exists but has no esqbe metadata (_meta.model/_meta.dim): not an esqbe index")
    if m.get("esqbe_layout", LAYOUT) != LAYOUT:
        raise BackendError(f"index {index!r} has layout {m.get('esqbe_layout')!r}; this esqbe reads {LAYOUT!r}: rebuild it")
    return IndexMeta.from_dict(m)
