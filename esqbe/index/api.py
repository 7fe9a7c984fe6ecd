"""The Python API: open an index, add papers, query by example. The CLI is a thin layer over this.

    import esqbe
    index = esqbe.open_index("esqbe-index")
    report = index.index_files(["papers.jsonl"])
    result = index.query(paper_id="1791179", facet="method", k=10)
    for hit in result.hits:
        print(hit.rank, hit.paper_id, hit.title, hit.matches[0].candidate_sentence)
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, overload

from ..backends.base import Backend
from ..core import deadline
from ..core.filters import FilterError
from ..core.limits import MAX_AVOID, MAX_EXAMPLE_SENTENCES, MAX_EXAMPLES
from ..core.workids import identifier_keys
from ..domain import IndexedPaper, IndexMeta, Paper, normalize_label
from ..errors import BackendError, ModelMismatchError, StorageError
from ..ingest.readers import InputError
from ..query import centering
from ..query.combine import run_examples
from ..query.results import (
    EmptyIndexError,
    Example,
    ExampleSpec,
    FacetNotFoundError,
    PaperNotFoundError,
    QueryError,
    QueryResult,
    QueryTooLargeError,
    soft_probabilities,
)
from ..query.search import (
    explain_selection,
    facet_probability,
    numbered_sentences,
    query_sentences,
    query_texts,
    select_query_sentences,
    settings_for_facet,
)
from ..settings.config import Settings, load_settings
from .ingest import IngestMixin
from .open import _DeferredBackend, make_filter, open_backend  # noqa: F401  (_DeferredBackend: the server)
from .reports import _STORAGE_ERRORS, EncodeReport, IndexReport, _reason


class Index(IngestMixin):
    """An index (any backend) with the encoder and settings it is used with (writing: IngestMixin)."""

    #: share a loaded model with the other indexes of this process (`esqbe.encode.loader`); False: load one of its
    #: own (the server's threads: a tokenizer must not be used from two threads at once)
    shares_encoder = True
    #: measure the index's similarity scale on the querying thread when it is due (esqbe.index.scale); False (the
    #: server's readers): on a thread of its own, while queries go on with the stored or fixed scale
    scale_waits = True

    def __init__(self, backend: Backend, settings: Settings, encoder=None):
        self.backend = backend
        self.settings = settings
        self._encoder = encoder
        self._tagger: Any = None  # None: not loaded yet; False: none to load
        self._tagger_shares_encoder = False

    # --- the encoder, checked against what the index was built with ------------------------------
    def _requested_meta(self, encoder) -> IndexMeta:
        return IndexMeta(encoder.name, encoder.dim, self.settings.encoder_mode,
                         getattr(encoder, "fingerprint", None), getattr(encoder, "location", None),
                         getattr(encoder, "runtime", None), getattr(getattr(encoder, "adapter", None), "name", None),
                         getattr(encoder, "distilled", None))

    def _stored_meta(self) -> IndexMeta | None:
        """The index's meta; an index written before fingerprints gets the fingerprint of the installed
        package its name names (e.g. the default model), so it can be compared with a model directory."""
        meta = self.backend.meta() if self.backend is not None else None  # no backend: encoder_only()
        if meta is None or meta.fingerprint or "/" in meta.model or Path(meta.model).exists():
            return meta
        from ..encode.identity import ModelNotFoundError, model_info

        try:
            info = model_info(meta.model)
        except (ModelNotFoundError, ImportError, ValueError):
            return meta
        if info.dim not in (None, meta.dim):
            return meta
        return replace(meta, fingerprint=info.fingerprint, model_source=meta.model)

    def check_model(self, *, query: bool = False) -> None:
        """Fail early (before loading any weights) if this run's model, dimension or encoder mode is not
        the one the index was built with. Models are compared by fingerprint, not by name. A query
        encodes in the index's own mode, so `query=True` checks the model only."""
        meta = self._stored_meta()
        if meta is None:
            return
        mode = meta.encoder_mode if query else self.settings.encoder_mode
        if self._encoder is not None:  # a query's vectors are not stored: its runtime is not checked
            requested = self._requested_meta(self._encoder)
            meta.check(replace(requested, encoder_mode=mode, runtime=None if query else requested.runtime))
            return
        if self.settings.model is None:
            return  # the index's own model (loaded only if needed: `encoder` fails clearly if it is gone)
        from ..encode.identity import model_info

        info = model_info(self.settings.model, self.settings.adapter)
        meta.check(IndexMeta(info.name, info.dim or meta.dim, mode, info.fingerprint, adapter=info.adapter))

    @property
    def encoder(self):
        if self._encoder is None:
            from ..encode.identity import ModelNotFoundError
            from ..encode.loader import ModelSpec, load_encoder

            meta = self._stored_meta()
            self.check_model(query=True)  # the encoder mode is checked where vectors are written (ensure)
            spec = ModelSpec.for_index(self.settings, meta)  # the settings' model, else the index's own
            try:
                encoder = load_encoder(spec, shared=self.shares_encoder)  # shared by the indexes of this process
            except ModelNotFoundError as e:
                if self.settings.model is None and meta is not None:  # the index names its model; where is it?
                    raise ModelNotFoundError(f"{e}. The index was built with model {meta.model!r}: give its directory "
                                             f"with --model DIR (or ESQBE_MODEL, or `model:` in the config file)") from None
                raise
            if meta is not None:  # the stored model's files may have changed since (the runtime: checked on writes)
                meta.check(replace(self._requested_meta(encoder), encoder_mode=meta.encoder_mode, runtime=None))
            self._encoder = encoder
        return self._encoder

    @property
    def tagger(self):
        """The facet tagger (the `tagger` setting's weights, else the shipped ones), or None if none can be used.

        It reuses this index's encoder pass when its weights belong to that encoder; with another
        encoder (e.g. `--model` all-mpnet-base-v2) it runs the encoder it was trained on itself."""
        if self._tagger is None:
            from ..tagger.runtime import load_tagger

            # the `tagger` setting was checked where it was set (config.check_value)
            tagger, self._tagger_shares_encoder = load_tagger(self.settings.tagger, lambda: self.encoder)
            self._tagger = tagger if tagger is not None else False  # False: no tagger weights in this build
        return self._tagger or None

    def _where(self) -> str:
        s = self.settings
        return s.path if s.backend == "embedded" else f"{s.backend} index {s.index!r}"


    def iter_papers(self, batch: int = 256) -> Iterator[IndexedPaper]:
        """Every stored paper (with its vectors), in id order, fetched `batch` at a time."""
        ids = self.backend.paper_ids()
        for start in range(0, len(ids), batch):
            found = self.backend.get(ids[start : start + batch])
            yield from (found[i] for i in ids[start : start + batch] if i in found)

    def delete(self, paper_ids: Iterable[str]) -> int:
        """Delete papers by id (an id merged into another paper, or a paper's DOI, arXiv or PubMed id, deletes that
        paper); returns how many were deleted."""
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        deleted, _missing, merged = self.delete_papers(ids)
        return len({merged.get(p, p) for p in deleted})

    def delete_papers(self, paper_ids: Iterable[str]) -> tuple[list[str], list[str], dict[str, str]]:
        """Delete papers by id; returns (the ids asked for that deleted a paper, the ids that name none, {each of them
        that is a record's id merged into another paper (esqbe.index.merge) or an identifier of one: the paper it
        names, deleted}). Where the
        backend keeps an alias table, any id that finds a paper (`show`, `query --paper`) deletes that paper."""
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        try:
            present = set(self.backend.content_hashes(ids))
            named = self._merged_into([p for p in ids if p not in present])
            there = set(self.backend.content_hashes(sorted(set(named.values())))) if named else set()
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot read the index at {self._where()}: {_reason(e, self.settings.path)}") from e
        merged = {p: target for p, target in named.items() if target in there}
        targets = list(dict.fromkeys([p for p in ids if p in present] + list(merged.values())))
        try:
            count = self.backend.delete(targets) if targets else 0
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}") from e
        self._written(count)
        return ([p for p in ids if p in present or p in merged], [p for p in ids if p not in present and p not in merged],
                merged)

    def _written(self, papers: int) -> None:
        """`papers` were added, replaced or deleted through this index: what is derived from its papers looks again
        (the corpus directions past 10% of their corpus, the similarity scale at its next query)."""
        from .scale import recheck

        centering.written(self.backend, papers)
        if papers > 0:
            recheck(self._scale_where())

    def _scale_where(self) -> str:
        """The index's name for this process's memo of similarity scales (esqbe.index.scale)."""
        return self._where() if self.settings.backend != "embedded" else str(Path(self.settings.path or "").resolve())

    def _merged_into(self, paper_ids: list[str]) -> dict[str, str]:
        """Each of `paper_ids` that names a paper by another id -> that paper (an alias table's): a record's id merged
        into it, or one of its identifiers (a DOI, arXiv or PubMed id, as `show` and `query --paper` take them)."""
        if not paper_ids or not self.backend.keeps_aliases:
            return {}
        asked = {p: [f"id:{p}", *identifier_keys(p)] for p in paper_ids}
        found = self.backend.work_aliases(key for keys in asked.values() for key in keys)
        return {p: next(found[k] for k in keys if k in found) for p, keys in asked.items() if any(k in found for k in keys)}

    def stats(self) -> dict:
        try:
            stats = self.backend.stats()
            meta = self.backend.meta()
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot read the index at {self._where()}: {_reason(e, self.settings.path)}") from e
        if meta is not None:
            stats["model_fingerprint"] = meta.fingerprint
            stats["model_source"] = meta.model_source
            stats["encoder_runtime"] = meta.effective_runtime  # how the vectors were computed (IndexMeta.runtime)
            stats["encoder_runtime_recorded"] = meta.runtime is not None  # False: an older index, taken as torch-fp32
            stats["encoder_adapter"] = meta.adapter or "none"  # merged into the model's weights (part of its identity)
            if meta.distilled:  # `esqbe adapt`'s model: teacher, data and recipe
                stats["model_distilled"] = meta.distilled
        return stats

    def check_recall(self, *, queries: int = 50, facet: str | None = None, seed: int = 0, k: int = 100):
        """The first stage's kNN recall@10 / @k against exact search, measured on a seeded sample of this index's
        own papers (esqbe.index.recall; `esqbe check recall`)."""
        from .recall import check_recall

        try:
            return check_recall(self.backend, queries=queries, facet=facet, seed=seed, k=k)
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot read the index at {self._where()}: {_reason(e, self.settings.path)}") from e

    def calibrate_knn(self, *, force: bool = False, progress: Callable[[str], None] | None = None) -> dict | None:
        """Calibrate the approximate kNN for the settings' `knn_recall_target` / `knn_recall_statistic` where its
        stored calibration is for another target or statistic (`force`: every facet, as `esqbe check recall
        --calibrate` does). Embedded: each IVF's nprobe and re-scored papers, without rebuilding it; engines:
        num_candidates (ef_search); `progress` is told what is being calibrated. Returns {facet: calibration} of
        what was stored, None when nothing was done."""
        try:
            return self.backend.calibrate_knn(self.settings.knn_recall_target, self.settings.knn_recall_statistic,
                                              force=force, progress=progress)
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}") from e

    # --- querying -------------------------------------------------------------------------------
    def query(self, paper_id: str | None = None, *, facet: str | None = None, sentences: Sequence[int] | None = None,
              text: str | Sequence[str] | None = None, title: str = "", restrict_to: Sequence[str] | None = None,
              filters=None, engine_filter: dict | str | None = None, examples: Sequence | None = None,
              avoid: Sequence | None = None, place_hits: bool = True, **overrides) -> QueryResult:
        """Papers most similar to a paper's facet (or chosen sentences), or to several examples and unlike others.

        The query paper is `paper_id` (from the index; its stored vectors are reused) or `text`
        (an abstract string or a list of sentences, encoded now; facet labels predicted if a facet
        is asked for). `overrides` are Settings fields (k, rescorer, rescorer_params, ...); they win over
        the settings' `facet_settings` entry for the facet, which wins over the general settings.

        `examples` instead of one paper: several, each a paper id, a `{"paper_id" | "text", "facet" | "sentences",
        "title"}` mapping or an `esqbe.query.results.ExampleSpec`; `avoid`: papers the hits should not resemble
        (ids or mappings). An example or avoided paper without its own facet or sentences takes `facet` (neither:
        every sentence). The single-paper query is the query of one example (esqbe.query.combine); examples and
        avoided papers are never hits.

        `filters` restricts the candidates by their metadata before ranking: a grammar string
        ("year>=2019"), a {"key", "op", "value"} dict, or a list of them, all of which must hold
        (esqbe.core.filters). `engine_filter` (Elasticsearch/OpenSearch only) is a query DSL clause, or its
        JSON text, that the candidates must also match, e.g. {"term": {"lang": "en"}}.

        `place_hits`: each hit's score's percentile and band on the index's scale (esqbe.index.scale; measured the
        first time it is needed); False for work that reads only the ranking (evaluation, reranking, watches).

        Every text (`text`, the examples') is split and counted before anything is fetched, tagged or encoded, all
        together at most `esqbe.core.limits.MAX_QUERY_SENTENCES` sentences, each counted whole whichever are chosen
        (esqbe.query.search.query_texts; past it QueryTooLargeError).
        """
        return self._query(paper_id, facet=facet, sentences=sentences, text=text, title=title, restrict_to=restrict_to,
                           filters=filters, engine_filter=engine_filter, examples=examples, avoid=avoid,
                           place_hits=place_hits, **overrides)[0]

    def graph(self, paper_id: str | None = None, *, facet: str | None = None, sentences: Sequence[int] | None = None,
              text: str | Sequence[str] | None = None, title: str = "", filters=None,
              engine_filter: dict | str | None = None, examples: Sequence | None = None, avoid: Sequence | None = None,
              **overrides):
        """The query's hits as a graph (esqbe.query.graph.QueryGraph): the query `query` runs with the same arguments
        (k at most esqbe.query.graph.MAX_GRAPH_HITS, refused before any work), its hits as nodes (same order, same
        scores, same bands), edges between hits by the rescorer's similarity each way in the query's facet (kept at the
        scale's fair band or above), groups where the hits split, and a seeded layout. The hits' vectors are fetched
        once."""
        from ..query.graph import MAX_GRAPH_HITS, build_graph
        from ..rescore.batches import RescoreContext

        t0 = time.perf_counter()
        result, settings, scale = self._query(paper_id, facet=facet, sentences=sentences, text=text, title=title,
                                              restrict_to=None, filters=filters, engine_filter=engine_filter,
                                              examples=examples, avoid=avoid, place_hits=True, max_k=MAX_GRAPH_HITS,
                                              **overrides)
        t1 = time.perf_counter()
        papers = self.backend.get([h.paper_id for h in result.hits])
        directions = None
        if settings.vector_centering != "none":
            directions = centering.corpus_directions(self.backend, settings.vector_centering)
        t2 = time.perf_counter()
        assert scale is not None  # placed: place_hits
        graph = build_graph(result, papers, settings, scale,
                            context=RescoreContext(encoder=_LazyEncoder(self), backend=self.backend),
                            directions=directions)
        graph.timings = {"query": round(1000 * (t1 - t0), 2), "fetch": round(1000 * (t2 - t1), 2), **graph.timings,
                         "total": round(1000 * (time.perf_counter() - t0), 2)}
        return graph

    def _query(self, paper_id: str | None, *, facet: str | None, sentences: Sequence[int] | None,
               text: str | Sequence[str] | None, title: str, restrict_to: Sequence[str] | None, filters,
               engine_filter: dict | str | None, examples: Sequence | None, avoid: Sequence | None, place_hits: bool,
               max_k: int | None = None, **overrides):
        """`query`, with what it ran with: (the result, its settings, the scale its hits were placed on or None)."""
        if examples is not None or avoid:
            if paper_id is not None or text is not None or sentences is not None:
                raise QueryError("give the query as examples, or as one paper id or text, not both")
            specs = [ExampleSpec.of(x) for x in (examples or [])]
            avoid_specs = [ExampleSpec.of(x) for x in (avoid or [])]
        else:
            if (paper_id is None) == (text is None):
                raise QueryError("give exactly one of a paper id or a query text")
            specs = [ExampleSpec(None if paper_id is None else str(paper_id), facet,
                                 None if sentences is None else tuple(sentences),
                                 text if text is None or isinstance(text, str) else tuple(text), title)]
            avoid_specs = []
        check_examples(specs, avoid_specs)
        # every text split and counted whole, all together, before anything is fetched, tagged or encoded
        at = [i for i, x in enumerate(specs) if x.text is not None]
        for i, sents in zip(at, query_texts([specs[i].text or "" for i in at])):
            specs[i] = replace(specs[i], text=tuple(sents))
        shared = {normalize_label(x.facet or facet) for x in specs if x.sentences is None and (x.facet or facet)}
        settings = settings_for_facet(self.settings, shared.pop() if len(shared) == 1 else None).replace(**overrides)
        if max_k is not None and settings.k > max_k:
            raise QueryError(f"k is {settings.k}; a graph has at most {max_k} hits (its pairs grow as k squared)")
        flt = make_filter(filters, engine_filter, settings)  # value lists bounded before anything is fetched
        meta = self.backend.meta()
        if meta is None:
            raise EmptyIndexError("the index is empty: index some papers first (`esqbe index FILE`)")
        self.check_model(query=True)
        if flt:
            self.backend.check_filter(flt)  # an unknown key or a value no paper has: an error, not "no hits"
        ids = [x.paper_id for x in (*specs, *avoid_specs) if x.paper_id is not None]
        found = self.backend.get(ids) if ids else {}
        missing = [i for i in ids if i not in found]
        if missing:
            raise PaperNotFoundError(f"paper{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                                     f"{'are' if len(missing) > 1 else 'is'} not in the index")
        parts, encode_ms = [], None
        for x in (*specs, *avoid_specs):  # every example chosen before anything is encoded or ranked
            own = x.facet if x.facet is not None or x.sentences is not None else facet
            if x.paper_id is not None:
                paper = found[x.paper_id]
            else:
                paper, encode_ms = self._text_example(x, own, meta, settings)
            indices = select_query_sentences(paper, own, x.sentences, settings.query_facet_threshold)
            parts.append(_example(paper, indices, own, x, settings))
        total = sum(len(p.indices) for p in parts[: len(specs)])
        if len(specs) > 1 and total > MAX_EXAMPLE_SENTENCES:
            raise QueryTooLargeError(f"the {len(specs)} examples have {total} query sentences together; at most "
                                     f"{MAX_EXAMPLE_SENTENCES} per query (choose a facet or fewer sentences per example)")
        from ..rescore.batches import RescoreContext

        context = RescoreContext(encoder=_LazyEncoder(self), backend=self.backend)
        result = run_examples(self.backend, parts[: len(specs)], parts[len(specs):], settings, restrict_to=restrict_to,
                              context=context, filter=flt)
        head = parts[0]
        result.selection = head.selection
        soft = soft_probabilities(head.paper.paper)
        result.query_probabilities = [soft[i] for i in head.indices] if soft else None
        if not head.indexed:
            result.query_paper_id = None
        if encode_ms is not None:
            result.timings = {"encode": encode_ms, **result.timings}
        scale = self._place(result, settings, meta, context) if place_hits else None
        return result, settings, scale

    def similarity_scale(self, rescorer: str | None = None, *, wait: bool | None = None, **overrides):
        """Where this index's matches stand for `rescorer` (default: the settings'), an
        `esqbe.index.scale.SimilarityScale`: measured on the index's own papers where it has enough of them (stored
        with the index, measured again when it has changed by a fifth), else the shipped fixed scale. `wait`: measure it
        here where due (None: as a query would, see `_scale`)."""
        from ..rescore.batches import RescoreContext

        meta = self.backend.meta()
        if meta is None:
            raise EmptyIndexError("the index is empty: index some papers first (`esqbe index FILE`)")
        settings = self.settings.replace(**({"rescorer": rescorer} if rescorer else {}), **overrides)
        return self._scale(settings, meta, RescoreContext(encoder=_LazyEncoder(self), backend=self.backend), wait)

    def _scale(self, settings: Settings, meta: IndexMeta, context, wait: bool | None = None):
        from .scale import SCALE_SETTINGS, similarity_scale

        # measured with the index's own settings but for what decides a match's similarity (a query's deeper first
        # stage, say, must not make each measuring query as slow as it)
        settings = self.settings.replace(**{k: getattr(settings, k) for k in SCALE_SETTINGS})
        where = self._scale_where()
        opener = (lambda: open_backend(self.settings, create=False))  # noqa: E731  (a backend of the measuring thread's own)
        try:
            # under a deadline the query's own work must not wait for a measurement: it runs on a thread of its own;
            # nor where the backend keeps no note of it (an engine's): a one-shot process would measure it every time
            if wait is None:
                wait = self.scale_waits and not deadline.active() and self.backend.keeps_notes
            return similarity_scale(self.backend, settings, meta.fingerprint or meta.model, where, wait=wait,
                                    context=context, opener=opener)
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot read the index at {self._where()}: {_reason(e, self.settings.path)}") from e

    def _place(self, result: QueryResult, settings: Settings, meta: IndexMeta, context):
        """Each hit's percentile and band on the index's similarity scale (esqbe.index.scale); returns the scale."""
        t = time.perf_counter()
        scale = self._scale(settings, meta, context)
        for hit in result.hits:
            hit.percentile, hit.band = scale.place(hit.score)  # the score that orders the hits
        result.scale = scale.public()
        result.timings = {**result.timings, "scale": round(1000 * (time.perf_counter() - t), 2)}
        return scale

    def _text_example(self, spec, facet: str | None, meta: IndexMeta, settings: Settings) -> tuple[IndexedPaper, float]:
        """A pasted text as an example: split (refused past the caps), labelled by the tagger, encoded."""
        sents = query_sentences(spec.text if isinstance(spec.text, str) else list(spec.text))  # before any tokenizing
        if not sents:
            raise QueryError("the query text has no sentences")
        deadline.check()
        t_encode = time.perf_counter()  # labels predicted and vectors encoded for this text
        paper = Paper("query", spec.title, sents)
        if self.tagger is not None:  # labels shown for every text query, used by a facet query
            labels, probs = self.tagger.tag_with_probabilities([paper])
            paper.facets = [normalize_label(x) for x in labels[0]]
            # as for an indexed paper the tagger labelled: its probabilities choose the query's sentences
            # (query_facet_threshold), so a facet the hard labels miss can still be asked for
            paper.metadata = {**(paper.metadata or {}), "facet_probs": probs[0]}
        likely = facet is not None and bool(settings.query_facet_threshold) and "facet_probs" in (paper.metadata or {}) \
            and bool((facet_probability(paper, normalize_label(facet)) >= float(settings.query_facet_threshold)).any())
        if facet is not None and normalize_label(facet) not in paper.facets and not likely:
            labelled = sorted(set(paper.facets) - {"unlabeled"})
            raise FacetNotFoundError(
                f"the query text has no {facet} sentence: "
                + (f"the tagger labels its {len(sents)} sentence(s) {', '.join(labelled)}" if labelled
                   else "no facet tagger is available to label it")
                + f"; its sentences: {numbered_sentences(paper, normalize_label(facet))}; choose sentences by index "
                "instead (--sentences 0,2 on the command line, \"sentences\": [0, 2] in JSON), ask for another "
                "facet, or leave the facet out to query with every sentence")
        deadline.check()
        vectors = self.encoder.sentence_vectors([paper], meta.encoder_mode)[0]
        return IndexedPaper(paper, vectors), round(1000 * (time.perf_counter() - t_encode), 2)

    def rerank(self, query, documents: Sequence[str], **overrides):
        """Scores of given candidate papers (ids, in their order) against a rerank query such as
        "paper:ID facet:method" (esqbe.index.rerank: the grammar, unknown ids scored lowest): a RerankResult."""
        from .rerank import rerank

        return rerank(self, query, documents, **overrides)

    @overload
    def get(self, paper_ids: str) -> Paper | None: ...  # type: ignore[overload-overlap]  # a str first: one id
    @overload
    def get(self, paper_ids: Iterable[str]) -> dict[str, Paper]: ...

    def get(self, paper_ids):
        """Stored papers (sentences, facet labels, metadata): of one id (a str), its Paper or None where the index
        holds none; of a list (any iterable) of ids, {id: Paper} with the missing ids absent."""
        if isinstance(paper_ids, (str, bytes)):
            one = paper_ids.decode() if isinstance(paper_ids, bytes) else paper_ids
            found = self.backend.get([one])
            return found[one].paper if one in found else None
        return {pid: ip.paper for pid, ip in self.backend.get([str(p) for p in paper_ids]).items()}

    def search(self, text: str, k: int = 10) -> list[tuple[Paper, float]]:
        """Find papers by title/abstract words (BM25), best first: (paper, score)."""
        found = self.backend.search_text(text, k)
        papers = self.get([pid for pid, _ in found])
        return [(papers[pid], score) for pid, score in found if pid in papers]

    # --- cited text identification ------------------------------------------------------------
    def matcher(self, options=None, **params):
        """The cited-text matcher for these options (`esqbe.query.cite.CiteOptions` or its fields), kept for reuse."""
        from ..query.cite import CitedTextMatcher, CiteOptions

        options = options if options is not None else CiteOptions.from_params(params)
        cache = self.__dict__.setdefault("_matchers", {})
        if options not in cache:
            counts = self.backend.token_counts if options.words is None else None
            cache[options] = CitedTextMatcher(options, encoder=_LazyEncoder(self) if options.words is None else None,
                                              counts=counts)
        return cache[options]

    def cite(self, paper_id: str, text: str, *, k: int = 2, explain: bool = True, options=None, **params):
        """The sentences of indexed paper `paper_id` that the citing sentence `text` most likely refers to:
        a `CiteResult` with the top `k`, best first, each with its score and the query words it matched.
        `params` are `CiteOptions` fields (method, d, alpha, words, max_tokens, markers, stopwords, ...)."""
        return self.cite_many(paper_id, [text], k=k, explain=explain, options=options, **params)[0]

    def cite_many(self, paper_id: str, texts: Sequence[str], *, k: int = 2, explain: bool = False, options=None,
                  **params) -> list:
        """`cite` for several citing sentences of the same paper, scored in one batch."""
        from ..query.cite import CitedSentence, CiteResult

        if int(k) < 1:
            raise QueryError(f"k must be at least 1 (got {k})")
        if self.backend.meta() is None:
            raise QueryError("the index is empty: index some papers first (`esqbe index FILE`)")
        texts = [str(t) for t in texts]
        if not texts or any(not t.strip() for t in texts):
            raise QueryError("the citing sentence is empty")
        found = self.backend.get([str(paper_id)])
        if str(paper_id) not in found:
            raise QueryError(f"paper {paper_id} is not in the index")
        paper = found[str(paper_id)].paper
        if not paper.sentences:
            raise QueryError(f"paper {paper_id} has no sentences")
        sids = paper.metadata.get("sentence_ids") if isinstance(paper.metadata, dict) else None
        if not isinstance(sids, list) or len(sids) != len(paper.sentences):
            sids = [str(i) for i in range(len(paper.sentences))]
        matcher = self.matcher(options, **params)
        results = []
        for text, ranked in zip(texts, matcher.rank(texts, paper.sentences, int(k))):
            hits = [CitedSentence(r + 1, j, str(sids[j]), paper.sentences[j], score,
                                  matcher.explain(text, paper.sentences[j]) if explain else [])
                    for r, (j, score) in enumerate(ranked)]
            results.append(CiteResult(str(paper_id), text, matcher.options.method, hits))
        return results

    def close(self) -> None:
        """Close the index; the embedded writer folds fresh rows into its ANN and checkpoints here."""
        if self.backend is not None:
            try:
                self.backend.close()
            except _STORAGE_ERRORS as e:
                raise StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}") from e

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except Exception:
            if exc_type is None:
                raise
            # an error is already on its way out and says what went wrong (a full disk, say); closing
            # fails for the same reason, and must not hide it


