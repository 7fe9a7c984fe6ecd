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
`--filter 'in_library!=true'` keeps a query's finds to papers not in the library yet.

A citation key names a record within its file: a library record whose key is already a paper's from another file is
that paper's record where both are one work (the same identifier, or no identifier that differs and the same title:
merged as above), and another paper where they are two works (another DOI or title): it is indexed under a derived id,
`KEY@FILE` (the file's name without its extension; `-2`, `-3` where that is taken too), which the run reports
(`renamed`) and every later run of the same files finds again. Each source a paper remembers carries its record's
hash (`record`), so that a re-run of unchanged files finds a merged paper unchanged (esqbe.index.ingest)."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import PurePath

from ..backends.base import Backend
from ..core.filters import fold
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
        self.holders: dict[str, Paper] = {}  # the stored papers under the citation keys of the records read ahead

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
            self._look_up([p for p, _, _ in chunk])
            for p, source, line in chunk:
                yield self._one(p, source, line)
            if failure is not None:
                raise failure
            if len(chunk) < LOOKAHEAD:
                return

    def _look_up(self, papers: list[Paper]) -> None:
        """The alias table's answer for the identifiers and titles of the records read ahead, in one request; and
        the stored papers under their citation keys (a library record's id), in one more."""
        keys = []
        for p in papers:
            keys += work_keys(p.metadata)
            title = title_key(p.title, (p.metadata or {}).get("year"))
            if title is not None:
                keys.append(f"title:{title}")
        self.known = self.backend.work_aliases(keys) if keys and self.backend.keeps_aliases else {}
        cited = [p.paper_id for p in papers if _library_record(p) and p.paper_id not in self.seen]
        present = self.backend.content_hashes(cited) if cited else {}
        self.holders = {pid: ip.paper for pid, ip in self.backend.get(sorted(present)).items()} if present else {}

    def _one(self, p: Paper, source: str | None, line: int) -> Paper:
        """One record, read at `source`:`line`, renamed to the paper of its work where one is known."""
        if len(self.where) >= MAX_REMEMBERED:
            for memory in (self.keys, self.where, self.titles, self.seen):
                memory.clear()
        here = f"{source}:{line}" if line else source or "?"
        _remember_source(p, source)
        keys = work_keys(p.metadata)
        found = self._named(p.paper_id, keys)
        if found is not None and _library_record(p) and found[1].startswith(f"{p.paper_id}@"):
            found = self._renamed_before(p, source, line, found)
        elif found is None and _library_record(p):  # its citation key: another file's record of it, or another work
            found = self._own_key(p, source, line)
        if found is not None:
            key, target = found
            self.report.merged.append({
                "file": source, "line": line or None, "id": p.paper_id, "into": target,
                "into_record": self.where.get(target), "by": described(key)})
            if p.paper_id != target:
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

    def _holder(self, paper_id: str, *, looked_up: bool = True) -> Paper | None:
        """The paper that holds `paper_id` now: this run's record of it, else the stored one (looked up with the
        records read ahead, or now; never through an alias: a merged-away id is no paper's own)."""
        if paper_id in self.seen:
            return self.seen[paper_id]
        if looked_up:
            return self.holders.get(paper_id)
        return self._stored(paper_id) if self.backend.content_hashes([paper_id]) else None

    def _renamed_before(self, p: Paper, source: str | None, line: int,
                        found: tuple[str, str]) -> tuple[str, str] | None:
        """A library record whose identifier names a paper under an id derived from its own key (`found`: the
        identifier, the id): where that paper holds this file's record (an earlier run renamed it), the record is
        renamed to it again, said as such, and None; else `found` (another file's record: merged into it)."""
        target = found[1]
        holder = self._holder(target, looked_up=False)
        if holder is None or not _from_file(holder, source):
            return found
        key = p.paper_id
        key_holder = self._holder(key)
        self.report.renamed.append({
            "file": source, "line": line or None, "key": key, "id": target,
            "other_record": (self.where.get(key) or _origin(key_holder)) if key_holder is not None else None,
            "why": (_other_work(p, key_holder) if key_holder is not None else None) or "renamed in an earlier run"})
        p.paper_id = target
        return None

    def _own_key(self, p: Paper, source: str | None, line: int) -> tuple[str, str] | None:
        """A library record whose citation key holds a paper of another file: (`key:KEY`, KEY) where both are one work
        (merged like a shared identifier); else, where they are two, the record renamed to a derived id, said in
        `report.renamed`, and None."""
        key = p.paper_id
        holder = self._holder(key)
        if holder is None or _from_file(holder, source):
            return None
        why = _other_work(p, holder)
        if why is None:
            return f"citation key:{key}", key
        stem = re.sub(r"[^\w.-]", "_", PurePath(str(source or "-")).stem)[:40] or "file"
        base = new = f"{key}@{stem}"
        for n in range(2, 1000):  # the first free one, or this file's own from an earlier run
            taken = self._holder(new, looked_up=False)
            if taken is None or _from_file(taken, source):
                break
            new = f"{base}-{n}"
        self.report.renamed.append({"file": source, "line": line or None, "key": key, "id": new,
                                    "other_record": self.where.get(key) or _origin(holder), "why": why})
        p.paper_id = new
        return None

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
            elif key == "entry_type" and _same_type(own, meta[key], other, value):
                continue  # one type in two vocabularies (BibTeX `article`, RIS `JOUR`): the library's kept, no conflict
            elif (_names(meta[key]) != _names(value)) if key == "authors" else meta[key] != value:
                self.report.merge_conflicts.append({
                    "record": here, "id": later.paper_id, "field": key, "kept": _in_words(key, meta[key]),
                    "kept_from": _origin(own), "other": _in_words(key, value), "other_from": _origin(other)})
        meta["sources"] = merged_sources((own.metadata or {}).get("sources"), (other.metadata or {}).get("sources"),
                                         later=(later.metadata or {}).get("sources"))
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
    """The record's file, format and hash (as read) as its paper's first source; `in_library` where the format is a
    library's."""
    meta = p.metadata if p.metadata is not None else {}
    fmt = meta.get("format")
    p.metadata = meta
    meta.setdefault("sources", [{"file": str(source or "-"), "format": str(fmt or ""), "record": p.content_hash()}])
    if fmt in LIBRARY_FORMATS:
        meta["in_library"] = True
    p.metadata = meta


def merged_sources(*lists, later=None) -> list[dict]:
    """The sources of a paper made of records of several files: each file once (by its name), in order; where a file
    is named twice (an earlier run's record of it and this run's), the `later` record's entry stands."""
    newer = {_file_name(s): s for s in later or [] if isinstance(s, dict)}
    out: dict[str, dict] = {}
    for sources in lists:
        for s in sources or []:
            if isinstance(s, dict):
                out.setdefault(_file_name(s), dict(newer.get(_file_name(s), s)))
    return list(out.values())


def _file_name(source: dict) -> str:
    return PurePath(str(source.get("file") or "-")).name


def _from_file(p: Paper, source: str | None) -> bool:
    """Whether `p` holds a record read from a file of `source`'s name (a paper from before sources were kept: yes)."""
    sources = [s for s in (p.metadata or {}).get("sources") or [] if isinstance(s, dict)]
    return not sources or any(_file_name(s) == PurePath(str(source or "-")).name for s in sources)


def _other_work(p: Paper, other: Paper) -> str | None:
    """Why two records are two works, in words (an identifier of one kind that differs; else another title), or None
    where they are one (an identifier shared, or none that differs and the same title, case and punctuation aside)."""
    mine = dict(k.split(":", 1) for k in work_keys(p.metadata))
    theirs = dict(k.split(":", 1) for k in work_keys(other.metadata))
    if any(theirs.get(kind) == value for kind, value in mine.items()):
        return None
    for kind, value in mine.items():
        if kind in theirs:
            return f"{kind} {value}, not {theirs[kind]}"
    if _WORDS.findall(fold(p.title or "")) != _WORDS.findall(fold(other.title or "")):
        return f'title "{_short_text(p.title)}", not "{_short_text(other.title)}"'
    return None


_WORDS = re.compile(r"\w+")


def _short_text(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _library_record(p: Paper) -> bool:
    """A record of a researcher's library file, whose id is its citation key."""
    return (p.metadata or {}).get("format") in LIBRARY_FORMATS


def _in_library(p: Paper) -> bool:
    return bool((p.metadata or {}).get("in_library")) or (p.metadata or {}).get("format") in LIBRARY_FORMATS


def _names(authors) -> list:
    """Authors as a merge compares them: by their names' parts, particles left out (esqbe.core.names.compared)."""
    return [compared(a) for a in authors] if isinstance(authors, list) else [authors]


def _in_words(key: str, value) -> str:
    """A field's value as `esqbe show` writes it (authors by name joined with "; ", a list of strings with ", ", other
    values as JSON), at most 80 characters."""
    import json

    if key == "authors" and isinstance(value, list):
        text = "; ".join(str(n).strip() for n in (a.get("name") if isinstance(a, dict) else a for a in value)
                         if isinstance(n, str) and n.strip())
    elif isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        text = ", ".join(value)
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _origin(p: Paper) -> str | None:
    """The file a record (or a paper, its first source) was read from."""
    sources = (p.metadata or {}).get("sources")
    first = sources[0] if isinstance(sources, list) and sources and isinstance(sources[0], dict) else {}
    return str(first["file"]) if first.get("file") else None


def _same_type(a: Paper, a_type, b: Paper, b_type) -> bool:
    """Whether two records' entry types name one type in their formats' vocabularies (BibTeX `article`, RIS `JOUR`,
    CSL `article-journal`, Zotero `journalArticle`: esqbe.query.export's mapping through CSL's types)."""
    from ..query.export import vocabulary_type

    if not isinstance(a_type, str) or not isinstance(b_type, str):
        return False
    types = [vocabulary_type(str((p.metadata or {}).get("format") or ""), t) for p, t in ((a, a_type), (b, b_type))]
    return types[0] is not None and types[0] == types[1]
