"""One run of the followed sources (`esqbe follow run`, `esqbe serve --follow-every`): what is new since each
source's mark is fetched, indexed with every rule of `esqbe index` (its readers and their limits, one paper per work
across the run's records and the index's papers, likely duplicates named, provenance: the source in `sources`,
unchanged papers skipped before encoding), then every watch runs on what arrived; one summary says it all.

Nothing lost, nothing twice: a source's new state (its mark: an OAI-PMH resumption token or day, an OpenAlex cursor or
day, Zotero's last change stamp, a folder's files) is written only after the papers before it are committed, page by
page (file by file). A run killed or stopped mid-page goes on from the last page committed: that page comes again and
its committed papers are found unchanged (never encoded or reported twice); a record that arrives again with new
content (arXiv's next version, a corrected OpenAlex work, an edited Zotero item) updates its paper, by the same id. A
record its source says is gone is named in the summary and kept or removed as `follow_deleted` says.

A source that fails (unreachable, a refused or hostile answer, a file that cannot be read) ends its own run with the
error kept in its state (GET /stats shows it); the next source runs. The embedded index's write lock is held for the
whole run (like `esqbe watch run`), so two runs never interleave.
"""
from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..core.deadline import Cancelled
from ..domain import Paper
from ..errors import EsqbeError
from ..ingest import folder
from ..ingest.formats import _Invalid
from ..ingest.readers import ReadReport, read_papers, read_pdf_paper
from ..ingest.web import FetchError, Page
from .follow import FollowNotFoundError, Source, _store, check_name, list_sources
from .merge import Merger
from .reports import IndexReport

#: what one run's summary keeps of each list (the counts are whole)
KEPT = 200


@dataclass
class SourceRun:
    """What one run of one source did: pages asked, records fetched, and what `esqbe index` did with them."""

    name: str
    spec: str
    started: float
    seconds: float = 0.0
    pages: int = 0
    fetched: int = 0
    indexed: int = 0
    replaced: int = 0
    unchanged: int = 0
    tagged: int = 0
    merged: int = 0
    likely_duplicates: int = 0
    #: records of the set outside the followed category (arXiv's sets are its archives)
    filtered: int = 0
    skipped: Counter = field(default_factory=Counter)
    skipped_records: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    #: records the source says are gone: {"id", "when", "how", "action"} ("kept" or "removed"; "not in the index")
    deleted: list[dict] = field(default_factory=list)
    deleted_count: int = 0
    #: the source's mark once the run ended (where the next one goes on)
    mark: str | None = None
    #: the run reached the end of what is new (False: stopped, failed, or cut at follow_max_pages)
    complete: bool = False
    #: why it ended before the end without failing (follow_max_pages, an interrupt)
    stopped: str | None = None
    #: why it failed: the service's or the file's error (the next source ran)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    requests: int = 0
    #: the waits the service asked for (Retry-After, seconds), each honoured
    waited: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "spec": self.spec, "started": self.started, "seconds": round(self.seconds, 2),
                "pages": self.pages, "requests": self.requests, "fetched": self.fetched, "indexed": self.indexed,
                "replaced": self.replaced, "unchanged": self.unchanged, "tagged": self.tagged, "merged": self.merged,
                "likely_duplicates": self.likely_duplicates, "filtered": self.filtered, "skipped": dict(self.skipped),
                "skipped_records": self.skipped_records, "errors": self.errors, "error_count": self.error_count,
                "deleted": self.deleted, "deleted_count": self.deleted_count, "mark": self.mark,
                "complete": self.complete, "stopped": self.stopped, "error": self.error, "notes": self.notes,
                "waited": self.waited}

    def last(self) -> dict:
        """What the source's state keeps of this run (GET /stats, `esqbe follow list`): when, the counts, the error."""
        return {"at": self.started, "seconds": round(self.seconds, 2), "pages": self.pages, "fetched": self.fetched,
                "indexed": self.indexed, "replaced": self.replaced, "unchanged": self.unchanged, "merged": self.merged,
                "skipped": sum(self.skipped.values()), "errors": self.error_count, "deleted": self.deleted_count,
                "complete": self.complete, "stopped": self.stopped, "error": self.error}


@dataclass
class FollowRun:
    """One `follow run`: each source's run, then each watch's (esqbe.index.watches.WatchRun), in order."""

    sources: list[SourceRun] = field(default_factory=list)
    watches: list = field(default_factory=list)
    #: why the watches did not run (this index keeps none; the run was interrupted), or None
    watches_skipped: str | None = None
    interrupted: str | None = None

    @property
    def failed(self) -> bool:
        """A source failed or a watch was refused (the exit status says so: 1)."""
        return any(s.error for s in self.sources) or any(w.refused for w in self.watches)

    def to_dict(self) -> dict:
        return {"sources": [s.to_dict() for s in self.sources], "watches": [w.to_dict() for w in self.watches],
                "watches_skipped": self.watches_skipped, "interrupted": self.interrupted, "failed": self.failed}


