"""esqbe inside an Elasticsearch / OpenSearch index the user already has (`esqbe attach`).

The user's documents stay where they are and as they are; esqbe adds its fields under one object,
`esqbe` (layout `attached/1`):

    esqbe.background_sentences, esqbe.method_sentences, ...   nested {idx, facet, text (not indexed), vector}
    esqbe.vectors_b64                                         every sentence vector (float32, base64): the rescorers' copy
    esqbe.content_hash, esqbe.source_hash, esqbe.n_sentences  re-runs skip documents whose text did not change
    esqbe.background_mv, ..., esqbe.all_mv                    with engine_facet_vectors: the per-facet multi-vector
                                                              fields (esqbe.backends.engines.maxsim), which queries
                                                              score the window with in the engine
    _meta.esqbe                                               model, dim, encoder_mode, id_field, text_fields
                                                              (other _meta keys kept)

1. `attach_mapping_body` is sent with `PUT <index>/_mapping` (adding fields to a mapping is allowed on
   every supported version; nothing existing is changed). OpenSearch only builds kNN structures for an
   index created with `index.knn: true`, a static setting: on an index without it `attach` stops and
   says so, or with `reindex_to` copies the index into a new one that has it (their settings'
   analysis and shard count, their mapping + esqbe's), via `_reindex`, and moves the alias if the
   user's name is an alias (docs/engines.md, "Attaching to an index you already have").
2. Every document is read with a scroll (`_source`: the id and text fields, `esqbe.source_hash`),
   papers are made from the text fields (first = title, the rest = abstract), encoded and tagged by
   the normal indexing loop (`Index.add_papers`), and written with bulk `update` actions whose `doc`
   holds only `esqbe` (a partial update: every other field is left untouched).
3. Queries: BM25 over the user's text fields, kNN over `esqbe.<facet>_sentences.vector`, fused and
   rescored like every other backend. Hits are the documents' `_id`s; `--paper` takes an `_id` or a
   value of the id field. Metadata filters name the user's own fields (their mapping decides number
   vs keyword); `engine_filter` adds their own query DSL.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core.filters import FilterError
from ...domain import FirstStageRequest, IndexedPaper, IndexMeta, Paper, UpsertResult, normalize_label
from ...errors import BackendError, ModelMismatchError
from ...ingest.sentences import split_sentences
from .calibrate import META_KEY
from .common import EngineBackend
from .documents import doc_to_paper, doc_to_text, paper_to_doc
from .elasticsearch import ElasticsearchBackend
from .filters import add_to_knn
from .mapping import FACET_PATHS, load_index_template
from .maxsim import MV_FIELDS, doc_fields, mapping_properties, mv_field
from .maxsim import check_version as check_maxsim_version
from .opensearch import OpenSearchBackend
from .watchstore import STAMP_FIELD

NAMESPACE = "esqbe"
ATTACHED_LAYOUT = "attached/1"
#: facet -> nested path inside the user's documents
ATTACHED_PATHS = {facet: f"{NAMESPACE}.{path}" for facet, path in FACET_PATHS.items()}
ATTACHED_VECTOR_FIELDS = tuple(f"{p}.vector" for p in ATTACHED_PATHS.values())
#: the per-facet multi-vector fields as an attached index holds them (engine_facet_vectors)
ATTACHED_MV_FIELDS = tuple(f"{NAMESPACE}.{f}" for f in MV_FIELDS)
#: ends `esqbe.source_hash` where the document's multi-vector fields were written with it: a document of an index
#: that carries the fields whose hash lacks it (written before they were added) is encoded and written again
MV_MARK = "+mv"
_ESQBE_KEYS = ("content_hash", "n_sentences", "vectors_b64", *FACET_PATHS.values())
_NUMERIC = {"long", "integer", "short", "byte", "double", "float", "half_float", "scaled_float", "unsigned_long"}
_KEYWORDISH = {"keyword", "constant_keyword", "wildcard", "boolean", "date", "date_nanos", "ip", "version"}
_TEXT_TYPES = {"text", "match_only_text", "keyword", "search_as_you_type"}


# ---------------------------------------------------------------------------------------------
# request bodies


def attach_mapping_body(engine: str, meta: IndexMeta, existing: dict, id_field: str, text_fields: Sequence[str],
                        facet_vectors: bool = False) -> dict:
    """`PUT <index>/_mapping` body: esqbe's fields under `esqbe` (with `facet_vectors`, the per-facet multi-vector
    fields too), and `_meta.esqbe` beside the user's `_meta` keys."""
    template = load_index_template(engine)["mappings"]["properties"]
    dim_key = "dims" if engine == "elasticsearch" else "dimension"
    props: dict[str, Any] = {
        "content_hash": {"type": "keyword"},
        "source_hash": {"type": "keyword"},
        "n_sentences": {"type": "integer"},
        "vectors_b64": {"type": "binary"},
    }
    for path in FACET_PATHS.values():
        nested = copy.deepcopy(template[path])
        nested["properties"]["text"] = {"type": "text", "index": False}  # shown with hits, not searched
        nested["properties"]["vector"][dim_key] = int(meta.dim)
        props[path] = nested
    if facet_vectors:
        props.update(mapping_properties(engine, meta.dim))
    meta_all = dict(existing.get("_meta") or {})
    meta_all[NAMESPACE] = {"esqbe_layout": ATTACHED_LAYOUT, **meta.to_dict(), "id_field": id_field,
                           "text_fields": list(text_fields)}
    return {"_meta": meta_all, "properties": {NAMESPACE: {"type": "object", "properties": props}}}


