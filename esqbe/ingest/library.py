"""Reference-manager files, read whole: BibTeX (bibtexparser), RIS (rispy) and CSL-JSON (Zotero's export).

Unlike the JSON Lines formats a record spans several lines, so a file is split into its records first,
each with the line it starts on (`file:line: field: reason` points at it), then each record becomes a
`Paper` with its metadata under esqbe's key names. A record without an abstract is skipped with the
reason, as in every reader. A BibTeX entry is also kept as written (`AS_WRITTEN`), so that a BibTeX export gives it
back byte for byte; its names keep their parts (esqbe.core.names), as RIS's and CSL-JSON's do.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from ..core.names import FLAGS, PARTS, person, split_particles
from ..domain import LIMITS, Paper
from .formats import NO_ABSTRACT, _authors, _checked_id, _Invalid, _metadata, _Skip, _split_text_abstract, _type_name
from .latex import carried, concatenated, latex_decoder, strip_enclosing, written

#: formats read as a whole file rather than line by line
WHOLE_FILE_FORMATS = ("bibtex", "ris", "csl-json")

#: RIS tags that may repeat: rispy's, and `AN` (esqbe's export writes `AN  - arXiv:...` and `AN  - PMID:...`)
RIS_LIST_TAGS = ["A1", "A2", "A3", "A4", "AU", "KW", "N1", "UR", "AN"]
_RIS_TAG = re.compile(r"^([A-Z][A-Z0-9])  -( |$)")
_JSON_ARRAY_OF_OBJECTS = re.compile(r"^\[\s*(\{|$)")  # `[` alone (pretty-printed) or `[{...` (minified)
_YEAR = re.compile(r"\b(1[5-9]\d\d|2\d\d\d)\b")


def sniff_format(first_line: str) -> str | None:
    """The whole-file format a file's first non-blank line announces, or None (JSON Lines)."""
    s = first_line.lstrip("\ufeff \t")
    if s.startswith("@") or s.startswith("%"):
        return "bibtex"
    if _RIS_TAG.match(s):
        return "ris"
    if _JSON_ARRAY_OF_OBJECTS.match(s.rstrip()):
        return "csl-json"
    return None


def entries(fmt: str, text: str) -> Iterator[tuple[int, dict | _Invalid]]:
    """(line the record starts on, the record as a dict or why it cannot be read) for each record."""
    if fmt == "bibtex":
        return _bibtex_entries(text)
    if fmt == "ris":
        return _ris_entries(text)
    return _csl_entries(text)


def parse(fmt: str, record: dict, raw_labels: bool = False, folder: Path | None = None, pdf=None) -> Paper:
    """The record as a Paper. A BibTeX/RIS record without an abstract that names a PDF (`file`, `L1`) takes its
    abstract, and its title if it has none, from the PDF (`esqbe.ingest.pdf`, read by `pdf`, a `TextReader`, or a
    new one; paths relative to `folder`, the folder of the file read; None: stdin) and is marked
    `abstract_source: pdf`; else it is skipped with the reason."""
    try:
        return _PARSERS[fmt](record)
    except _Skip as skip:
        paths = _pdf_paths(fmt, record) if skip.reason == NO_ABSTRACT else []
        if not paths:
            raise
    from .pdf import read_pdf_abstract

    found = read_pdf_abstract(paths, folder, pdf)
    title_key = "title" if fmt == "bibtex" or record.get("title") or not record.get("primary_title") else "primary_title"
    with_pdf = {**record, "abstract": found.abstract}
    if not _plain(record.get(title_key)) and found.title:
        with_pdf[title_key] = found.title
    paper = _PARSERS[fmt](with_pdf)
    paper.metadata["abstract_source"] = "pdf"
    return paper


def _pdf_paths(fmt: str, record: dict) -> list[str]:
    from .pdf import bibtex_files, ris_files

    if fmt == "bibtex" and isinstance(record.get("file"), str):
        return bibtex_files(record["file"])
    if fmt == "ris" and record.get("file_attachments1"):
        return ris_files(record["file_attachments1"])
    return []