def run_follow(index, names: Sequence[str] | None = None, *, stop=None, say: Callable[[str], None] | None = None,
               now: float | None = None) -> FollowRun:
    """Run the named sources (all, if none named), then every watch: see the module's notes. `stop`: a Deadline
    whose cancellation ends the run after the page (file) being indexed, that page's mark not moved unless all of it
    was committed; `say`: told each page's progress."""
    from .watches import WatchesUnsupportedError, run_watches

    store = _store(index)
    wanted = [check_name(n) for n in dict.fromkeys(names or ())]
    begin = getattr(store, "begin_write", None)
    if begin is not None:
        begin()  # the whole run under the write lock: two runs (or a run and `esqbe index`) never interleave
    sources = list_sources(index)
    if wanted:
        missing = [n for n in wanted if n not in {s.name for s in sources}]
        if missing:
            raise FollowNotFoundError(f"no followed source named {', '.join(missing)} in this index "
                                      "(`esqbe follow list`)")
        sources = [s for s in sources if s.name in wanted]
    run = FollowRun()
    for source in sources:
        if stop is not None and stop.cancelled:
            break
        run.sources.append(_run_source(index, store, source, stop, say, now))
    if stop is not None and stop.cancelled:
        run.interrupted = str(stop.cancelled)
        run.watches_skipped = f"interrupted ({stop.cancelled}): the watches run at the next run"
        return run
    try:
        run.watches = run_watches(index, now=now)
    except WatchesUnsupportedError as e:
        run.watches_skipped = str(e)
    return run


def _run_source(index, store, source: Source, stop, say, now) -> SourceRun:
    result = SourceRun(source.name, source.spec, time.time() if now is None else float(now))
    t0 = time.perf_counter()
    state = dict(source.state)
    report = IndexReport()
    job = _Job(index, store, source, state, report, result, Merger(lambda: index.backend, report), stop, say)
    try:
        if source.kind in ("arxiv", "openalex"):
            job.harvest()
        elif source.kind == "zotero":
            job.zotero()
        else:
            job.folder()
    except (FetchError, folder.FolderError) as e:
        result.error = str(e)
    except Cancelled as e:  # a wait (a Retry-After, the interval) given up: the run is cancelled
        result.stopped = f"interrupted ({e}): the next run goes on from the last page committed"
    except _Invalid as e:
        result.error = f"{source.target}: {e.field}: {e.reason}"
    finally:
        result.seconds = time.perf_counter() - t0
        _fold_counts(result, report)
        result.mark = state.get("mark")
        state["last"] = result.last()
        try:
            store.follow_save(source.name, state)
        except (EsqbeError, OSError) as e:  # the index cannot be written: the run's own error says more
            result.notes.append(f"its state could not be written: {e}")
    if say is not None and result.error:
        say(f"{source.name}: {result.error}")
    return result


def _fold_counts(result: SourceRun, report: IndexReport) -> None:
    result.fetched = report.read
    result.indexed, result.replaced, result.unchanged, result.tagged = (report.indexed, report.replaced,
                                                                       report.unchanged, report.tagged)
    result.merged, result.likely_duplicates = len(report.merged), len(report.likely_duplicates)
    result.skipped = Counter(report.skipped)
    result.skipped_records = report.skipped_records[:KEPT]
    result.error_count = len(report.errors)
    result.errors = report.errors[:KEPT]
    result.notes.extend(report.notes)


