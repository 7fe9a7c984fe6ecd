"""Hits a researcher can take back into a reference manager: a query result written as CSV, BibTeX, RIS or
CSL-JSON (Zotero's native import) from each hit's metadata and abstract. `esqbe query --format` and `POST /query`
with `"format"` use it.

It takes the result's one JSON shape (`esqbe.query.results`), so the CLI and the server export the same thing;
a hit's abstract is its `sentences` (the caller asks for the papers). Every export round-trips through esqbe's own
readers (tests/test_export_roundtrip.py): the paper's id (the citation key it came with), title, abstract, authors,
year, venue, DOI, and its entry type, kept as the source named it where the export is the source's format
(`@inproceedings` stays one, with `booktitle`; RIS `CONF` stays `CONF`) and mapped through CSL's types otherwise.
A paper read from BibTeX goes back to BibTeX as written (tests/test_bibtex_as_written.py): its entry type, citation
key and every field it held (`esqbe.ingest.library.AS_WRITTEN`: LaTeX, braces, ties, `--`, math, `@string`s
resolved), byte for byte but for runs of white space; a field merged in from another record is added where the entry
has none. Any other paper's BibTeX is written from its text so that it decodes back to it
(`esqbe.ingest.latex.bib_escape`): TeX's specials escaped, inline math (`$\\mu$`) kept as math, Unicode as UTF-8,
titles' capitals braced (`{ASR}`).

Text is carried exactly (tests/test_export_exact.py): what a reader gets back is the text, LaTeX-like or not (`22
$\\mu$m`, `{a, b}`, a backslash), as `esqbe.ingest.latex.carried` makes it (control characters and whitespace runs
one space). Names keep their parts (`esqbe.core.names`, tests/test_name_parts.py): CSL-JSON every part under its own
key, BibTeX `von Last, Jr, First`, RIS `Family, Given, Suffix`. The arXiv and PubMed ids travel too: BibTeX
`eprint`/`pmid`, RIS `AN  - arXiv:...`/`AN  - PMID:...`, CSL-JSON `custom.arxiv`/`PMID`.

esqbe's rank and scores are written only when asked (`with_scores`): a reference manager would keep them as notes
(BibTeX: `note`, or `annote` where the entry holds a `note` of its own).
BibTeX is written by hand (a field per line, braces balanced), RIS by rispy (without its `1.` record numbers, which
no RIS reader takes), CSL-JSON as the citation-style-language schema says (tests/specs/csl-data.json). Whatever a
paper's metadata holds, every exported value is one line and no CSV cell is a formula (`esqbe.core.textsafe`:
tests/test_hostile_export.py).
"""
from __future__ import annotations

import csv
import io
import json
import re

from ..core.names import FLAGS, PARTS, is_particle, parts_of
from ..core.textsafe import csv_cell, one_line
from ..errors import ParameterError
from ..ingest.latex import bib_escape, carried, entry_type_ok, strip_enclosing, writable
from ..ingest.library import AS_WRITTEN, RIS_LIST_TAGS

#: the export formats, each with its media type and file extension
EXPORT_FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "bibtex": ("application/x-bibtex; charset=utf-8", "bib"),
    "ris": ("application/x-research-info-systems; charset=utf-8", "ris"),
    "csl-json": ("application/vnd.citationstyles.csl+json; charset=utf-8", "json"),
}

#: CSV's columns; `SCORE_COLUMNS` come first with `with_scores`
CSV_COLUMNS = ("paper_id", "type", "title", "abstract", "authors", "year", "venue", "publisher", "doi", "arxiv",
               "pubmed", "url", "volume", "pages", "likely_version_of")
SCORE_COLUMNS = ("rank", "score", "similarity")

# ---------------------------------------------------------------- entry types: each format's, through CSL's