# ---------------------------------------------------------------- BibTeX


#: the fields esqbe reads (decodes) from an entry (`_from_bibtex`); every field is kept as written besides (`AS_WRITTEN`)
_BIBTEX_FIELDS = frozenset({"title", "abstract", "author", "journal", "booktitle", "journaltitle", "year", "date", "doi",
                            "publisher", "url", "volume", "pages", "archiveprefix", "eprinttype", "eprint", "pmid"})
#: the metadata key of a BibTeX entry as written: {"type": its entry type, "key": its citation key, "fields": {each
#: field's name: its value as written (delimiters, braces, LaTeX; `@string` references resolved; runs of white space
#: one space)}}: what a BibTeX export writes back byte for byte (esqbe.query.export), whatever esqbe decoded of it
AS_WRITTEN = "bibtex"
#: a field's LaTeX as written may be longer than its decoded text (`{\'e}` is `é`): the raw text may be this many
#: times its bound in LIMITS before it is refused without decoding; the decoded text is then held to the bound itself
_LATEX_SLACK = 2
#: a `file` field (Zotero/JabRef attachments) longer than this is not read for PDF paths
_FILE_FIELD_CHARS = 20_000
#: `@string`s that refer to `@string`s: followed this deep, no deeper (a loop is a name left as written)
_STRING_DEPTH = 8
_ENTRY_TYPE = re.compile(r"\s*@\s*([^\s{(]+)")


def _raw_bound(name: str) -> tuple[int, str]:
    """(characters of LaTeX `name` may hold before it is decoded, the LIMITS key behind it)."""
    key = {"title": "title_chars", "abstract": "abstract_chars"}.get(name, "metadata_bytes")
    return _LATEX_SLACK * LIMITS[key], key


def _bibtex_entries(text: str) -> Iterator[tuple[int, dict | _Invalid]]:
    """The entries of a BibTeX file. bibtexparser splits it (linear); esqbe then resolves `@string` references and
    `#` concatenations, keeps every field as written and decodes the LaTeX of the fields it reads itself, each
    bounded BEFORE it is expanded or decoded: a field past twice its LIMITS bound, an entry whose other fields
    together are, or `@string` expansions past twice the file's size (a 90 KB string used by a thousand entries would
    be 90 MB of text to decode) are refused as that entry's error. Each distinct expanded value is decoded once,
    however often it is used."""
    import bibtexparser
    from bibtexparser import model

    logging.getLogger("bibtexparser").setLevel(logging.CRITICAL)  # its failures are reported as ours, per record
    try:
        library = bibtexparser.parse_string(text, parse_stack=[])  # as written: no @string expansion, braces kept
    except Exception as e:  # noqa: BLE001 (its splitter reports entries it cannot read as blocks; anything else)
        yield 1, _Invalid("file", f"not a BibTeX file bibtexparser can split: {' '.join(str(e).split())[:200]}")
        return
    strings = {key.lower(): s.value.strip() for key, s in library.strings_dict.items() if isinstance(s.value, str)}
    budget = [2 * len(text) + 100_000]  # characters @string references may still expand to in this file
    decode = latex_decoder()
    decoded_strings: dict[tuple[str, str], object] = {}  # an expanded value as decoded (once, however often used)
    for block in library.blocks:
        line = (block.start_line or 0) + 1
        if isinstance(block, model.ParsingFailedBlock):
            error = block.error
            reason = getattr(error, "abort_reason", None) or " ".join(str(error).split()) or type(error).__name__
            yield line, _Invalid("entry", f"not a valid BibTeX entry: {reason}")
        elif isinstance(block, model.Entry):
            try:
                yield line, _bibtex_record(block, strings, budget, decode, decoded_strings)
            except _Invalid as e:
                yield line, e