class _Job:
    """One source's run: its pages (files) indexed one at a time, its state saved after each."""

    def __init__(self, index, store, source: Source, state: dict, report: IndexReport, result: SourceRun,
                 merger: Merger, stop, say):
        self.index, self.store, self.source, self.state = index, store, source, state
        self.report, self.result, self.merger, self.stop, self.say = report, result, merger, stop, say
        self.settings = index.settings

    # --- committing ------------------------------------------------------------------------------
    def _index(self, papers: Iterable[Paper], reader_report: ReadReport, ids: list[str] | None = None) -> bool:
        """Index `papers` (read into `reader_report`) with every rule of `esqbe index` (each paper's id, once merged,
        noted in `ids` where given); whether all of them were committed (False: the run was interrupted before the
        last of them was encoded)."""
        left = self.report.left
        merged = self.merger.papers(papers, reader_report)
        try:
            self.index.add_papers(_noting(merged, ids) if ids is not None else merged, report=self.report,
                                  stop=self.stop)
        finally:
            self.report.add_read(reader_report)
        complete = self.report.left == left and not (self.stop is not None and self.stop.cancelled)
        if not complete:
            self.result.stopped = f"interrupted ({self.stop.cancelled if self.stop else '?'}): the part committed " \
                                  "stays; the next run asks again from the last page committed"
        return complete

    def _save(self) -> None:
        if not self.store.follow_save(self.source.name, self.state):
            raise FollowNotFoundError(f"followed source {self.source.name} was removed during its run")

    def _gone(self, items: list[dict]) -> None:
        """Name the papers whose records the source says are gone; keep or remove them as `follow_deleted` says. A
        deletion the source gives again (a day's records come again at the next run) is named once: each one named
        with its date is remembered while that date is not before the source's mark (`gone`)."""
        named = set(self.state.get("gone") or [])
        items = [d for d in items if _gone_key(d) not in named]
        if not items:
            return
        mark = str(self.state.get("mark") or "")
        self.state["gone"] = sorted({k for k in named if k.rpartition("@")[2] >= mark}
                                    | {_gone_key(d) for d in items if d.get("when")})[-MAX_GONE_KEPT:]
        ids = list(dict.fromkeys(str(d["id"]) for d in items))
        if self.settings.follow_deleted == "remove":
            deleted, _missing, _merged = self.index.delete_papers(ids)
            done, action = set(deleted), "removed"
        else:
            done = set(self.index.backend.content_hashes(ids)) | set(self.index._merged_into(ids))
            action = "kept (follow_deleted=keep)"
        self.result.deleted_count += len(items)
        room = KEPT - len(self.result.deleted)
        self.result.deleted.extend({**d, "action": action if str(d["id"]) in done else "not in the index"}
                                   for d in items[:max(room, 0)])

    def _told(self, text: str) -> None:
        if self.say is not None:
            self.say(f"{self.source.name}: {text}")

    def _cut(self) -> bool:
        """Whether this run stops here: interrupted, or at follow_max_pages (its mark says where the next goes on)."""
        if self.stop is not None and self.stop.cancelled:
            self.result.stopped = f"interrupted ({self.stop.cancelled}): the next run goes on from the last page committed"
            return True
        if self.result.pages >= int(self.settings.follow_max_pages):
            self.result.stopped = (f"stopped after {self.result.pages} pages (follow_max_pages, --max-pages): the next "
                                   "run goes on from there")
            return True
        return False

    # --- arXiv and OpenAlex: pages -----------------------------------------------------------------
    def harvest(self) -> None:
        s, src = self.settings, self.source
        common = dict(source=f"{src.name} ({src.spec})", url=src.url, since=src.since, first_days=s.follow_first_days,
                      timeout=s.follow_timeout, max_bytes=s.follow_max_page_bytes, retries=s.follow_retries,
                      max_retry_after=s.follow_max_retry_after, mailto=s.follow_mailto, stop=self.stop)
        if src.kind == "arxiv":
            from ..ingest.arxiv import Harvest as ArxivHarvest

            harvest: ArxivHarvest | OpenAlexHarvest = ArxivHarvest(src.target, self.state, interval=s.arxiv_interval,
                                                                   **common)
        else:
            from ..ingest.openalex import Harvest as OpenAlexHarvest

            harvest = OpenAlexHarvest(src.target, self.state, interval=s.openalex_interval,
                                      api_key=s.openalex_api_key, per_page=s.openalex_per_page,
                                      date_filter=s.openalex_date_filter, **common)
        try:
            for page in harvest.pages():
                if not self._page(page):
                    return
                if "run" not in page.state:
                    self.result.complete = True
                    return
                if self._cut():
                    return
        finally:
            self.result.requests = harvest.transport.requests
            self.result.waited = list(harvest.transport.waited)
            self.result.notes.extend(harvest.notes)
            harvest.transport.close()

    def _page(self, page: Page) -> bool:
        """One page indexed, its gone records named, then its state saved; False if it was not all committed."""
        self.result.filtered += page.filtered
        self.report.errors.extend(page.errors)
        if page.records:
            reader_report = ReadReport()
            if not self._index(self._records(page, reader_report), reader_report):
                return False
        self._gone([{**d, "how": "deleted at the source"} for d in page.deleted])
        for key in ("mark", "run"):
            if key in page.state and page.state[key] is not None:
                self.state[key] = page.state[key]
            else:
                self.state.pop(key, None)
        self._save()
        self.result.pages += 1
        self._told(f"{page.label}: {len(page.records)} record(s) read, {len(page.deleted)} deleted at the source; "
                   f"{self.report.indexed} indexed, {self.report.replaced} replaced, {self.report.unchanged} unchanged "
                   "so far")
        return True

    def _records(self, page: Page, reader_report: ReadReport) -> Iterator[Paper]:
        """The page's records read as `esqbe index` reads a file of them (the page named where a record is wrong),
        each paper's source the followed SPEC."""
        text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in page.records)
        stream = io.StringIO(text)
        stream.name = f"{self.source.spec} {page.label}"
        for paper in read_papers(stream, page.fmt, report=reader_report, whole_files=False):
            paper.metadata.setdefault("sources", [{"file": self.source.spec, "format": page.fmt}])
            yield paper

    # --- Zotero: the items changed since the last change read ----------------------------------------
    def zotero(self) -> None:
        from ..ingest import zotero

        s, path = self.settings, self.source.target
        since = self.state.get("mark") or (f"{self.source.since} 00:00:00" if self.source.since else None)
        latest, removed = zotero.changes(path, since, zotero.Clock(s.zotero_timeout))
        reader_report = ReadReport()
        papers = read_papers(path, "zotero", report=reader_report, pdf_timeout=s.pdf_timeout,
                             zotero_timeout=s.zotero_timeout, zotero_since=since)
        if not self._index(papers, reader_report):
            return
        whole = [e for e in self.report.errors if e.startswith(f"{path}: ")]
        if whole:  # the database could not be read at all: the mark stays where it was
            self.result.error = whole[0]
            return
        self._gone(removed)
        self.result.pages = 1
        if latest is not None:
            self.state["mark"] = max(latest, since or "")
        self._save()
        self.result.complete = True
        self._told(f"{reader_report.read} item(s) added or changed since {since or 'the start'}")

    # --- a folder: the files added or changed ------------------------------------------------------
    def folder(self) -> None:
        s, root = self.settings, Path(self.source.target)
        seen, passed = folder.scan(root)
        known: dict[str, dict] = dict(self.state.get("files") or {})
        since_ns = None
        if not known and self.source.since:
            since_ns = int(datetime.fromisoformat(self.source.since).replace(tzinfo=UTC).timestamp() * 1e9)
        fresh, gone = folder.changes(seen, known, since_ns)
        for rel in seen:  # a first run's files from before --since: known, not read (read once they change)
            if rel not in known and rel not in fresh:
                known[rel] = {"sig": seen[rel], "ids": []}
        if passed:
            self.result.notes.append(f"{passed} file(s) or folder(s) passed over (hidden, links, or not a format "
                                     "esqbe reads)")
        for rel in fresh:
            ids: list[str] = []
            reader_report = ReadReport()
            path = root / rel
            if rel.lower().endswith(".pdf"):
                papers = read_pdf_paper(path, f"{self.source.name}:{rel}", report=reader_report,
                                        pdf_timeout=s.pdf_timeout)
            else:
                papers = read_papers(str(path), None, report=reader_report, pdf_timeout=s.pdf_timeout,
                                     zotero_timeout=s.zotero_timeout, max_line_bytes=s.max_line_bytes)
            if not self._index(papers, reader_report, ids):
                return
            before = set((known.get(rel) or {}).get("ids") or [])
            self._gone([{"id": i, "when": None, "how": f"no longer in {rel}"} for i in sorted(before - set(ids))])
            known[rel] = {"sig": seen[rel], "ids": ids if len(ids) <= folder.MAX_IDS_PER_FILE else None}
            self.state["files"] = known
            self._save()
            self.result.pages += 1
            self._told(f"{rel}: {reader_report.read} record(s) read")
            if self.stop is not None and self.stop.cancelled:
                self.result.stopped = f"interrupted ({self.stop.cancelled}): the files left are read at the next run"
                return
        for rel in gone:
            ids_then = known.pop(rel).get("ids")
            if ids_then is None:
                self.result.notes.append(f"{rel} is gone; it gave more than {folder.MAX_IDS_PER_FILE:,} papers, "
                                         "whose ids were not kept: they are left as they are")
            self._gone([{"id": i, "when": None, "how": f"its file {rel} is gone"} for i in ids_then or []])
        self.state["files"] = known
        self.state["mark"] = datetime.now(UTC).isoformat(timespec="seconds")
        self._save()
        self.result.complete = True


#: deletions remembered per source so that one given again is named once (those dated at or after its mark)
MAX_GONE_KEPT = 10_000


def _gone_key(item: dict) -> str:
    return f"{item['id']}@{item.get('when') or ''}"


def _noting(papers: Iterable[Paper], ids: list[str]) -> Iterator[Paper]:
    """`papers` passed on, each one's id noted in `ids` (a file's papers, to name them once it is gone)."""
    for p in papers:
        ids.append(p.paper_id)
        yield p