def scan_body(id_field: str, text_fields: Sequence[str]) -> dict:
    """What the scroll over the user's documents asks for (only what attaching needs)."""
    fields = [f for f in [id_field, *text_fields] if f != "_id"] + [f"{NAMESPACE}.source_hash"]
    return {"_source": {"includes": fields}, "query": {"match_all": {}}}


def source_hash(title: str, text: str) -> str:
    return hashlib.sha1(json.dumps([title, text], ensure_ascii=False).encode("utf-8")).hexdigest()


def esqbe_fields(ip: IndexedPaper, src_hash: str | None, facet_vectors: bool = False) -> dict:
    """The `esqbe` object of one document (a partial update's `doc`); with `facet_vectors`, its multi-vector fields
    too (maxsim.doc_fields), its source hash marked as written with them (MV_MARK)."""
    doc = paper_to_doc(ip)
    out = {k: doc[k] for k in _ESQBE_KEYS if k in doc}
    # a partial update merges `esqbe` key by key: a facet the paper's text no longer has is written as null (no
    # value), or its old sentences and vectors would stay beside the new ones. (A multi-vector field of such a facet
    # may stay: the window scores a paper by the facets its sentences carry, so it is never read.)
    for path in FACET_PATHS.values():
        out.setdefault(path, None)
    if facet_vectors:
        out.update(doc_fields([normalize_label(f) for f in ip.paper.facets], ip.vectors))
        src_hash = (src_hash or "") + MV_MARK
    if src_hash:
        out["source_hash"] = src_hash
    return out


def update_action(index: str, doc_id: str, fields: dict) -> dict:
    """A bulk `update` action for the clients' helpers: only `esqbe` changes in the document."""
    return {"_op_type": "update", "_index": index, "_id": doc_id, "doc": {NAMESPACE: fields}}


def remove_action(index: str, doc_id: str) -> dict:
    """A bulk `update` that removes esqbe's fields from one document (never the document)."""
    return {"_op_type": "update", "_index": index, "_id": doc_id,
            "script": {"source": f"ctx._source.remove('{NAMESPACE}')", "lang": "painless"}}


def field_spec(mapping: dict, path: str) -> dict | None:
    """The mapping of a dotted field path (objects, multi-fields), or None."""
    props = mapping.get("properties", {})
    parts = path.split(".")
    spec = None
    for i, part in enumerate(parts):
        spec = props.get(part)
        if spec is None:
            # a multi-field (title.keyword) or an object's subfield written with dots
            return None
        if i < len(parts) - 1:
            if "properties" in spec:
                props = spec["properties"]
            elif "fields" in spec and i == len(parts) - 2:
                return spec["fields"].get(parts[-1])
            else:
                return None
    return spec