def _bibtex_record(entry, strings: dict[str, str], budget: list[int], decode, decoded_strings: dict) -> dict:
    """One entry as a record: the fields esqbe reads decoded (`author` as its names), and the whole entry as written
    under AS_WRITTEN."""
    record: dict = {}
    fields: dict[str, str] = {}
    other_chars = 0
    for field in entry.fields:
        if not isinstance(field.value, str):
            continue
        name = field.key.lower()
        value, expanded = _resolved(field.value.strip(), strings, 0)
        bound, key = _raw_bound(name)
        if len(value) > bound:
            via = " (after @string expansion)" if expanded else ""
            raise _Invalid(name, f"{len(value)} characters of LaTeX{via}; at most {bound} before decoding "
                                 f"(the decoded text at most {LIMITS[key]})")
        if key == "metadata_bytes":
            other_chars += len(value)
            if other_chars > bound:
                raise _Invalid(name, f"the entry's fields but title and abstract hold over {bound} characters of "
                                     f"LaTeX; at most {bound} before decoding (as JSON at most {LIMITS[key]} bytes)")
        if expanded:
            budget[0] -= expanded
            if budget[0] < 0:
                raise _Invalid(name, "@string references in this file expand to more than twice its size; "
                                     "write the text in the entries instead")
        value = fields[field.key] = written(value)
        if name == "file":  # attached files: paths as written, never LaTeX-decoded
            if len(value) <= _FILE_FIELD_CHARS:
                record["file"] = strip_enclosing(value)
            continue
        if name not in _BIBTEX_FIELDS:
            continue
        raw = strip_enclosing(value)
        cache_key = (name == "author", raw)  # an author list is split into names
        try:
            if expanded and cache_key in decoded_strings:
                record[name] = decoded_strings[cache_key]
            else:
                record[name] = _bibtex_names(raw, decode) if name == "author" else decode(raw)
                if expanded:
                    decoded_strings[cache_key] = record[name]
        except Exception as e:  # noqa: BLE001 (pylatexenc raises anything; a RecursionError on deep braces)
            reason = " ".join(str(e).split())[:200] or type(e).__name__
            raise _Invalid(name, f"cannot decode its LaTeX: {reason}") from None
    found = _ENTRY_TYPE.match(entry.raw or "")
    kind = found.group(1) if found else entry.entry_type  # as written (bibtexparser gives it lower-cased)
    record["ENTRYTYPE"], record["ID"] = entry.entry_type.lower(), entry.key
    record[AS_WRITTEN] = {"type": kind, "key": entry.key, "fields": fields}
    return record


def _resolved(value: str, strings: dict[str, str], depth: int) -> tuple[str, int]:
    """(a value as BibTeX reads it, characters its `@string` references expanded to): a value without references as
    written (`{...}`, `"..."`, a number); a reference to an `@string` as the string's value is written; pieces
    joined by `#` as one `{...}` of their texts. A name no `@string` of the file defines (BibTeX's own `jan`, a
    typo) stays as written, and so does a concatenation holding one."""
    pieces = concatenated(value)
    if len(pieces) == 1 and (depth >= _STRING_DEPTH or value.lower() not in strings):
        return value, 0
    texts, expanded = [], 0
    for piece in pieces:
        if piece.lower() in strings and depth < _STRING_DEPTH and not piece.isdigit():
            found, more = _resolved(strings[piece.lower()], strings, depth + 1)
            expanded += len(found) + more
            if len(pieces) == 1:
                return found, expanded
            piece = found
        if piece[:1] not in ('{', '"') and not piece.isdigit():
            return value, expanded  # a name BibTeX defines itself (or nobody does): kept as written
        texts.append(strip_enclosing(piece))
    return "{" + "".join(texts) + "}", expanded