#: the item types of CSL 1.0.2 (tests/specs/csl-data.json)
CSL_TYPES = frozenset((
    "article", "article-journal", "article-magazine", "article-newspaper", "bill", "book", "broadcast", "chapter",
    "classic", "collection", "dataset", "document", "entry", "entry-dictionary", "entry-encyclopedia", "event",
    "figure", "graphic", "hearing", "interview", "legal_case", "legislation", "manuscript", "map", "motion_picture",
    "musical_score", "pamphlet", "paper-conference", "patent", "performance", "periodical", "personal_communication",
    "post", "post-weblog", "regulation", "report", "review", "review-book", "software", "song", "speech", "standard",
    "thesis", "treaty", "webpage"))
_BIB_TO_CSL = {
    "article": "article-journal", "inproceedings": "paper-conference", "conference": "paper-conference",
    "proceedings": "book", "book": "book", "inbook": "chapter", "incollection": "chapter", "phdthesis": "thesis",
    "mastersthesis": "thesis", "thesis": "thesis", "techreport": "report", "report": "report",
    "unpublished": "manuscript", "online": "webpage", "electronic": "webpage", "www": "webpage", "misc": "document",
    "manual": "document", "booklet": "pamphlet", "dataset": "dataset", "software": "software", "patent": "patent"}
_CSL_TO_BIB = {
    "article-journal": "article", "article-magazine": "article", "article-newspaper": "article",
    "paper-conference": "inproceedings", "book": "book", "chapter": "incollection", "thesis": "phdthesis",
    "report": "techreport", "manuscript": "unpublished", "pamphlet": "booklet"}
_RIS_TO_CSL = {
    "JOUR": "article-journal", "JFULL": "article-journal", "EJOUR": "article-journal", "ABST": "article-journal",
    "CONF": "paper-conference", "CPAPER": "paper-conference", "BOOK": "book", "EBOOK": "book", "EDBOOK": "book",
    "CHAP": "chapter", "ECHAP": "chapter", "THES": "thesis", "RPRT": "report", "GEN": "document", "ELEC": "webpage",
    "BLOG": "post-weblog", "UNPB": "manuscript", "UNPD": "manuscript", "MANSCPT": "manuscript",
    "MGZN": "article-magazine", "NEWS": "article-newspaper", "DATA": "dataset", "COMP": "software", "PAT": "patent",
    "PAMP": "pamphlet"}
_CSL_TO_RIS = {
    "article-journal": "JOUR", "paper-conference": "CONF", "book": "BOOK", "chapter": "CHAP", "thesis": "THES",
    "report": "RPRT", "document": "GEN", "webpage": "ELEC", "post-weblog": "BLOG", "manuscript": "UNPB",
    "article-magazine": "MGZN", "article-newspaper": "NEWS", "dataset": "DATA", "software": "COMP", "patent": "PAT",
    "pamphlet": "PAMP"}
#: Zotero's item types (its database: `esqbe.ingest.zotero`) as Zotero's own CSL export names them
_ZOTERO_TO_CSL = {
    "journalArticle": "article-journal", "conferencePaper": "paper-conference", "book": "book",
    "bookSection": "chapter", "thesis": "thesis", "report": "report", "preprint": "article",
    "manuscript": "manuscript", "webpage": "webpage", "blogPost": "post-weblog", "magazineArticle": "article-magazine",
    "newspaperArticle": "article-newspaper", "dataset": "dataset", "computerProgram": "software", "patent": "patent",
    "presentation": "speech", "encyclopediaArticle": "entry-encyclopedia", "dictionaryEntry": "entry-dictionary",
    "document": "document", "standard": "standard"}
_BIB_TYPE = re.compile(r"[a-z]{2,32}")
_RIS_TYPE = re.compile(r"[A-Z]{2,8}")
#: BibTeX entry types whose venue is the book or proceedings they are in (`booktitle`), not a `journal`
_IN_A_BOOK = frozenset({"inproceedings", "conference", "incollection", "inbook"})


