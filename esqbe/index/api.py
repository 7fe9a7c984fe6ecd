"""The Python API: open an index, add papers, query by example. The CLI is a thin layer over this.

    import esqbe
    index = esqbe.open_index("esqbe-index")
    report = index.index_files(["papers.jsonl"])
    result = index.query(paper_id="1791179", facet="method", k=10)
    for hit in result.hits:
        print(hit.rank, hit.paper_id, hit.title, hit.matches[0].candidate_sentence)
"""
from __future__ import annotations

import errno
import os
import sqlite3
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..backends.base import Backend
from ..core import deadline
from ..core.filters import FilterError, MetadataFilter, coerce_filters
from ..core.progress import Progress
from ..domain import IndexedPaper, IndexMeta, Paper, normalize_label
from ..errors import BackendError, ModelMismatchError, StorageError
from ..ingest.encoded import is_parquet
from ..ingest.readers import InputError, ReadReport, check_source, read_papers
from ..query import centering
from ..query.search import (
    EmptyIndexError,
    PaperNotFoundError,
    QueryError,
    QueryResult,
    facet_probability,
    query_sentences,
    run_query,
    select_query_sentences,
    settings_for_facet,
)
from ..settings.config import Settings, load_settings

FACET_MODES = ("keep", "predict", "none")
_ENCODERS: dict = {}  # loaded models, shared by the indexes of one process (the CLI runner, a server)


def open_backend(settings: Settings, *, create: bool = True) -> Backend:
    """The backend named in the settings (engine clients are imported only when asked for)."""
    if settings.backend == "embedded":
        from ..backends.embedded.backend import EmbeddedBackend

        def make(create: bool):
            try:
                return EmbeddedBackend(settings.path, create=create)
            except (sqlite3.Error, OSError) as e:
                raise StorageError(f"cannot open the index at {settings.path}: {_reason(e, settings.path)}") from e

        if create and not os.path.exists(settings.path):
            return _DeferredBackend(lambda: make(True))  # created by the first write, not by a run that fails first
        return make(create)
    if settings.backend in ("elasticsearch", "opensearch"):
        if not settings.url:
            raise BackendError(f"the {settings.backend} backend needs --url (or ESQBE_URL, or `url:` in the config file)")
        kwargs = dict(api_key=settings.api_key, username=settings.username, password=settings.password,
                      ca_certs=settings.ca_certs, verify_certs=settings.verify_certs)
        from ..backends.engines.attach import (
            maybe_attached,  # an index the user owns, with esqbe attached to it
        )

        if settings.backend == "elasticsearch":
            from ..backends.engines.elasticsearch import ElasticsearchBackend

            return maybe_attached(ElasticsearchBackend(settings.url, settings.index, **kwargs))
        from ..backends.engines.opensearch import OpenSearchBackend

        return maybe_attached(OpenSearchBackend(settings.url, settings.index, **kwargs))
    raise BackendError(f"unknown backend {settings.backend!r}; choose embedded, elasticsearch or opensearch")