def _bibtex_names(raw: str, decode) -> list[dict]:
    """An author list as written (`Last, First and First von Last and {Some Organisation} and others`) as esqbe's
    authors (esqbe.core.names): split at ` and ` outside braces (by esqbe: bibtexparser's splitter loses the first
    two characters of a name that begins with a backslash, `\\'Alvarez`), each name into BibTeX's parts (First, von,
    Last, Jr) by bibtexparser; First's last words in lower case are its dropping particle (`La Fontaine, Jean de`),
    von the non-dropping one (`de Vries, Johan`). A name braced whole (`{Google AI Language}`, not a lone
    `{\\textmacro}`) is an organisation's (`literal`); `others` (et al.) is no author."""
    from bibtexparser.middlewares.names import parse_single_name_into_parts

    def text(words: list[str]) -> str:
        return carried(decode(" ".join(words))) if words else ""

    names = []
    for name in _and_split(raw):
        if not name or name.lower() == "others":
            continue
        if len(name) > 2 and name[0] == "{" and name[1] != "\\" and _depth_zero_inside(name):
            names.append({"name": carried(decode(name)), "literal": True})
            continue
        # a name ending in a comma has an empty First (`Brinch Hansen,`, `King, Jr.,`), which bibtexparser reads as
        # no comma at all: it is given one, `{}`, that decodes to nothing
        parts = parse_single_name_into_parts(f"{name} {{}}" if _top_level_comma(name, last=True) else name, strict=False)
        found = person({**split_particles("", text(parts.first)), "non-dropping-particle": text(parts.von),
                        "family": text(parts.last), "suffix": text(parts.jr)})
        if found:
            names.append(found)
    return names


#: a brace that counts: not `\{` or `\}` (an escaped one); `{\\textbackslash}` (a backslash) counts
_COUNTED_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)


def _braces(text: str):
    """(position, +1 or -1) of each brace of `text` that counts."""
    for m in _COUNTED_BRACE.finditer(text):
        if m.group() in "{}":
            yield m.start(), 1 if m.group() == "{" else -1


def _and_split(text: str) -> list[str]:
    """`text` split at each ` and ` (any case, as BibTeX) outside braces."""
    text = " ".join(text.split())
    parts, start, depth = [], 0, 0
    for m in re.finditer(r"\\.|[{}]|(?i: and )", text, re.DOTALL):
        token = m.group()
        if token in "{}":
            depth += 1 if token == "{" else -1
        elif token[0] != "\\" and depth == 0:
            parts.append(text[start:m.start()].strip())
            start = m.end()
    return [*parts, text[start:].strip()]


def _top_level_comma(part: str, last: bool = False) -> bool:
    """Whether `part` ends with a comma outside braces (`last`), or has one anywhere."""
    depth, at = 0, None
    for m in re.finditer(r"\\.|[{},]", part, re.DOTALL):
        token = m.group()
        if token in "{}":
            depth += 1 if token == "{" else -1
        elif token == "," and depth == 0:
            at = m.start()
    return at is not None and (not last or at == len(part.rstrip()) - 1)


def _depth_zero_inside(part: str) -> bool:
    """`{...}` whose first brace closes only at its end (not `{M}uller {X}`)."""
    depth = 0
    for pos, step in _braces(part):
        depth += step
        if depth == 0 and pos < len(part) - 1:
            return False
    return depth == 0


def _from_bibtex(record: dict) -> Paper:
    paper_id = (record.get("ID") or "").strip()
    if not paper_id:
        raise _Invalid("key", "missing (every entry needs a citation key)")
    _checked_id(paper_id, "key")
    title = _plain(record.get("title"))
    sentences = _split_text_abstract(_plain(record.get("abstract")) or None, "abstract")
    venue = next((_plain(record.get(k)) for k in ("journal", "booktitle", "journaltitle") if record.get(k)), None)
    names = record.get("author")
    meta = _metadata(
        "bibtex", _year(record.get("year") or record.get("date")),
        venue=venue, journal=_plain(record.get("journal")), authors=_authors(names) if isinstance(names, list) else None,
        publisher=_plain(record.get("publisher")),
        external_ids={"doi": _doi(record.get("doi")), "arxiv": _arxiv_eprint(record),
                      "pubmed": _plain(record.get("pmid")) or _pubmed_eprint(record)},
        url=_plain(record.get("url")), entry_type=record.get("ENTRYTYPE"),
        volume=_plain(record.get("volume")), pages=_plain(record.get("pages")),
    )
    if isinstance(record.get(AS_WRITTEN), dict):  # as written, not cleaned: `_metadata` would join its white space
        meta[AS_WRITTEN] = record[AS_WRITTEN]
    return Paper(paper_id, title, sentences, metadata=meta)