def user_field_resolver(index: str, mapping: dict):
    """esqbe.core.filters FieldResolver over the user's own mapping: numbers compare as numbers, keyword-like
    fields (and a text field's `.keyword`) as text; anything else is a FilterError naming the field."""

    def resolve(path: str) -> list[tuple[str, str]]:
        spec = field_spec(mapping, path)
        if spec is None:
            raise FilterError(f"filter on {path!r}: index {index!r} has no such field")
        kind = spec.get("type", "object")
        if kind in _NUMERIC:
            return [(path, "num")]
        if kind in _KEYWORDISH:
            return [(path, "kw")]
        if kind == "object" or "properties" in spec:
            subs = [f"{path}.{k}" for k in spec.get("properties", {})]
            if subs:
                return [r for s in subs for r in resolve(s)]  # exists on an object: any of its fields
        if kind == "text":
            for name, sub in (spec.get("fields") or {}).items():
                if sub.get("type") == "keyword":
                    return [(f"{path}.{name}", "kw")]
            raise FilterError(f"filter on {path!r}: a text field without a keyword sub-field cannot be filtered exactly; "
                              "filter on a keyword field, or use --engine-filter with a match query")
        raise FilterError(f"filter on {path!r}: field type {kind!r} cannot be filtered by esqbe; use --engine-filter")

    return resolve


# ---------------------------------------------------------------------------------------------
# the backend


if TYPE_CHECKING:
    _Engine = EngineBackend  # what the mixin is mixed into, for mypy; at run time it adds nothing to the MRO
else:
    _Engine = object


