"""Hits a researcher can take back into a reference manager: a query result written as CSV, BibTeX, RIS or
CSL-JSON (Zotero's native import) from each hit's metadata and abstract. `esqbe query --format` and `POST /query`
with `"format"` use it.

It takes the result's one JSON shape (`esqbe.query.results`), so the CLI and the server export the same thing;
a hit's abstract is its `sentences` (the caller asks for the papers). Every export round-trips through esqbe's own
readers (tests/test_export_roundtrip.py): the paper's id (the citation key it came with), title, abstract, authors,
year, venue, DOI, and its entry type, kept as the source named it where the export is the source's format
(`@inproceedings` stays one, with `booktitle`; RIS `CONF` stays `CONF`) and mapped through CSL's types otherwise.
BibTeX titles keep their capitals (`{ASR}`).

Text is carried exactly (tests/test_export_exact.py): what a reader gets back is the text,
LaTeX-like or not (`22 $\\mu$m`, `{a, b}`, a backslash), as `esqbe.ingest.library.carried` makes it (control
characters and whitespace runs one space); BibTeX escapes TeX's specials as bibtexparser's LatexEncodingMiddleware
does (`esqbe.ingest.library.bib_escape`), and esqbe's BibTeX reader decodes exactly that. The arXiv and PubMed ids
travel too: BibTeX `eprint`/`pmid`, RIS `AN  - arXiv:...`/`AN  - PMID:...`, CSL-JSON `custom.arxiv`/`PMID`.

esqbe's rank and scores are written only when asked (`with_scores`): a reference manager would keep them as notes.
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

from ..core.textsafe import csv_cell, one_line
from ..errors import ParameterError
from ..ingest.library import RIS_LIST_TAGS, bib_escape, carried

#: the export formats, each with its media type and file extension
EXPORT_FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "bibtex": ("application/x-bibtex; charset=utf-8", "bib"),
    "ris": ("application/x-research-info-systems; charset=utf-8", "ris"),
    "csl-json": ("application/vnd.citationstyles.csl+json; charset=utf-8", "json"),
}

#: CSV's columns; `SCORE_COLUMNS` come first with `with_scores`
CSV_COLUMNS = ("paper_id", "type", "title", "abstract", "authors", "year", "venue", "publisher", "doi", "arxiv",
               "pubmed", "url", "volume", "pages")
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
    t = entry_type.strip()
    found = {"bibtex": _BIB_TO_CSL.get(t.lower()), "ris": _RIS_TO_CSL.get(t.upper()),
             "csl-json": t if t in CSL_TYPES else None, "zotero": _ZOTERO_TO_CSL.get(t)}.get(source_format)
    if found:
        return found
    if source_format == "arxiv" and not venue:
        return "article"  # CSL's preprint
    return "article-journal" if venue else "document"


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
    return {**a, **{k: _text(a[k]) for k in ("name", "family", "given") if k in a}}


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
    }
    return out


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
               "score": _score(h["score"]), "similarity": _score(h["similarity"])}
        writer.writerow([csv_cell(row[c]) for c in columns])  # one line, no formula (esqbe.core.textsafe)
    return out.getvalue()


# ---------------------------------------------------------------- names


def _family_given(author: dict) -> tuple[str, str] | None:
    """(family, given) of a person, from the split the source gave, else `Ashish Vaswani` split at its last space;
    None for a name that is not a person's (`literal`: an organisation) or of one word."""
    name = str(author["name"]).strip()
    if author.get("literal"):
        return None
    if author.get("family"):
        return str(author["family"]).strip(), str(author.get("given") or "").strip()
    if "," in name:
        family, _, given = name.partition(",")
        return family.strip(), given.strip()
    if " " not in name:
        return None
    given, _, family = name.rpartition(" ")
    return family, given


def _last_first(author: dict) -> str:
    """An author as `Family, Given`; a name not a person's (`Google AI Language`) or of one word as it is."""
    split = _family_given(author)
    if split is None:
        return str(author["name"]).strip()
    family, given = split
    return f"{family}, {given}" if given else family


# ---------------------------------------------------------------- BibTeX


def _bib_author(author: dict) -> str:
    """One BibTeX author: `Family, Given`, or an organisation braced whole (`{Google AI Language}`) so that no
    BibTeX reader splits it into a first and a last name. Inside a person's name each ` and ` is braced (`Johnson
    {and} Johnson`: one author, not two) and so is each comma (`{,}`: the first bare comma is BibTeX's own, between
    family and given); a family name of several words with no given name keeps its comma (`de Souza,`)."""
    if author.get("literal") or _family_given(author) is None:
        value = bib_escape(str(author["name"]))
        return f"{{{value}}}" if author.get("literal") else _bib_name_part(value)
    family, given = _family_given(author) or ("", "")
    family, given = _bib_name_part(bib_escape(family)), _bib_name_part(bib_escape(given))
    return f"{family}, {given}" if given else f"{family}," if " " in family else family