def _reason(e: BaseException, path: str | None = None) -> str:
    """A storage failure in words (sqlite says 'unable to open database file' for a read-only directory)."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    if "disk is full" in text or getattr(e, "errno", None) == errno.ENOSPC:
        return f"the disk is full ({text})"
    if ("readonly" in text or "read-only" in text or getattr(e, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM)
            or (path is not None and os.path.isdir(path) and not os.access(path, os.W_OK))):
        return f"the index is read-only here ({text})"
    return text


_STORAGE_ERRORS = (sqlite3.Error, OSError)


class _DeferredBackend:
    """A backend that does not exist yet: reads see an empty index; the first write creates it."""

    def __init__(self, factory):
        self._factory = factory
        self._real = None

    def meta(self):
        return self._real.meta() if self._real is not None else None

    def content_hashes(self, paper_ids):
        return self._real.content_hashes(paper_ids) if self._real is not None else {}

    def get(self, paper_ids):
        return self._real.get(paper_ids) if self._real is not None else {}

    def close(self):
        if self._real is not None:
            self._real.close()

    def __getattr__(self, name):
        if self._real is None:
            self._real = self._factory()
        return getattr(self._real, name)


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
    #: a --strict run: the error it stopped at, and the sources (or rest of one) it did not read
    stopped: str | None = None
    not_read: list[str] = field(default_factory=list)
    #: `file:line: id: ...` for each record whose id repeats an earlier line of its file (the later one wins)
    repeated: list[str] = field(default_factory=list)

    @property
    def stored(self) -> int:
        """Papers of this run that are in the index now (added, replaced or already there unchanged)."""
        return self.indexed + self.replaced + self.unchanged

    @property
    def failed(self) -> bool:
        """Errors, and none of what this run read is in the index: the run did nothing useful."""
        return bool(self.errors) and self.stored == 0

    def failure_message(self) -> str:
        if not self.failed:
            return ""
        if self.read == 0:
            return "nothing indexed: no input could be read"
        return f"nothing indexed: none of the {self.read} record(s) read could be indexed (see the errors above)"

    def stop_message(self) -> str:
        """What a stopped (--strict) run did and did not index, in words."""
        if self.stopped is None:
            return ""
        rest = f"; not read: {', '.join(self.not_read)}" if self.not_read else ""
        return (f"--strict: stopped at {self.stopped.split(': ')[0]}; the {self.stored} paper(s) read before it are in "
                f"the index ({self.indexed} indexed, {self.replaced} replaced, {self.unchanged} unchanged){rest}")

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
            "stopped": self.stopped,
            "not_read": list(self.not_read),
            "failed": self.failure_message() or None,
            "repeated": list(self.repeated),
        }


@dataclass
class EncodeReport:
    """What an encoding run did (papers of other shards are read but not counted as encoded)."""

    path: str = ""
    read: int = 0
    encoded: int = 0
    tagged: int = 0
    skipped: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"path": self.path, "read": self.read, "encoded": self.encoded, "tagged": self.tagged,
                "skipped": dict(self.skipped), "errors": list(self.errors), "seconds": round(self.seconds, 2)}


class Index:
    """An index (any backend) with the encoder and settings it is used with."""

    #: encode each batch in a worker thread while this thread writes the batch before it and reads the one
    #: after (False: one batch at a time, in this thread; benchmarks/bench_encode.py measures both)
    pipelined = True
    #: share a loaded model with the other indexes of this process (`_ENCODERS`); False: load one of its own
    #: (the server's threads: a tokenizer must not be used from two threads at once)
    shares_encoder = True

    def __init__(self, backend: Backend, settings: Settings, encoder=None):
        self.backend = backend
        self.settings = settings
        self._encoder = encoder
        self._tagger = None
        self._tagger_shares_encoder = False

    # --- the encoder, checked against what the index was built with ------------------------------
    def _requested_meta(self, encoder) -> IndexMeta:
        return IndexMeta(encoder.name, encoder.dim, self.settings.encoder_mode,
                         getattr(encoder, "fingerprint", None), getattr(encoder, "location", None))

    def _stored_meta(self) -> IndexMeta | None:
        """The index's meta; an index written before fingerprints gets the fingerprint of the installed
        package its name names (e.g. the default model), so it can be compared with a model directory."""
        meta = self.backend.meta() if self.backend is not None else None  # no backend: encoder_only()
        if meta is None or meta.fingerprint or "/" in meta.model or Path(meta.model).exists():
            return meta
        from ..encode.encoder import ModelNotFoundError, model_info

        try:
            info = model_info(meta.model)
        except (ModelNotFoundError, ImportError, ValueError):
            return meta
        if info.dim not in (None, meta.dim):
            return meta
        return replace(meta, fingerprint=info.fingerprint, model_source=meta.model)

    def _model_to_load(self, meta: IndexMeta | None) -> str | None:
        """The model this index is used with: the settings' model, else the one the index was built with."""
        if self.settings.model or meta is None:
            return self.settings.model
        source = meta.model_source or meta.model
        if os.path.isabs(source) and not os.path.isdir(source):
            from ..encode.encoder import ModelNotFoundError

            raise ModelNotFoundError(
                f"this index was built with model {meta.model!r} from {source}, which no longer exists; "
                f"pass --model with a copy of that model (fingerprint {meta.fingerprint or 'unknown'})")
        return source

    def check_model(self, *, query: bool = False) -> None:
        """Fail early (before loading any weights) if this run's model, dimension or encoder mode is not
        the one the index was built with. Models are compared by fingerprint, not by name. A query
        encodes in the index's own mode, so `query=True` checks the model only."""
        meta = self._stored_meta()
        if meta is None:
            return
        mode = meta.encoder_mode if query else self.settings.encoder_mode
        if self._encoder is not None:
            meta.check(replace(self._requested_meta(self._encoder), encoder_mode=mode))
            return
        if self.settings.model is None:
            return  # the index's own model (loaded only if needed: `encoder` fails clearly if it is gone)
        from ..encode.encoder import model_info

        info = model_info(self.settings.model)
        meta.check(IndexMeta(info.name, info.dim or meta.dim, mode, info.fingerprint))

    @property
    def encoder(self):
        if self._encoder is None:
            from ..encode.encoder import Encoder

            meta = self._stored_meta()
            self.check_model(query=True)  # the encoder mode is checked where vectors are written (ensure)
            model = self._model_to_load(meta)
            key = (model, self.settings.device, self.settings.batch_size, self.settings.encoder_backend)
            cache = _ENCODERS if self.shares_encoder else {}
            if key not in cache:
                from ..encode.encoder import ModelNotFoundError

                try:
                    cache[key] = Encoder.load(model, device=self.settings.device, batch_size=self.settings.batch_size,
                                              backend=self.settings.encoder_backend)
                except ModelNotFoundError as e:
                    if self.settings.model is None and meta is not None:  # the index names its model; where is it?
                        raise ModelNotFoundError(f"{e}. The index was built with model {meta.model!r}: give its directory "
                                                 f"with --model DIR (or ESQBE_MODEL, or `model:` in the config file)") from None
                    raise
            encoder = cache[key]
            if meta is not None:  # the stored model's files may have changed since
                meta.check(replace(self._requested_meta(encoder), encoder_mode=meta.encoder_mode))
            self._encoder = encoder
        return self._encoder

    @property
    def tagger(self):
        """The facet tagger (the `tagger` setting's weights, else the shipped ones), or None if none can be used.

        It reuses this index's encoder pass when its weights belong to that encoder; with another
        encoder (e.g. `--model` all-mpnet-base-v2) it runs the encoder it was trained on itself."""
        if self._tagger is None:
            from ..tagger.runtime import FacetTagger, TaggerMismatchError

            path = self.settings.tagger  # checked where it was set (config.check_value)
            try:
                try:
                    self._tagger = FacetTagger.load(path, encoder=self.encoder)
                    self._tagger_shares_encoder = True
                except TaggerMismatchError:
                    self._tagger = FacetTagger.load(path)  # a second encoder pass, its own
                    self._tagger_shares_encoder = False
            except (ImportError, FileNotFoundError):
                if path:
                    raise  # weights the user named are gone: say so rather than leave papers unlabelled
                self._tagger = False  # no tagger weights in this build: sentences stay `unlabeled`
        return self._tagger or None

    # --- writing --------------------------------------------------------------------------------
    def _encode(self, papers: list[Paper], facets: str, on_progress=None) -> tuple[list[IndexedPaper], int]:
        """Sentence vectors (and predicted facet labels where needed) for a batch, in one encoder pass."""
        needs_tags = [facets == "predict" or (facets == "keep" and not p.is_labeled) for p in papers]
        if any(needs_tags) and self.tagger is None:
            needs_tags = [False] * len(papers)
        on_batch = None
        if any(needs_tags) and self.settings.encoder_mode == "contextual" and self._tagger_shares_encoder:
            on_batch = self.tagger.listener()
        vectors = self.encoder.sentence_vectors(papers, self.settings.encoder_mode, on_batch=on_batch,
                                                on_progress=on_progress)
        tagged = 0
        if any(needs_tags):
            # labels and soft labels (class probabilities, kept beside the hard ones for facet matching
            # that tolerates tagger errors), from this encoder pass or the tagger's own
            if on_batch is not None:
                labels, probs = self.tagger.collect(papers), self.tagger.collect_probabilities(papers)
            else:
                labels, probs = self.tagger.tag_with_probabilities(papers)
            for p, need, lab, prob in zip(papers, needs_tags, labels, probs):
                if need:
                    # the input as read: a re-run of the same input is recognised without encoding it again
                    p.metadata["input_hash"] = p.content_hash()
                    p.facets = [normalize_label(x) for x in lab]
                    p.metadata["facets_predicted"] = True
                    if prob is not None:
                        p.metadata["facet_probs"] = prob
                    tagged += 1
        return [IndexedPaper(p, v, self.encoder.token_counts(p)) for p, v in zip(papers, vectors)], tagged

    def _already_tagged(self, papers: list[Paper], *, same_input: bool = False) -> set[str]:
        """Ids whose stored copy was tagged from this very input (`input_hash`); without `same_input`,
        also those whose stored copy has the same title and sentences and tagger-predicted labels."""
        if not papers:
            return set()
        stored = self.backend.get([p.paper_id for p in papers])
        out = set()
        for p in papers:
            s = stored.get(p.paper_id)
            if s is None or not s.paper.metadata.get("facets_predicted"):
                continue
            if s.paper.metadata.get("input_hash") == p.content_hash() or (
                    not same_input and (s.paper.title, s.paper.sentences) == (p.title, p.sentences)):
                out.add(p.paper_id)
        return out

    def preflight(self) -> None:
        """Check the model and the device exist before reading or loading anything (a run must not fail
        after its first file because of a typo in --model or --device)."""
        if self._encoder is not None:
            return
        from ..encode.encoder import _pick_device, model_info

        self.check_model()
        if self.settings.model:
            model_info(self.settings.model)
        _pick_device(self.settings.device)

    def _where(self) -> str:
        return self.settings.path if self.settings.backend == "embedded" else f"{self.settings.backend} index {self.settings.index!r}"

    def _ensure_index(self) -> None:
        """Create the index for this run's model, or check it is the one the index holds (loads the model)."""
        requested = self._requested_meta(self.encoder)
        stored = self._stored_meta()
        if stored is not None and not self.backend.meta().fingerprint and stored.same_model(requested):
            requested = replace(requested, model=stored.model)  # an index from before fingerprints, same model
        self.backend.ensure(requested)

    def add_papers(self, papers: Iterable[Paper], *, facets: str | None = None, report: IndexReport | None = None,
                   progress: bool = False) -> IndexReport:
        """Upsert papers by id: unchanged papers are skipped before encoding; each batch is committed.

        The model is loaded (and the index created) only when a batch has papers to encode. A failing
        store (disk full, read-only) raises StorageError with `.report`: what was committed before it."""
        facets = facets or self.settings.facets
        if facets not in FACET_MODES:
            raise ValueError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
        report = report or IndexReport()
        start = time.perf_counter()
        self.check_model()  # before any weights are loaded
        bar = progress if isinstance(progress, Progress) else Progress() if progress else None
        stop: list[InputError] = []
        ensured = False

        def until_bad_line(items):  # a --strict reader raises at a bad line: index the batch read before it first
            try:
                yield from items
            except InputError as e:
                stop.append(e)

        def storage_error(e: BaseException) -> StorageError:
            error = StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}; "
                                 f"{report.stored} paper(s) of this run were committed before it")
            error.report = report
            return error

        def store(pending) -> None:
            """Write one encoded batch (waiting for its encoding) and count it."""
            encoding, n_batch, n_fresh = pending
            try:
                if encoding is not None:
                    indexed, tagged = encoding.result()  # an encoder error surfaces here
                    result = self.backend.upsert(indexed)
                    centering.written(self.backend, result.added + result.replaced)
                    report.tagged += tagged
                    report.indexed += result.added
                    report.replaced += result.replaced
                    report.unchanged += result.unchanged
                    report.errors.extend(result.errors)
            except _STORAGE_ERRORS as e:
                raise storage_error(e) from e
            if bar is not None:
                bar.update(n_batch - n_fresh)  # the encoded ones were counted per encoder batch

        # batch N is encoded in the worker while this thread writes batch N-1 and reads batch N+1: reading,
        # splitting, SQLite, tantivy and fsync overlap with the model instead of leaving it idle
        worker = ThreadPoolExecutor(1, thread_name_prefix="esqbe-encode") if self.pipelined else None
        pending = None
        try:
            for batch in _batches(until_bad_line(papers), max(1, int(self.settings.commit_every))):
                latest = {p.paper_id: p for p in batch}  # an id repeated within a batch: the last one wins
                report.replaced += len(batch) - len(latest)
                try:
                    fresh = self._fresh(latest, facets, report)
                    if fresh and not ensured:
                        self._ensure_index()
                        ensured = True
                except _STORAGE_ERRORS as e:
                    raise storage_error(e) from e
                encoding = None
                if fresh:
                    args = (fresh, facets, bar.update if bar is not None else None)
                    encoding = worker.submit(self._encode, *args) if worker is not None else _Done(self._encode(*args))
                if pending is not None:
                    store(pending)
                pending = (encoding, len(batch), len(fresh))
            if pending is not None:
                store(pending)
                pending = None
        finally:
            if worker is not None:
                worker.shutdown(wait=True, cancel_futures=True)  # an error in this thread: the batch being encoded is dropped
            if bar is not None and bar is not progress:
                bar.close()
            report.seconds += time.perf_counter() - start
        if stop:
            raise stop[0]
        return report

    def _fresh(self, latest: dict[str, Paper], facets: str, report: IndexReport) -> list[Paper]:
        """The papers of a batch that need encoding; the others are counted as unchanged."""
        stored = self.backend.content_hashes(latest)
        if facets == "predict":
            tagged_before = self._already_tagged([p for p in latest.values() if p.paper_id in stored])
        elif facets == "keep":  # unlabelled input whose stored copy was tagged from the same input
            tagged_before = self._already_tagged([p for p in latest.values() if p.paper_id in stored and not p.is_labeled
                                                  and stored[p.paper_id] != p.content_hash()], same_input=True)
        else:
            tagged_before = set()
        fresh = []
        for p in latest.values():
            if p.paper_id in tagged_before:
                report.unchanged += 1  # same input, labels already predicted: tagging again changes nothing
            elif facets != "predict" and stored.get(p.paper_id) == p.content_hash():
                report.unchanged += 1
            else:
                fresh.append(p)
        return fresh

    def index_files(self, sources: Sequence[str], *, format: str | None = None, strict: bool = False,
                    facets: str | None = None, progress: bool = False) -> IndexReport:
        """Read each source (path, .gz, or '-') and upsert its papers; bad lines are reported, not fatal.

        Every source is checked before anything is loaded: a missing file (or a directory) is reported
        like a bad line and the others are read. With `strict` the first problem stops the run: every
        paper read before a bad line is committed, and the InputError propagates with `.report` (this
        IndexReport: what was indexed, `stopped`, `not_read`); a StorageError carries `.report` too."""
        report = IndexReport()
        sources = list(sources)
        problems = {i: e for i, s in enumerate(sources) if (e := check_source(s)) is not None}
        if strict and problems:
            first = problems[min(problems)]
            report.errors.append(str(first))
            report.stopped = str(first)
            report.not_read = [str(s) for s in sources]
            first.report = report
            raise first
        report.errors.extend(str(e) for e in problems.values())
        if len(problems) < len(sources):
            self.preflight()
        bar = progress if isinstance(progress, Progress) else None
        if progress is True:
            sizes = [os.path.getsize(s) if isinstance(s, (str, os.PathLike)) and str(s) != "-" else None
                     for i, s in enumerate(sources) if i not in problems]
            bar = Progress(total_bytes=None if None in sizes else sum(sizes))
        try:
            self._index_sources(sources, problems, format, strict, facets, bar, report)
        finally:
            if bar is not None:
                bar.close()
        return report

    def _index_sources(self, sources, problems, format, strict, facets, bar, report) -> None:
        done_bytes = 0
        for i, source in enumerate(sources):
            if i in problems:
                continue
            reader_report = ReadReport()
            if bar is not None:
                bar.position = lambda: done_bytes + reader_report.position
            try:
                if format in (None, "parquet") and is_parquet(source) or format == "parquet":
                    self.add_encoded(source, strict=strict, report=report, reader_report=reader_report, progress=bar)
                    continue
                self.add_papers(read_papers(source, format, strict=strict, report=reader_report), facets=facets,
                                report=report, progress=bar)
            except InputError as e:
                report.errors.append(str(e))
                if not strict:  # not a line-level problem the reader could report and pass over
                    continue
                report.stopped = str(e)
                if e.line:
                    report.not_read.append(f"{e.source} from line {e.line}")
                report.not_read.extend(str(s) for s in sources[i + 1 :])
                e.report = report
                raise
            except StorageError as e:
                report.not_read.extend(str(s) for s in sources[i + 1 :])
                e.report = report
                raise
            finally:
                report.read += reader_report.read
                report.skipped.update(reader_report.skipped)
                report.errors.extend(str(e) for e in reader_report.errors)
                report.repeated.extend(reader_report.repeated)
                done_bytes += reader_report.position

    def add_encoded(self, source: str, *, strict: bool = False, report: IndexReport | None = None,
                    reader_report: ReadReport | None = None, progress: bool = False,
                    batch_size: int | None = None) -> IndexReport:
        """Load pre-encoded papers from a Parquet file (see esqbe.ingest.encoded) without running a model.

        The file's `esqbe` metadata must match the index (and the model named in the settings, if any);
        papers are committed every `batch_size` rows (default max(commit_every, 16384)); unchanged papers are skipped."""
        from ..ingest.encoded import read_encoded, read_meta

        report = report if report is not None else IndexReport()
        own_reader_report = reader_report is None
        reader_report = reader_report if reader_report is not None else ReadReport()
        start = time.perf_counter()
        meta = read_meta(source)
        if self.settings.model is not None:  # the model named in the settings must be the file's (by fingerprint)
            from ..encode.encoder import model_info

            info = model_info(self.settings.model)
            IndexMeta(info.name, info.dim or meta.dim, self.settings.encoder_mode, info.fingerprint).check(meta)
        stored = self._stored_meta()
        if stored is not None:
            stored.check(meta)
        self.backend.ensure(meta)
        bar = progress if isinstance(progress, Progress) else Progress() if progress else None
        try:
            for batch in read_encoded(source, batch_size=batch_size or max(16384, int(self.settings.commit_every)), strict=strict,
                                      report=reader_report):
                stored = self.backend.content_hashes(p.paper_id for p in batch)
                fresh = [p for p in batch if stored.get(p.paper_id) != p.paper.content_hash()]
                report.unchanged += len(batch) - len(fresh)
                if fresh:
                    result = self.backend.upsert(fresh)
                    centering.written(self.backend, result.added + result.replaced)
                    report.indexed += result.added
                    report.replaced += result.replaced
                    report.unchanged += result.unchanged
                    report.errors.extend(result.errors)
                if bar is not None:
                    bar.update(len(batch))
        except _STORAGE_ERRORS as e:
            error = StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}; "
                                 f"{report.stored} paper(s) of this run were committed before it")
            error.report = report
            raise error from e
        finally:
            if bar is not None and bar is not progress:
                bar.close()
            report.seconds += time.perf_counter() - start
            if own_reader_report:
                report.read += reader_report.read
                report.skipped.update(reader_report.skipped)
                report.errors.extend(str(e) for e in reader_report.errors)
        return report

    def encode_files(self, sources: Sequence[str], out: str, *, shard: tuple[int, int] = (0, 1), format: str | None = None,
                     strict: bool = False, facets: str | None = None, progress: bool = False) -> "EncodeReport":
        """Encode papers (and tag them, per `facets`) into OUT/papers-<i>-of-<n>.parquet without touching an index;
        with `shard=(i, n)` only the papers whose id hashes to shard i of n (so n machines split one corpus)."""
        from pathlib import Path

        from ..ingest.encoded import EncodedWriter, shard_of

        i, n = shard
        if not (n >= 1 and 0 <= i < n):
            raise ValueError(f"shard must be I/N with 0 <= I < N (got {i}/{n})")
        facets = facets or self.settings.facets
        if facets not in FACET_MODES:
            raise ValueError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
        Path(out).mkdir(parents=True, exist_ok=True)
        target = Path(out) / f"papers-{i:05d}-of-{n:05d}.parquet"
        report = EncodeReport(path=str(target))
        start = time.perf_counter()
        bar = Progress() if progress else None
        with EncodedWriter(target, self._requested_meta(self.encoder)) as writer:
            for source in sources:
                reader_report = ReadReport()
                try:
                    papers = (p for p in read_papers(source, format, strict=strict, report=reader_report)
                              if shard_of(p.paper_id, n) == i)
                    for batch in _batches(papers, max(1, int(self.settings.commit_every))):
                        latest = list({p.paper_id: p for p in batch}.values())
                        indexed, tagged = self._encode(latest, facets)
                        writer.write(indexed)
                        report.tagged += tagged
                        report.encoded += len(indexed)
                        if bar is not None:
                            bar.update(len(batch))
                finally:
                    report.read += reader_report.read
                    report.skipped.update(reader_report.skipped)
                    report.errors.extend(str(e) for e in reader_report.errors)
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - start
        return report

    def iter_papers(self, batch: int = 256) -> Iterator[IndexedPaper]:
        """Every stored paper (with its vectors), in id order, fetched `batch` at a time."""
        ids = self.backend.paper_ids()
        for start in range(0, len(ids), batch):
            found = self.backend.get(ids[start : start + batch])
            yield from (found[i] for i in ids[start : start + batch] if i in found)

    def delete(self, paper_ids: Iterable[str]) -> int:
        try:
            deleted = self.backend.delete(paper_ids)
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}") from e
        centering.written(self.backend, deleted)
        return deleted

    def delete_papers(self, paper_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Delete papers by id; returns (deleted ids, ids that were not in the index)."""
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        try:
            present = self.backend.content_hashes(ids)
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot read the index at {self._where()}: {_reason(e, self.settings.path)}") from e
        self.delete([p for p in ids if p in present])
        return [p for p in ids if p in present], [p for p in ids if p not in present]

    def stats(self) -> dict:
        try:
            stats = self.backend.stats()
            meta = self.backend.meta()
        except _STORAGE_ERRORS as e:
            raise StorageError(f"cannot read the index at {self._where()}: {_reason(e, self.settings.path)}") from e
        if meta is not None:
            stats["model_fingerprint"] = meta.fingerprint
            stats["model_source"] = meta.model_source
        return stats

    # --- querying -------------------------------------------------------------------------------
    def query(self, paper_id: str | None = None, *, facet: str | None = None, sentences: Sequence[int] | None = None,
              text: str | Sequence[str] | None = None, title: str = "", restrict_to: Sequence[str] | None = None,
              filters=None, engine_filter: dict | str | None = None, **overrides) -> QueryResult:
        """Papers most similar to a paper's facet (or chosen sentences).

        The query paper is `paper_id` (from the index; its stored vectors are reused) or `text`
        (an abstract string or a list of sentences, encoded now; facet labels predicted if a facet
        is asked for). `overrides` are Settings fields (k, rescorer, rescorer_params, ...); they win over
        the settings' `facet_settings` entry for the facet, which wins over the general settings.

        `filters` restricts the candidates by their metadata before ranking: a grammar string
        ("year>=2019"), a {"key", "op", "value"} dict, or a list of them, all of which must hold
        (esqbe.core.filters). `engine_filter` (Elasticsearch/OpenSearch only) is a query DSL clause, or its
        JSON text, that the candidates must also match, e.g. {"term": {"lang": "en"}}.
        """
        settings = settings_for_facet(self.settings, facet).replace(**overrides)
        flt = make_filter(filters, engine_filter)
        meta = self.backend.meta()
        if meta is None:
            raise EmptyIndexError("the index is empty: index some papers first (`esqbe index FILE`)")
        self.check_model(query=True)
        if (paper_id is None) == (text is None):
            raise QueryError("give exactly one of a paper id or a query text")
        if paper_id is not None:
            found = self.backend.get([str(paper_id)])
            if str(paper_id) not in found:
                raise PaperNotFoundError(f"paper {paper_id} is not in the index")
            query = found[str(paper_id)]
        else:
            sents = query_sentences(text)  # refused past esqbe.core.limits' caps, before any tokenizing
            if not sents:
                raise QueryError("the query text has no sentences")
            deadline.check()
            t_encode = time.perf_counter()  # labels predicted and vectors encoded for this text
            paper = Paper("query", title, sents)
            if facet is not None and self.tagger is not None:
                labels, probs = self.tagger.tag_with_probabilities([paper])
                paper.facets = [normalize_label(x) for x in labels[0]]
                # as for an indexed paper the tagger labelled: its probabilities choose the query's sentences
                # (query_facet_threshold), so a facet the hard labels miss can still be asked for
                paper.metadata = {**(paper.metadata or {}), "facet_probs": probs[0]}
            likely = facet is not None and bool(settings.query_facet_threshold) and "facet_probs" in (paper.metadata or {}) \
                and bool((facet_probability(paper, normalize_label(facet)) >= float(settings.query_facet_threshold)).any())
            if facet is not None and normalize_label(facet) not in paper.facets and not likely:
                labelled = sorted(set(paper.facets) - {"unlabeled"})
                raise QueryError(
                    f"the query text has no {facet} sentence: "
                    + (f"the tagger labels its {len(sents)} sentence(s) {', '.join(labelled)}" if labelled
                       else "no facet tagger is available to label it")
                    + "; ask for another --facet, or leave --facet out to query with every sentence")
            deadline.check()
            vectors = self.encoder.sentence_vectors([paper], meta.encoder_mode)[0]
            query = IndexedPaper(paper, vectors)
            encode_ms = round(1000 * (time.perf_counter() - t_encode), 2)
        indices = select_query_sentences(query, facet, sentences, settings.query_facet_threshold)
        from ..rescore.rescorers import RescoreContext

        context = RescoreContext(encoder=_LazyEncoder(self), backend=self.backend)
        result = run_query(self.backend, query, indices, settings, facet=facet, restrict_to=restrict_to, context=context,
                           filter=flt)
        if paper_id is None:
            result.query_paper_id = None
            result.timings = {"encode": encode_ms, **result.timings}
        return result

    def get(self, paper_ids: Sequence[str]) -> dict[str, Paper]:
        """Stored papers by id (sentences, facet labels, metadata); missing ids are absent."""
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


class _LazyEncoder:
    """Loads the model only if a rescorer actually needs it (token-level matching)."""

    def __init__(self, index: Index):
        self._index = index

    def __getattr__(self, name):
        return getattr(self._index.encoder, name)


def make_filter(filters=None, engine_filter: dict | str | None = None) -> MetadataFilter | None:
    """The API's `filters` / `engine_filter` arguments as one MetadataFilter (None when both are empty);
    a FilterError (a ValueError) names what is wrong."""
    import json

    conditions = coerce_filters(filters)
    if isinstance(engine_filter, str):
        try:
            engine_filter = json.loads(engine_filter)
        except json.JSONDecodeError as e:
            raise FilterError(f"engine filter is not JSON: {e.msg} at column {e.colno}") from None
    if engine_filter is not None and (not isinstance(engine_filter, dict) or len(engine_filter) != 1):
        raise FilterError(f"engine filter must be one query DSL clause, a JSON object with one key such as "
                          f'{{"term": {{"lang": "en"}}}}, got {engine_filter!r}')
    flt = MetadataFilter(conditions, engine_filter)
    return flt if flt else None


def encoder_only(*, config: str | None = None, settings: Settings | None = None, encoder=None, **overrides) -> Index:
    """An Index with no backend, for `Index.encode_files` (encoding runs where no index is)."""
    base = settings or load_settings(config)
    return Index(None, base.replace(**overrides), encoder=encoder)


def open_index(path: str | None = None, *, config: str | None = None, settings: Settings | None = None,
               encoder=None, create: bool = True, **overrides) -> Index:
    """Open (or create) an index. `path` is the embedded index directory; other settings as keywords
    (backend, url, index, model, ...) override the config file and environment."""
    base = settings or load_settings(config)
    settings = base.replace(path=path, **overrides)
    return Index(open_backend(settings, create=create), settings, encoder=encoder)


class _Done:
    """A result computed in place, with the interface of a Future (the serial indexing loop)."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _batches(items: Iterable, n: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


__all__ = ["open_index", "open_backend", "encoder_only", "make_filter", "FilterError", "Index", "IndexReport", "EncodeReport",
           "QueryError", "InputError", "ModelMismatchError", "BackendError", "StorageError"]