def check_examples(specs: Sequence, avoid: Sequence) -> None:
    """The examples and papers to avoid as asked, checked before anything is fetched: at least one example, within
    the bounds (esqbe.core.limits), no paper twice, none both an example and avoided."""
    if not specs:
        raise QueryError("a query needs at least one example (a paper id or a text)")
    if len(specs) > MAX_EXAMPLES:
        raise QueryError(f"{len(specs)} examples; at most {MAX_EXAMPLES} per query")
    if len(avoid) > MAX_AVOID:
        raise QueryError(f"{len(avoid)} papers to avoid; at most {MAX_AVOID} per query")
    if any(x.paper_id is None for x in avoid):
        raise QueryError("a paper to avoid is a paper id of the index, not a text")
    for what, group in (("examples", specs), ("papers to avoid", avoid)):
        ids = [x.paper_id for x in group if x.paper_id is not None]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise QueryError(f"{'papers' if len(twice) > 1 else 'paper'} {', '.join(twice)} given twice as "
                             f"{what}; give each paper once (one facet or sentence list per paper)")
    both = sorted({x.paper_id for x in specs if x.paper_id is not None} & {x.paper_id for x in avoid})
    if both:
        raise QueryError(f"{'papers' if len(both) > 1 else 'paper'} {', '.join(both)} both an example and to avoid; "
                         "give each either way, not both")