_NAME_SEPARATOR = re.compile(r"(?<=\s)(and|others)(?=\s|$)|^(others)$|,", re.IGNORECASE)


def _bib_name_part(escaped: str) -> str:
    """Part of a name as BibTeX must see it: ` and ` (any case), a lone `others` and a comma braced."""
    return _NAME_SEPARATOR.sub(lambda m: "{" + m.group() + "}", escaped)


#: a word with a capital after its first letter (ASR, BERT, iPhone, LaTeX, 3D): styles that lower-case titles
#: must leave it be, so it is braced
_WORD = re.compile(r"[^\W_]+")


def bib_value(text: str) -> str:
    """A field value safe inside `{...}` (`bib_escape`): what a BibTeX reader (esqbe's, bibtexparser with pylatexenc)
    decodes back to `text` as every export carries it (`esqbe.ingest.library.carried`)."""
    return bib_escape(text)


def _bib_title(text: str) -> str:
    """A title for BibTeX: safe as any value, and each word with a capital inside braced (`{ASR}`, `{BERT}-based`)."""
    def brace(m: re.Match) -> str:
        word = m.group()
        return f"{{{word}}}" if any(c.isupper() for c in word[1:]) else word

    return _WORD.sub(brace, bib_value(text))  # escapes are `\%` or `{\textmacro}`: no capital to brace


#: what a BibTeX key may not hold (whitespace, the entry's own delimiters, LaTeX's specials)
_BAD_KEY = re.compile(r"[\s,{}()=\"'#%~\\]")


def _bib_key(paper_id: str, seen: set[str]) -> str:
    """The paper's id as its citation key (the key it came with stays it); an id BibTeX cannot hold made into one."""
    key = _BAD_KEY.sub("_", one_line(paper_id)) or "hit"
    base, n = key, 2
    while key in seen:
        key, n = f"{base}_{n}", n + 1
    seen.add(key)
    return key


def _bibtex(hits: list[dict], with_scores: bool) -> str:
    entries: list[str] = []
    seen: set[str] = set()
    for h in hits:
        kind = _entry_type(h, "bibtex")
        venue_field = "journal" if kind == "article" else "booktitle" if kind in _IN_A_BOOK or h["venue"] else ""
        fields = [("year", h["year"]), (venue_field, h["venue"]), ("volume", h["volume"]), ("pages", h["pages"]),
                  ("publisher", h["publisher"]), ("doi", h["doi"])]
        if h["arxiv"]:
            fields += [("eprint", h["arxiv"]), ("archiveprefix", "arXiv")]
        fields.append(("pmid", h["pubmed"]))  # as Zotero's and Better BibTeX's exports name it
        fields += [("url", h["url"]), ("keywords", ", ".join(h["keywords"])), ("abstract", h["abstract"])]
        if with_scores:
            fields.append(("note", f"esqbe rank {h['rank']}, score {_score(h['score'])}, similarity "
                                   f"{_score(h['similarity']) or '-'}"))
        lines = [f"  {name} = {{{bib_value(value)}}}" for name, value in fields if value and name]
        head = [f"  title = {{{_bib_title(h['title'])}}}"] if h["title"] else []
        if h["authors"]:  # each name made safe on its own: an organisation's braces must stay
            head.append(f"  author = {{{' and '.join(_bib_author(a) for a in h['authors'])}}}")
        body = ",\n".join(head + lines)
        entries.append(f"@{kind}{{{_bib_key(h['paper_id'], seen)},\n{body}\n}}\n")
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
            record["authors"] = [_last_first(a) for a in h["authors"]]
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
        if with_scores:
            record["notes"] = [f"esqbe rank {h['rank']}, score {_score(h['score'])}, "
                               f"similarity {_score(h['similarity']) or '-'}"]
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
        for a in h["authors"]:
            split = _family_given(a)
            authors.append({"literal": str(a["name"])} if split is None else
                           {"family": split[0], **({"given": split[1]} if split[1] else {})})
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
        if h["arxiv"] or with_scores:  # CSL's place for data without a variable of its own (not `note`)
            item["custom"] = {**({"arxiv": h["arxiv"]} if h["arxiv"] else {}),
                              **({"esqbe_rank": h["rank"], "esqbe_score": h["score"], "esqbe_similarity": h["similarity"]}
                                 if with_scores else {})}
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
