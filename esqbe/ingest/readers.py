"""Read papers from every input format esqbe accepts into `Paper` objects.

Each source (a path, a gzipped path, `-` for stdin, or an open text stream) is JSON Lines, or a whole
BibTeX, RIS or CSL-JSON file (`esqbe.ingest.library`; told by its first line). A JSON Lines format is
detected from the first parseable record of the source unless `format=` is given.
Bad lines are reported as `file:line: field: reason` and reading goes on (`strict=True` stops at
the first one); records without an abstract are skipped and counted. Nothing is dropped silently:
every non-blank line ends up yielded, skipped (with a reason) or in `ReadReport.errors`.
"""
from __future__ import annotations

import collections
import gzip
import io
import itertools
import json
import os
import re
import sys
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from esqbe.domain import FACET_LABELS, Paper, paper_problem
from esqbe.errors import ParameterError, UserError

from . import library, zotero
from .formats import (
    _PARSERS,
    _RAW_LABELS,
    FORMATS,
    _Invalid,
    _Skip,
    _type_name,
    detect_format,
    unkept_fields,
)
from .library import WHOLE_FILE_FORMATS, sniff_format
from .pdf import TextReader

_GZIP_MAGIC = b"\x1f\x8b"
#: bytes one line of input may hold (`max_line_bytes`' default): a record within every LIMITS bound, written with
#: JSON's longest escapes, stays well under it; a longer line is skipped unparsed, and never held whole
MAX_LINE_BYTES = 16 << 20
#: how much of a line past the bound is read at a time, to find where it ends (and dropped)
_SKIP_CHUNK = 1 << 20
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class InputError(UserError, ValueError):
    """One bad input line, located precisely enough to fix it by hand."""

    def __init__(self, source: str, line: int | None, field: str, reason: str):
        self.source = source
        self.line = line
        self.field = field
        self.reason = reason
        where = f"{source}:{line}" if line else str(source)  # no line: the source as a whole (missing, a directory)
        super().__init__(f"{where}: {field}: {reason}")


def check_source(source) -> InputError | None:
    """Why `source` cannot be read at all (missing, a directory, not readable), or None; checked for
    every input before anything is loaded, so a bad name is found in a second, not after the first file."""
    if not isinstance(source, (str, os.PathLike)) or str(source) == "-":
        return None
    path = Path(source)
    if not path.exists():
        return InputError(str(source), None, "file", "no such file")
    if path.is_dir():
        return InputError(str(source), None, "file", "is a directory, not a file of papers")
    if not os.access(path, os.R_OK):
        return InputError(str(source), None, "file", "permission denied")
    return None


@dataclass
class ReadReport:
    """What happened to every line, so a caller can show the user that nothing was lost.

    For line-level outcomes `read == yielded + sum(skipped.values()) + len(errors)`; a source that
    cannot be opened (missing, a directory) or read to its end (corrupt gzip) adds one error for it.
    """

    read: int = 0
    yielded: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)
    errors: list[InputError] = field(default_factory=list)
    #: `file:line: id: ...` for each record whose id repeats an earlier line of the same source
    repeated: list[str] = field(default_factory=list)
    #: one {"file", "line", "id", "title", "reason"} per skipped record (`skipped_record`), so each can be named
    skipped_records: list[dict] = field(default_factory=list)
    #: records whose abstract was read from their PDF (`abstract_source: pdf`)
    abstracts_from_pdf: int = 0
    #: bytes of the source consumed so far (for progress; 0 for stdin and streams)
    position: int = 0
    #: where the paper yielded last starts: the source's name and line (an index run names a merged record by it)
    source: str = ""
    line: int = 0
    #: how a source was read where the user should know it (a Zotero database read from a copy while Zotero ran)
    notes: list[str] = field(default_factory=list)
    #: the fields of the records read that esqbe does not keep (`formats.unkept_fields`): field -> records
    not_kept: collections.Counter = field(default_factory=collections.Counter)

    def summary(self) -> dict:
        summary = {
            "read": self.read,
            "yielded": self.yielded,
            "skipped": dict(sorted(self.skipped.items())),
            "errors": [str(e) for e in self.errors],
        }
        if self.repeated:
            summary["repeated"] = list(self.repeated)
        if self.abstracts_from_pdf:
            summary["abstracts_from_pdf"] = self.abstracts_from_pdf
        if self.notes:
            summary["notes"] = list(self.notes)
        if self.not_kept:
            summary["not_kept"] = dict(self.not_kept)
        return summary


