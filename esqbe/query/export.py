"""Hits a researcher can act on: a query result written as CSV, BibTeX or RIS from each hit's metadata
(authors, year, venue, DOI, arXiv id, URL). `esqbe query --format` and `POST /query` with `"format"` use it.

It takes the result's one JSON shape (`esqbe.query.result_json`), so the CLI and the server export the
same thing. BibTeX is written by hand (a field per line, braces balanced, LaTeX specials escaped) and RIS
by rispy; both parse back with bibtexparser / rispy (tests/test_export.py). Whatever a paper's metadata holds,
every exported value is one line and no CSV cell is a formula (`esqbe.core.textsafe`: tests/test_export_hostile.py).
"""
from __future__ import annotations

import csv
import io
import re

from ..core.textsafe import csv_cell, one_line
from ..errors import ParameterError

#: the export formats, each with its media type and file extension
EXPORT_FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "bibtex": ("application/x-bibtex; charset=utf-8", "bib"),
    "ris": ("application/x-research-info-systems; charset=utf-8", "ris"),
}

CSV_COLUMNS = ("rank", "paper_id", "title", "score", "similarity", "year", "venue", "authors", "doi", "arxiv", "url")


def export_hits(result: dict, fmt: str) -> str:
    """The hits of `result` (a query result's JSON) as text in `fmt` (a key of EXPORT_FORMATS)."""
    if fmt not in EXPORT_FORMATS:
        raise ParameterError(f"unknown export format {fmt!r}; valid formats: {', '.join(EXPORT_FORMATS)}")
    hits = [_fields(h) for h in result.get("hits") or []]
    return {"csv": _csv, "bibtex": _bibtex, "ris": _ris}[fmt](hits)


def media_type(fmt: str) -> str:
    return EXPORT_FORMATS[fmt][0]


def file_name(fmt: str, stem: str = "esqbe-hits") -> str:
    return f"{stem}.{EXPORT_FORMATS[fmt][1]}"


def _fields(hit: dict) -> dict:
    """What every export uses of one hit."""
    meta = hit.get("metadata") or {}
    ids: dict = meta["external_ids"] if isinstance(meta.get("external_ids"), dict) else {}
    authors = [a if isinstance(a, dict) else {"name": a} for a in meta.get("authors") or [] if isinstance(a, (dict, str))]
    year = meta.get("year")
    return {
        "rank": hit.get("rank"), "paper_id": str(hit.get("paper_id", "")), "title": hit.get("title") or "",
        "score": hit.get("score"), "similarity": hit.get("similarity"),
        "year": str(year) if year is not None else "",
        "venue": str(meta.get("venue") or meta.get("journal") or ""),
        "authors": [a for a in authors if a.get("name")],
        "doi": str(ids.get("doi") or ""), "arxiv": str(ids.get("arxiv") or ""),
        "url": str(meta.get("open_access_url") or meta.get("s2_url") or ""),
        "publisher": str(meta.get("publisher") or ""),
    }


def _csv(hits: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_ALL)  # RFC 4180; every cell quoted (OWASP)
    writer.writerow(CSV_COLUMNS)
    for h in hits:
        row = {**h, "authors": "; ".join(str(a["name"]) for a in h["authors"]),
               "score": "" if h["score"] is None else f"{h['score']:.6g}",
               "similarity": "" if h["similarity"] is None else f"{h['similarity']:.6g}"}
        writer.writerow([csv_cell(row[c]) for c in CSV_COLUMNS])  # one line, no formula (esqbe.core.textsafe)
    return out.getvalue()


def _last_first(author: dict) -> str:
    """An author as `Family, Given`: from the split the source gave (`family`, `given`), else `Ashish Vaswani` as
    `Vaswani, Ashish`; a name already with a comma, of one word, or not a person's (`literal`: an organisation,
    `Google AI Language`) as it is."""
    name = str(author["name"]).strip()
    if author.get("literal"):
        return name
    if author.get("family"):
        return f"{author['family']}, {author['given']}" if author.get("given") else str(author["family"])
    if "," in name or " " not in name:
        return name
    first, _, last = name.rpartition(" ")
    return f"{last}, {first}"


def _bib_author(author: dict) -> str:
    """One BibTeX author: `Family, Given`, or an organisation braced whole (`{Google AI Language}`) so that no
    BibTeX reader splits it into a first and a last name."""
    value = _bib_value(_last_first(author))
    return f"{{{value}}}" if author.get("literal") else value


_LATEX_SPECIALS = re.compile(r"([&%$#_])")


def _bib_value(text: str) -> str:
    """A field value safe inside `{...}`: braces cannot unbalance it, LaTeX specials are escaped."""
    text = " ".join(one_line(text).split()).replace("\\", "/").replace("{", "(").replace("}", ")")
    return _LATEX_SPECIALS.sub(r"\\\1", text)


def _bib_key(paper_id: str, seen: set[str]) -> str:
    key = re.sub(r"[^A-Za-z0-9_:.\-]", "_", paper_id) or "hit"
    if not key[0].isalpha():
        key = "p" + key
    base, n = key, 2
    while key in seen:
        key, n = f"{base}_{n}", n + 1
    seen.add(key)
    return key


def _bibtex(hits: list[dict]) -> str:
    entries: list[str] = []
    seen: set[str] = set()
    for h in hits:
        fields = [("title", h["title"]), ("year", h["year"]), ("journal", h["venue"]), ("publisher", h["publisher"]),
                  ("doi", h["doi"])]
        if h["arxiv"]:
            fields += [("eprint", h["arxiv"]), ("archiveprefix", "arXiv")]
        fields += [("url", h["url"]), ("note", f"esqbe rank {h['rank']}, paper id {h['paper_id']}")]
        lines = [f"  {name} = {{{_bib_value(value)}}}" for name, value in fields if value]
        if h["authors"]:  # each name made safe on its own: an organisation's braces must stay
            lines.insert(1 if h["title"] else 0, f"  author = {{{' and '.join(_bib_author(a) for a in h['authors'])}}}")
        body = ",\n".join(lines)
        kind = "article" if h["venue"] else "misc"
        entries.append(f"@{kind}{{{_bib_key(h['paper_id'], seen)},\n{body}\n}}\n")
    return "\n".join(entries)


def _ris(hits: list[dict]) -> str:
    import rispy

    records = []
    for h in hits:
        record: dict = {"type_of_reference": "JOUR" if h["venue"] else "GEN", "id": h["paper_id"], "title": h["title"]}
        if h["authors"]:
            record["authors"] = [_last_first(a) for a in h["authors"]]
        for key, value in (("year", h["year"]), ("secondary_title", h["venue"]), ("doi", h["doi"]),
                           ("publisher", h["publisher"])):
            if value:
                record[key] = value
        if h["url"]:
            record["urls"] = [h["url"]]
        record["notes"] = [f"esqbe rank {h['rank']}"]
        records.append(record)
    return rispy.dumps([_one_line_values(r) for r in records]) if records else ""


def _one_line_values(record: dict) -> dict:
    """An RIS record whose every value is one line: a line break in a value would start a forged tag or record."""
    return {k: [one_line(x) for x in v] if isinstance(v, list) else one_line(v) for k, v in record.items()}
