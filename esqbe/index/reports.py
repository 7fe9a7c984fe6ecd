"""What an indexing or encoding run did (IndexReport, EncodeReport), and a storage failure in words."""
from __future__ import annotations

import errno
import os
import sqlite3
from collections import Counter
from dataclasses import dataclass, field

from ..core.textsafe import printable
from ..ingest.readers import ReadReport


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
    #: papers whose abstract (and title, if they had none) was read from their attached PDF
    abstracts_from_pdf: int = 0
    seconds: float = 0.0
    #: a --strict run: the error it stopped at, and the sources (or rest of one) it did not read
    stopped: str | None = None
    not_read: list[str] = field(default_factory=list)
    #: `file:line: id: ...` for each record whose id repeats an earlier line of its file (the later one wins)
    repeated: list[str] = field(default_factory=list)
    #: the run was interrupted (its reason: "SIGINT", "SIGTERM"): what it counts is what was committed before
    interrupted: str | None = None
    #: an interrupted run: papers read but not encoded (the rest of the batch being encoded, the batch read after),
    #: so not indexed; the papers it did encode were written
    left: int = 0
    #: one {"file", "line", "id", "title", "reason"} per skipped record, in the order read (see `skipped_lines`)
    skipped_records: list[dict] = field(default_factory=list)
    #: records merged into a paper named by the same identifier (esqbe.index.merge): {"file", "line", "id", "into",
    #: "into_record", "by"}; records of one title and year but no shared identifier, not merged: {"record", "id",
    #: "like", "like_record", "title"}; whether the backend remembers the merged ids (its alias table)
    merged: list[dict] = field(default_factory=list)
    likely_duplicates: list[dict] = field(default_factory=list)
    #: fields two merged records give differently: {"record", "id", "field", "kept", "kept_from", "other",
    #: "other_from"}: each value in words (as `esqbe show` writes it), and the file it came from
    merge_conflicts: list[dict] = field(default_factory=list)
    aliases_kept: bool | None = None
    #: library records whose citation key was another file's key for another work, indexed under a derived id
    #: (esqbe.index.merge): {"file", "line", "key", "id", "other_record", "why"}
    renamed: list[dict] = field(default_factory=list)
    #: the ids of the papers this run replaced (stored before, written again: `replaced` counts them, and the records
    #: an id repeated within one batch replaced)
    replaced_ids: list[str] = field(default_factory=list)
    #: per file, the fields of its records esqbe does not keep ({file: {field: records}}; ReadReport.not_kept)
    not_kept: dict[str, dict[str, int]] = field(default_factory=dict)
    #: how a source was read where the user should know it (ReadReport.notes: a Zotero database read from a copy)
    notes: list[str] = field(default_factory=list)

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

    def interrupt_message(self, held: int | None = None) -> str:
        """What an interrupted run left, in words: what is committed and searchable, and how to go on."""
        if self.interrupted is None:
            return ""
        rest = f"; not read: {', '.join(self.not_read)}" if self.not_read else ""
        total = f"; the index holds {held} paper(s) in all" if held is not None else ""
        return (f"interrupted ({self.interrupted}): the {self.stored} paper(s) counted above are committed and "
                f"searchable ({self.indexed} indexed, {self.replaced} replaced, {self.unchanged} unchanged){total}; "
                f"{self.left} paper(s) read were left out, their encoding not finished (at most one slice of it "
                f"lost){rest}. Run the same command again to index the rest (the {self.stored} committed are skipped "
                f"as unchanged)")

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
            "left": self.left,
            "failed": self.failure_message() or None,
            "repeated": list(self.repeated),
            "skipped_records": list(self.skipped_records),
            "interrupted": self.interrupted,
            "merged": list(self.merged),
            "abstracts_from_pdf": self.abstracts_from_pdf,
            "likely_duplicates": list(self.likely_duplicates),
            "merge_conflicts": list(self.merge_conflicts),
            "renamed": list(self.renamed),
            "replaced_ids": list(self.replaced_ids),
            "not_kept": {f: dict(c) for f, c in self.not_kept.items()},
            "notes": list(self.notes),
        }

    def add_read(self, read: ReadReport, source: str | None = None) -> None:
        """What a reader counted while this run read one source, folded into the run's report (every indexing path:
        files, pre-encoded Parquet, followed sources); its unkept fields listed under `source` (or the reader's)."""
        self.read += read.read
        self.skipped.update(read.skipped)
        self.errors.extend(str(e) for e in read.errors)
        self.repeated.extend(read.repeated)
        self.abstracts_from_pdf += read.abstracts_from_pdf
        self.skipped_records.extend(read.skipped_records)
        self.notes.extend(read.notes)
        if read.not_kept:
            counts = self.not_kept.setdefault(source if source is not None else read.source, {})
            for key, n in read.not_kept.items():
                counts[key] = counts.get(key, 0) + n

    def merge_lines(self, first: int = 10) -> list[str]:
        """`merged N: file:line = file:line (doi ...); ...` and the likely duplicates, in words (the first `first`)."""
        out = []
        if self.merged:
            shown = [f"{_where(m['file'], m['line'])} {m['id']} into {m['into']} ("
                     + (f"read at {m['into_record']}" if m["into_record"] else "already in the index")
                     + f"; same {m['by']})" for m in self.merged[:first]]
            more = f"; and {len(self.merged) - first} more (all: --json)" if len(self.merged) > first else ""
            out.append(printable(f"merged {len(self.merged)}: " + "; ".join(shown) + more))
            if self.aliases_kept is False:
                out.append("  (this backend keeps no alias table: a merged record's own id does not find the paper, "
                           "and later runs merge only within themselves)")
        for r in self.renamed[:first]:
            out.append(printable(f"renamed: {_where(r['file'], r['line'])} {r['key']} is indexed as {r['id']}: the key "
                                 f"is {r['other_record']}'s, another work ({r['why']})"))
        if len(self.renamed) > first:
            out.append(f"and {len(self.renamed) - first} more renamed (all: --json)")
        for file, fields in self.not_kept.items():
            out.append(printable(f"not kept from {file} (fields esqbe does not read): "
                                 + ", ".join(f"{k} ({n} record{'s' if n != 1 else ''})" for k, n in fields.items())))
        for d in self.likely_duplicates[:first]:
            like = f"read at {d['like_record']} as {d['like']}" if d["like_record"] else \
                f"already in the index as {d['like']}"
            out.append(printable(f"likely duplicate, not merged (same title and year, no shared DOI, arXiv or PubMed "
                                 f"id): {d['record']} {d['id']}, {like}"))
        if len(self.likely_duplicates) > first:
            out.append(f"and {len(self.likely_duplicates) - first} more likely duplicates (all: --json)")
        for c in self.merge_conflicts[:first]:
            kept, other = (f" ({c[k]})" if c.get(k) else "" for k in ("kept_from", "other_from"))
            out.append(printable(f"merge conflict, {c['record']} into {c['id']}: {c['field']}: kept "
                                 f"\"{c['kept']}\"{kept}, not \"{c['other']}\"{other}"))
        if len(self.merge_conflicts) > first:
            out.append(f"and {len(self.merge_conflicts) - first} more merge conflicts (all: --json)")
        return out

    def skipped_lines(self, first: int = 10) -> list[str]:
        """The first `first` skipped records as `file:line: id "title": reason`, then `and N more` if there are more."""
        lines = [skipped_line(r) for r in self.skipped_records[:first]]
        if len(self.skipped_records) > first:
            lines.append(f"and {len(self.skipped_records) - first} more")
        return lines


def skipped_line(record: dict) -> str:
    """One skipped record in words: where it is, what it is called, why it was skipped."""
    where = f"{record.get('file')}:{record['line']}" if record.get("line") else str(record.get("file"))
    name = " ".join(x for x in (record.get("id") or "", f'"{record["title"]}"' if record.get("title") else "") if x)
    return printable(f"{where}: {name or '(no id or title)'}: {record.get('reason')}")  # a file's controls shown, not obeyed


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
    #: the files written, where a run writes more than one (`ray_encode`: `path` is then their directory)
    files: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        out = {"path": self.path, "read": self.read, "encoded": self.encoded, "tagged": self.tagged,
               "skipped": dict(self.skipped), "errors": list(self.errors), "seconds": round(self.seconds, 2)}
        return out | ({"files": list(self.files)} if self.files else {})


def _where(file, line) -> str:
    return f"{file}:{line}" if line else str(file)