# ---------------------------------------------------------------- format detection


# ---------------------------------------------------------------- field helpers


# ---------------------------------------------------------------- one parser per format


# ---------------------------------------------------------------- sources


@dataclass(frozen=True)
class LongLine:
    """A line past the bound, in place of its text: read to its end a chunk at a time and dropped."""

    size: int  # bytes it held (characters, from a text stream), its newline included
    bound: int

    def strip(self) -> LongLine:  # not a blank line
        return self

    def reason(self, whole_file: bool = False) -> str:
        return (f"{self.size:,} bytes; a line holds at most {self.bound:,} (max_line_bytes)"
                + ("; the rest of the file is not read" if whole_file else ": skipped without being parsed"))


def bounded_lines(stream, bound: int = MAX_LINE_BYTES) -> Iterator:
    """The lines of `stream` (bytes or text, as it reads), each read under `bound` bytes (characters, from a text
    stream): a longer line comes as a `LongLine`, having been read on to its end in chunks and dropped, so that no
    more than about `bound` is ever held, whatever the line."""
    while True:
        line = stream.readline(bound + 1)
        if not line:
            return
        newline = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) <= bound or (len(line) == bound + 1 and line.endswith(newline)):
            yield line
            continue
        size = len(line)
        while not line.endswith(newline):
            line = stream.readline(_SKIP_CHUNK)
            if not line:
                break
            size += len(line)
        yield LongLine(size, bound)


def open_lines(source, stack: ExitStack, max_line_bytes: int | None = None) -> tuple[str, Iterator]:
    """(name for messages, iterator of raw lines as bytes or str, each under `max_line_bytes`: see `bounded_lines`)
    for a path, `-` or a stream; gzip is told by its content (a path's, stdin's). For a path, `stack.tell` is set
    to the bytes of the file consumed so far (compressed bytes for gzip)."""
    bound = int(max_line_bytes or MAX_LINE_BYTES)
    if isinstance(source, str) and source == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream put in place of stdin: already decoded, cannot be gzip
            return "<stdin>", bounded_lines(sys.stdin, bound)
        if not hasattr(stream, "peek"):
            stream = io.BufferedReader(stream)
        if stream.peek(2)[:2] == _GZIP_MAGIC:  # `cat x.jsonl.gz | esqbe index -`: sniffed as files are
            stream = stack.enter_context(gzip.open(stream, "rb"))
        return "<stdin>", bounded_lines(stream, bound)
    if hasattr(source, "read"):
        return str(getattr(source, "name", "<stream>")), bounded_lines(source, bound)
    name = str(source)
    raw = stack.enter_context(open(source, "rb"))
    if raw.seekable():  # a named pipe (`<(zcat x.gz)`) has no position: no progress by bytes, not a traceback
        stack.tell = raw.tell  # type: ignore[attr-defined]  # progress: how far into the file we are
    f: io.BufferedIOBase = raw
    if raw.peek(2)[:2] == _GZIP_MAGIC:  # by content, so a `.gz` name is neither needed nor trusted
        f = stack.enter_context(gzip.open(raw, "rb"))
    return name, bounded_lines(f, bound)


def _decode(raw, lineno: int) -> str:
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Invalid("encoding", f"not UTF-8 ({e.reason} at byte {e.start})") from None
    else:
        text = raw
    return text.lstrip("\ufeff") if lineno == 1 else text