def _pubmed_eprint(record: dict) -> str | None:
    prefix = str(record.get("archiveprefix") or record.get("eprinttype") or "").lower()
    return _plain(record.get("eprint")) if prefix == "pubmed" else None


def _arxiv_eprint(record: dict) -> str | None:
    prefix = str(record.get("archiveprefix") or record.get("eprinttype") or "").lower()
    return _plain(record.get("eprint")) if prefix == "arxiv" else None


# ---------------------------------------------------------------- RIS


def _ris_entries(text: str) -> Iterator[tuple[int, dict | _Invalid]]:
    """Records split at `ER  -`, each parsed by rispy; a tag line outside a record is an error at its line."""
    import rispy

    list_tags = [*RIS_LIST_TAGS, "L1"]  # Zotero writes one `L1` per attached file (a snapshot, then the PDF)
    chunk: list[str] = []
    start = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not chunk:
            if not line.strip():
                continue
            if not line.lstrip("\ufeff").startswith("TY  -"):
                yield lineno, _Invalid("TY", f"a record must start with a 'TY  - ' line, got {line[:40]!r}")
                continue
            start = lineno
        chunk.append(line.lstrip("\ufeff"))
        if line.startswith("ER  -"):
            try:
                records = rispy.loads("\n".join(chunk) + "\n", list_tags=list_tags)
            except Exception as e:  # rispy raises plain exceptions for malformed records
                yield start, _Invalid("record", f"not a valid RIS record: {e}")
            else:
                for record in records:
                    yield start, record
            chunk = []
    if chunk:
        yield start, _Invalid("ER", "the file ends inside a record (no 'ER  - ' line)")


def _from_ris(record: dict) -> Paper:
    title = _plain(record.get("title") or record.get("primary_title"))
    doi = _doi(record.get("doi"))
    ident = record.get("id")  # as written: an id with a control character is refused (domain.paper_problem), not mended
    paper_id = (_checked_id(" ".join(ident.split()), "ID") if isinstance(ident, str) else "") or doi or \
        _derived_id("ris", title, record.get("year"))
    abstract = record.get("abstract") or record.get("notes_abstract")
    if isinstance(abstract, str) and len(abstract) > _LATEX_SLACK * LIMITS["abstract_chars"]:  # before it is cleaned
        raise _Invalid("AB", f"{len(abstract)} characters as written; at most {_LATEX_SLACK * LIMITS['abstract_chars']}"
                             f" (the text at most {LIMITS['abstract_chars']})")
    sentences = _split_text_abstract(_plain(abstract) or None, "AB")
    authors = [*(record.get("authors") or []), *(record.get("first_authors") or [])]
    names = [_ris_name(a) for a in authors if isinstance(a, str) and a.strip()]
    venue = _plain(record.get("secondary_title") or record.get("journal_name") or record.get("alternate_title3"))
    urls = record.get("urls")
    meta = _metadata(
        "ris", _year(record.get("year") or record.get("publication_year") or record.get("date")),
        venue=venue, journal=_plain(record.get("journal_name")), authors=_authors(names),
        publisher=_plain(record.get("publisher")), external_ids={"doi": doi, **_accession_ids(record)},
        url=urls[0] if isinstance(urls, list) and urls and isinstance(urls[0], str) else None,
        entry_type=_plain(record.get("type_of_reference")),
        volume=_plain(record.get("volume")), keywords=record.get("keywords"),
    )
    return Paper(paper_id, title, sentences, metadata=meta)


