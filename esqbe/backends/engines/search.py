"""The first stage on an engine (mixed into EngineBackend): the searches of one query (BM25 and one kNN per
query sentence and facet path) with metadata filters applied, sent together in one `_msearch` with a stable
`preference`, parsed into BM25 and kNN scores per paper and fused on the client (esqbe.core.fusion, as the
embedded backend fuses); and exact kNN for `esqbe check recall` (esqbe.backends.engines.exact)."""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core.fusion import fuse, top_k
from ...domain import Candidate, FirstStageRequest, IndexedPaper, IndexMeta, Paper
from ...errors import BackendError, ModelMismatchError
from ..base import WindowAnswer, WindowScores
from .bodies import bm25_body, facet_paths
from .client import RETRY_STATUSES, _ItemRetry, _reason
from .documents import doc_to_text
from .filters import MAX_RESOLVED_IDS, add_to_bm25, add_to_knn, filter_clauses, ids_body, knn_needs_ids
from .mapping import FACET_PATHS, VECTOR_FIELDS
from .maxsim import MV_FACETS, MV_FIELDS, WINDOW_MAX, summax_from_score, window_body, window_scores
from .maxsim import check_version as check_maxsim_version
from .versions import EngineInfo, cosine_from_score

if TYPE_CHECKING:
    class _Host:
        """What the first stage uses of EngineBackend (declared for the type checker only)."""

        name: str
        engine: str
        index: str
        client: Any
        bm25_max_clauses: int
        preference: str | None
        def info(self) -> EngineInfo: ...
        def _index_meta(self) -> IndexMeta: ...
        def _space_engine(self) -> str: ...
        def _knn_body(self, path: str, vector: list[float], k: int, num_candidates: int,
                      restrict_to: list[str] | None) -> dict: ...
        def candidates_factor(self, facet: str | None) -> tuple[int, str]: ...
        facet_vectors: bool
        def _has_facet_vectors(self) -> bool: ...
        def get(self, paper_ids: Any) -> dict[str, IndexedPaper]: ...
        def _retrying(self) -> Any: ...
        def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...
        def _body(self, resp: Any) -> dict: ...
        def _error(self, what: str, exc: BaseException) -> Exception: ...
else:
    _Host = object