def _parse_json(line: str) -> dict:
    line = line.rstrip("\r\n")  # else an error at the end of the line is placed in column 1 of the next one
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise _Invalid("json", f"{e.msg} (column {e.pos + 1})") from None
    except RecursionError:  # Python's parser recurses per level of nesting
        raise _Invalid("json", "nested too deeply") from None
    except ValueError as e:  # an integer past Python's 4,300-digit limit for int(str)
        raise _Invalid("json", " ".join(str(e).split("; use sys.set_int_max_str_digits")[0].split())[:200]) from None
    if not isinstance(record, dict):
        raise _Invalid("record", f"expected a JSON object, got {_type_name(record)}")
    if _SURROGATE_ESCAPE.search(line):  # valid JSON, but a lone surrogate is not text that can be stored
        try:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise _Invalid("json", f"not valid Unicode: lone surrogate \\u{ord(e.object[e.start]):04x}") from None
    return record


def read_papers(
    source,
    format: str | None = None,
    *,
    strict: bool = False,
    raw_labels: bool = False,
    report: ReadReport | None = None,
    whole_files: bool = True,
    pdf_timeout: float | None = None,
    zotero_timeout: float | None = None,
    zotero_since: str | None = None,
    max_line_bytes: int | None = None,
) -> Iterator[Paper]:
    """Yield the papers of one source, filling `report` with what was read, skipped or wrong.

    An unknown `format` raises ValueError at once; a line whose format cannot be detected (before any
    line could be) is an InputError like any bad line, and detection goes on with the next line. `raw_labels=True` keeps
    `objective` apart from `background`, for training the facet tagger on the five CSAbstruct labels.
    `whole_files=False` reads JSON Lines only: a first line like BibTeX's `@...` or CSL-JSON's `[{...` is not
    taken for that format (POST /papers: one JSON object a record, whatever its text looks like).
    `pdf_timeout`: seconds of wall clock one attached PDF's text may take (esqbe.ingest.pdf); `zotero_timeout`: the
    seconds reading one Zotero database may take (esqbe.ingest.zotero); None: their defaults. `zotero_since`: only
    the items of a Zotero database added or changed at or after this stamp of Zotero's (`esqbe follow`).
    `max_line_bytes`: the bytes one line may hold (a longer one is an error of its line, read no further than that
    bound; None: MAX_LINE_BYTES).
    """
    if format is not None and format not in FORMATS:
        raise ParameterError(f"unknown input format {format!r}; valid formats: {', '.join(FORMATS)}")
    if (format in WHOLE_FILE_FORMATS or format == "zotero") and not whole_files:
        raise ParameterError(f"{format} is read as a whole file, not a record at a time")
    return _read(source, format, strict, raw_labels, report if report is not None else ReadReport(), whole_files,
                 (pdf_timeout, zotero_timeout), zotero_since, max_line_bytes)


#: how a PDF begins (`%PDF-1.7`): a file given to read on its own, not a file of papers
_PDF_MAGIC = b"%PDF-"
#: what `esqbe index paper.pdf` is told
PDF_ON_ITS_OWN = ("a PDF is not a file of papers: esqbe reads a PDF only for a library record that names it and has "
                  "no abstract (a BibTeX `file` field, an RIS `L1`, a Zotero attachment): index that record's library "
                  "(my-library.bib, zotero.sqlite) instead")