class AttachedMixin(_Engine):
    """Backend over a user's index holding esqbe's fields under `esqbe` (mixed into the engine backends)."""

    attached = True
    #: a user's documents carry no `indexed_at` stamp: nothing would ever be new to a watch
    keeps_watches = False
    #: nor an alias table (esqbe.backends.engines.aliasstore): the documents are the user's, written by their own tools
    #: too, so keys written with esqbe's writes alone would name some papers and not others; records merge within a
    #: run only, and a DOI or a merged-away id does not find a paper
    keeps_aliases = False
    #: document id -> hash of the text it was made from, stored as `esqbe.source_hash` by `upsert` (set_source_hashes)
    _source_hashes: Mapping[str, str] = {}

    def watches_unsupported(self) -> str | None:
        return (f"index {self.index!r} is attached (`esqbe attach`): its documents carry no esqbe {STAMP_FIELD} stamp, "
                "so no paper would ever be new to a watch; watches need an index esqbe writes (`esqbe index`)")

    # --- the per-facet multi-vector fields (engine_facet_vectors): `esqbe.<facet>_mv`; window_scoring and
    # score_windows are the engine backend's, over these hooks
    _mv_writer = ("attached", "esqbe attach")
    _mv_namespace = NAMESPACE

    def _has_facet_vectors(self) -> bool:
        """Whether the attached mapping carries the multi-vector fields. Where it does, every document written gets
        them, the setting on or off: a partial update merges `esqbe`, so a field left out would keep the vectors of
        the document's old text, and a later query with the setting would score by them."""
        props = ((self._index_mapping().get("properties") or {}).get(NAMESPACE) or {}).get("properties") or {}
        return mv_field(None) in props

    def _window_source(self) -> tuple[list[str], list[str]]:
        includes = [f"{p}.{leaf}" for p in ATTACHED_PATHS.values() for leaf in ("idx", "facet")]
        if "facet_probs" not in self.text_fields:  # a user's field of that name is the paper's metadata, as in `get`
            includes.append("facet_probs")
        return includes, [*ATTACHED_VECTOR_FIELDS, f"{NAMESPACE}.vectors_b64", *ATTACHED_MV_FIELDS]

    def _window_paper(self, pid: str, source: dict) -> Paper:
        ns = source.get(NAMESPACE) or {}
        if not isinstance(ns, dict):
            raise TypeError("esqbe is not an object")
        metadata = {k: v for k, v in source.items() if k != NAMESPACE and k not in self.text_fields}
        return doc_to_text({"paper_id": pid, "metadata": metadata, **{p: ns[p] for p in FACET_PATHS.values() if p in ns}})

    def set_source_hashes(self, hashes: Mapping[str, str] | None) -> None:
        """The source hash to store with each document the next upserts write (`esqbe.source_hash`, what a
        re-run compares to skip unchanged text), by document id; None: store none. The mapping is read
        when each batch is written, so the caller may fill it while its papers stream (run_attach does)."""
        self._source_hashes = hashes if hashes is not None else {}

    def _attached_meta(self, mapping: dict | None) -> dict | None:
        return ((mapping or {}).get("_meta") or {}).get(NAMESPACE)

    def _esqbe_meta(self) -> dict:
        m = self._attached_meta(self._index_mapping())
        if not m:
            raise BackendError(f"index {self.index!r} has no esqbe fields: run `esqbe attach` first")
        return m

    def _calibration_home(self) -> dict:  # the kNN calibration lives in `_meta.esqbe`, beside the user's keys
        return self._esqbe_meta()

    def _meta_with(self, cal: dict) -> dict:
        return {**(self._index_mapping().get("_meta") or {}), NAMESPACE: {**self._esqbe_meta(), META_KEY: cal}}

    @property
    def text_fields(self) -> list[str]:
        return list(self._esqbe_meta().get("text_fields") or [])

    @property
    def id_field(self) -> str:
        return self._esqbe_meta().get("id_field") or "_id"

    def meta(self) -> IndexMeta | None:
        mapping = self._get_mapping()
        if mapping is None:
            return None
        self._mapping = mapping
        m = self._attached_meta(mapping)
        return IndexMeta.from_dict(m) if m else None

    def _index_meta(self) -> IndexMeta:
        meta = IndexMeta.from_dict(self._esqbe_meta())
        if self._expected is not None:
            meta.check(self._expected)
        return meta

    def ensure(self, meta: IndexMeta) -> None:
        existing = self.meta()
        if existing is None:
            raise BackendError(f"index {self.index!r} is not attached: run `esqbe attach` first")
        existing.check(meta)
        self._expected = meta

    def _space_engine(self) -> str:
        props = self._index_mapping()["properties"][NAMESPACE]["properties"]
        vector = props[FACET_PATHS["method"]]["properties"]["vector"]
        return (vector.get("method") or {}).get("engine", "lucene")

    def _filter_resolver(self):
        return user_field_resolver(self.index, self._index_mapping())

    # --- attaching ------------------------------------------------------------------------------

    def check_settings(self) -> str | None:
        """Why esqbe's fields cannot be added in place (None if they can)."""
        if self.engine != "opensearch":
            return None
        try:
            body = self._body(self._call(self.client.indices.get_settings, index=self.index))
        except Exception as exc:
            raise self._error("reading the settings", exc) from exc
        first: dict[str, Any] = next(iter(body.values()), {})
        settings = first.get("settings", {}).get("index", {})
        if str(settings.get("knn", "false")).lower() != "true":
            return (f"OpenSearch index {self.index!r} was created without `index.knn: true` (a static setting), so kNN "
                    "fields cannot be added to it in place; re-run with --reindex-to NEW_INDEX to copy it into a new index "
                    "that has it (docs/engines.md, 'Attaching to an index you already have')")
        return None

    def attach(self, meta: IndexMeta, id_field: str, text_fields: Sequence[str]) -> dict:
        """Add esqbe's fields to the mapping (idempotent); returns the body sent."""
        mapping = self._get_mapping()
        if mapping is None:
            raise BackendError(f"index {self.index!r} does not exist at {self.url}")
        existing = self._attached_meta(mapping)
        if existing:
            IndexMeta.from_dict(existing).check(meta)
        for f in text_fields:
            spec = field_spec(mapping, f)
            if spec is None:
                raise BackendError(f"index {self.index!r} has no field {f!r} (--text-fields)")
            if spec.get("type") not in _TEXT_TYPES:
                raise BackendError(f"field {f!r} of index {self.index!r} is a {spec.get('type')!r} field, "
                                   "not text (--text-fields)")
        if id_field != "_id" and field_spec(mapping, id_field) is None:
            raise BackendError(f"index {self.index!r} has no field {id_field!r} (--id-field)")
        problem = self.check_settings()
        if problem:
            raise BackendError(problem)
        if self.facet_vectors:  # the version that has the MaxSim function, named where it is missing
            check_maxsim_version(self.engine, self.info().number)
        body = attach_mapping_body(self.engine, meta, mapping, id_field, text_fields, self.facet_vectors)
        try:
            self._call(self.client.indices.put_mapping, index=self.index, body=body)
        except Exception as exc:
            raise self._error("adding esqbe's fields to the mapping", exc) from exc
        self._mapping = None
        self._expected = meta
        return body

    def reindex_into(self, new_index: str, meta: IndexMeta, id_field: str, text_fields: Sequence[str]) -> dict:
        """OpenSearch without `index.knn`: create `new_index` (their analysis + shard count, knn on, their
        mapping + esqbe's), `_reindex` into it, move the alias if `self.index` is one. Returns what was done."""
        from .names import check_index_name

        check_index_name(new_index, what="--reindex-to", creating=True)  # before any request
        mapping = self._get_mapping()
        if mapping is None:
            raise BackendError(f"index {self.index!r} does not exist at {self.url}")
        settings = self._body(self._call(self.client.indices.get_settings, index=self.index))
        concrete, entry = next(iter(settings.items()))
        theirs = entry.get("settings", {}).get("index", {})
        index_settings: dict[str, Any] = {"knn": True}
        for key in ("number_of_shards", "analysis"):
            if key in theirs:
                index_settings[key] = theirs[key]
        if self.facet_vectors:
            check_maxsim_version(self.engine, self.info().number)
        new_mapping = copy.deepcopy(mapping)
        add = attach_mapping_body(self.engine, meta, mapping, id_field, text_fields, self.facet_vectors)
        new_mapping["_meta"] = add["_meta"]
        new_mapping.setdefault("properties", {}).update(add["properties"])
        create = {"settings": {"index": index_settings}, "mappings": new_mapping}
        try:
            self._call(self.client.indices.create, index=new_index, body=create)
            self._call(self.client.reindex, body={"source": {"index": self.index}, "dest": {"index": new_index}},
                       wait_for_completion=True, refresh=True)
        except Exception as exc:
            raise self._error(f"copying into {new_index!r}", exc) from exc
        aliased = concrete != self.index
        if aliased:
            actions = {"actions": [{"remove": {"index": concrete, "alias": self.index}},
                                   {"add": {"index": new_index, "alias": self.index}}]}
            try:
                self._call(self.client.indices.update_aliases, body=actions)
            except Exception as exc:
                raise self._error(f"moving alias {self.index!r} to {new_index!r}", exc) from exc
        else:
            self.index = new_index  # a concrete index name cannot become an alias while it exists
        self._mapping = None
        self._expected = meta
        return {"created": new_index, "from": concrete, "alias_moved": aliased}

    def scan(self, id_field: str, text_fields: Sequence[str], batch: int = 500) -> Iterator[tuple[str, Paper | None, str]]:
        """(doc _id, paper or None when its text fields are empty, source hash) for every document. Where the index
        carries the multi-vector fields, a document written before them (its hash unmarked) is not unchanged."""
        mv = self._has_facet_vectors()
        for hit in self._scan_hits(scan_body(id_field, text_fields), batch):
            src = hit.get("_source") or {}
            values = [_text_value(_get_path(src, f)) for f in text_fields]
            title, rest = values[0], " ".join(v for v in values[1:] if v)
            h = source_hash(title, rest)
            stored = (src.get(NAMESPACE) or {}).get("source_hash")
            sentences = split_sentences(rest) if len(values) > 1 else split_sentences(title)
            if len(values) == 1:
                title = ""
            if stored == h + MV_MARK or stored == h and not mv:
                yield hit["_id"], None, "unchanged"
            elif not sentences:
                yield hit["_id"], None, "no text"
            else:
                ident = hit["_id"] if id_field == "_id" else _get_path(src, id_field)
                meta = {} if id_field == "_id" or ident is None else {id_field: ident}
                yield hit["_id"], Paper(str(hit["_id"]), title, sentences, metadata=meta), h

    # --- Backend over the attached fields ---------------------------------------------------------

    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        if not ids:
            return {}
        # where the index carries the multi-vector fields, a document written before them holds an older form of its
        # paper: its hash is not the paper's, so it is encoded and written again
        mv = self._has_facet_vectors()
        includes = [f"{NAMESPACE}.content_hash", *([f"{NAMESPACE}.source_hash"] if mv else [])]
        out = {}
        for pid, src in self._mget_sources(ids, _source_includes=includes).items():
            ns = src.get(NAMESPACE) or {}
            if ns.get("content_hash"):
                stale = mv and not str(ns.get("source_hash") or "").endswith(MV_MARK)
                out[pid] = ns["content_hash"] + (" without multi-vector fields" if stale else "")
        return out

    def get(self, paper_ids: Sequence[str]) -> dict[str, IndexedPaper]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        if not ids:
            return {}
        dim = self._index_meta().dim
        excludes = [*ATTACHED_VECTOR_FIELDS, *(ATTACHED_MV_FIELDS if self._has_facet_vectors() else ())]
        sources = self._mget_sources(ids, _source_excludes=excludes)
        missing = [p for p in ids if p not in sources]
        out = {pid: self._paper(pid, src, dim) for pid, src in sources.items() if src.get(NAMESPACE)}
        if missing and self.id_field != "_id":  # --paper may name the user's own id
            body = {"size": len(missing), "query": {"bool": {"filter": [{"terms": {self.id_field: missing}}]}},
                    "_source": {"excludes": excludes}}
            try:
                hits = self._body(self._call(self.client.search, index=self.index, body=body))["hits"]["hits"]
            except Exception as exc:
                raise self._error("fetching papers by id field", exc) from exc
            for hit in hits:
                src = hit.get("_source") or {}
                if src.get(NAMESPACE):
                    out[str(_get_path(src, self.id_field))] = self._paper(hit["_id"], src, dim)
        return out

    def _paper(self, doc_id: str, src: dict, dim: int) -> IndexedPaper:
        fields = self.text_fields
        ns = src[NAMESPACE]
        metadata = {k: v for k, v in src.items() if k != NAMESPACE and k not in fields}
        title = _text_value(_get_path(src, fields[0])) if len(fields) > 1 else ""
        shim = {"paper_id": str(doc_id), "title": title, "metadata": metadata, **{k: ns[k] for k in _ESQBE_KEYS if k in ns}}
        return doc_to_paper(shim, dim)

    def upsert(self, papers: Sequence[IndexedPaper]) -> UpsertResult:
        result = UpsertResult()
        if not papers:
            return result
        meta = self._index_meta()
        by_id = {}
        for ip in papers:
            if ip.vectors.shape[0] and ip.vectors.shape[1] != meta.dim:
                raise ModelMismatchError(f"paper {ip.paper_id} has {ip.vectors.shape[1]}-d vectors but index "
                                         f"{self.index!r} holds {meta.dim}-d")
            by_id[ip.paper_id] = ip
        stored = self.content_hashes(list(by_id))
        hashes = self._source_hashes
        mv = self._has_facet_vectors()  # the index carries them: every document written gets them (_has_facet_vectors)
        actions = []
        for pid, ip in by_id.items():
            if stored.get(pid) == ip.paper.content_hash():
                result.unchanged += 1
            else:
                actions.append(update_action(self.index, pid, esqbe_fields(ip, hashes.get(pid), mv)))
        for pid, (ok, info) in self._bulk(actions).items():
            if ok:
                if pid in stored:
                    result.replaced += 1
                else:
                    result.added += 1
            else:
                from .client import _describe

                result.errors.append(f"{pid}: {_describe(info)}")
        if actions:
            self._refresh()
        return result

    def delete(self, paper_ids: Iterable[str]) -> int:
        """Remove esqbe's fields from these documents; the documents themselves stay."""
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        present = self.content_hashes(ids)
        results = self._bulk([remove_action(self.index, pid) for pid in present])
        self._refresh()
        return sum(1 for ok, _ in results.values() if ok)

    def search_bodies(self, request: FirstStageRequest) -> list[tuple[str, int | None, dict]]:
        q = np.asarray(request.vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        restrict = [{"terms": {"_id": sorted(request.restrict_to)}}] if request.restrict_to is not None else []
        has_esqbe = {"exists": {"field": f"{NAMESPACE}.content_hash"}}
        out: list[tuple[str, int | None, dict]] = []
        if request.text and request.text.strip() and request.bm25_k > 0:
            match = {"multi_match": {"query": request.text, "fields": self.text_fields, "type": "most_fields"}}
            query: dict[str, Any] = {"must": [match], "filter": [has_esqbe, *restrict]}
            if request.exclude:
                query["must_not"] = [{"terms": {"_id": sorted(request.exclude)}}]
            out.append(("bm25", None, {"size": min(request.bm25_k, 10_000), "_source": False, "track_total_hits": False,
                                        "query": {"bool": query}}))
        if request.knn_k > 0 and q.shape[0] and q.shape[1]:
            k = min(10_000, request.knn_k + len(request.exclude))
            num_candidates = min(10_000, max(k, self.candidates_factor(request.facet)[0] * k, 100))
            paths = [ATTACHED_PATHS[request.facet]] if request.facet else list(ATTACHED_PATHS.values())
            for i, vec in enumerate(q):
                values = [float(x) for x in vec]
                for path in paths:
                    body = self._knn_body(path, values, k, num_candidates, None)
                    out.append(("knn", i, add_to_knn(self.engine, body, restrict)))
        return self._with_filter(out, request)

    def stats(self) -> dict:
        info = self.info()
        meta = self._index_meta()
        body = {"size": 0, "track_total_hits": True, "query": {"exists": {"field": f"{NAMESPACE}.content_hash"}},
                "aggs": {facet: {"nested": {"path": path}} for facet, path in ATTACHED_PATHS.items()}}
        try:
            resp = self._body(self._call(self.client.search, index=self.index, body=body))
        except Exception as exc:
            raise self._error("counting", exc) from exc
        total = resp.get("hits", {}).get("total", {})
        facets = {f: int(resp.get("aggregations", {}).get(f, {}).get("doc_count", 0)) for f in ATTACHED_PATHS}
        return {"backend": self.name, "engine": str(info), "url": self.url, "index": self.index, "layout": ATTACHED_LAYOUT,
                "papers": int(total.get("value", 0) if isinstance(total, dict) else total),
                "sentences": sum(facets.values()), "sentences_by_facet": {f: n for f, n in sorted(facets.items()) if n},
                "model": meta.model, "dim": meta.dim, "encoder_mode": meta.encoder_mode,
                "id_field": self.id_field, "text_fields": self.text_fields,
                "knn": {f: self.knn_setting(f) for f in ("background", "method", "result") if facets.get(f)},
                "knn_calibration": self.knn_calibration()}

    def _scan_hits(self, body: dict, batch: int) -> Iterator[dict]:
        if self.engine == "elasticsearch":
            from elasticsearch.helpers import scan
        else:
            from opensearchpy.helpers import scan
        try:
            yield from scan(self.client, index=self.index, query=body, size=batch, scroll="5m")
        except Exception as exc:
            raise self._error("reading the documents", exc) from exc


def _get_path(src: dict, path: str):
    node: Any = src
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and path in node:  # a key written with dots
            return node[path]
        else:
            return None
    return node


def _text_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(_text_value(v) for v in value)
    return " ".join(str(value).split())


class AttachedElasticsearchBackend(AttachedMixin, ElasticsearchBackend):
    """An Elasticsearch index the user owns, with esqbe's fields attached."""


class AttachedOpenSearchBackend(AttachedMixin, OpenSearchBackend):
    """An OpenSearch index the user owns, with esqbe's fields attached."""


#: engine -> its attached-index backend class
ATTACHED: dict[str, type[AttachedMixin]] = {
    "elasticsearch": AttachedElasticsearchBackend,
    "opensearch": AttachedOpenSearchBackend,
}


def attached_class(engine: str) -> type[AttachedMixin]:
    return ATTACHED["elasticsearch" if engine == "elasticsearch" else "opensearch"]


def attached_backend(backend: EngineBackend) -> AttachedMixin:
    """The same connection as an attached-index backend (sharing the client)."""
    return attached_class(backend.engine).from_connection(backend)


def maybe_attached(backend):
    """`backend` as an attached-index backend if its index holds `_meta.esqbe` (checked once, at open);
    unchanged otherwise or when the engine cannot be asked (errors then surface on first use)."""
    if not isinstance(backend, EngineBackend) or isinstance(backend, AttachedMixin):
        return backend
    attempts = backend.retry_attempts
    backend.retry_attempts = 1  # one quick look: an unreachable engine is reported (with retries) on first use
    try:
        mapping = backend._get_mapping()
    except Exception:
        return backend
    finally:
        backend.retry_attempts = attempts
    if mapping and ((mapping.get("_meta") or {}).get(NAMESPACE) or {}).get("esqbe_layout") == ATTACHED_LAYOUT:
        return attached_backend(backend)
    return backend


