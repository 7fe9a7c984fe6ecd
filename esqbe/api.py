"""The Python API: open an index, add papers, query by example. The CLI is a thin layer over this.

    import esqbe
    index = esqbe.open_index("esqbe-index")
    report = index.index_files(["papers.jsonl"])
    result = index.query(paper_id="1791179", facet="method", k=10)
    for hit in result.hits:
        print(hit.rank, hit.paper_id, hit.title, hit.matches[0].candidate_sentence)
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from .backends.base import Backend, BackendError, IndexedPaper, IndexMeta, ModelMismatchError, UpsertResult
from .config import Settings, load_settings
from .papers import Paper, split_sentences
from .readers import InputError, ReadReport, read_papers
from .search import QueryError, QueryResult, run_query, select_query_sentences, settings_for_facet

FACET_MODES = ("keep", "predict", "none")
_ENCODERS: dict = {}  # loaded models, shared by the indexes of one process (the CLI runner, a server)


def open_backend(settings: Settings, *, create: bool = True) -> Backend:
    """The backend named in the settings (engine clients are imported only when asked for)."""
    if settings.backend == "embedded":
        from .backends.embedded import EmbeddedBackend

        return EmbeddedBackend(settings.path, create=create)
    if settings.backend in ("elasticsearch", "opensearch"):
        if not settings.url:
            raise BackendError(f"the {settings.backend} backend needs --url (or ESQBE_URL, or `url:` in the config file)")
        kwargs = dict(api_key=settings.api_key, username=settings.username, password=settings.password,
                      ca_certs=settings.ca_certs, verify_certs=settings.verify_certs)
        if settings.backend == "elasticsearch":
            from .backends.elasticsearch import ElasticsearchBackend

            return ElasticsearchBackend(settings.url, settings.index, **kwargs)
        from .backends.opensearch import OpenSearchBackend

        return OpenSearchBackend(settings.url, settings.index, **kwargs)
    raise BackendError(f"unknown backend {settings.backend!r}; choose embedded, elasticsearch or opensearch")


@dataclass
class IndexReport:
    """What an indexing run did: nothing read is unaccounted for."""

    read: int = 0
    indexed: int = 0
    replaced: int = 0
    unchanged: int = 0
    skipped: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    tagged: int = 0
    seconds: float = 0.0

    def summary(self) -> dict:
        return {
            "read": self.read,
            "indexed": self.indexed,
            "replaced": self.replaced,
            "unchanged": self.unchanged,
            "skipped": dict(self.skipped),
            "errors": list(self.errors),
            "tagged": self.tagged,
            "seconds": round(self.seconds, 2),
        }


class Index:
    """An index (any backend) with the encoder and settings it is used with."""

    def __init__(self, backend: Backend, settings: Settings, encoder=None):
        self.backend = backend
        self.settings = settings
        self._encoder = encoder
        self._tagger = None
        self._tagger_shares_encoder = False

    # --- the encoder, checked against what the index was built with ------------------------------
    def _requested_meta(self, encoder) -> IndexMeta:
        return IndexMeta(encoder.name, encoder.dim, self.settings.encoder_mode)

    def check_model(self) -> None:
        """Fail early if the settings name another model than the index was built with."""
        meta = self.backend.meta()
        if meta is None or self.settings.model is None and self._encoder is None:
            return
        from .encoder import resolve_model

        name = self._encoder.name if self._encoder is not None else resolve_model(self.settings.model)[1]
        if name != meta.model or self.settings.encoder_mode != meta.encoder_mode:
            meta.check(IndexMeta(name, self._encoder.dim if self._encoder else meta.dim, self.settings.encoder_mode))

    @property
    def encoder(self):
        if self._encoder is None:
            from .encoder import Encoder

            meta = self.backend.meta()
            model = self.settings.model or (meta.model if meta else None)
            self.check_model()
            key = (model, self.settings.device, self.settings.batch_size)
            if key not in _ENCODERS:
                from .encoder import ModelNotFoundError

                try:
                    _ENCODERS[key] = Encoder.load(model, device=self.settings.device, batch_size=self.settings.batch_size)
                except ModelNotFoundError as e:
                    if self.settings.model is None and meta is not None:  # the index names its model; where is it?
                        raise ModelNotFoundError(f"{e}. The index was built with model {meta.model!r}: give its directory "
                                                 f"with --model DIR (or ESQBE_MODEL, or `model:` in the config file)") from None
                    raise
            self._encoder = _ENCODERS[key]
        return self._encoder

    @property
    def tagger(self):
        """The shipped facet tagger, or None if none can be used.

        It reuses this index's encoder pass when its weights belong to that encoder; with another
        encoder (e.g. `--model` all-mpnet-base-v2) it runs the encoder it was trained on itself."""
        if self._tagger is None:
            try:
                from .tagger import FacetTagger, TaggerMismatchError

                try:
                    self._tagger = FacetTagger.load(encoder=self.encoder)
                    self._tagger_shares_encoder = True
                except TaggerMismatchError:
                    self._tagger = FacetTagger.load()  # a second encoder pass, its own
                    self._tagger_shares_encoder = False
            except (ImportError, FileNotFoundError):
                self._tagger = False  # no tagger weights in this build: sentences stay `unlabeled`
        return self._tagger or None

    # --- writing --------------------------------------------------------------------------------
    def _encode(self, papers: list[Paper], facets: str) -> tuple[list[IndexedPaper], int]:
        """Sentence vectors (and predicted facet labels where needed) for a batch, in one encoder pass."""
        needs_tags = [facets == "predict" or (facets == "keep" and not p.is_labeled) for p in papers]
        if any(needs_tags) and self.tagger is None:
            needs_tags = [False] * len(papers)
        on_batch = None
        if any(needs_tags) and self.settings.encoder_mode == "contextual" and self._tagger_shares_encoder:
            on_batch = self.tagger.listener()
        vectors = self.encoder.sentence_vectors(papers, self.settings.encoder_mode, on_batch=on_batch)
        tagged = 0
        if any(needs_tags):
            # labels and soft labels (class probabilities, kept beside the hard ones for facet matching
            # that tolerates tagger errors), from this encoder pass or the tagger's own
            if on_batch is not None:
                labels, probs = self.tagger.collect(papers), self.tagger.collect_probabilities(papers)
            else:
                labels, probs = self.tagger.tag_with_probabilities(papers)
            from .papers import normalize_label

            for p, need, lab, prob in zip(papers, needs_tags, labels, probs):
                if need:
                    p.facets = [normalize_label(x) for x in lab]
                    p.metadata["facets_predicted"] = True
                    if prob is not None:
                        p.metadata["facet_probs"] = prob
                    tagged += 1
        return [IndexedPaper(p, v, self.encoder.token_counts(p)) for p, v in zip(papers, vectors)], tagged

    def _already_tagged(self, papers: list[Paper]) -> set[str]:
        """Ids whose stored copy has the same title and sentences and tagger-predicted labels."""
        if not papers:
            return set()
        stored = self.backend.get([p.paper_id for p in papers])
        return {p.paper_id for p in papers if p.paper_id in stored
                and stored[p.paper_id].paper.metadata.get("facets_predicted")
                and (stored[p.paper_id].paper.title, stored[p.paper_id].paper.sentences) == (p.title, p.sentences)}

    def add_papers(self, papers: Iterable[Paper], *, facets: str | None = None, report: IndexReport | None = None,
                   progress: bool = False) -> IndexReport:
        """Upsert papers by id: unchanged papers are skipped before encoding; each batch is committed."""
        facets = facets or self.settings.facets
        if facets not in FACET_MODES:
            raise ValueError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
        report = report or IndexReport()
        start = time.perf_counter()
        self.backend.ensure(self._requested_meta(self.encoder))
        bar = _bar(progress)
        for batch in _batches(papers, max(1, int(self.settings.commit_every))):
            latest = {p.paper_id: p for p in batch}  # an id repeated within a batch: the last one wins
            report.replaced += len(batch) - len(latest)
            stored = self.backend.content_hashes(latest)
            tagged_before = self._already_tagged([p for p in latest.values() if p.paper_id in stored]) if facets == "predict" else set()
            fresh = []
            for p in latest.values():
                if facets == "predict":
                    if p.paper_id in tagged_before:
                        report.unchanged += 1  # same text, labels already predicted: tagging again changes nothing
                    else:
                        fresh.append(p)
                elif stored.get(p.paper_id) == p.content_hash():
                    report.unchanged += 1
                else:
                    fresh.append(p)
            if fresh:
                indexed, tagged = self._encode(fresh, facets)
                report.tagged += tagged
                result = self.backend.upsert(indexed)
                report.indexed += result.added
                report.replaced += result.replaced
                report.unchanged += result.unchanged
                report.errors.extend(result.errors)
            bar.update(len(batch))
        bar.close()
        report.seconds += time.perf_counter() - start
        return report

    def index_files(self, sources: Sequence[str], *, format: str | None = None, strict: bool = False,
                    facets: str | None = None, progress: bool = False) -> IndexReport:
        """Read each source (path, .gz, or '-') and upsert its papers; bad lines are reported, not fatal
        unless `strict` (then the InputError propagates after what was read before it is committed)."""
        report = IndexReport()
        for source in sources:
            reader_report = ReadReport()
            try:
                self.add_papers(read_papers(source, format, strict=strict, report=reader_report), facets=facets,
                                report=report, progress=progress)
            finally:
                report.read += reader_report.read
                report.skipped.update(reader_report.skipped)
                report.errors.extend(str(e) for e in reader_report.errors)
        return report

    def delete(self, paper_ids: Iterable[str]) -> int:
        return self.backend.delete(paper_ids)

    def stats(self) -> dict:
        return self.backend.stats()

    # --- querying -------------------------------------------------------------------------------
    def query(self, paper_id: str | None = None, *, facet: str | None = None, sentences: Sequence[int] | None = None,
              text: str | Sequence[str] | None = None, title: str = "", restrict_to: Sequence[str] | None = None,
              **overrides) -> QueryResult:
        """Papers most similar to a paper's facet (or chosen sentences).

        The query paper is `paper_id` (from the index; its stored vectors are reused) or `text`
        (an abstract string or a list of sentences, encoded now; facet labels predicted if a facet
        is asked for). `overrides` are Settings fields (k, rescorer, rescorer_params, ...); they win over
        the settings' `facet_settings` entry for the facet, which wins over the general settings.
        """
        settings = settings_for_facet(self.settings, facet).replace(**overrides)
        meta = self.backend.meta()
        if meta is None:
            raise QueryError("the index is empty: index some papers first (`esqbe index FILE`)")
        self.check_model()
        if (paper_id is None) == (text is None):
            raise QueryError("give exactly one of a paper id or a query text")
        if paper_id is not None:
            found = self.backend.get([str(paper_id)])
            if str(paper_id) not in found:
                raise QueryError(f"paper {paper_id} is not in the index")
            query = found[str(paper_id)]
        else:
            sents = split_sentences(text) if isinstance(text, str) else [s for s in text if str(s).strip()]
            if not sents:
                raise QueryError("the query text has no sentences")
            paper = Paper("query", title, sents)
            if facet is not None and self.tagger is not None:
                paper.facets = self.tagger.tag([paper])[0]
                from .papers import normalize_label

                paper.facets = [normalize_label(x) for x in paper.facets]
            vectors = self.encoder.sentence_vectors([paper], meta.encoder_mode)[0]
            query = IndexedPaper(paper, vectors)
        indices = select_query_sentences(query, facet, sentences, settings.query_facet_threshold)
        from .rescore import RescoreContext

        context = RescoreContext(encoder=_LazyEncoder(self), backend=self.backend)
        result = run_query(self.backend, query, indices, settings, facet=facet, restrict_to=restrict_to, context=context)
        if paper_id is None:
            result.query_paper_id = None
        return result

    def close(self) -> None:
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _LazyEncoder:
    """Loads the model only if a rescorer actually needs it (token-level matching)."""

    def __init__(self, index: Index):
        self._index = index

    def __getattr__(self, name):
        return getattr(self._index.encoder, name)


def open_index(path: str | None = None, *, config: str | None = None, settings: Settings | None = None,
               encoder=None, create: bool = True, **overrides) -> Index:
    """Open (or create) an index. `path` is the embedded index directory; other settings as keywords
    (backend, url, index, model, ...) override the config file and environment."""
    base = settings or load_settings(config)
    settings = base.replace(path=path, **overrides)
    return Index(open_backend(settings, create=create), settings, encoder=encoder)


def _batches(items: Iterable, n: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _bar(enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc="indexing", unit=" papers", file=sys.stderr, dynamic_ncols=True)


__all__ = ["open_index", "open_backend", "Index", "IndexReport", "QueryError", "InputError", "ModelMismatchError", "BackendError"]