def _read(source, fmt: str | None, strict: bool, raw_labels: bool, report: ReadReport,
          whole_files: bool = True, timeouts: tuple[float | None, float | None] = (None, None),
          zotero_since: str | None = None, max_line_bytes: int | None = None) -> Iterator[Paper]:
    if whole_files and (fmt == "zotero" or fmt is None and zotero.is_database(source)):
        state = _State(str(getattr(source, "name", source)), "zotero", strict, raw_labels, report, timeouts[0])
        try:
            yield from _read_zotero(source, state, timeouts[1], zotero_since)
        finally:
            state.close()
        return
    with ExitStack() as stack:
        try:
            name, lines = open_lines(source, stack, max_line_bytes)
        except OSError as e:  # missing, a directory, unreadable: the source as a whole is one error
            error = check_source(source) or InputError(str(source), None, "file", e.strerror or str(e))
            if strict:
                raise error from None
            report.errors.append(error)
            return
        tell = getattr(stack, "tell", None)
        first, lines = _first_line(lines)
        head = None if isinstance(first, LongLine) else first  # a line past the bound tells no format: JSON Lines
        if whole_files and head is not None and (head[:5] == _PDF_MAGIC if isinstance(head, bytes)
                                                 else str(head).startswith(_PDF_MAGIC.decode())):
            error = InputError(name, None, "file", PDF_ON_ITS_OWN)
            if strict:
                raise error
            report.errors.append(error)
            return
        if fmt is None and head is not None and whole_files:
            fmt = sniff_format(head.decode("utf-8", "replace") if isinstance(head, bytes) else str(head))
        state = _State(name, fmt, strict, raw_labels, report, timeouts[0])
        stack.callback(state.close)  # the PDF reader's child process, if one was started
        if isinstance(source, (str, os.PathLike)) and str(source) != "-":  # a record's PDF paths are relative to it
            state.folder = Path(source).parent
        read_before, errors_before = report.read, len(report.errors)
        if fmt in WHOLE_FILE_FORMATS:
            yield from _read_whole(lines, state, tell)
        else:
            yield from _read_lines(lines, state, tell)
        if report.read == read_before and len(report.errors) == errors_before:  # said, not a silent "read 0"
            state.error(InputError(name, None, "file", "no records: the input is empty" if first is None
                                   else "no records in it"))


def _read_lines(lines: Iterator, state: _State, tell) -> Iterator[Paper]:
    """A JSON Lines source, line by line."""
    name, report = state.name, state.report
    lineno = 0
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            break
        except (EOFError, OSError, zlib.error) as e:  # truncated or corrupt gzip, I/O failure
            if state.error(InputError(name, lineno + 1, "file", f"cannot read further: {e}")):
                break
        lineno += 1
        if tell is not None:
            report.position = tell()
        if isinstance(raw, LongLine):  # an error of its line, as any bad line is; the run goes on
            state.one(lineno, lambda: _Invalid("line", raw.reason()))  # noqa: B023 (called at once)
            continue
        if not raw.strip():
            continue
        paper = state.one(lineno, lambda: _parse_json(_decode(raw, lineno)))  # noqa: B023 (called at once)
        if paper is not None:
            yield paper


def _first_line(lines: Iterator) -> tuple[object | None, Iterator]:
    """The first non-blank line (None: there is none), and the lines again from the start; a read error
    met on the way is raised again where the reading loop meets it."""
    consumed: list = []
    failure: BaseException | None = None
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            break
        except (EOFError, OSError, zlib.error) as e:
            failure = e
            break
        consumed.append(raw)
        if raw.strip():
            break

    def again() -> Iterator:
        yield from consumed
        if failure is not None:
            raise failure
        yield from lines

    return (consumed[-1] if consumed and consumed[-1].strip() else None), again()


def _read_whole(lines: Iterator, state: _State, tell) -> Iterator[Paper]:
    """A BibTeX, RIS or CSL-JSON file: read to its end, then record by record (each at its first line)."""
    parts: list[str] = []
    lineno = 0
    try:
        for raw in lines:
            lineno += 1
            if isinstance(raw, LongLine):  # the records cannot be delimited past a line not read
                state.error(InputError(state.name, lineno, "line", raw.reason(whole_file=True)))
                return
            parts.append(_decode(raw, lineno))
    except _Invalid as e:  # not UTF-8: the records cannot be delimited past this line
        state.error(InputError(state.name, lineno, "file", f"{e.reason}; the rest of the file is not read"))
        return
    except (EOFError, OSError, zlib.error) as e:
        state.error(InputError(state.name, lineno + 1, "file", f"cannot read further: {e}"))
        return
    end = tell() if tell is not None else None
    # the position as the records are handed on: the bytes before each record's first line (the file was read
    # whole, but a progress bar over its bytes must move with the papers, not say 100% at the first)
    starts = list(itertools.accumulate((len(p.encode("utf-8")) for p in parts), initial=0))
    assert state.fmt is not None
    fmt = state.fmt
    for line, record in library.entries(fmt, "".join(parts)):
        if end is not None and starts[-1]:
            state.report.position = end * starts[min(max(line, 1), len(starts)) - 1] // starts[-1]
        paper = state.one(line, lambda: record,  # noqa: B023
                          lambda r: library.parse(fmt, r, folder=state.folder, pdf=state.pdf_reader()))
        if paper is not None:
            yield paper
    if end is not None:
        state.report.position = end