def csl_type(source_format: str, entry_type: str, venue: str) -> str:
    """A paper's CSL item type from the type its source named (BibTeX, RIS, CSL or Zotero vocabulary), else a journal
    article when it names a venue, a document when not."""
    found = vocabulary_type(source_format, entry_type)
    if found:
        return found
    if source_format == "arxiv" and not venue:
        return "article"  # CSL's preprint
    return "article-journal" if venue else "document"


def vocabulary_type(source_format: str, entry_type: str) -> str | None:
    """The CSL item type an entry type names in its format's vocabulary (BibTeX `article`, RIS `JOUR`, CSL
    `article-journal`, Zotero `journalArticle`: all `article-journal`), None where the vocabulary has no such type."""
    t = entry_type.strip()
    return {"bibtex": _BIB_TO_CSL.get(t.lower()), "ris": _RIS_TO_CSL.get(t.upper()),
            "csl-json": t if t in CSL_TYPES else None, "zotero": _ZOTERO_TO_CSL.get(t)}.get(source_format)


def _entry_type(h: dict, fmt: str) -> str:
    """The entry type in `fmt`'s vocabulary: the source's own where it is `fmt`, else through CSL's."""
    src, own = h["format"], h["entry_type"].strip()
    if fmt == "bibtex":
        if src == "bibtex" and _BIB_TYPE.fullmatch(own.lower()):
            return own.lower()
        return _CSL_TO_BIB.get(h["type"], "misc")
    if src == "ris" and _RIS_TYPE.fullmatch(own.upper()):
        return own.upper()
    return _CSL_TO_RIS.get(h["type"], "GEN")


# ---------------------------------------------------------------- the fields of a hit


def export_hits(result: dict, fmt: str, *, with_scores: bool = False) -> str:
    """The hits of `result` (a query result's JSON) as text in `fmt` (a key of EXPORT_FORMATS); each hit's abstract
    from its `sentences` (None: none written); rank, score and similarity only `with_scores`."""
    if fmt not in EXPORT_FORMATS:
        raise ParameterError(f"unknown export format {fmt!r}; valid formats: {', '.join(EXPORT_FORMATS)}")
    hits = [_fields(h) for h in result.get("hits") or []]
    return {"csv": _csv, "bibtex": _bibtex, "ris": _ris, "csl-json": _csl}[fmt](hits, with_scores)


def media_type(fmt: str) -> str:
    return EXPORT_FORMATS[fmt][0]


def file_name(fmt: str, stem: str = "esqbe-hits") -> str:
    return f"{stem}.{EXPORT_FORMATS[fmt][1]}"


def _text(value) -> str:
    """A metadata value as every format carries text (`carried`: one line, whitespace runs one space)."""
    return "" if value is None or isinstance(value, (dict, list)) else carried(value)


def _author(a) -> dict:
    a = a if isinstance(a, dict) else {"name": a}
    return {**a, **{k: _text(a[k]) for k in ("name", *PARTS) if k in a}}


def _fields(hit: dict) -> dict:
    """What every export uses of one hit."""
    meta = hit.get("metadata") or {}
    ids: dict = meta["external_ids"] if isinstance(meta.get("external_ids"), dict) else {}
    authors = [_author(a) for a in meta.get("authors") or [] if isinstance(a, (dict, str))]
    sentences = hit.get("sentences") or []
    abstract = _text(" ".join(str(s.get("text") if isinstance(s, dict) else s) for s in sentences if s is not None))
    venue = _text(meta.get("venue") or meta.get("journal"))
    keywords = meta.get("keywords")
    source_format, entry_type = _text(meta.get("format")), _text(meta.get("entry_type"))
    out: dict = {
        "rank": hit.get("rank"), "paper_id": str(hit.get("paper_id", "")), "title": _text(hit.get("title")),
        "score": hit.get("score"), "similarity": hit.get("similarity"),
        "year": _text(meta.get("year")), "date": _text(meta.get("publication_date")),
        "venue": venue, "abstract": abstract,
        "authors": [a for a in authors if a.get("name")],
        "doi": _text(ids.get("doi")), "arxiv": _text(ids.get("arxiv")), "pubmed": _text(ids.get("pubmed")),
        "url": _text(meta.get("url") or meta.get("open_access_url") or meta.get("s2_url")),
        "publisher": _text(meta.get("publisher")), "volume": _text(meta.get("volume")),
        "pages": _text(meta.get("pages")),
        "keywords": [str(k) for k in keywords if isinstance(k, (str, int))] if isinstance(keywords, list) else [],
        "format": source_format, "entry_type": entry_type, "type": csl_type(source_format, entry_type, venue),
        # a likely version of another paper (esqbe.query.versions): said in every export, scores or not
        "likely_version_of": _text(hit.get("likely_version_of")),
        "as_written": _as_written(meta.get(AS_WRITTEN)),
    }
    return out


