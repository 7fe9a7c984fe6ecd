"""A record's abstract (and title) from its attached PDF, for BibTeX/RIS records that have none.

Zotero and JabRef name a record's files (BibTeX `file = {Full Text:files/12/x.pdf:application/pdf}`, several
separated by `;`; RIS `L1`). When a record has no abstract, its PDFs are tried in order: a path is taken relative to
the folder of the file that names it; only a regular file of at most `MAX_PDF_BYTES` is opened, and pypdf reads its
first page (and the second, when the abstract runs on). The abstract is the text after an "Abstract" heading up to
the next heading ("1 Introduction", "Keywords", "Index Terms", ...), de-hyphenated and whitespace-normalised, held
to LIMITS. A PDF that is missing, too large, cannot be parsed, has no text (a scanned image) or no abstract section
makes the record a skipped one, with that reason (`_Skip`: the reason counted, and the record's own reason naming the
PDF's path), as a record without an abstract always is.

The text is extracted in a child process (`esqbe.ingest.pdf_child`, one per source read, kept for its PDFs) under a
wall clock per file (`pdf_timeout`) and a memory bound: a PDF that draws one form XObject thousands of times costs
pypdf about a second a drawing, hours a file; past the clock the child is killed, the record is skipped with that
reason, and the next PDF gets a new child. The child keeps the same clock itself and dies with this process, so
that a parent killed (`kill -9`) or stopped leaves no reader working on. (On Linux it dies when the thread that
started it ends: a reader is used by the thread that reads its source.)
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
import unicodedata
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ..domain import LIMITS
from .formats import _Skip

#: a PDF larger than this is not opened
MAX_PDF_BYTES = 100 * 1024 * 1024
#: pages read from the start of a PDF: the first, and the second if the abstract runs on
MAX_PDF_PAGES = 2
#: attachments of one record tried at most
MAX_ATTACHMENTS = 8
#: an abstract shorter than this (characters) is not taken for one (a heading's stray word)
MIN_ABSTRACT_CHARS = 50
#: the default wall clock of one PDF's text extraction, seconds (`pdf_timeout`)
PDF_SECONDS = 20.0
#: bytes of one answer from the child at most (two pages' text, the first page's runs, the title, as JSON)
_MAX_ANSWER_BYTES = 16 * 1024 * 1024

MISSING = "no abstract; its PDF is not found (or not a regular file)"
TOO_LARGE = f"no abstract; its PDF is over {MAX_PDF_BYTES // (1024 * 1024)} MB"
UNPARSABLE = "no abstract; its PDF cannot be parsed"
NO_TEXT = "no abstract; its PDF has no text (a scanned image?)"
NO_SECTION = "no abstract; its PDF has no Abstract section on its first pages"
#: past the clock (formatted with its `seconds`)
TOO_SLOW = "no abstract; reading its PDF's text took over {seconds:g} s (pdf_timeout): stopped"
TOO_MUCH_MEMORY = "no abstract; reading its PDF's text needed more memory than allowed (stopped)"

#: an abstract's heading at a line's start: alone on its line, or with a dash, colon or full stop after it
#: ("Abstract—We ...", IEEE; "Abstract. We ...", LNCS); then, only if there is none, "Abstract We ..." (a title
#: such as "Abstract Interpretation of ..." is thus not taken for the heading when the real one follows)
_HEADING = r"^[ \t]*(?:A[ \t]?B[ \t]?S[ \t]?T[ \t]?R[ \t]?A[ \t]?C[ \t]?T|Abstract|Summary|SUMMARY)"
_START = re.compile(_HEADING + r"(?:[ \t]*\n|[ \t]*[.:\u2014\u2013-]+[ \t]*)", re.MULTILINE)
_START_LOOSE = re.compile(r"^[ \t]*(?:ABSTRACT|Abstract)[ \t]+(?=[A-Z])", re.MULTILINE)
#: where an abstract ends: the next heading, at a line's start or (keywords, index terms) after a sentence
_END = re.compile(
    r"(?:^|(?<=[.!?])[ \t]+)[ \t]*(?:(?:[1I]|1\.|I\.)[ \t]+)?"
    r"(?:Introduction|INTRODUCTION|Keywords|KEYWORDS|Key[ \t]?[Ww]ords|Index[ \t]Terms|INDEX[ \t]TERMS"
    r"|CCS[ \t]Concepts|ACM[ \t]Reference[ \t]Format|General[ \t]Terms)\b"
    r"|^[ \t]*(?:1|1\.|I\.)[ \t]+[A-Z][A-Za-z]+(?:[ \t]+[A-Za-z]+){0,3}[ \t]*$",
    re.MULTILINE)
#: a page's number alone on its last line: dropped where an abstract runs on to the next page
_PAGE_NUMBER_AT_END = re.compile(r"\n[ \t]*\d{1,4}[ \t]*\s*$")
_HYPHEN_BREAK = re.compile(r"([a-z])-\n[ \t]*([a-z])")
_LIGATURES = {chr(c): unicodedata.normalize("NFKC", chr(c)) for c in range(0xFB00, 0xFB07)}


@dataclass
class PdfText:
    abstract: str
    title: str  # "" when the PDF names none
    path: str


def bibtex_files(value: str) -> list[str]:
    """The PDF paths a BibTeX `file` field names: `desc:path:type` items (Zotero, JabRef) or bare paths, separated
    by `;`, with `\\:` `\\;` `\\\\` escapes; items whose type or name is not PDF are left out."""
    paths = []
    for item in _split_unescaped(value, ";")[:MAX_ATTACHMENTS]:
        parts = [_unescape(p) for p in _split_unescaped(item, ":")]
        if len(parts) == 1:
            path, kind = parts[0], ""
        else:
            path, kind = parts[1], ":".join(parts[2:])
            if len(parts) > 3 and len(parts[1]) == 1 and parts[1].isalpha():  # an unescaped Windows drive `C:\...`
                path, kind = f"{parts[1]}:{parts[2]}", ":".join(parts[3:])
        path = path.strip()
        if path and ("pdf" in kind.lower() or path.lower().endswith(".pdf")):
            paths.append(path)
    return paths


def ris_files(value) -> list[str]:
    """The PDF paths of an RIS `L1` (rispy's `file_attachments1`): a path or a `file://` URL, one or a list."""
    values = value if isinstance(value, list) else [value]
    return [v.strip() for v in values[:MAX_ATTACHMENTS] if isinstance(v, str) and v.strip()
            and v.strip().lower().split("?")[0].endswith(".pdf")]


def _split_unescaped(text: str, sep: str) -> list[str]:
    return re.split(r"(?<!\\)" + re.escape(sep), text)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


class TextReader:
    """PDFs' first pages read as text in a child process (`pdf_child.py`), one file at a time, each under `timeout`
    seconds of wall clock; past it the child is killed (and another started for the next file). Close it (or use
    it as a context manager) when the source is read."""

    def __init__(self, timeout: float | None = None):
        self.timeout = float(timeout if timeout is not None else PDF_SECONDS)
        self._child: subprocess.Popen | None = None

    def __enter__(self) -> TextReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            try:
                if child.stdin is not None:
                    child.stdin.close()
                child.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()

    def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()

    def _start(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None:
            script = Path(__file__).with_name("pdf_child.py")
            self._child = subprocess.Popen([sys.executable, str(script), str(os.getpid())], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        return self._child

    def pages(self, path: Path) -> tuple[list[str], list[tuple[float, str]], str]:
        """(the text of the first MAX_PDF_PAGES pages, the first page's text runs with their font size, the PDF's
        own title); `_Skip` with the reason when the file cannot be read so, or not within the clock."""
        request = json.dumps({"path": str(path), "pages": MAX_PDF_PAGES, "max_bytes": MAX_PDF_BYTES,
                              "seconds": self.timeout}) + "\n"  # the child keeps the clock too (pdf_child)
        child = self._start()
        assert child.stdin is not None and child.stdout is not None
        deadline = time.monotonic() + self.timeout
        try:
            child.stdin.write(request.encode("utf-8"))
            child.stdin.flush()
        except OSError:  # the child died: its next one answers the next file
            self._kill()
            raise _Skip(UNPARSABLE) from None
        answer = self._answer(child, deadline)
        error = answer.get("error")
        if error is not None:
            raise _Skip({"missing": MISSING, "too large": TOO_LARGE, "memory": TOO_MUCH_MEMORY}.get(error, UNPARSABLE))
        pages, runs, title = answer.get("pages"), answer.get("runs"), answer.get("title")
        if not isinstance(pages, list) or not isinstance(runs, list) or not isinstance(title, str):
            raise _Skip(UNPARSABLE)
        return ([p for p in pages if isinstance(p, str)],
                [(float(r[0]), str(r[1])) for r in runs if isinstance(r, list) and len(r) == 2], title)

    def _answer(self, child: subprocess.Popen, deadline: float) -> dict:
        assert child.stdout is not None
        fd, parts, size = child.stdout.fileno(), [], 0
        while True:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:  # past the clock: the child is stopped, whatever it was doing
                self._kill()
                raise _Skip(TOO_SLOW.format(seconds=self.timeout))
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # it died: its own clock (SIGALRM), the memory bound, a crash in a parser
                try:
                    slow = child.wait(timeout=5) == -signal.SIGALRM
                except subprocess.TimeoutExpired:
                    slow = False
                self._kill()
                raise _Skip(TOO_SLOW.format(seconds=self.timeout) if slow else UNPARSABLE)
            parts.append(chunk)
            size += len(chunk)
            if chunk.endswith(b"\n"):
                break
            if size > _MAX_ANSWER_BYTES:
                self._kill()
                raise _Skip(UNPARSABLE)
        try:
            answer = json.loads(b"".join(parts))
        except ValueError:
            self._kill()
            raise _Skip(UNPARSABLE) from None
        return answer if isinstance(answer, dict) else {"error": "unparsable"}


def read_pdf_abstract(paths: list[str], folder: Path | None, reader: TextReader | None = None) -> PdfText:
    """The abstract (and title) of the first of `paths` that has one; `_Skip` with the first PDF's reason if none
    (its `detail` naming that PDF's path). `reader` reads the text (a new one, closed after, if none is given)."""
    if reader is None:
        with TextReader() as own:
            return read_pdf_abstract(paths, folder, own)
    first: _Skip | None = None
    for raw in paths[:MAX_ATTACHMENTS]:
        try:
            return _one(raw, folder, reader)
        except _Skip as e:
            first = first or e
    raise first or _Skip(MISSING)


def _resolve(raw: str, folder: Path | None) -> Path | None:
    if raw.lower().startswith("file:"):
        parsed = urllib.parse.urlparse(raw)
        if parsed.netloc not in ("", "localhost"):
            return None
        raw = urllib.parse.unquote(parsed.path)
    elif "://" in raw:  # an http(s) link: not fetched
        return None
    path = Path(raw)
    if not path.is_absolute():
        if folder is None:  # stdin or a stream: no folder to resolve against
            return None
        path = folder / path
    return path


def _shown(raw: str, path: Path | None) -> str:
    """Where a PDF was looked for, in a skipped record's reason: its path, or why a path names no file here."""
    if path is not None:
        return str(path)
    if "://" in raw and not raw.lower().startswith("file:"):
        return f"{raw[:300]} (a web link: not fetched)"
    if raw.lower().startswith("file:"):
        return f"{raw[:300]} (a file URL of another host)"
    return f"{raw[:300]} (a relative path, and no folder to take it from: stdin, or Zotero's base directory)"


def _one(raw: str, folder: Path | None, reader: TextReader) -> PdfText:
    path = _resolve(raw, folder)
    where = _shown(raw, path)
    try:
        return _read_one(path, reader)
    except _Skip as e:
        raise _Skip(e.reason, f"{e.reason}: {where}") from None


def _read_one(path: Path | None, reader: TextReader) -> PdfText:
    if path is None:
        raise _Skip(MISSING)
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        raise _Skip(MISSING) from None
    if not stat.S_ISREG(info.st_mode):  # a FIFO or a device is never opened
        raise _Skip(MISSING)
    if info.st_size > MAX_PDF_BYTES:
        raise _Skip(TOO_LARGE)
    pages, runs, meta_title = reader.pages(path)
    if not any(p.strip() for p in pages):
        raise _Skip(NO_TEXT)
    abstract = None
    for n in range(1, len(pages) + 1):  # the first page; the second only if the abstract runs on
        abstract = _abstract("\n".join(_PAGE_NUMBER_AT_END.sub("", page) for page in pages[:n]))
        if abstract is not None:
            break
    if abstract is None:
        raise _Skip(NO_SECTION)
    return PdfText(abstract, _title(meta_title, runs), str(path))


def _clean(text: str) -> str:
    text = "".join(_LIGATURES.get(c, c) for c in text)
    text = _HYPHEN_BREAK.sub(r"\1\2", text)
    return " ".join(text.split())


def _abstract(text: str) -> str | None:
    """The text from the first abstract heading that is followed by a closing heading, up to that heading."""
    for start_pattern in (_START, _START_LOOSE):
        for start in start_pattern.finditer(text):
            end = _END.search(text, start.end())
            if end is None:
                break  # no closing heading after this one: none after a later one either
            abstract = _clean(text[start.end():end.start()])
            if len(abstract) >= MIN_ABSTRACT_CHARS:
                return abstract[:LIMITS["abstract_chars"]]
    return None


def _title(meta_title: str, runs: list[tuple[float, str]]) -> str:
    """The PDF's own title if it names a plausible one, else the first page's largest text before its abstract."""
    title = _clean(meta_title)
    if len(title) >= 4 and not re.search(r"\.(dvi|docx?|tex|pdf)$|^untitled$|^microsoft word", title, re.I):
        return title[:LIMITS["title_chars"]]
    runs = [(size, text) for size, text in runs if text.strip()]
    heading = next((i for i, (_, text) in enumerate(runs) if _START.match(text.strip() + "\n")), None)
    if heading is None:
        heading = next((i for i, (_, text) in enumerate(runs) if _START_LOOSE.match(text.strip())), len(runs))
    before = runs[:heading]
    if not before:
        return ""
    largest = max(size for size, _ in before)
    first = next(i for i, (size, _) in enumerate(before) if size == largest)
    words = []
    for size, text in before[first:]:  # the largest run and those of its size right after it
        if size != largest:
            break
        words.append(text)
    return _clean(" ".join(words))[:LIMITS["title_chars"]]