def _read_zotero(source, state: _State, timeout: float | None = None, since: str | None = None) -> Iterator[Paper]:
    """A Zotero database (`zotero.sqlite`), read whole under its clock (esqbe.ingest.zotero: past it, the file's
    error and no paper of it), then item by item (each at its itemID); a stored PDF is read for an item without an
    abstract."""
    if not isinstance(source, (str, os.PathLike)) or str(source) == "-":
        state.error(InputError(state.name, None, "file", "a Zotero database is read from its file, not a stream"))
        return
    if not zotero.is_database(source):
        state.error(check_source(source) or InputError(state.name, None, "file", "not an SQLite database (--format "
                                                                                   "zotero reads zotero.sqlite)"))
        return
    clock = zotero.Clock(timeout if timeout is not None else zotero.READ_SECONDS)
    try:
        conn, how = zotero.connect(source, clock)
    except _Invalid as e:
        state.error(InputError(state.name, None, e.field, e.reason))
        return
    try:
        items = zotero.read_all(conn, source, clock, since)
    except _Invalid as e:
        state.error(InputError(state.name, None, e.field, e.reason))
        return
    finally:
        conn.close()
    if how != "read-only":  # Zotero is running: say what was read, and what cannot be in it
        state.report.notes.append(f"{state.name}: Zotero holds it locked (it is running), so esqbe read " + (
            "a temporary copy of it and its WAL (removed after)" if how == "snapshot" else
            "the file as it stands, without a lock") + "; what Zotero had not committed then is not in")
    size, read_before, errors_before = os.path.getsize(source), state.report.read, len(state.report.errors)
    total = max(len(items), 1)
    for done, (item, record) in enumerate(items, 1):
        state.report.position = size * min(done, total) // total
        paper = state.one(item, lambda: record, lambda r: zotero.parse(r, state.pdf_reader()))  # noqa: B023
        if paper is not None:
            yield paper
    state.report.position = size
    if state.report.read == read_before and len(state.report.errors) == errors_before and since is None:
        state.error(InputError(state.name, None, "file", "no items in this Zotero library"))


def read_pdf_paper(path, paper_id: str, *, report: ReadReport, pdf_timeout: float | None = None) -> Iterator[Paper]:
    """A PDF on its own (a followed folder's, esqbe.ingest.folder) as one paper `paper_id`: its title and abstract from
    its first pages as a library record's attached PDF is read (`abstract_source: pdf`), counted in `report` as any
    record is (skipped with the PDF's reason where it gives no abstract)."""
    from .formats import _metadata, _split_text_abstract
    from .pdf import read_pdf_abstract

    state = _State(str(path), "pdf", False, False, report, pdf_timeout)

    def parse(record: dict) -> Paper:
        text = read_pdf_abstract([record["path"]], None, state.pdf_reader())
        meta = _metadata("pdf", attachments=[record["path"]])
        meta["abstract_source"] = "pdf"
        return Paper(paper_id, text.title, _split_text_abstract(text.abstract, "abstract"), metadata=meta)

    try:
        paper = state.one(1, lambda: {"id": paper_id, "path": str(Path(path).resolve())}, parse)
    finally:
        state.close()
    if paper is not None:
        yield paper