def _notes(h: dict, with_scores: bool) -> list[str]:
    """An entry's esqbe notes: its rank and scores (`with_scores`), and the paper it likely is a version of."""
    out = [f"esqbe rank {h['rank'] if h['rank'] is not None else '-'}, score {_score(h['score'])}, similarity "
           f"{_score(h['similarity']) or '-'}"] if with_scores else []
    if h["likely_version_of"]:
        out.append(f"esqbe: likely a version of {h['likely_version_of']} (nearly the same sentences)")
    return out


def _as_written(kept) -> dict | None:
    """A BibTeX entry kept as written (esqbe.ingest.library.AS_WRITTEN), where the metadata holds one of its shape."""
    if not isinstance(kept, dict) or not isinstance(kept.get("fields"), dict) or not kept["fields"]:
        return None
    return {"type": kept.get("type"), "key": kept.get("key"),
            "fields": {k: v for k, v in kept["fields"].items() if isinstance(k, str) and isinstance(v, str)}}


def _score(x) -> str:
    return "" if x is None else f"{x:.6g}"


# ---------------------------------------------------------------- CSV


def _csv(hits: list[dict], with_scores: bool) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_ALL)  # RFC 4180; every cell quoted (OWASP)
    columns = (*SCORE_COLUMNS, *CSV_COLUMNS) if with_scores else CSV_COLUMNS
    writer.writerow(columns)
    for h in hits:
        row = {**h, "authors": "; ".join(str(a["name"]) for a in h["authors"]),
               "score": _score(h["score"]), "similarity": _score(h["similarity"]),
               "rank": "" if h["rank"] is None else h["rank"]}  # (a likely version has none)
        writer.writerow([csv_cell(row[c]) for c in columns])  # one line, no formula (esqbe.core.textsafe)
    return out.getvalue()


# ---------------------------------------------------------------- names


def _parts(author: dict) -> dict | None:
    """A person's name parts (esqbe.core.names: those the source gave, else told from the name by BibTeX's rules);
    None for a name that is not a person's (`literal`: an organisation) or of one word given without parts: each is
    written whole."""
    if author.get("literal"):
        return None
    if not any(author.get(k) for k in PARTS) and " " not in str(author["name"]).strip():
        return None
    parts = parts_of(author)
    return parts if parts and parts.get("family") else None


def _joined(*words) -> str:
    return " ".join(w for w in (str(x or "").strip() for x in words) if w)


def _ris_name(author: dict) -> str:
    """An author as RIS writes one, `Family, Given, Suffix`: the non-dropping particle before the family name, the
    dropping one after the given name (`de Vries, Johan`; `La Fontaine, Jean de`), as esqbe's RIS reader tells them
    apart again; a family name alone keeps its comma (`Plato,`); a name that is not a person's as it is."""
    parts = _parts(author)
    if parts is None:
        return str(author["name"]).strip()
    family = _joined(parts.get("non-dropping-particle"), parts.get("family"))
    given, suffix = _joined(parts.get("given"), parts.get("dropping-particle")), _joined(parts.get("suffix"))
    return f"{family}, {given}, {suffix}" if suffix else f"{family}, {given}" if given else f"{family},"


