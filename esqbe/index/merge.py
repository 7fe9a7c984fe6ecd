"""One paper per paper (issue 38, item 2): records of an index run that name the same work by a normalised DOI, arXiv
id or PubMed id (esqbe.core.workids) are one paper. The later record takes the first one's id (so it updates that
paper), its own id is remembered as an alias of it (the embedded backend's alias table: either id finds the paper),
and the run's report names each merge (`dup.ris:12 = my-library.bib:40 (doi 10.1088/...)`). Records are matched
against this run's earlier records and, where the backend keeps an alias table, against every paper indexed before.
Titles are never merged: two records of one normalised title and year but no shared identifier are reported as
likely duplicates, and both stay."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..backends.base import Backend
from ..core.workids import described, title_key, work_keys
from ..domain import Paper
from ..ingest.readers import ReadReport
from .reports import IndexReport

#: records remembered in memory per run (identifiers, where each was read, titles); past this the memory is cleared
#: and identifiers are found through the alias table (committed papers) alone: a run of millions stays bounded
MAX_REMEMBERED = 200_000


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

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            backend = self._backend_of()
            self.report.aliases_kept = backend.keeps_aliases
            self._backend = backend
            return backend
        return self._backend

    def papers(self, papers: Iterable[Paper], read: ReadReport) -> Iterator[Paper]:
        """`papers` as read (`read` says where each starts), a record of a work already seen renamed to its paper."""
        for p in papers:
            if len(self.where) >= MAX_REMEMBERED:
                for memory in (self.keys, self.where, self.titles):
                    memory.clear()
            here = f"{read.source}:{read.line}" if read.line else read.source or "?"
            keys = work_keys(p.metadata)
            found = self._named(p.paper_id, keys)
            if found is not None:
                key, target = found
                self.report.merged.append({
                    "file": read.source, "line": read.line or None, "id": p.paper_id, "into": target,
                    "into_record": self.where.get(target), "by": described(key)})
                self.backend.add_aliases({f"id:{p.paper_id}": target})
                p.paper_id = target
            else:
                self._likely_duplicate(p, here)
            for key in keys:
                self.keys.setdefault(key, p.paper_id)
            self.where.setdefault(p.paper_id, here)
            yield p

    def _named(self, paper_id: str, keys: list[str]) -> tuple[str, str] | None:
        """(the identifier, the paper it names) where one of `keys` names another paper than `paper_id`."""
        for key in keys:
            if self.keys.get(key, paper_id) != paper_id:
                return key, self.keys[key]
        known = self.backend.work_aliases(keys) if keys and self.backend.keeps_aliases else {}
        for key in keys:
            if known.get(key, paper_id) != paper_id:
                return key, known[key]
        return None

    def _likely_duplicate(self, p: Paper, here: str) -> None:
        key = title_key(p.title, (p.metadata or {}).get("year"))
        if key is None:
            return
        first = self.titles.setdefault(key, p.paper_id)
        if first != p.paper_id:
            self.report.likely_duplicates.append({"record": here, "id": p.paper_id, "like": first,
                                                  "like_record": self.where.get(first), "title": key})