class _State:
    """One source being read: its name, its format (once known), and what each record came to."""

    def __init__(self, name: str, fmt: str | None, strict: bool, raw_labels: bool, report: ReadReport,
                 pdf_timeout: float | None = None):
        self.name, self.fmt, self.strict, self.raw_labels, self.report = name, fmt, strict, raw_labels, report
        self.detected_at: int | None = None  # the line the format was detected from (None: given or sniffed)
        self.seen: dict[str, int] = {}  # paper id -> the line it was last read from
        self.folder: Path | None = None  # the folder of the file read (None: stdin, a stream)
        self.pdf_timeout = pdf_timeout
        self._pdf: TextReader | None = None

    def pdf_reader(self) -> TextReader:
        """The reader of this source's attached PDFs (its child process started at its first PDF)."""
        if self._pdf is None:
            self._pdf = TextReader(self.pdf_timeout)
        return self._pdf

    def close(self) -> None:
        if self._pdf is not None:
            self._pdf.close()
            self._pdf = None

    def error(self, error: InputError) -> bool:
        """Record `error` (raise it when strict); True."""
        if self.strict:
            raise error
        self.report.errors.append(error)
        return True

    def one(self, lineno: int, load, parse=None) -> Paper | None:
        """Read one record (`load()` gives it, `parse(record)` makes it a Paper, else the format's parser):
        the paper, or None with the record counted as skipped or wrong."""
        self.report.read += 1
        record = None
        try:
            record = load()
            if isinstance(record, _Invalid):
                raise record
            if self.fmt is None:
                try:
                    self.fmt = detect_format(record)
                    self.detected_at = lineno
                except ValueError as e:  # this line: a later one may still tell the format
                    raise _Invalid("format", str(e)) from None
            paper = parse(record) if parse else _PARSERS[self.fmt](record, self.raw_labels)
            problem = paper_problem(paper, _RAW_LABELS if self.raw_labels else FACET_LABELS)  # NaN metadata, LIMITS
            if problem:
                raise _Invalid(*problem)
            if parse is None:  # a JSON record: its fields the parser does not keep, counted for the run's summary
                self.report.not_kept.update(unkept_fields(self.fmt, record))
        except _Invalid as e:
            self.error(InputError(self.name, lineno, e.field, self._reason(e, record)))
            return None
        except _Skip as e:
            self.report.skipped[e.reason] += 1
            self.report.skipped_records.append(skipped_record(self.name, lineno, record, e.detail))
            return None
        except RecursionError:  # a record nested deeper than a parser's recursion (each bounds its own depth)
            self.error(InputError(self.name, lineno, "record", "nested too deeply"))
            return None
        if paper.paper_id in self.seen:
            self.report.repeated.append(f"{self.name}:{lineno}: id: {paper.paper_id!r} repeats line "
                                        f"{self.seen[paper.paper_id]} of this file; this later record replaces it")
        self.seen[paper.paper_id] = lineno
        self.report.yielded += 1
        if paper.metadata.get("abstract_source") == "pdf":
            self.report.abstracts_from_pdf += 1
        self.report.source, self.report.line = self.name, lineno
        return paper

    def _reason(self, e: _Invalid, record) -> str:
        reason = e.reason
        if self.detected_at is not None and isinstance(record, dict) and e.field != "format":
            try:
                looks_like = detect_format(record)
            except ValueError:
                looks_like = None
            if looks_like not in (None, self.fmt):
                reason += (f" (the format was detected as {self.fmt} from line {self.detected_at}; this record looks "
                           f"like {looks_like}: split the file by format, or pass --format)")
        return reason


#: the keys a record's own id or citation key is under, by format (BibTeX's key, RIS `ID`/`DO`, CSL-JSON, JSON Lines)
_ID_KEYS = ("ID", "id", "paper_id", "corpusid", "corpusId", "doi", "DOI")


def skipped_record(source: str, line: int | None, record, reason: str) -> dict:
    """A skipped record named so that a user can find and fix it: file, line, its id or key, its title, why."""
    ident = title = None
    if isinstance(record, dict):
        ident = next((str(record[k]).strip() for k in _ID_KEYS
                      if isinstance(record.get(k), (str, int)) and str(record[k]).strip()), None)
        title = next((" ".join(record[k].split()) for k in ("title", "primary_title")
                      if isinstance(record.get(k), str) and record[k].strip()), None)
    return {"file": source, "line": line, "id": ident[:200] if ident else None,
            "title": title[:200] if title else None, "reason": reason}