# ---------------------------------------------------------------- BibTeX


def _bib_author(author: dict) -> str:
    """One BibTeX author in BibTeX's parts, `von Last, Jr, First` (`de Vries, Johan`, `King, Jr., Martin`), the
    dropping particle after the given name (`La Fontaine, Jean de`), a particle that is not in lower case part of the
    family name (BibTeX would not take it for one); or an organisation braced whole (`{Google AI Language}`) so that
    no BibTeX reader splits it into a first and a last name. Inside a part each ` and ` is braced (`Johnson {and}
    Johnson`: one author, not two) and so is each comma (`{,}`: the bare commas are BibTeX's own); an empty First
    after a family name of several words or a suffix keeps its comma (`Brinch Hansen,`)."""
    parts = _parts(author)
    if parts is None:
        value = bib_escape(str(author["name"]))
        if not author.get("literal"):
            return _bib_name_part(value)
        # braced whole; an empty group first where it would begin `{\`, which a reader takes for one accented letter
        return f"{{{'{}' if value.startswith(chr(92)) else ''}{value}}}"
    von, last = (_joined(parts.get(k)) for k in ("non-dropping-particle", "family"))
    if von and not is_particle(von.split()[-1]):
        von, last = "", _joined(von, last)
    given, suffix = _joined(parts.get("given"), parts.get("dropping-particle")), _joined(parts.get("suffix"))
    von, last, given, suffix = (_bib_name_part(bib_escape(p)) for p in (von, last, given, suffix))
    head = _joined(von, last)
    if suffix:
        return f"{head}, {suffix}, {given}".rstrip()
    return f"{head}, {given}" if given else f"{head}," if " " in head else head


_NAME_SEPARATOR = re.compile(r"(?<=\s)(and|others)(?=\s|$)|^(others)$|,", re.IGNORECASE)


def _bib_name_part(escaped: str) -> str:
    """Part of a name as BibTeX must see it: ` and ` (any case) and a comma braced, a lone `others` given a brace
    that does not hold it whole (`{O}thers`: braced whole, a name is an organisation's)."""
    return _NAME_SEPARATOR.sub(lambda m: "{" + m.group()[0] + "}" + m.group()[1:] if m.group(2) else
                               "{" + m.group() + "}", escaped)


def bib_value(text: str) -> str:
    """A field value safe inside `{...}` (`bib_escape`): what a BibTeX reader (esqbe's, bibtexparser with pylatexenc)
    decodes back to `text` as every export carries it (`esqbe.ingest.latex.carried`), math kept as math."""
    return bib_escape(text)


def _bib_title(text: str) -> str:
    """A title for BibTeX: safe as any value, and each word with a capital inside braced (`{ASR}`, `{BERT}-based`)."""
    return bib_escape(text, protect_capitals=True)


#: what a BibTeX key may not hold (whitespace, the entry's own delimiters, LaTeX's specials)
_BAD_KEY = re.compile(r"[\s,{}()=\"'#%~\\]")
#: what a citation key kept as written may not hold: what would end the key or the entry, or start a comment
_BAD_KEY_AS_WRITTEN = re.compile(r"[\s,{}()%\\\"]")


def _bib_key(paper_id: str, seen: set[str], bad: re.Pattern = _BAD_KEY) -> str:
    """The paper's id as its citation key (the key it came with stays it); an id BibTeX cannot hold made into one, an
    id already written in this file given a number (`key_2`)."""
    key = bad.sub("_", one_line(paper_id)) or "hit"
    base, n = key, 2
    while key in seen:
        key, n = f"{base}_{n}", n + 1
    seen.add(key)
    return key


