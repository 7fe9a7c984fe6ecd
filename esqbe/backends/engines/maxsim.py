"""esqbe's summax scored inside the engine (the request side): per-facet multi-vector fields and
the `rescore` that ranks the first stage's window by MaxSim, on every shard, with no vector shipped to Python.

summax (esqbe.rescore.rescorers.rescore_summax) is, over unit vectors, MaxSim divided by the query's sentence
count n: S = sum over query sentences q of max over the candidate's sentences d (of the facet) of q.d; summax = S/n.
The engines' documented functions:

- Elasticsearch (`rank_vectors` field, technical preview from 8.18 / 9.0; the Painless function
  `maxSimDotProduct(query_vectors, field)` in `script_score`): S over float vectors.
- OpenSearch k-NN (3.3+; `lateInteractionScore(query_vectors, field, params._source, space_type)` over a field kept
  in `_source`, mapped `{"type": "object", "enabled": false}`): with space "cosinesimil" it returns (n + S) / 2 in
  every version read (k-NN's KNNPainlessScriptUtils: first the sum of the per-vector Lucene cosine scores
  (1 + cos) / 2, later n * (1 + S/n) / 2: the same number).

`script_score` refuses negative scores, and summax lies in [-1, 1]; both scripts therefore return (1 + summax) / 2
in [0, 1] (monotone), and `summax_from_score` turns it back. The emulations (`emulate_*`) compute what the engine
computes from the documented semantics (float32, as both do), so tests can check them against esqbe's own summax."""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ...errors import BackendError
from .versions import parse_version

#: the facets a query can choose, each with its multi-vector field; ALL: every sentence (a query without a facet)
MV_FACETS = ("background", "method", "result")
ALL = "all"


def mv_field(facet: str | None) -> str:
    """The multi-vector field of `facet` (None: every sentence)."""
    name = ALL if facet is None else facet
    if name not in (*MV_FACETS, ALL):
        raise ValueError(f"no multi-vector field for facet {facet!r}")
    return f"{name}_mv"


#: every multi-vector field: left out of every `_source` esqbe fetches (its vectors come from `vectors_b64`)
MV_FIELDS = tuple(mv_field(f) for f in (*MV_FACETS, None))


#: the versions that have each function (named in the error where a cluster is older)
MIN_VERSION = {"elasticsearch": (8, 18, 0), "opensearch": (3, 3, 0)}
FEATURE = {"elasticsearch": "the rank_vectors field and maxSimDotProduct (technical preview; a licence that allows "
                            "it, e.g. the trial)",
           "opensearch": "lateInteractionScore in script_score (the k-NN plugin)"}


def check_version(engine: str, version: str) -> None:
    """BackendError unless `engine` at `version` has its MaxSim function."""
    have = parse_version(version)
    need = MIN_VERSION[engine]
    if have < need:
        raise BackendError(f"{engine} {version} cannot rank by aspect in the cluster: {FEATURE[engine]} needs "
                           f"{engine} {'.'.join(map(str, need))} or later")


def mapping_properties(engine: str, dim: int) -> dict:
    """The per-facet multi-vector fields of an esqbe index (beside its nested sentences)."""
    if engine == "elasticsearch":
        spec = {"type": "rank_vectors", "dims": int(dim), "element_type": "float"}
    else:
        spec = {"type": "object", "enabled": False}  # kept in _source only, as lateInteractionScore reads it
    return {mv_field(f): dict(spec) for f in (*MV_FACETS, None)}