def _ris_name(text: str) -> dict | None:
    """An RIS name: `Family, Given, Suffix` (RIS's form), the particles told as BibTeX tells them (`de Vries, Johan`,
    `La Fontaine, Jean de`: esqbe.core.names.split_particles); a name without a comma is an organisation's, whole."""
    if "," not in text:
        return {"name": text.strip(), "literal": True}
    family, given, suffix = (*(p.strip() for p in text.split(",", 2)), "", "")[:3]
    return person({**split_particles(family, given), "suffix": suffix})


def _accession_ids(record: dict) -> dict:
    """`AN  - arXiv:1706.03762` and `AN  - PMID:12345` (esqbe's export; PubMed's own RIS) as external ids."""
    found = record.get("accession_number")
    out: dict[str, str] = {}
    for value in found if isinstance(found, list) else [found] if isinstance(found, str) else []:
        kind, sep, ident = str(value).partition(":")
        name = {"arxiv": "arxiv", "pmid": "pubmed", "pubmed": "pubmed"}.get(kind.strip().lower()) if sep else None
        if name and _plain(ident):
            out.setdefault(name, _plain(ident))
    return out


# ---------------------------------------------------------------- CSL-JSON


def _csl_entries(text: str) -> Iterator[tuple[int, dict | _Invalid]]:
    """The items of a CSL-JSON array, decoded one by one so that each has its own line (counted on from the item
    before: linear in the file). An item Python's JSON decoder cannot take (nested past its recursion limit, an
    integer of thousands of digits) is that item's error, and reading goes on after it."""
    decoder = json.JSONDecoder()
    line = _LineCounter(text)
    pos = _skip_ws(text, 0)
    if text[pos:pos + 1] != "[":
        yield line(pos), _Invalid("json", "a CSL-JSON file is one JSON array of items")
        return
    pos = _skip_ws(text, pos + 1)
    n = 0
    while pos < len(text) and text[pos] != "]":
        at = line(pos)
        item: object
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            yield line(e.pos), _Invalid("json", f"item {n}: {e.msg} (column {e.colno}); the rest is not read")
            return
        except (RecursionError, ValueError) as e:  # too deep, or an int past Python's digit limit: skip the item
            end = _json_value_end(text, pos)
            if end is None:
                yield at, _Invalid("json", f"item {n}: {_decoder_refusal(e)}; its end cannot be found, the rest is "
                                           "not read")
                return
            item, pos = _Invalid("json", f"item {n}: {_decoder_refusal(e)}"), end
        yield at, item if isinstance(item, (dict, _Invalid)) else _Invalid(
            "item", f"item {n}: expected an object, got {_type_name(item)}")
        n += 1
        pos = _skip_ws(text, pos)
        if text[pos:pos + 1] == ",":
            pos = _skip_ws(text, pos + 1)
        elif text[pos:pos + 1] != "]":
            yield line(pos), _Invalid("json", f"expected ',' or ']' after item {n - 1}; the rest is not read")
            return
    if pos >= len(text):
        yield line(pos), _Invalid("json", "the array is not closed with ']'")


def _decoder_refusal(e: Exception) -> str:
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return " ".join(str(e).split("; use sys.set_int_max_str_digits")[0].split())[:200]


_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _json_value_end(text: str, pos: int) -> int | None:
    """Where the JSON object or array starting at `pos` ends (its brackets counted, strings skipped), without
    decoding it; None if it does not start with a bracket or is not closed."""
    if text[pos:pos + 1] not in ("{", "["):
        return None
    depth = 0
    for match in _JSON_TOKEN.finditer(text, pos):
        token = match.group()
        if token in ("{", "["):
            depth += 1
        elif token in ("}", "]"):
            depth -= 1
            if depth == 0:
                return match.end()
    return None


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n\ufeff":
        pos += 1
    return pos


