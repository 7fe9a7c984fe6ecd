"""Writing to an index: encode papers (tagging them where asked), skip unchanged ones, commit batch by batch,
read input files and pre-encoded Parquet, and write encoded shards. `Index` composes this mixin."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend
from ..core.deadline import Cancelled, Deadline
from ..core.progress import Progress
from ..domain import IndexedPaper, IndexMeta, Paper, normalize_label
from ..errors import ParameterError, StorageError
from ..ingest.encoded import is_parquet
from ..ingest.readers import InputError, ReadReport, check_source, read_papers
from ..settings.config import Settings
from ..settings.table import FACET_MODES  # noqa: E402
from .reports import _STORAGE_ERRORS, EncodeReport, IndexReport, _reason

#: encoder batches per slice of an interruptible run (at least): a signal loses at most one slice of encoding work
_SLICE_BATCHES = 4
#: papers per slice at least (int8 on a CPU encodes one row per batch: a call per few papers would cost its set-up)
_SLICE_MIN_PAPERS = 32


class IngestMixin:
    """Index's writing side. Uses the encoder, tagger and model checks that `Index` defines."""

    backend: Backend
    settings: Settings
    _encoder: Any
    _tagger_shares_encoder: bool

    if TYPE_CHECKING:  # what `Index` defines, declared for mypy (at run time Index's own are found)
        @property
        def encoder(self) -> Any: ...
        @property
        def tagger(self) -> Any: ...
        def check_model(self, *, query: bool = False) -> None: ...
        def _requested_meta(self, encoder: Any) -> IndexMeta: ...
        def _stored_meta(self) -> IndexMeta | None: ...
        def _written(self, papers: int) -> None: ...
        def _where(self) -> str: ...
    #: encode each batch in a worker thread while this thread writes the batch before it and reads the one
    #: after (False: one batch at a time, in this thread)
    pipelined = True

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
        from ..encode.identity import _pick_device, model_info

        self.check_model()
        if self.settings.model:
            model_info(self.settings.model, self.settings.adapter)
        _pick_device(self.settings.device)

    def _ensure_index(self) -> None:
        """Create the index for this run's model, or check it is the one the index holds (loads the model)."""
        requested = self._requested_meta(self.encoder)
        stored, meta = self._stored_meta(), self.backend.meta()
        if stored is not None and meta is not None and not meta.fingerprint and stored.same_model(requested):
            requested = replace(requested, model=stored.model)  # an index from before fingerprints, same model
        self.backend.ensure(requested)

    def add_papers(self, papers: Iterable[Paper], *, facets: str | None = None, report: IndexReport | None = None,
                   progress: bool = False, stop: Deadline | None = None) -> IndexReport:
        """Upsert papers by id: unchanged papers are skipped before encoding; each batch is committed.

        The model is loaded (and the index created) only when a batch has papers to encode. A failing
        store (disk full, read-only) raises StorageError with `.report`: what was committed before it.
        Once `stop` is cancelled (`esqbe index` on SIGINT/SIGTERM) no further batch is read; the batch being encoded
        stops at the next slice of a few encoder batches (`_encode_until`) and what it encoded is written, as is a
        batch being written; the papers read but not encoded are counted in `report.left`, and the run returns with
        `report.interrupted` set to the token's reason: the report counts exactly what is committed."""
        facets = facets or self.settings.facets
        if facets not in FACET_MODES:
            raise ParameterError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
        report = report or IndexReport()
        start = time.perf_counter()
        self.check_model()  # before any weights are loaded
        bar = progress if isinstance(progress, Progress) else Progress() if progress else None
        bad_line: list[InputError] = []
        ensured = False

        def until_bad_line(items):  # a --strict reader raises at a bad line: index the batch read before it first
            try:
                yield from items
            except InputError as e:
                bad_line.append(e)

        def storage_error(e: BaseException) -> StorageError:
            error = StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}; "
                                 f"{report.stored} paper(s) of this run were committed before it", report=report)
            return error

        def _count(result, tagged: int) -> None:
            report.tagged += tagged
            report.indexed += result.added
            report.replaced += result.replaced
            report.unchanged += result.unchanged
            report.errors.extend(result.errors)

        def store(pending) -> None:
            """Write one encoded batch (waiting for its encoding) and count it."""
            encoding, n_batch, n_fresh, n_repeated = pending
            try:
                if encoding is not None:
                    try:
                        indexed, tagged, left = encoding.result()  # an encoder error surfaces here
                    except Cancelled:
                        if stop is None or not stop.cancelled:
                            raise
                        report.left += n_fresh  # (not expected: _encode_until returns what it encoded)
                        return
                    report.left += left  # interrupted: these were read, not encoded; the encoded ones are written
                    report.replaced += n_repeated
                    if not indexed:  # interrupted before any of it was encoded
                        return
                    try:
                        result = self.backend.upsert(indexed)
                    except _STORAGE_ERRORS as e:  # past its commit (the text index failed): the batch counts
                        committed = getattr(e, "committed", None)
                        if committed is None:
                            raise
                        _count(committed, tagged)
                        raise
                    self._written(result.added + result.replaced)
                    _count(result, tagged)
                else:
                    report.replaced += n_repeated
                if bar is not None:
                    bar.committed = report.stored
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
                if stop is not None and stop.cancelled:
                    report.left += len(batch)  # the batch just read is not indexed (the summary says so)
                    break
                latest = {p.paper_id: p for p in batch}  # an id repeated within a batch: the last one wins
                try:
                    fresh = self._fresh(latest, facets, report)
                    if fresh and not ensured:
                        self._ensure_index()
                        ensured = True
                except _STORAGE_ERRORS as e:
                    raise storage_error(e) from e
                encoding = None
                if fresh:
                    args = (fresh, facets, bar.update if bar is not None else None, stop)
                    encoding = worker.submit(self._encode_until, *args) if worker is not None else \
                        _Done.of(self._encode_until, *args)
                if pending is not None:
                    store(pending)
                pending = (encoding, len(batch), len(fresh), len(batch) - len(latest))
            if pending is not None:
                store(pending)
                pending = None
        finally:
            if worker is not None:
                worker.shutdown(wait=True, cancel_futures=True)  # an error in this thread: the batch being encoded is dropped
            if bar is not None and bar is not progress:
                bar.close()
            report.seconds += time.perf_counter() - start
            if stop is not None and stop.cancelled:
                report.interrupted = stop.cancelled
        if bad_line:
            raise bad_line[0]
        return report

    def _encode_until(self, papers: list[Paper], facets: str, on_progress, stop: Deadline | None):
        """`_encode` -> (encoded papers, tagged, papers left not encoded). With `stop`, in slices of
        `_SLICE_BATCHES` encoder batches (twice the parallel ONNX sessions, if more; `_SLICE_MIN_PAPERS` papers at
        least): once it is cancelled the slice being encoded is abandoned (the encoder checks the token between its
        batches) and the slices finished so far are returned, to be written: an interrupt loses at most one slice
        of encoding work, never a whole committed batch."""
        if stop is None:
            return (*self._encode(papers, facets, on_progress), 0)
        # a slice keeps every parallel ONNX session busy (their batches run `workers` at a time)
        workers = int(getattr(getattr(self.encoder, "_runner", None), "workers", 1) or 1)
        batch = max(1, int(getattr(self.encoder, "batch_size", None) or self.settings.batch_size))
        step = max(_SLICE_MIN_PAPERS, batch * max(_SLICE_BATCHES, 2 * workers))
        done: list[IndexedPaper] = []
        tagged = 0
        for start in range(0, len(papers), step):
            try:
                with stop:  # raises Cancelled on entry once cancelled; the encoder checks it between its batches
                    encoded, n = self._encode(papers[start : start + step], facets, on_progress)
            except Cancelled:
                if not stop.cancelled:
                    raise
                return done, tagged, len(papers) - start
            done.extend(encoded)
            tagged += n
        return done, tagged, 0

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
        fresh, merged = [], {}
        same_records = self._same_records([p for p in latest.values() if p.paper_id in stored and p.paper_id not in
                                           tagged_before and stored[p.paper_id] != p.content_hash()], facets)
        for p in latest.values():
            if p.paper_id in same_records:  # every record of it already in the stored paper (a merged paper)
                report.unchanged += 1
            elif p.paper_id in tagged_before or facets != "predict" and stored.get(p.paper_id) == p.content_hash():
                report.unchanged += 1  # (same input, labels already predicted: tagging again changes nothing)
                sources = (p.metadata or {}).get("sources") or []
                if len(sources) > 1:  # esqbe.index.merge combined it with the stored paper's own sources
                    merged[p.paper_id] = sources
            else:
                fresh.append(p)
        if merged:  # a record of another file merged in without changing the paper: its sources are written, added
            # to those the stored paper has (a file of an earlier run not read in this one stays among them)
            from .merge import merged_sources

            before = self.backend.get(sorted(merged))
            self.backend.update_sources({pid: merged_sources(
                (before[pid].paper.metadata or {}).get("sources") if pid in before else [], sources, later=sources)
                for pid, sources in merged.items()})
        report.replaced_ids.extend(p.paper_id for p in fresh if p.paper_id in stored)
        return fresh

    def _same_records(self, papers: list[Paper], facets: str) -> set[str]:
        """The ids of `papers` whose stored paper already holds each of their records, as read (esqbe.index.merge:
        every source's file and record hash among the stored paper's sources): a re-run of the files a merged paper
        was made of finds it unchanged, whichever of them it reads first."""
        def records(p) -> set[tuple[str, str]] | None:
            sources = [s for s in (p.metadata or {}).get("sources") or [] if isinstance(s, dict)]
            if not sources or any(not s.get("record") for s in sources):
                return None
            return {(os.path.basename(str(s.get("file"))), str(s["record"])) for s in sources}

        wanted = {p.paper_id: r for p in papers if (r := records(p)) is not None}
        if not wanted:
            return set()
        found = self.backend.get(sorted(wanted))
        return {pid for pid, need in wanted.items() if pid in found
                and need <= (records(found[pid].paper) or set())
                and (facets != "predict" or found[pid].paper.metadata.get("facets_predicted"))}

    def index_files(self, sources: Sequence[str], *, format: str | None = None, strict: bool = False,
                    facets: str | None = None, progress: bool = False, stop: Deadline | None = None) -> IndexReport:
        """Read each source (path, .gz, or '-') and upsert its papers; bad lines are reported, not fatal.

        Every source is checked before anything is loaded: a missing file (or a directory) is reported
        like a bad line and the others are read. With `strict` the first problem stops the run: every
        paper read before a bad line is committed, and the InputError propagates with `.report` (this
        IndexReport: what was indexed, `stopped`, `not_read`); a StorageError carries `.report` too. `stop`: see
        `add_papers`; the sources after the one interrupted are listed in `not_read` and no calibration runs."""
        report = IndexReport()
        sources = list(sources)
        problems = {i: e for i, s in enumerate(sources) if (e := check_source(s)) is not None}
        if strict and problems:
            first = problems[min(problems)]
            report.errors.append(str(first))
            report.stopped = str(first)
            report.not_read = [str(s) for s in sources]
            raise first.with_report(report)
        report.errors.extend(str(e) for e in problems.values())
        if len(problems) < len(sources):
            self.preflight()
        bar = progress if isinstance(progress, Progress) else None
        if progress is True:
            sizes = [os.path.getsize(s) if isinstance(s, (str, os.PathLike)) and str(s) != "-" else None
                     for i, s in enumerate(sources) if i not in problems]
            bar = Progress(total_bytes=None if None in sizes else sum(s for s in sizes if s is not None))
        try:
            self._index_sources(sources, problems, format, strict, facets, bar, report, stop)
        finally:
            if bar is not None:
                bar.close(stopped=stop.cancelled if stop is not None else None)
        if stop is not None and stop.cancelled:
            report.interrupted = stop.cancelled
            return report  # the calibration is due on the next run (it finds the index holding papers)
        self._calibrate_knn(report, progress=bool(progress))
        return report

    def _read_timeouts(self) -> dict:
        """The readers' bounds from the settings: the wall clocks of one attached PDF's text and of one Zotero
        database, the bytes of one line."""
        return {"pdf_timeout": self.settings.pdf_timeout, "zotero_timeout": self.settings.zotero_timeout,
                "max_line_bytes": self.settings.max_line_bytes}

    def _calibrate_knn(self, report, *, progress: bool = False) -> None:
        """After an index run that found the index holding papers: the kNN is calibrated for knn_recall_target when
        due, even when no paper changed: a run with another target (or statistic) re-calibrates what was
        built for the old one (an engine's num_candidates, the embedded IVFs' nprobe); one with the same target finds
        nothing due. A run that read nothing touches no index (none is created)."""
        if report.indexed or report.replaced or report.unchanged:
            self.backend.calibrate_knn(self.settings.knn_recall_target, self.settings.knn_recall_statistic,
                                       progress=_say if progress else None)

    def _index_sources(self, sources, problems, format, strict, facets, bar, report, stop=None) -> None:
        from .merge import Merger

        merger = Merger(lambda: self.backend, report)  # records of one work across this run's sources: one paper
        done_bytes = 0
        for i, source in enumerate(sources):
            if i in problems:
                continue
            if stop is not None and stop.cancelled:
                report.not_read.extend(str(s) for j, s in enumerate(sources) if j >= i and j not in problems)
                return
            reader_report = ReadReport()
            papers = read_papers(source, format, strict=strict, report=reader_report, **self._read_timeouts())
            if bar is not None:  # bytes of the papers done, not of those read ahead (the merger's look-ahead, the
                # next batches): noted as each record is read, the merger passing on one paper per record
                papers, bar.position = _bytes_done(papers, reader_report, bar, done_bytes)
            papers = merger.papers(papers, reader_report)
            try:
                if format in (None, "parquet") and is_parquet(source) or format == "parquet":
                    if bar is not None:
                        bar.position = lambda d=done_bytes: d + reader_report.position  # noqa: B023 (this source's)
                    self.add_encoded(source, strict=strict, report=report, reader_report=reader_report, progress=bar,
                                     stop=stop)
                    continue
                self.add_papers(papers, facets=facets, report=report, progress=bar, stop=stop)
            except InputError as e:
                report.errors.append(str(e))
                if not strict:  # not a line-level problem the reader could report and pass over
                    continue
                report.stopped = str(e)
                if e.line:
                    report.not_read.append(f"{e.source} from line {e.line}")
                report.not_read.extend(str(s) for s in sources[i + 1 :])
                e.with_report(report)
                raise
            except StorageError as e:
                report.not_read.extend(str(s) for s in sources[i + 1 :])
                e.with_report(report)
                raise
            finally:
                report.add_read(reader_report, str(source))
                done_bytes += reader_report.position
                if bar is not None:
                    bar.position = lambda d=done_bytes: d  # this source is done: counted once

    def add_encoded(self, source: str, *, strict: bool = False, report: IndexReport | None = None,
                    reader_report: ReadReport | None = None, progress: bool = False,
                    batch_size: int | None = None, stop: Deadline | None = None) -> IndexReport:
        """Load pre-encoded papers from a Parquet file (see esqbe.ingest.encoded) without running a model.

        The file's `esqbe` metadata must match the index (and the model named in the settings, if any);
        papers are committed every `batch_size` rows (default max(commit_every, 16384)); unchanged papers are skipped.
        Once `stop` is cancelled no further batch is written (`report.interrupted`)."""
        from ..ingest.encoded import read_encoded, read_meta

        report = report if report is not None else IndexReport()
        own_reader_report = reader_report is None
        reader_report = reader_report if reader_report is not None else ReadReport()
        start = time.perf_counter()
        meta = read_meta(source)
        meta = replace(meta, runtime=meta.effective_runtime)  # a file from before runtimes were recorded: torch-fp32
        if self.settings.model is not None:  # the model named in the settings must be the file's (by fingerprint)
            from ..encode.identity import model_info

            info = model_info(self.settings.model, self.settings.adapter)
            IndexMeta(info.name, info.dim or meta.dim, self.settings.encoder_mode, info.fingerprint,
                      adapter=info.adapter).check(replace(meta, runtime=None))  # the model only; the runtime: below
        stored = self._stored_meta()
        if stored is not None:
            stored.check(meta)
        self.backend.ensure(meta)
        bar = progress if isinstance(progress, Progress) else Progress() if progress else None
        try:
            for batch in read_encoded(source, batch_size=batch_size or max(16384, int(self.settings.commit_every)), strict=strict,
                                      report=reader_report):
                if stop is not None and stop.cancelled:
                    report.interrupted = stop.cancelled
                    break
                hashes = self.backend.content_hashes(p.paper_id for p in batch)
                fresh = [p for p in batch if hashes.get(p.paper_id) != p.paper.content_hash()]
                report.unchanged += len(batch) - len(fresh)
                report.replaced_ids.extend(p.paper_id for p in fresh if p.paper_id in hashes)
                if fresh:
                    result = self.backend.upsert(fresh)
                    self._written(result.added + result.replaced)
                    report.indexed += result.added
                    report.replaced += result.replaced
                    report.unchanged += result.unchanged
                    report.errors.extend(result.errors)
                if bar is not None:
                    bar.update(len(batch))
        except _STORAGE_ERRORS as e:
            error = StorageError(f"cannot write the index at {self._where()}: {_reason(e, self.settings.path)}; "
                                 f"{report.stored} paper(s) of this run were committed before it", report=report)
            raise error from e
        finally:
            if bar is not None and bar is not progress:
                bar.close()
            report.seconds += time.perf_counter() - start
            if own_reader_report:
                report.add_read(reader_report, str(source))
        return report

    def encode_files(self, sources: Sequence[str], out: str, *, shard: tuple[int, int] = (0, 1), format: str | None = None,
                     strict: bool = False, facets: str | None = None, progress: bool = False) -> EncodeReport:
        """Encode papers (and tag them, per `facets`) into OUT/papers-<i>-of-<n>.parquet without touching an index;
        with `shard=(i, n)` only the papers whose id hashes to shard i of n (so n machines split one corpus)."""
        from pathlib import Path

        from ..ingest.encoded import EncodedWriter, shard_of

        i, n = shard
        if not (n >= 1 and 0 <= i < n):
            raise ParameterError(f"shard must be I/N with 0 <= I < N (got {i}/{n})")
        facets = facets or self.settings.facets
        if facets not in FACET_MODES:
            raise ParameterError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
        Path(out).mkdir(parents=True, exist_ok=True)
        target = Path(out) / f"papers-{i:05d}-of-{n:05d}.parquet"
        report = EncodeReport(path=str(target))
        start = time.perf_counter()
        bar = Progress() if progress else None
        with EncodedWriter(target, self.encoded_meta()) as writer:
            for source in sources:
                reader_report = ReadReport()
                try:
                    papers = (p for p in read_papers(source, format, strict=strict, report=reader_report,
                                                     **self._read_timeouts())
                              if shard_of(p.paper_id, n) == i)
                    self.encode_into(writer, papers, facets=facets, report=report,
                                     on_batch=bar.update if bar is not None else None)
                finally:
                    report.read += reader_report.read
                    report.skipped.update(reader_report.skipped)
                    report.errors.extend(str(e) for e in reader_report.errors)
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - start
        return report

    def encoded_meta(self) -> IndexMeta:
        """The model identity this run's vectors carry (an encoded file's `esqbe` metadata); loads the encoder."""
        return self._requested_meta(self.encoder)

    def encode_into(self, writer, papers: Iterable[Paper], *, facets: str | None = None,
                    report: EncodeReport | None = None, on_batch=None) -> EncodeReport:
        """Encode papers (tagging them per `facets`) into `writer` (an `esqbe.ingest.encoded.EncodedWriter`
        made with `encoded_meta()`), `commit_every` papers at a time (an id repeated within one: the last
        wins). `esqbe encode` and the Ray workers (esqbe.distributed) both write through here."""
        facets = facets or self.settings.facets
        if facets not in FACET_MODES:
            raise ParameterError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
        report = report if report is not None else EncodeReport(path=str(writer.path))
        for batch in _batches(papers, max(1, int(self.settings.commit_every))):
            latest = list({p.paper_id: p for p in batch}.values())
            indexed, tagged = self._encode(latest, facets)
            writer.write(indexed)
            report.tagged += tagged
            report.encoded += len(indexed)
            if on_batch is not None:
                on_batch(len(batch))
        return report