def unit(vectors) -> np.ndarray:
    """Rows scaled to unit length (float32): what summax and cosinesimil both assume; an encoder's vectors already
    are, an embedded index's float16 copies are within ~1e-3 of it."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True) if v.ndim == 2 and len(v) else np.ones((len(v), 1), np.float32)
    return (v / np.where(norms > 0, norms, 1)).astype(np.float32)


def doc_fields(facets: Sequence[str], vectors: np.ndarray) -> dict:
    """A paper's multi-vector fields: its unit sentence vectors per facet (a facet it has no sentence of is left
    out) and all of them. `facets[i]` labels `vectors[i]`."""
    vecs = unit(vectors)
    out: dict = {}
    for f in MV_FACETS:
        rows = [vecs[i].tolist() for i, lab in enumerate(facets) if lab == f]
        if rows:
            out[mv_field(f)] = rows
    if len(vecs):
        out[mv_field(None)] = vecs.tolist()
    return out


def es_source(field: str) -> str:
    """The Elasticsearch script: (1 + summax) / 2, the field named as a literal as the documentation does."""
    return f"(maxSimDotProduct(params.query_vectors, '{field}') / params.n + 1.0) / 2.0"


def os_source(field: str, namespace: str | None = None) -> str:
    """The OpenSearch script: (1 + summax) / 2; a paper without the field scores 0. `namespace`: the fields live in
    that object of `_source` (an attached index's `esqbe`), whose map is what lateInteractionScore is given (it reads
    the field as a key of the map it gets, not as a dotted path)."""
    if namespace is None:
        source, has = "params._source", f"params._source.containsKey('{field}')"
    else:
        source = f"params._source['{namespace}']"
        has = f"params._source.containsKey('{namespace}') && {source}.containsKey('{field}')"
    return (f"{has} ? "
            f"lateInteractionScore(params.query_vectors, '{field}', {source}, 'cosinesimil') / params.n : 0.0")


def rescore_body(engine: str, facet: str | None, query_vectors: np.ndarray, window: int,
                 namespace: str | None = None) -> dict:
    """The search body's `rescore`: the first stage's top `window` per shard rescored by MaxSim against the
    facet's field, the first stage's score dropped (query_weight 0), so the hits' order is summax's. `namespace`:
    the object the fields are under (`esqbe` in an attached index; None: top level)."""
    qv = np.asarray(query_vectors, dtype=np.float32)
    if qv.ndim != 2 or not len(qv):
        raise ValueError("the query needs at least one sentence vector")
    field = mv_field(facet)
    params = {"query_vectors": qv.tolist(), "n": len(qv)}
    if engine == "elasticsearch":
        path = field if namespace is None else f"{namespace}.{field}"
        inner = {"exists": {"field": path}}  # a paper without a sentence of the facet keeps score 0
        script = {"source": es_source(path), "params": params}
    else:
        inner = {"match_all": {}}
        script = {"source": os_source(field, namespace), "params": params}
    return {"window_size": int(window),
            "query": {"rescore_query": {"script_score": {"query": inner, "script": script}},
                      "query_weight": 0.0, "rescore_query_weight": 1.0}}


def summax_from_score(score: float) -> float:
    """esqbe's summax from the engine's score (1 + summax) / 2."""
    return 2.0 * float(score) - 1.0


# --- a query's window scored in the engine (EngineBackend.score_windows) -----------------------------------------
#: the most ids one window search holds (index.max_result_window and index.max_rescore_window default to 10,000)
WINDOW_MAX = 10_000
#: how far past [0, 1] an engine's (1 + summax) / 2 may stray by float rounding before it is refused
SCORE_SLACK = 1e-4


def window_body(engine: str, paper_ids: Sequence[str], facet: str | None, query_vectors, includes: Sequence[str],
                excludes: Sequence[str], namespace: str | None = None) -> dict:
    """The search that scores a query's window for one part of it (all parts go in one `_msearch`): exactly those
    papers (an `ids` query, each scoring the same), every one of them rescored by MaxSim against the facet's field
    (`rescore_body`, the window as wide as the ids), the query's vectors sent unit length (as summax compares them),
    and of each paper only `includes` back, no vector (`excludes`). `namespace`: as for rescore_body."""
    ids = [str(p) for p in paper_ids]
    if not ids or len(ids) > WINDOW_MAX:
        raise ValueError(f"a window search holds 1 to {WINDOW_MAX} ids (got {len(ids)})")
    return {"size": len(ids), "query": {"ids": {"values": ids}},
            "rescore": rescore_body(engine, facet, unit(query_vectors), len(ids), namespace),
            "_source": {"includes": list(includes), "excludes": list(excludes)}}


def window_scores(hits, asked: Sequence[str]) -> dict[str, tuple[float, dict]]:
    """paper id -> (the engine's score (1 + summax) / 2, its `_source`) from a window search's hits, which are
    hostile until checked: a hit not of a dict, an id not asked for or answered twice, a score missing, not a number,
    non-finite or outside [0, 1] is a BackendError naming it. An id asked for and not answered is absent (deleted
    since the first stage)."""
    wanted = set(map(str, asked))
    out: dict[str, tuple[float, dict]] = {}
    if not isinstance(hits, list):
        raise BackendError("the window search answered no list of hits")
    for hit in hits:
        pid = str(hit.get("_id")) if isinstance(hit, dict) and "_id" in hit else None
        if pid is None or pid not in wanted:
            raise BackendError(f"the window search answered paper {pid!r}, which it was not asked for")
        if pid in out:
            raise BackendError(f"the window search answered paper {pid!r} twice")
        score = hit.get("_score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not np.isfinite(score) \
                or not -SCORE_SLACK <= score <= 1 + SCORE_SLACK:
            raise BackendError(f"the window search scored paper {pid!r} {score!r}; the MaxSim script gives a "
                               "number in [0, 1]")
        source = hit.get("_source")
        out[pid] = (float(score), source if isinstance(source, dict) else {})
    return out


# --- the documented semantics, emulated ---------------------------------------------------------------------
def emulate_es(query_vectors, doc_vectors) -> float:
    """es_source as Elasticsearch evaluates it: maxSimDotProduct = sum over query vectors of the largest float
    dot product with a document vector."""
    q = np.asarray(query_vectors, dtype=np.float32)
    d = np.asarray(doc_vectors, dtype=np.float32)
    s = float((q @ d.T).max(axis=1).astype(np.float32).sum(dtype=np.float32))
    return (s / len(q) + 1.0) / 2.0


def emulate_os(query_vectors, doc_vectors) -> float:
    """os_source as OpenSearch evaluates it: lateInteractionScore with 'cosinesimil' = n * (1 + mean of the
    per-query-vector best cosine) / 2 (k-NN's KNNPainlessScriptUtils.toScore), divided by n."""
    q = np.asarray(query_vectors, dtype=np.float32)
    d = np.asarray(doc_vectors, dtype=np.float32)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    raw = float((qn @ dn.T).max(axis=1).astype(np.float64).sum())
    n = len(q)
    return (n * (1 + raw / n) / 2) / n


# --- the Painless sources against the documented signatures --------------------------------------------------
#: name -> the documented parameters: "vectors" (params.query_vectors, a list of vectors), "field" (a quoted field
#: name, as the documentation writes it), "source" (params._source, or one object of it: a Map, as documented),
#: "space" (a quoted space type)
SIGNATURES: dict[str, dict[str, tuple[str, ...]]] = {
    "elasticsearch": {"maxSimDotProduct": ("vectors", "field")},
    "opensearch": {"lateInteractionScore": ("vectors", "field", "source", "space")},
}
SPACES = ("innerproduct", "cosinesimil", "l2")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(([^()]*)\)")
_KINDS = {"vectors": re.compile(r"params\.query_vectors"), "field": re.compile(r"'[\w.]+'"),
          "source": re.compile(r"params\._source(?:\['\w+'\])?"), "space": re.compile(r"'(\w+)'")}
_ALLOWED_NAMES = {"containsKey"}


def check_painless(engine: str, source: str) -> list[str]:
    """Problems of `source` against the engine's documented function signatures (empty: none): every function
    called is a documented one (or Map.containsKey), with its documented number and kinds of arguments, and a
    documented space type."""
    problems, called = [], set()
    for name, args in _CALL.findall(source):
        if name in _ALLOWED_NAMES:
            continue
        sig = SIGNATURES[engine].get(name)
        if sig is None:
            problems.append(f"{name}: not a documented {engine} scoring function")
            continue
        called.add(name)
        parts = [a.strip() for a in args.split(",")] if args.strip() else []
        if len(parts) != len(sig):
            problems.append(f"{name}: {len(parts)} arguments, documented {len(sig)} ({', '.join(sig)})")
            continue
        for kind, arg in zip(sig, parts):
            m = _KINDS[kind].fullmatch(arg)
            if not m:
                problems.append(f"{name}: argument {arg!r} is not a {kind}")
            elif kind == "space" and m.group(1) not in SPACES:
                problems.append(f"{name}: space {m.group(1)!r} is not one of {', '.join(SPACES)}")
    if not called:
        problems.append(f"no {engine} MaxSim function is called")
    return problems