def _example(paper: IndexedPaper, indices: list[int], facet: str | None, spec, settings: Settings):
    """An example (or paper to avoid) ready to rank with: its chosen sentences, the facet they speak for, and why."""
    ex = Example(paper, indices, normalize_label(facet) if facet and spec.sentences is None else None,
                 indexed=spec.paper_id is not None)
    ex.selection = explain_selection(paper.paper, facet if spec.sentences is None else None, spec.sentences,
                                     settings.query_facet_threshold, indices)
    return ex


class _LazyEncoder:
    """Loads the model only if a rescorer actually needs it (token-level matching)."""

    def __init__(self, index: Index):
        self._index = index

    def __getattr__(self, name):
        return getattr(self._index.encoder, name)


def encoder_only(*, config: str | None = None, settings: Settings | None = None, encoder=None, **overrides) -> Index:
    """An Index with no backend, for `Index.encode_files` (encoding runs where no index is)."""
    base = settings or load_settings(config)
    return Index(None, base.replace(**overrides), encoder=encoder)  # type: ignore[arg-type]  # no backend: encoding only


def open_index(path: str | None = None, *, config: str | None = None, settings: Settings | None = None,
               encoder=None, create: bool = True, **overrides) -> Index:
    """Open (or create) an index. `path` is the embedded index directory; other settings as keywords
    (backend, url, index, model, ...) override the config file and environment."""
    base = settings or load_settings(config)
    settings = base.replace(path=path, **overrides)
    return Index(open_backend(settings, create=create), settings, encoder=encoder)



__all__ = ["open_index", "open_backend", "encoder_only", "make_filter", "FilterError", "Index", "IndexReport", "EncodeReport",
           "QueryError", "InputError", "ModelMismatchError", "BackendError", "StorageError"]