#: the fields of a BibTeX entry that carry each field esqbe writes: an entry kept as written (AS_WRITTEN) gets the
#: field esqbe knows (merged in from another record, an abstract from its PDF) only where it has none of these
_CARRIED_BY = {"title": ("title",), "author": ("author",), "year": ("year", "date"),
               "journal": ("journal", "booktitle", "journaltitle"), "booktitle": ("journal", "booktitle", "journaltitle"),
               "volume": ("volume",), "pages": ("pages",), "publisher": ("publisher",), "doi": ("doi",),
               "eprint": ("eprint",), "archiveprefix": ("archiveprefix", "eprinttype"), "pmid": ("pmid",),
               "url": ("url",), "keywords": ("keywords",), "abstract": ("abstract",)}


def _kept_field(name: str, value: str) -> str:
    """One field of an entry kept as written: as it is where it can be (`esqbe.ingest.latex.writable`), else (metadata
    not read from a BibTeX file) its value as text, escaped, under its name made one BibTeX takes."""
    if writable(name, value):
        return f"  {name} = {value}"
    return f"  {_BAD_KEY.sub('_', one_line(name)) or 'field'} = {{{bib_value(strip_enclosing(value))}}}"


def _bibtex(hits: list[dict], with_scores: bool) -> str:
    entries: list[str] = []
    seen: set[str] = set()
    for h in hits:
        kind = _entry_type(h, "bibtex")
        venue_field = "journal" if kind == "article" else "booktitle" if kind in _IN_A_BOOK or h["venue"] else ""
        fields = [("title", _bib_title(h["title"]) if h["title"] else ""),
                  # each name made safe on its own: an organisation's braces must stay
                  ("author", " and ".join(_bib_author(a) for a in h["authors"]))]
        fields += [(name, bib_value(value)) for name, value in (
            ("year", h["year"]), (venue_field, h["venue"]), ("volume", h["volume"]), ("pages", h["pages"]),
            ("publisher", h["publisher"]), ("doi", h["doi"]),
            *((("eprint", h["arxiv"]), ("archiveprefix", "arXiv")) if h["arxiv"] else ()),
            ("pmid", h["pubmed"]),  # as Zotero's and Better BibTeX's exports name it
            ("url", h["url"]), ("keywords", ", ".join(h["keywords"])), ("abstract", h["abstract"]))]
        lines: list[str] = []
        key = _bib_key(h["paper_id"], seen) if h["as_written"] is None else None
        kept = h["as_written"]
        if kept is not None:  # the entry as the researcher wrote it, then what esqbe knows that it does not hold
            kind = kept["type"] if entry_type_ok(kept["type"]) else kind
            key = _bib_key(kept["key"], seen, _BAD_KEY_AS_WRITTEN) if isinstance(kept["key"], str) and \
                kept["key"].strip() else _bib_key(h["paper_id"], seen)
            lines = [_kept_field(name, value) for name, value in kept["fields"].items()]
            held = {name.lower() for name in kept["fields"]}
            fields = [(name, value) for name, value in fields if not held & set(_CARRIED_BY.get(name, (name,)))]
        lines += [f"  {name} = {{{value}}}" for name, value in fields if value and name]
        notes = _notes(h, with_scores)
        if notes:  # in a field of its own: a `note` the entry holds is kept as it is
            held = {line.split("=", 1)[0].strip().lower() for line in lines}
            note = next(n for n in ("note", "annote", "esqbe") if n not in held)
            lines.append(f"  {note} = {{{bib_value('; '.join(notes))}}}")
        entries.append(f"@{kind}{{{key},\n" + ",\n".join(lines) + "\n}\n")
    return "\n".join(entries)


# ---------------------------------------------------------------- RIS


def _ris_writer():
    """rispy's writer (`RIS_LIST_TAGS`: `AN` may repeat, one identifier each)."""
    from rispy.writer import RisWriter

    class _Writer(RisWriter):
        def set_header(self, count):  # rispy's `1.` before each record: no RIS reader (esqbe's either) takes it
            return None

    return _Writer


