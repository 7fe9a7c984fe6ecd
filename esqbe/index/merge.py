"""One paper per paper: records of an index run that name the same work by a normalised DOI, arXiv
id or PubMed id (esqbe.core.workids) are one paper. The later record takes the first one's id (so it updates that
paper), its own id is remembered as an alias of it (the embedded backend's alias table: either id finds the paper),
and the run's report names each merge (`dup.ris:12 = my-library.bib:40 (doi 10.1088/...)`). Records are matched
against this run's earlier records and, where the backend keeps an alias table, against every paper indexed before.
Titles are never merged: two records of one normalised title and year (and first author, where both name one) but no
shared identifier are reported as likely duplicates, and both stay.

A merge is field by field: a record from the researcher's library (BibTeX, RIS, CSL-JSON, Zotero:
`LIBRARY_FORMATS`) keeps its own title, abstract and metadata (entry type, url, authors as written, format); the
other record only fills the fields it lacks (a venue, an id, ...); a field both give differently is a conflict, named
in the run's report (`merge_conflicts`). Every paper remembers its sources (`sources`: each file and format) and
whether one of them is the library (`in_library: true`, whatever is merged into it later), so that
`--filter 'in_library!=true'` keeps a query's finds to papers not in the library yet."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..backends.base import Backend
from ..core.names import compared
from ..core.workids import described, same_work, title_key, work_keys
from ..domain import Paper
from ..ingest.readers import ReadReport
from .reports import IndexReport

#: records remembered in memory per run (identifiers, where each was read, titles); past this the memory is cleared
#: and identifiers are found through the alias table (committed papers) alone: a run of millions stays bounded
MAX_REMEMBERED = 200_000
#: records read ahead of their merge, so that their identifiers and titles are looked up in the alias table in one
#: request (an engine's companion index answers over the network: one `_mget` a record would slow a run of unchanged
#: records many times over)
LOOKAHEAD = 256
#: the formats a researcher's own library comes in: its records keep their fields when another source's is merged in
LIBRARY_FORMATS = frozenset({"bibtex", "ris", "csl-json", "zotero"})
#: metadata that says where a paper came from, never a field compared or filled
#: (`bibtex`: an entry as written, esqbe.ingest.library.AS_WRITTEN, is its own record's: never filled from another)
_PROVENANCE = frozenset({"sources", "in_library", "format", "input_hash", "facets_predicted", "facet_probs", "bibtex"})


class Merger:
    """The identifiers and titles seen in one index run, across its sources."""

    def __init__(self, backend_of: Callable[[], Backend], report: IndexReport):
        """`backend_of` gives the run's backend when a record first needs it: a run that reads nothing opens (and so
        creates) no index."""
        self._backend_of, self.report = backend_of, report
        self._backend: Backend | None = None
        self.keys: dict[str, str] = {}  # identifier key -> the paper id its first record of this run has
        self.where: dict[str, str] = {}  # paper id -> where its first record of this run is (file:line)
        self.titles: dict[str, str] = {}  # title key -> the paper id of its first record
        self.seen: dict[str, Paper] = {}  # paper id -> its record as merged so far in this run
        self.known: dict[str, str] = {}  # the alias table's answer for the keys of the records read ahead

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self._backend_of()
        # read each time: an engine whose companion alias index cannot be made stops keeping aliases mid-run
        self.report.aliases_kept = self._backend.keeps_aliases
        return self._backend

    def papers(self, papers: Iterable[Paper], read: ReadReport) -> Iterator[Paper]:
        """`papers` as read (`read` says where each starts), a record of a work already seen renamed to its paper.
        Records are read LOOKAHEAD at a time (where each starts noted as it is read); a reading error is raised after
        the records read before it have gone through."""
        records = iter(papers)
        while True:
            chunk: list[tuple[Paper, str | None, int]] = []
            failure: Exception | None = None
            try:
                for p in records:
                    chunk.append((p, read.source, read.line))
                    if len(chunk) >= LOOKAHEAD:
                        break
            except Exception as exc:  # noqa: BLE001  # raised below, once what was read before it is through
                failure = exc
            self._look_up(p for p, _, _ in chunk)
            for p, source, line in chunk:
                yield self._one(p, source, line)
            if failure is not None:
                raise failure
            if len(chunk) < LOOKAHEAD:
                return

    def _look_up(self, papers: Iterable[Paper]) -> None:
        """The alias table's answer for the identifiers and titles of the records read ahead, in one request."""
        keys = []
        for p in papers:
            keys += work_keys(p.metadata)
            title = title_key(p.title, (p.metadata or {}).get("year"))
            if title is not None:
                keys.append(f"title:{title}")
        self.known = self.backend.work_aliases(keys) if keys and self.backend.keeps_aliases else {}

    def _one(self, p: Paper, source: str | None, line: int) -> Paper:
        """One record, read at `source`:`line`, renamed to the paper of its work where one is known."""
        if len(self.where) >= MAX_REMEMBERED:
            for memory in (self.keys, self.where, self.titles, self.seen):
                memory.clear()
        here = f"{source}:{line}" if line else source or "?"
        _remember_source(p, source)
        keys = work_keys(p.metadata)
        found = self._named(p.paper_id, keys)
        if found is not None:
            key, target = found
            self.report.merged.append({
                "file": source, "line": line or None, "id": p.paper_id, "into": target,
                "into_record": self.where.get(target), "by": described(key)})
            self.backend.add_aliases({f"id:{p.paper_id}": target})
            earlier = self.seen.get(target) or self._stored(target)
            p.paper_id = target
            if earlier is not None:
                p = self._combined(earlier, p, here)
        else:
            self._likely_duplicate(p, here)
        for key in keys:
            self.keys.setdefault(key, p.paper_id)
        self.where.setdefault(p.paper_id, here)
        self.seen[p.paper_id] = p
        return p

    def _stored(self, paper_id: str) -> Paper | None:
        found = self.backend.get([paper_id])
        return found[paper_id].paper if paper_id in found else None

    def _combined(self, earlier: Paper, later: Paper, here: str) -> Paper:
        """One paper of two records of one work: the library's record (the earlier one when both or neither is)
        keeps its text and fields, the other fills what it lacks; differing fields are reported."""
        own, other = (later, earlier) if _in_library(later) and not _in_library(earlier) else (earlier, later)
        meta = dict(own.metadata or {})
        for key, value in (other.metadata or {}).items():
            if key in _PROVENANCE:
                continue
            if key not in meta:
                meta[key] = value
            elif key == "external_ids" and isinstance(value, dict) and isinstance(meta[key], dict):
                meta[key] = {**value, **meta[key]}
            elif (_names(meta[key]) != _names(value)) if key == "authors" else meta[key] != value:
                self.report.merge_conflicts.append({"record": here, "id": later.paper_id, "field": key,
                                                    "kept": _short(meta[key]), "other": _short(value)})
        sources = [*((own.metadata or {}).get("sources") or []), *((other.metadata or {}).get("sources") or [])]
        meta["sources"] = [dict(t) for t in dict.fromkeys(tuple(sorted(x.items())) for x in sources
                                                          if isinstance(x, dict))]
        if _in_library(own) or _in_library(other):
            meta["in_library"] = True
        return Paper(later.paper_id, own.title, own.sentences, own.facets, meta)

    def _named(self, paper_id: str, keys: list[str]) -> tuple[str, str] | None:
        """(the identifier, the paper it names) where one of `keys` names another paper than `paper_id`."""
        for key in keys:
            if self.keys.get(key, paper_id) != paper_id:
                return key, self.keys[key]
        for key in keys:  # the records read ahead were looked up together (`_look_up`)
            if self.known.get(key, paper_id) != paper_id:
                return key, self.known[key]
        return None

    def _likely_duplicate(self, p: Paper, here: str) -> None:
        key = title_key(p.title, (p.metadata or {}).get("year"))
        if key is None:
            return
        if key not in self.titles:  # across runs: the index's, looked up with the read-ahead
            known = self.known.get(f"title:{key}")
            if known is not None and known != p.paper_id:
                self.titles[key] = known
        first = self.titles.setdefault(key, p.paper_id)
        if first != p.paper_id:
            other = self.seen.get(first) or self._stored(first)
            if other is not None and not same_work(p.title, p.metadata, other.title, other.metadata):
                return  # the same title and year by another first author: another work
            self.report.likely_duplicates.append({"record": here, "id": p.paper_id, "like": first,
                                                  "like_record": self.where.get(first), "title": key})


def _remember_source(p: Paper, source: str | None) -> None:
    """The record's file and format as its paper's first source; `in_library` where the format is a library's."""
    meta = p.metadata if p.metadata is not None else {}
    fmt = meta.get("format")
    meta.setdefault("sources", [{"file": str(source or "-"), "format": str(fmt or "")}])
    if fmt in LIBRARY_FORMATS:
        meta["in_library"] = True
    p.metadata = meta


def _in_library(p: Paper) -> bool:
    return bool((p.metadata or {}).get("in_library")) or (p.metadata or {}).get("format") in LIBRARY_FORMATS


def _names(authors) -> list:
    """Authors as a merge compares them: by their names' parts, particles left out (esqbe.core.names.compared)."""
    return [compared(a) for a in authors] if isinstance(authors, list) else [authors]


def _short(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
