"""A record's abstract (and title) from its attached PDF, for BibTeX/RIS records that have none.

Zotero and JabRef name a record's files (BibTeX `file = {Full Text:files/12/x.pdf:application/pdf}`, several
separated by `;`; RIS `L1`). When a record has no abstract, its PDFs are tried in order: a path is taken relative to
the folder of the file that names it; only a regular file of at most `MAX_PDF_BYTES` is opened, and pypdf reads its
first page (and the second, when the abstract runs on). The abstract is the text after an "Abstract" heading up to
the next heading ("1 Introduction", "Keywords", "Index Terms", ...), de-hyphenated and whitespace-normalised, held
to LIMITS. A PDF that is missing, too large, cannot be parsed, has no text (a scanned image) or no abstract section
makes the record a skipped one, with that reason (`_Skip`), as a record without an abstract always is.
"""
from __future__ import annotations

import logging
import math
import os
import re
import stat
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

MISSING = "no abstract; its PDF is not found (or not a regular file)"
TOO_LARGE = f"no abstract; its PDF is over {MAX_PDF_BYTES // (1024 * 1024)} MB"
UNPARSABLE = "no abstract; its PDF cannot be parsed"
NO_TEXT = "no abstract; its PDF has no text (a scanned image?)"
NO_SECTION = "no abstract; its PDF has no Abstract section on its first pages"

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


def read_pdf_abstract(paths: list[str], folder: Path | None) -> PdfText:
    """The abstract (and title) of the first of `paths` that has one; `_Skip` with the first PDF's reason if none."""
    first_reason = None
    for raw in paths[:MAX_ATTACHMENTS]:
        try:
            return _one(raw, folder)
        except _Skip as e:
            first_reason = first_reason or e.reason
    raise _Skip(first_reason or MISSING)


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


def _one(raw: str, folder: Path | None) -> PdfText:
    path = _resolve(raw, folder)
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
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_PDF_BYTES:  # replaced since it was looked at
                raise _Skip(TOO_LARGE)
            pages, runs, meta_title = _pages_text(f)
    except OSError:
        raise _Skip(MISSING) from None
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


def _pages_text(f) -> tuple[list[str], list[tuple[float, str]], str]:
    """The text of the first pages, the first page's text runs with their font size, and the PDF's own title."""
    import pypdf

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings on a broken file: the record's reason says it
    runs: list[tuple[float, str]] = []

    def visit(text, cm, tm, font_dict, font_size):
        if len(runs) < 400 and isinstance(font_size, (int, float)):
            scale = math.hypot(tm[0], tm[1]) * math.hypot(cm[0], cm[1])
            runs.append((round(float(font_size) * scale, 1), text))

    try:
        reader = pypdf.PdfReader(f)
        if reader.is_encrypted:
            reader.decrypt("")  # many PDFs are "encrypted" with an empty password; others fail below
        pages = []
        for i in range(min(len(reader.pages), MAX_PDF_PAGES)):
            pages.append(reader.pages[i].extract_text(visitor_text=visit if i == 0 else None) or "")
        meta = reader.metadata
        title = meta.title if meta is not None and isinstance(meta.title, str) else ""
    except _Skip:
        raise
    except Exception:  # noqa: BLE001  # pypdf raises many kinds on a broken or hostile file
        raise _Skip(UNPARSABLE) from None
    return pages, runs, title


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