class FirstStageMixin(_Host):
    # --- first stage ---------------------------------------------------------------------------

    def search_bodies(self, request: FirstStageRequest) -> list[tuple[str, int | None, dict]]:
        """The searches of one first stage: ("bm25", None, body) and ("knn", query sentence, body) per
        (query sentence, facet path). Sent together in one `_msearch`."""
        q = np.asarray(request.vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        restrict = sorted(request.restrict_to) if request.restrict_to is not None else None
        out: list[tuple[str, int | None, dict]] = []
        if request.text and request.text.strip() and request.bm25_k > 0:
            out.append(("bm25", None, bm25_body(request.text, min(request.bm25_k, 10_000), restrict, request.exclude,
                                                self.bm25_max_clauses)))
        if request.knn_k > 0 and q.shape[0] and q.shape[1]:
            # excluded ids are dropped on the client: a must_not inside a nested kNN filter is unreliable
            # before ES 8.13 / OpenSearch 3.5, so ask for as many more hits as there are exclusions
            k = min(10_000, request.knn_k + len(request.exclude))
            # num_candidates / k: calibrated for knn_recall_target per facet, unless fixed (esqbe.backends.engines.calibrate)
            num_candidates = min(10_000, max(k, self.candidates_factor(request.facet)[0] * k, 100))
            for i, vec in enumerate(q):
                values = [float(x) for x in vec]
                for path in facet_paths(request.facet):
                    out.append(("knn", i, self._knn_body(path, values, k, num_candidates, restrict)))
        return self._with_filter(out, request)

    # --- metadata filters (engine_filters): pre-filtered BM25 and kNN ----------------------------

    def _filter_resolver(self):
        """Where metadata keys live in this index's documents (None: esqbe's meta_kw / meta_num)."""
        return None

    def _with_filter(self, searches: list, request: FirstStageRequest) -> list:
        clauses = filter_clauses(request.filter, self._filter_resolver())
        if not clauses:
            return searches
        info = self.info()
        post = knn_needs_ids(info.engine, info.version, clauses)  # only when the ids could not be resolved first
        for kind, _qi, body in searches:
            if kind == "bm25":
                add_to_bm25(body, clauses)
            else:
                add_to_knn(info.engine, body, clauses, post=post)
        return searches

    def _resolve_filter(self, request: FirstStageRequest) -> FirstStageRequest:
        """OpenSearch < 3.5 with a filter its nested kNN cannot run: the ids it allows become a pool."""
        clauses = filter_clauses(request.filter, self._filter_resolver())
        info = self.info()
        if not knn_needs_ids(info.engine, info.version, clauses):
            return request
        try:
            body = self._body(self._call(self.client.search, index=self.index, body=ids_body(clauses)))
        except Exception as exc:
            raise self._error("resolving the filter", exc) from exc
        hits = body.get("hits", {})
        total = hits.get("total", {})
        total = total.get("value", 0) if isinstance(total, dict) else int(total or 0)
        if total > MAX_RESOLVED_IDS:
            return request  # too wide to list: the kNN gets it as a post-filter (docs/engines.md, Limits)
        ids = frozenset(str(h["_id"]) for h in hits.get("hits", []))
        restrict = ids if request.restrict_to is None else ids & request.restrict_to
        return dataclasses.replace(request, restrict_to=restrict, filter=None)

    def preference_for(self, request: FirstStageRequest) -> str:
        """A stable shard-copy `preference` for one query: with replicas, primary and replica hold different
        deleted-document counts after upserts, so BM25 statistics (and scores) depend on which copy answers.
        The same query (text, facet, vectors, pool) always goes to the same copies; different queries still
        spread over the replicas. Never starts with `_` (reserved for the engines' own preference values)."""
        if self.preference:
            return self.preference
        h = hashlib.sha1()
        h.update((request.text or "").encode("utf-8"))
        h.update(f"\x00{request.facet}\x00".encode())
        h.update(np.ascontiguousarray(np.asarray(request.vectors, dtype="<f4")).tobytes())
        if request.restrict_to is not None:
            h.update("\x00".join(sorted(request.restrict_to)).encode("utf-8"))
        if request.filter is not None:
            h.update(f"\x00{request.filter!r}".encode())
        return f"esqbe-{h.hexdigest()[:16]}"

    def _msearch_once(self, bodies: list[dict], preference: str | Sequence[str | None] | None = None,
                      labels: list[str] | None = None) -> list[dict]:
        """One `_msearch`; a search inside it failing with 429/5xx raises so the whole request is retried; another
        failure is a BackendError (naming the search by `labels`, where given). `preference`: every search's, or
        one per search."""
        prefs = [preference] * len(bodies) if preference is None or isinstance(preference, str) else list(preference)
        lines: list[dict] = []
        for body, pref in zip(bodies, prefs, strict=True):
            lines.extend(({"preference": pref} if pref else {}, body))
        resp = self.client.msearch(index=self.index, body=lines)
        responses = self._body(resp).get("responses", [])
        if len(responses) != len(bodies):
            raise BackendError(f"_msearch returned {len(responses)} responses for {len(bodies)} searches")
        for i, r in enumerate(responses):
            if not isinstance(r, dict):
                raise BackendError(f"_msearch answered {type(r).__name__} for a search")
            if "error" in r:
                status = r.get("status")
                if status in RETRY_STATUSES:
                    raise _ItemRetry(status, r["error"])
                which = f" ({labels[i]})" if labels and i < len(labels) else ""
                raise BackendError(f"{self.name} search failed{which} ({status}): {_reason(r['error'])}")
        return responses

    def first_stage(self, request: FirstStageRequest) -> list[Candidate]:
        planned = self._first_stage_plan(request)
        if planned is None:
            return []
        request, searches = planned
        try:
            responses = self._retrying()(self._msearch_once, [body for _, _, body in searches], self.preference_for(request))
        except BackendError:
            raise
        except Exception as exc:
            raise self._error("searching", exc) from exc
        return self._first_stage_answer(request, searches, responses)

    def _first_stage_plan(self, request: FirstStageRequest) -> tuple[FirstStageRequest, list] | None:
        """The request as searched (a filter resolved to ids where it must be) and its searches; None: nothing to
        search (an empty pool, no text and no vector)."""
        meta = self._index_meta()
        q = np.asarray(request.vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if q.size and q.shape[1] != meta.dim:
            raise ModelMismatchError(
                f"query vectors are {q.shape[1]}-d but index {self.index!r} was built with {meta.model} ({meta.dim}-d)"
            )
        if request.filter:
            request = self._resolve_filter(request)
        if request.restrict_to is not None and not request.restrict_to:
            return None
        searches = self.search_bodies(request)
        return (request, searches) if searches else None

    def _first_stage_answer(self, request: FirstStageRequest, searches: list, responses: list[dict]) -> list[Candidate]:
        """The candidates of a first stage's `_msearch` answers: parsed, fused on the client, the best `k`."""
        bm25, knn = self.parse_first_stage(searches, responses, request, self.info(), self._space_engine())
        fused = fuse(bm25, knn, request.fusion, request.bm25_weight)
        best = top_k(fused, request.k)
        papers = self.get([pid for pid, _ in best]) if request.with_papers else {}
        return [
            Candidate(pid, float(score), bm25=bm25.get(pid, 0.0), knn=knn.get(pid, 0.0), paper=papers.get(pid))
            for pid, score in best
        ]

    def parse_first_stage(
        self,
        searches: list[tuple[str, int | None, dict]],
        responses: list[dict],
        request: FirstStageRequest,
        info: EngineInfo,
        space_engine: str = "lucene",
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(bm25 score per paper, knn per paper) from the `_msearch` responses.

        knn = mean over query sentences of the best cosine of any of the paper's searched sentences
        (0 where a query sentence did not reach the paper), each query sentence keeping its best `knn_k` papers."""
        excluded = set(request.exclude)
        bm25: dict[str, float] = {}
        best: dict[int, dict[str, float]] = {}
        for (kind, qi, _), resp in zip(searches, responses):
            for hit in resp.get("hits", {}).get("hits", []):
                pid = str(hit["_id"])
                if pid in excluded or hit.get("_score") is None:
                    continue
                if kind == "bm25":
                    bm25[pid] = float(hit["_score"])
                else:
                    cos = cosine_from_score(hit["_score"], info.engine, space_engine, info.version)
                    assert qi is not None  # a kNN search is one query sentence's
                    row = best.setdefault(int(qi), {})
                    if cos > row.get(pid, -2.0):
                        row[pid] = cos
        q = np.asarray(request.vectors)
        m = 1 if q.ndim == 1 else q.shape[0]
        knn: dict[str, float] = {}
        for row in best.values():
            for pid, cos in sorted(row.items(), key=lambda kv: (-kv[1], kv[0]))[: request.knn_k]:
                knn[pid] = knn.get(pid, 0.0) + cos / m
        return bm25, knn

    # --- the window scored in the engine (engine_facet_vectors) ----------------------------

    def window_scoring(self) -> tuple[bool, str]:
        """Scoring in the engine needs the setting on and the index's per-facet multi-vector fields; a cluster whose
        version (known exactly) lacks the MaxSim function is a BackendError naming the version that has it."""
        if not self.facet_vectors:
            return False, "engine_facet_vectors is off: summax runs in Python on the candidates' fetched vectors"
        if not self._has_facet_vectors():
            return False, (f"index {self.index!r} has no per-facet multi-vector fields (engine_facet_vectors was off "
                           f"when it was {self._mv_writer[0]}, and no `{self._mv_writer[1]}` run has added them since): "
                           "summax runs in Python")
        info = self.info()
        if info.exact:
            check_maxsim_version(self.engine, info.number)
        function = "maxSimDotProduct" if self.engine == "elasticsearch" else "lateInteractionScore"
        return True, (f"in {self.engine}: one _msearch over the window's ids (a search per example and avoided paper), "
                      f"rescored by {function} over the query "
                      "facet's multi-vector field")

    def score_windows(self, paper_ids, parts, lookups: Sequence[FirstStageRequest] = ()) -> WindowAnswer | None:
        """One `_msearch` holding, for each part of the query (its vectors, the facet it is matched with), one search
        (per 10,000 ids) over exactly `paper_ids`, rescored by MaxSim against the facet's field
        (esqbe.backends.engines.maxsim.window_body), and the searches of the `lookups` (first stages, each with its
        own shard-copy preference, as `first_stage` sends it); of each paper only its labels and soft labels back
        (no text, no vector: the hits shown are fetched whole afterwards). A search failing with 429/5xx retries the
        request; any other failure, or a hostile answer (`window_scores`), is a BackendError naming the part. A paper
        with no sentence of the facet gets NaN (no match, as in Python); one that has some but scored 0 (no field:
        written before the index carried them) is left unscored for the caller."""
        if not self.window_scoring()[0] or any(facet is not None and facet not in MV_FACETS for _, facet in parts):
            return None
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        includes, excludes = self._window_source()
        batches = [ids[start : start + WINDOW_MAX] for start in range(0, len(ids), WINDOW_MAX)]
        searches = [(n, batch, window_body(self.engine, batch, facet, vectors, includes, excludes,
                                           self._mv_namespace))
                    for n, (vectors, facet) in enumerate(parts) for batch in batches]
        labels = [f"part {n + 1} of {len(parts)}" for n, _, _ in searches]
        bodies: list[dict] = [body for _, _, body in searches]
        prefs: list[str | None] = [None] * len(searches)
        planned = [self._first_stage_plan(request) for request in lookups]
        for m, plan in enumerate(planned):
            if plan is not None:
                bodies += [body for _, _, body in plan[1]]
                prefs += [self.preference_for(plan[0])] * len(plan[1])
                labels += [f"look-up {m + 1} of {len(lookups)}"] * len(plan[1])
        out = WindowAnswer([WindowScores() for _ in parts], [[] for _ in lookups])
        if not bodies:
            return out
        try:
            responses = self._retrying()(self._msearch_once, bodies, prefs, labels=labels)
        except Exception as exc:
            raise self._error("scoring the window in the engine", exc) from exc
        rest = responses[len(searches):]
        for m, plan in enumerate(planned):
            if plan is not None:
                out.lookups[m] = self._first_stage_answer(plan[0], plan[1], rest[: len(plan[1])])
                rest = rest[len(plan[1]):]
        for (n, batch, _), answer in zip(searches, responses):
            facet = parts[n][1]
            hits = (answer.get("hits") or {}).get("hits") if isinstance(answer, dict) else None
            try:
                scored = window_scores(hits, batch)
            except BackendError as exc:
                raise BackendError(f"part {n + 1} of {len(parts)} of the query: {exc}") from None
            for pid, (score, source) in scored.items():
                try:
                    paper = self._window_paper(pid, source)
                except (KeyError, TypeError, ValueError) as exc:
                    raise BackendError(f"the window search answered paper {pid!r} with a malformed document") from exc
                out.parts[n].papers[pid] = paper
                has = any(facet is None or f == facet for f in paper.facets)
                if not has:
                    out.parts[n].scores[pid] = float("nan")
                elif score > 0.0:
                    out.parts[n].scores[pid] = summax_from_score(score)
        return out

    # where the window's fields live: the hooks an attached index (esqbe.backends.engines.attach) answers otherwise
    #: (the index was ..., the command that adds the fields): the words of window_scoring's refusal
    _mv_writer = ("made", "esqbe index")
    #: the object of `_source` the multi-vector fields are under (None: the top level)
    _mv_namespace: str | None = None

    def _window_source(self) -> tuple[list[str], list[str]]:
        """(includes, excludes) of each window hit's `_source`: what the caller decides by (the sentences' positions
        and labels, the tagger's soft labels), never a vector or a text."""
        includes = ["paper_id", *(f"{path}.{leaf}" for path in FACET_PATHS.values() for leaf in ("idx", "facet")),
                    "metadata.facet_probs"]
        return includes, [*VECTOR_FIELDS, "vectors_b64", *MV_FIELDS]

    def _window_paper(self, pid: str, source: dict) -> Paper:
        """The paper (no text, no vector) of one window hit's `_source`."""
        return doc_to_text({**source, "paper_id": pid})

    def exact_knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None,
                  exclude: frozenset[str] = frozenset()) -> dict[str, float]:
        """Exact kNN by a nested script_score over every document (esqbe.backends.engines.exact)."""
        from .exact import exact_knn_searches, parse_exact

        searches = exact_knn_searches(self.engine, vectors, k, facet, exclude)
        try:
            responses = self._retrying()(self._msearch_once, [body for _, body in searches])
        except BackendError:
            raise
        except Exception as exc:
            raise self._error("searching exactly", exc) from exc
        return parse_exact(searches, responses, len(np.atleast_2d(vectors)), k, exclude)