class _LineCounter:
    """`line(pos)`: the 1-based line of `pos`, counting only the text since the position asked before."""

    def __init__(self, text: str):
        self.text, self.pos, self.line = text, 0, 1

    def __call__(self, pos: int) -> int:
        if pos < self.pos:  # not met in order: counted from the start (once, for an error)
            return self.text.count("\n", 0, pos) + 1
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def _from_csl(record: dict) -> Paper:
    ident = record.get("id")
    if ident is None or isinstance(ident, bool) or not isinstance(ident, (str, int)) or not str(ident).strip():
        raise _Invalid("id", "missing" if ident is None else f"expected a string or integer, got {_type_name(ident)}")
    paper_id = _checked_id(str(ident).strip(), "id")
    if "://" in paper_id:  # Zotero: http://zotero.org/users/1/items/ABCD; an id such as a DOI keeps its slashes
        paper_id = paper_id.rstrip("/").rsplit("/", 1)[-1]
    title = _plain(record.get("title"))
    if record.get("abstract") is not None and not isinstance(record.get("abstract"), str):
        raise _Invalid("abstract", f"expected a string, got {_type_name(record.get('abstract'))}")
    sentences = _split_text_abstract(record.get("abstract"), "abstract")
    authors = []
    for i, a in enumerate(record.get("author") or []):
        if not isinstance(a, dict):
            raise _Invalid(f"author[{i}]", f"expected an object with family/given, got {_type_name(a)}")
        if a.get("literal"):
            authors.append({"name": str(a["literal"]), "literal": True})  # an organisation: one name, never split
            continue
        found = person({**{k: str(a[k]) for k in PARTS if a.get(k) not in (None, "")},
                        **{k: True for k in FLAGS if a.get(k) is True}})  # each part under its own key, as read
        if found:
            authors.append(found)
    issued = record.get("issued")
    parts = issued.get("date-parts") if isinstance(issued, dict) else None
    year = date = None
    if isinstance(parts, list) and parts and isinstance(parts[0], list) and parts[0]:
        nums = [p for p in parts[0] if isinstance(p, (int, str)) and str(p).isdigit()]
        year = int(nums[0]) if nums else None
        date = "-".join(f"{int(p):02d}" if i else str(p) for i, p in enumerate(nums)) if nums else None
    elif isinstance(issued, dict):
        year = _year(issued.get("raw") or issued.get("literal"))
    custom = record.get("custom")  # CSL's place for what has no variable: esqbe's export puts the arXiv id there
    meta = _metadata(
        "csl-json", year, publication_date=date, venue=_plain(record.get("container-title")),
        authors=_authors(authors), publisher=_plain(record.get("publisher")),
        external_ids={"doi": _doi(record.get("DOI")), "pubmed": _plain(record.get("PMID")),
                      "arxiv": _plain(custom.get("arxiv")) if isinstance(custom, dict) else None},
        url=_plain(record.get("URL")),
        entry_type=_plain(record.get("type")), volume=_plain(record.get("volume")), pages=_plain(record.get("page")),
    )
    return Paper(paper_id, title, sentences, metadata=meta)


# ---------------------------------------------------------------- shared


def _plain(value) -> str:
    """A field's text as `carried` ("" if not text). BibTeX's protective braces are gone already (its decoder drops
    them); a brace in RIS or CSL-JSON is text, kept."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        return ""
    return carried(value)


def _year(value) -> int | None:
    match = _YEAR.search(str(value)) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    return int(match.group(1)) if match else None


def _doi(value) -> str | None:
    doi = _plain(value)
    for prefix in ("https://doi.org/", "http://doi.org/", "http://dx.doi.org/", "https://dx.doi.org/", "doi:"):
        if doi.lower().startswith(prefix):
            doi = doi[len(prefix):]
    return doi or None


def _derived_id(fmt: str, title: str, year) -> str:
    """An id for a record that names none (RIS without ID or DO): stable across runs, from title and year."""
    if not title:
        raise _Invalid("ID", "missing, and no DO or TI to make an id from")
    digest = hashlib.sha1(f"{title.lower()}|{_year(year) or ''}".encode()).hexdigest()[:12]
    return f"{fmt}-{digest}"


_PARSERS = {"bibtex": _from_bibtex, "ris": _from_ris, "csl-json": _from_csl}