def _ris(hits: list[dict], with_scores: bool) -> str:
    import rispy

    records = []
    for h in hits:
        record: dict = {"type_of_reference": _entry_type(h, "ris"), "id": h["paper_id"], "title": h["title"]}
        if h["authors"]:
            record["authors"] = [_ris_name(a) for a in h["authors"]]
        first, _, last = h["pages"].replace("\u2013", "-").partition("-")  # 101--105, decoded as 101–105
        for key, value in (("year", h["year"]), ("secondary_title", h["venue"]), ("volume", h["volume"]),
                           ("start_page", first.strip()), ("end_page", last.strip("- ")),
                           ("publisher", h["publisher"]), ("doi", h["doi"]), ("abstract", h["abstract"])):
            if value:
                record[key] = value
        if h["url"]:
            record["urls"] = [h["url"]]
        accession = [f"{prefix}{h[k]}" for k, prefix in (("arxiv", "arXiv:"), ("pubmed", "PMID:")) if h[k]]
        if accession:  # RIS has no tag of its own for either: `AN` (accession number), one per identifier
            record["accession_number"] = accession
        if h["keywords"]:
            record["keywords"] = h["keywords"]
        if _notes(h, with_scores):
            record["notes"] = _notes(h, with_scores)
        records.append(record)
    return rispy.dumps([_one_line_values(r) for r in records], implementation=_ris_writer(),
                       list_tags=RIS_LIST_TAGS) if records else ""


def _one_line_values(record: dict) -> dict:
    """An RIS record whose every value is one line: a line break in a value would start a forged tag or record."""
    return {k: [one_line(x) for x in v] if isinstance(v, list) else one_line(v) for k, v in record.items()}


# ---------------------------------------------------------------- CSL-JSON


def _date_parts(h: dict) -> list[int] | None:
    """[year, month, day] as far as the paper's date (or year) goes."""
    parts = [p for p in re.split(r"[-/]", h["date"]) if p.isdigit()][:3] if h["date"] else []
    if not parts and h["year"].strip().lstrip("-").isdigit():
        parts = [h["year"].strip()]
    return [int(p) for p in parts] or None


def _csl(hits: list[dict], with_scores: bool) -> str:
    items = []
    for h in hits:
        item: dict = {"id": h["paper_id"], "type": h["type"], "citation-key": h["paper_id"], "title": h["title"]}
        authors = []
        for a in h["authors"]:  # each name's parts under CSL's keys, as read
            split = _parts(a)
            authors.append({"literal": str(a["name"])} if split is None else
                           {k: split[k] for k in (*PARTS, *FLAGS) if split.get(k)})
        if authors:
            item["author"] = authors
        parts = _date_parts(h)
        if parts:
            item["issued"] = {"date-parts": [parts]}
        for key, value in (("container-title", h["venue"]), ("volume", h["volume"]), ("page", h["pages"]),
                           ("publisher", h["publisher"]), ("DOI", h["doi"]), ("PMID", h["pubmed"]), ("URL", h["url"]),
                           ("keyword", ", ".join(h["keywords"])), ("abstract", h["abstract"])):
            if value:
                item[key] = value
        if h["arxiv"] or with_scores or h["likely_version_of"]:  # CSL's place for data without a variable of its own
            item["custom"] = {**({"arxiv": h["arxiv"]} if h["arxiv"] else {}),
                              **({"esqbe_rank": h["rank"], "esqbe_score": h["score"], "esqbe_similarity": h["similarity"]}
                                 if with_scores else {}),
                              **({"esqbe_likely_version_of": h["likely_version_of"]} if h["likely_version_of"] else {})}
        items.append(_one_line_tree(item))
    return json.dumps(items, ensure_ascii=False, indent=2) + "\n"


def _one_line_tree(value):
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, dict):
        return {k: _one_line_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_one_line_tree(v) for v in value]
    return value