class _Done:
    """A result computed in place, with the interface of a Future (the serial indexing loop)."""

    def __init__(self, value, error: BaseException | None = None):
        self.value, self.error = value, error

    @classmethod
    def of(cls, fn, *args) -> _Done:
        try:
            return cls(fn(*args))
        except Cancelled as e:  # raised by result(), as a Future would
            return cls(None, e)

    def result(self):
        if self.error is not None:
            raise self.error
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


def _bytes_done(papers, reader_report: ReadReport, bar: Progress, before: int):
    """(the papers, passed through, noting the bytes read up to each; a function: `before` + the bytes up to
    the last paper the bar counts as done). Papers are read ahead of the encoder by a batch or two, so the
    reader's position alone would run ahead of the work done (and past 100% when added once more at the end)."""
    import collections

    marks: collections.deque = collections.deque()  # (n-th paper of this source, bytes read when it was read)
    start = bar.papers
    consumed = [0]

    def noted():
        for n, paper in enumerate(papers, start=1):
            marks.append((n, reader_report.position))
            yield paper

    def position() -> int:
        done = bar.papers - start
        while marks and marks[0][0] <= done:
            consumed[0] = marks.popleft()[1]
        return before + consumed[0]

    return noted(), position


def _say(message: str) -> None:
    """A step of a long index run, on stderr (what the progress lines go to)."""
    print(f"esqbe: {message}...", file=sys.stderr, flush=True)
