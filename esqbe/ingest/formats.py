"""The input formats: recognising a record's format, and one parser per format from a JSON record to a `Paper`
(S2ORC, S2AG abstracts and S2ORC full text, CSFCube, CSAbstruct, plain JSONL, the arXiv metadata snapshot,
OpenAlex works), with the metadata each carries.
A parser raises `_Invalid` (a bad field: reported as `file:line: field: reason`) or `_Skip` (no abstract)."""
from __future__ import annotations

import json
from typing import Any

from ..core.names import FLAGS, PARTS, person
from ..domain import FACET_LABELS, LIMITS, RAW_LABELS, Paper, id_problem, normalize_label
from .sentences import split_sentences

NO_ABSTRACT = "no abstract"


_RAW_LABELS = (*FACET_LABELS, *RAW_LABELS)  # raw_labels=True keeps `objective` apart


class _Invalid(Exception):
    """A record is malformed in `field`; turned into an InputError once the line is known."""

    def __init__(self, field: str, reason: str):
        super().__init__(field, reason)
        self.field = field
        self.reason = reason


class _Skip(Exception):
    """A well-formed record that cannot become a paper (e.g. no abstract): `reason` is what the run counts,
    `detail` (default: the reason) what the record's own line says (which PDF, at what path)."""

    def __init__(self, reason: str, detail: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or reason


def detect_format(record: dict) -> str:
    """Name the format of one record from its keys; ValueError naming the keys if none fits."""
    if not isinstance(record, dict):
        raise ValueError(f"cannot detect the input format: expected a JSON object, got {_type_name(record)}")
    keys = set(record)
    lower = {k.lower() for k in keys}
    if "corpusid" in lower:
        if "content" in lower:
            return "s2ag-s2orc"
        if "abstract" in lower:
            return "s2ag-abstracts"
        if "title" in lower:
            raise ValueError(
                "records look like the S2AG 'papers' dataset, which has no abstracts; "
                "read the S2AG 'abstracts' (or 's2orc') dataset instead"
            )
    elif "abstract_inverted_index" in keys or str(record.get("id", "")).startswith("https://openalex.org/"):
        return "openalex"
    elif "id" in keys and "categories" in keys and keys & {"versions", "authors_parsed", "submitter"}:
        return "arxiv"
    elif "sentences" in keys:
        return "csabstruct"
    elif "pred_labels" in keys:
        return "csfcube"
    elif "paper_id" in keys:
        return "csfcube" if isinstance(record.get("abstract"), list) else "s2orc"
    elif "id" in keys:
        return "jsonl"
    raise ValueError(
        f"cannot detect the input format from keys {sorted(keys)}; "
        f"pass a format explicitly (one of {', '.join(FORMATS)})"
    )


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _paper_id(record: dict, key: str) -> str:
    value = record.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _Invalid(key, "missing")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Invalid(key, f"expected a string or integer, got {_type_name(value)}")
    return _checked_id(str(value).strip(), key)


def _checked_id(paper_id: str, key: str) -> str:
    """An id as the record gave it, or the record refused under its own field name (`id`, `paper_id`, the BibTeX key):
    no control, bidirectional or invisible character (esqbe.domain.id_problem; paper_problem checks it again for
    every path that makes a Paper)."""
    problem = id_problem(paper_id)
    if problem:
        raise _Invalid(key, problem)
    return paper_id


def _title(record: dict, key: str = "title") -> str:
    value = record.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Invalid(key, f"expected a string, got {_type_name(value)}")
    return " ".join(value.split())


def _split_text_abstract(value, key: str) -> list[str]:
    """A string abstract split into sentences; null/missing/blank is a skip, other types are errors."""
    if value is None:
        raise _Skip(NO_ABSTRACT)
    if not isinstance(value, str):
        raise _Invalid(key, f"expected a string, got {_type_name(value)}")
    if len(value) > LIMITS["abstract_chars"]:  # before it is split: the splitter's time and memory grow with it
        raise _Invalid(key, f"{len(value)} characters; at most {LIMITS['abstract_chars']}")
    sentences = split_sentences(value)
    if not sentences:
        raise _Skip(NO_ABSTRACT)
    return sentences


def _sentence_list(value, key: str) -> list[str]:
    """An abstract given as sentences; an empty one among others is an error (its label would dangle)."""
    if value is None:
        raise _Skip(NO_ABSTRACT)
    if not isinstance(value, list):
        raise _Invalid(key, f"expected a list of sentences, got {_type_name(value)}")
    for i, sentence in enumerate(value):
        if not isinstance(sentence, str):
            raise _Invalid(key, f"sentence {i} is {_type_name(sentence)}, expected a string")
    sentences = [s.strip() for s in value]
    if not any(sentences):
        raise _Skip(NO_ABSTRACT)
    for i, sentence in enumerate(sentences):
        if not sentence:
            raise _Invalid(key, f"sentence {i} is empty")
    return sentences


def _labels(value, n_sentences: int, key: str, raw_labels: bool) -> list[str]:
    """Given labels, one per sentence, normalised; null/missing means unlabeled."""
    if value is None:
        return ["unlabeled"] * n_sentences
    if not isinstance(value, list):
        raise _Invalid(key, f"expected a list of labels, got {_type_name(value)}")
    if len(value) != n_sentences:
        raise _Invalid(key, f"{len(value)} labels for {n_sentences} sentences")
    labels = []
    for i, label in enumerate(value):
        try:
            labels.append(normalize_label(label, raw=raw_labels))
        except ValueError as e:
            raise _Invalid(key, f"label {i}: {e}") from None
    return labels


def _metadata(fmt: str, year=None, **fields) -> dict:
    """What is kept next to the paper, under esqbe's key names (see METADATA_KEYS); empty values
    (None, "", [], {}) are left out so that `exists` filters mean something."""
    meta: dict[str, Any] = {"format": fmt}
    if isinstance(year, int) and not isinstance(year, bool):
        meta["year"] = year
    for key, value in fields.items():
        value = _clean(value)
        if value is not None:
            meta[key] = value
    return meta


#: the metadata keys readers fill, where the S2ORC / Semantic Scholar records give them (docs/library.md, "Metadata")
METADATA_KEYS = (
    "format", "year", "publication_date", "venue", "journal", "authors", "fields_of_study", "external_ids",
    "url", "open_access_url", "open_access_status", "license", "s2_url", "publisher",
)
# `open_access_url` is kept only where the record says the paper is open (S2's `openAccessPdf` / open-access info,
# OpenAlex's `open_access.oa_url`, every arXiv paper); a reference manager's `url` is a plain `url`.


#: S2ORC / S2AG external id names -> esqbe's (`external_ids.doi`, ...)
_EXTERNAL_IDS = {
    "doi": "doi", "arxiv": "arxiv", "arxiv_id": "arxiv", "acl": "acl", "acl_id": "acl", "pubmed": "pubmed",
    "pubmed_id": "pubmed", "pubmedcentral": "pmc", "pmc_id": "pmc", "mag": "mag", "mag_id": "mag", "dblp": "dblp",
    "corpusid": "corpus_id",
}


def _clean(value, depth: int = 1):
    """Drop empty strings/lists/dicts and None, recursively; strip strings. Below LIMITS' metadata depth a value is
    left as it is, for `paper_problem` to refuse with its path (and no record can recurse this past Python's limit)."""
    if depth > LIMITS["metadata_depth"]:
        return value
    if isinstance(value, str):
        value = " ".join(value.split())
        return value or None
    if isinstance(value, dict):
        out = {k: c for k, c in ((k, _clean(v, depth + 1)) for k, v in value.items()) if c is not None}
        return out or None
    if isinstance(value, list):
        kept = [c for c in (_clean(v, depth + 1) for v in value) if c is not None]
        return kept or None
    return value


def _external_ids(ids: dict | None, corpus_id=None) -> dict:
    out = {}
    for key, value in (ids or {}).items() if isinstance(ids, dict) else ():
        name = _EXTERNAL_IDS.get(str(key).lower())
        if name and value not in (None, ""):
            out[name] = str(value)
    if corpus_id not in (None, ""):
        out["corpus_id"] = str(corpus_id)
    return out


def _s2orc_author(a) -> dict | None:
    """S2ORC's {first, middle, last, suffix} as esqbe's author, its parts kept (given: first and middle names)."""
    if not isinstance(a, dict):
        return {"name": str(a)} if isinstance(a, str) else None
    middle = a.get("middle")
    given = [a.get("first"), *(middle if isinstance(middle, list) else [])]
    return person({"given": " ".join(str(p) for p in given if p), "family": str(a.get("last") or ""),
                   "suffix": str(a.get("suffix") or "")})


def _authors(value) -> list | None:
    """Authors as [{"name", "id"?, the name's parts?, "literal"?}] (esqbe.core.names): S2AG's {authorId, name},
    strings, S2ORC's {first, middle, last, suffix}, or objects given as such. Where the source splits a name, its
    parts are kept under CSL's keys (`family`, `given`, `non-dropping-particle`, `dropping-particle`, `suffix`; a
    family name of several words stays whole), and a name not given is told from them (`Johan de Vries`);
    `literal: true` (or CSL's `literal: "..."`) marks a name that is not a person's (an organisation), kept whole."""
    if not isinstance(value, list):
        return None
    out: list[dict] = []
    for a in value:
        if isinstance(a, str):
            out.append({"name": a})
        elif isinstance(a, dict):
            a = {str(k).lower(): v for k, v in a.items()}
            parts = {k: a[k].strip() for k in PARTS if isinstance(a.get(k), str) and a[k].strip()}
            literal = a["literal"].strip() if isinstance(a.get("literal"), str) else ""
            entry: dict = ({"name": a["name"]} if isinstance(a.get("name"), str) and a["name"].strip() else
                           {"name": literal} if literal else person(parts) or _s2orc_author(a) or {})
            if entry:
                entry.update(parts)
                entry.update({k: True for k in FLAGS if a.get(k) is True})
                if a.get("literal") is True or literal:
                    entry["literal"] = True
            ident = a.get("authorid", a.get("id"))
            if entry and ident not in (None, ""):
                entry["id"] = str(ident)
            if entry:
                out.append(entry)
    return out or None


def _fields_of_study(record: dict) -> list | None:
    """S2AG `s2fieldsofstudy` [{category, source}] or `fieldsofstudy` / S2ORC `mag_field_of_study` [str]."""
    out: list[str] = []
    for item in record.get("s2fieldsofstudy") or record.get("fieldsofstudy") or record.get("mag_field_of_study") or []:
        name = item.get("category") if isinstance(item, dict) else item
        if isinstance(name, str) and name.strip() and name not in out:
            out.append(name.strip())
    return out or None


def _s2ag_common(record: dict) -> dict:
    """Metadata fields shared by the Semantic Scholar Datasets records (keys already lower-cased)."""
    journal = record.get("journal")
    oa = record.get("openaccessinfo") or {}
    oa = _lower_keys(oa) if isinstance(oa, dict) else {}
    pdf = record.get("openaccesspdf")  # the S2 Graph API's {url, status}
    pdf = _lower_keys(pdf) if isinstance(pdf, dict) else {}
    oa_url = next((u for u in (oa.get("url"), pdf.get("url")) if isinstance(u, str) and u.strip()), None)
    oa_status = next((u for u in (oa.get("status"), pdf.get("status")) if isinstance(u, str)), None)
    return dict(
        publication_date=record.get("publicationdate") if isinstance(record.get("publicationdate"), str) else None,
        venue=record.get("venue") if isinstance(record.get("venue"), str) else None,
        journal=(journal.get("name") if isinstance(journal, dict) else journal) if isinstance(journal, (dict, str)) else None,
        authors=_authors(record.get("authors")),
        fields_of_study=_fields_of_study(record),
        external_ids=_external_ids(record.get("externalids") or oa.get("externalids"), record.get("corpusid")),
        open_access_url=oa_url, open_access_status=oa_status,
        license=oa.get("license") if isinstance(oa.get("license"), str) else None,
        s2_url=record.get("url") if isinstance(record.get("url"), str) else None,
    )


def _lower_keys(d: dict) -> dict:
    """S2AG bulk files use `corpusid`, the API docs `corpusId`: accept both."""
    return {str(k).lower(): v for k, v in d.items()}


def _from_s2orc(record: dict, raw_labels: bool) -> Paper:
    paper_id = _paper_id(record, "paper_id")
    title = _title(record)
    sentences = _split_text_abstract(record.get("abstract"), "abstract")
    ids = {k: record.get(k) for k in ("doi", "arxiv_id", "acl_id", "pubmed_id", "pmc_id", "mag_id")}
    meta = _metadata(
        "s2orc", record.get("year"),
        venue=record.get("venue") if isinstance(record.get("venue"), str) else None,
        journal=record.get("journal") if isinstance(record.get("journal"), str) else None,
        authors=([a for a in map(_s2orc_author, record.get("authors") or []) if a]
                 if isinstance(record.get("authors"), list) else None),
        fields_of_study=_fields_of_study(record),
        external_ids=_external_ids(ids, paper_id),
        s2_url=record.get("s2_url") if isinstance(record.get("s2_url"), str) else None,
    )
    return Paper(paper_id, title, sentences, metadata=meta)


def _from_s2ag_abstracts(record: dict, raw_labels: bool) -> Paper:
    record = _lower_keys(record)
    paper_id = _paper_id(record, "corpusid")
    title = _title(record)
    sentences = _split_text_abstract(record.get("abstract"), "abstract")
    return Paper(paper_id, title, sentences, metadata=_metadata("s2ag-abstracts", record.get("year"), **_s2ag_common(record)))


def _spans(annotations: dict, name: str, text: str) -> list[tuple[int, int]]:
    """Distinct (start, end) spans of one annotation; S2AG stores them as a JSON-encoded list."""
    key = f"content.annotations.{name}"
    value = annotations.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise _Invalid(key, f"not a JSON span list ({e.msg})") from None
    if not isinstance(value, list):
        raise _Invalid(key, f"expected a list of spans, got {_type_name(value)}")
    spans: dict[tuple[int, int], None] = {}  # in order, each once (a set beside a list: linear in the spans)
    for span in value:
        start = span.get("start") if isinstance(span, dict) else None
        end = span.get("end") if isinstance(span, dict) else None
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= len(text)):
            raise _Invalid(key, f"bad span {str(span)[:80]} for a text of {len(text)} characters")
        spans[(start, end)] = None
    return list(spans)


def _span_texts(annotations: dict, name: str, text: str, key: str, limit: int) -> list[str]:
    """The distinct texts of one annotation's spans, whitespace kept; past `limit` characters together (counted
    before a span is copied out of the text) the record is refused: many spans over one long text would
    otherwise copy it once per span."""
    out: dict[str, None] = {}
    total = 0
    for start, end in _spans(annotations, name, text):
        total += end - start
        if total > limit:
            raise _Invalid(f"content.annotations.{name}", f"its spans cover over {limit} characters; at most {limit}"
                           f" ({key})")
        part = text[start:end].strip()
        if part:
            out[part] = None
    return list(out)


def _from_s2ag_s2orc(record: dict, raw_labels: bool) -> Paper:
    record = _lower_keys(record)
    paper_id = _paper_id(record, "corpusid")
    content = record.get("content")
    if content is None:
        raise _Skip(NO_ABSTRACT)
    if not isinstance(content, dict):
        raise _Invalid("content", f"expected an object, got {_type_name(content)}")
    content = _lower_keys(content)
    text = content.get("text")
    if text is None:
        raise _Skip(NO_ABSTRACT)
    if not isinstance(text, str):
        raise _Invalid("content.text", f"expected a string, got {_type_name(text)}")
    annotations = content.get("annotations")
    if annotations is None:
        raise _Skip(NO_ABSTRACT)
    if not isinstance(annotations, dict):
        raise _Invalid("content.annotations", f"expected an object, got {_type_name(annotations)}")
    annotations = _lower_keys(annotations)

    # Grobid repeats the title and abstract (same or different offsets): keep each distinct text once.
    title_spans = _spans(annotations, "title", text)
    title_span = title_spans[0] if title_spans else (0, 0)
    if title_span[1] - title_span[0] > 4 * LIMITS["title_chars"]:  # whitespace runs count: refused before copied
        raise _Invalid("content.annotations.title", f"a span of {title_span[1] - title_span[0]} characters; at most "
                                                    f"{4 * LIMITS['title_chars']}")
    title = " ".join(text[title_span[0]:title_span[1]].split())
    parts = _span_texts(annotations, "abstract", text, "abstract_chars", 2 * LIMITS["abstract_chars"])
    sentences = _split_text_abstract(" ".join(parts), "content.annotations.abstract")
    common = _s2ag_common(record)
    source = _lower_keys(content.get("source") or {}) if isinstance(content.get("source"), dict) else {}
    oa = _lower_keys(source.get("oainfo") or {}) if isinstance(source.get("oainfo"), dict) else {}
    url, status = oa.get("openaccessurl"), oa.get("status")
    common["open_access_url"] = common["open_access_url"] or (url if isinstance(url, str) else None)
    common["open_access_status"] = common["open_access_status"] or (status if isinstance(status, str) else None)
    common["license"] = common["license"] or (oa.get("license") if isinstance(oa.get("license"), str) else None)
    # Grobid's header spans: venue, publisher, author names (repeated like the title: keep each once)
    span_text = lambda name: _distinct_span_texts(annotations, name, text)  # noqa: E731
    common["venue"] = common["venue"] or next(iter(span_text("venue")), None)
    common["publisher"] = next(iter(span_text("publisher")), None)
    if not common["authors"]:
        common["authors"] = [{"name": n} for n in span_text("author")] or None
    return Paper(paper_id, title, sentences, metadata=_metadata("s2ag-s2orc", record.get("year"), **common))


def _distinct_span_texts(annotations: dict, name: str, text: str) -> list[str]:
    parts = _span_texts(annotations, name, text, "metadata_bytes", LIMITS["metadata_bytes"])
    return list(dict.fromkeys(" ".join(p.split()) for p in parts))


def _from_csfcube(record: dict, raw_labels: bool) -> Paper:
    paper_id = _paper_id(record, "paper_id")
    title = _title(record)
    sentences = _sentence_list(record.get("abstract"), "abstract")
    facets = _labels(record.get("pred_labels"), len(sentences), "pred_labels", raw_labels)
    meta = record.get("metadata")
    extra = {k: v for k, v in meta.items() if k not in ("format", "year")} if isinstance(meta, dict) else {}
    year = meta.get("year") if isinstance(meta, dict) else None
    return Paper(paper_id, title, sentences, facets, metadata=_metadata("csfcube", year, **extra))


def _from_csabstruct(record: dict, raw_labels: bool) -> Paper:
    """A record of pre-split `sentences` (CSAbstruct's shape, or plain JSON Lines given so): its id (`paper_id`, else
    `id`), labels (`labels`, else `facets`), title, and every other field but the per-sentence annotations
    (`confs`) kept as metadata, as plain JSON Lines keeps them (year, authors, identifiers, ...)."""
    paper_id = _paper_id(record, "paper_id" if "paper_id" in record or "id" not in record else "id")
    sentences = _sentence_list(record.get("sentences"), "sentences")
    labels_key = "labels" if "labels" in record or "facets" not in record else "facets"
    facets = _labels(record.get(labels_key), len(sentences), labels_key, raw_labels)
    extra = {k: v for k, v in record.items() if k not in _CSABSTRUCT_OWN and k != labels_key}
    return Paper(paper_id, _title(record), sentences, facets, metadata=_jsonl_metadata(extra, "csabstruct"))


#: the csabstruct shape's own fields (the id under either name, the sentences, their annotators' confidences)
_CSABSTRUCT_OWN = frozenset({"paper_id", "id", "title", "sentences", "confs"})


def _from_jsonl(record: dict, raw_labels: bool) -> Paper:
    paper_id = _paper_id(record, "id")
    title = _title(record)
    abstract = record.get("abstract")
    facets = record.get("facets")
    if isinstance(abstract, list):
        sentences = _sentence_list(abstract, "abstract")
        labels = _labels(facets, len(sentences), "facets", raw_labels)
    elif abstract is None or isinstance(abstract, str):
        if facets is not None:
            raise _Invalid("facets", "only valid with an abstract given as a list of sentences")
        sentences = _split_text_abstract(abstract, "abstract")
        labels = []
    else:
        raise _Invalid("abstract", f"expected a string or a list of sentences, got {_type_name(abstract)}")
    return Paper(paper_id, title, sentences, labels, metadata=_jsonl_metadata(record))


_JSONL_FIELDS = ("id", "title", "abstract", "facets")


def _jsonl_metadata(record: dict, fmt: str = "jsonl") -> dict:
    """Every key besides id/title/abstract/facets, plus the keys of a `metadata` object, kept as given
    (`authors` as a list of names becomes [{"name"}] so that `author=...` filters work everywhere)."""
    extra = {k: v for k, v in record.items() if k not in _JSONL_FIELDS and k != "metadata"}
    if isinstance(record.get("metadata"), dict):
        extra.update(record["metadata"])
    elif record.get("metadata") is not None:
        raise _Invalid("metadata", f"expected an object, got {_type_name(record['metadata'])}")
    extra.pop("format", None)
    if "authors" in extra:
        extra["authors"] = _authors(extra["authors"]) if isinstance(extra["authors"], list) else extra["authors"]
    year = extra.pop("year", None)
    meta = _metadata(fmt, year, **extra)
    if year is not None and "year" not in meta:
        meta["year"] = year  # kept as given (a string year still filters as text)
    return meta


def _from_arxiv(record: dict, raw_labels: bool) -> Paper:
    """One line of the arXiv metadata snapshot (id, title, abstract, authors, categories, versions, doi, ...)."""
    paper_id = _paper_id(record, "id")
    title = _title(record)
    sentences = _split_text_abstract(record.get("abstract"), "abstract")
    parsed = record.get("authors_parsed")
    names: list
    if isinstance(parsed, list) and all(isinstance(a, list) for a in parsed):  # [last, first, suffix]: parts kept
        names = [person(dict(zip(("family", "given", "suffix"), (str(p) if p else "" for p in a[:3])))) for a in parsed]
    elif isinstance(record.get("authors"), str):
        names = [n for n in _re_split(r",\s*|\s+and\s+", record["authors"]) if n.strip()]
    else:
        names = []
    versions = record.get("versions")
    created = versions[0].get("created") if isinstance(versions, list) and versions and isinstance(versions[0], dict) else None
    date = _rfc2822_date(created) or _iso_date(record.get("created"))  # the snapshot's, or OAI-PMH's `<created>`
    categories = record.get("categories")
    meta = _metadata(
        "arxiv", int(date[:4]) if date else None, publication_date=date,
        venue=record.get("journal-ref") if isinstance(record.get("journal-ref"), str) else None,
        authors=_authors([n for n in names if n]),
        fields_of_study=categories.split() if isinstance(categories, str) else None,
        external_ids={"arxiv": paper_id, "doi": record.get("doi") if isinstance(record.get("doi"), str) else None},
        license=record.get("license") if isinstance(record.get("license"), str) else None,
        open_access_url=f"https://arxiv.org/pdf/{_quote(paper_id, safe='/.')}",  # every arXiv paper is free to read
    )
    return Paper(paper_id, title, sentences, metadata=meta)


def _quote(text: str, safe: str) -> str:
    from urllib.parse import quote

    return quote(text, safe=safe)


def _re_split(pattern: str, text: str) -> list[str]:
    import re

    return re.split(pattern, " ".join(text.split()))


def _rfc2822_date(value) -> str | None:
    """arXiv's `Mon, 2 Apr 2007 19:18:42 GMT` as `2007-04-02`."""
    if not isinstance(value, str):
        return None
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(value).date().isoformat()
    except (TypeError, ValueError):
        return None


def _iso_date(value) -> str | None:
    """`2007-04-02` as it is, where it is a date (arXiv's OAI-PMH metadata gives its dates so)."""
    if not isinstance(value, str):
        return None
    from datetime import date

    try:
        return date.fromisoformat(value.strip()[:10]).isoformat()
    except ValueError:
        return None


def _inverted_abstract(value) -> str | None:
    """OpenAlex's `abstract_inverted_index` ({word: [positions]}) back to its text, words in position order."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Invalid("abstract_inverted_index", f"expected an object of word -> positions, got {_type_name(value)}")
    # bounded before anything is built: the text it rebuilds is sum(len(word) + 1 for each position), so one long
    # word with many positions (or a far position) would ask for gigabytes from a small record
    limit = LIMITS["abstract_chars"]
    chars = 0
    for word, positions in value.items():
        if not isinstance(positions, list):
            raise _Invalid("abstract_inverted_index", f"word {str(word)[:40]!r}: expected a list of positions, got "
                                                      f"{_type_name(positions)}")
        chars += (len(word) + 1) * len(positions)
        if chars > limit + 1:
            raise _Invalid("abstract_inverted_index", f"rebuilds to over {limit} characters of abstract (word length "
                                                      f"x positions); at most {limit}")
    at: dict[int, str] = {}
    for word, positions in value.items():
        for p in positions:
            if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p <= limit:
                raise _Invalid("abstract_inverted_index", f"word {str(word)[:40]!r}: position {str(p)[:40]} is not "
                                                          f"an integer from 0 to {limit}")
            at[p] = word
    return " ".join(at[p] for p in sorted(at))


def _from_openalex(record: dict, raw_labels: bool) -> Paper:
    """One OpenAlex work (JSON Lines from the API or the snapshot); the abstract rebuilt from its inverted index."""
    paper_id = _paper_id(record, "id").rsplit("/", 1)[-1]  # https://openalex.org/W2741809807 -> W2741809807
    title = _title(record, "title" if record.get("title") is not None else "display_name")
    sentences = _split_text_abstract(_inverted_abstract(record.get("abstract_inverted_index")), "abstract_inverted_index")
    authors = []
    for a in record.get("authorships") or [] if isinstance(record.get("authorships"), list) else []:
        author = a.get("author") if isinstance(a, dict) else None
        if isinstance(author, dict) and author.get("display_name"):
            entry = {"name": author["display_name"]}
            if author.get("id"):
                entry["id"] = str(author["id"]).rsplit("/", 1)[-1]
            authors.append(entry)
    location: dict = record["primary_location"] if isinstance(record.get("primary_location"), dict) else {}
    source: dict = location["source"] if isinstance(location.get("source"), dict) else {}
    ids: dict = record["ids"] if isinstance(record.get("ids"), dict) else {}
    doi = record.get("doi") or ids.get("doi")
    doi = doi.split("doi.org/", 1)[-1] if isinstance(doi, str) else None
    oa: dict = record["open_access"] if isinstance(record.get("open_access"), dict) else {}
    concepts: list = record["concepts"] if isinstance(record.get("concepts"), list) else []
    meta = _metadata(
        "openalex", record.get("publication_year"),
        publication_date=record.get("publication_date") if isinstance(record.get("publication_date"), str) else None,
        venue=source.get("display_name") if isinstance(source.get("display_name"), str) else None,
        authors=authors or None,
        fields_of_study=[c["display_name"] for c in concepts if isinstance(c, dict) and c.get("level") == 0
                         and isinstance(c.get("display_name"), str)] or None,
        external_ids={"doi": doi, "openalex": paper_id,
                      "mag": str(ids["mag"]) if ids.get("mag") else None,
                      "pubmed": str(ids["pmid"]).rsplit("/", 1)[-1] if ids.get("pmid") else None},
        open_access_url=oa.get("oa_url") if isinstance(oa.get("oa_url"), str) else None,
        open_access_status=oa.get("oa_status") if isinstance(oa.get("oa_status"), str) else None,
    )
    return Paper(paper_id, title, sentences, metadata=meta)


#: the top-level fields each record format's parser reads (keys compared lower-cased); a record's other fields are
#: not kept, and an index run names them per file (`unkept_fields`). Plain JSON Lines keeps every field but esqbe's
#: own `format`; the csabstruct shape the same, less its per-sentence `confs`.
_READ_FIELDS = {
    "s2orc": frozenset({"paper_id", "title", "abstract", "year", "doi", "arxiv_id", "acl_id", "pubmed_id", "pmc_id",
                        "mag_id", "venue", "journal", "authors", "mag_field_of_study", "s2fieldsofstudy",
                        "fieldsofstudy", "s2_url"}),
    "s2ag-abstracts": frozenset({"corpusid", "abstract", "title", "year", "publicationdate", "venue", "journal",
                                 "authors", "s2fieldsofstudy", "fieldsofstudy", "externalids", "openaccessinfo",
                                 "openaccesspdf", "url"}),
    "s2ag-s2orc": frozenset({"corpusid", "content", "title", "year", "publicationdate", "venue", "journal", "authors",
                             "s2fieldsofstudy", "fieldsofstudy", "externalids", "openaccessinfo", "openaccesspdf",
                             "url"}),
    "csfcube": frozenset({"paper_id", "title", "abstract", "pred_labels", "metadata"}),
    "arxiv": frozenset({"id", "title", "abstract", "authors", "authors_parsed", "versions", "categories",
                        "journal-ref", "doi", "license"}),
    "openalex": frozenset({"id", "title", "display_name", "abstract_inverted_index", "authorships",
                           "primary_location", "ids", "doi", "open_access", "concepts", "publication_year",
                           "publication_date"}),
}
#: the fields the JSON Lines shapes read: all but these
_NOT_READ = {"jsonl": frozenset({"format"}), "csabstruct": frozenset({"format", "confs"})}


def unkept_fields(fmt: str, record: dict) -> list[str]:
    """The top-level fields of `record` (of format `fmt`) that its parser does not keep, in the record's order."""
    if fmt in _NOT_READ:
        dropped = _NOT_READ[fmt]
        inner = record["metadata"] if isinstance(record.get("metadata"), dict) else {}
        return [k for k in record if k in dropped] + [f"metadata.{k}" for k in inner if k in dropped]
    read = _READ_FIELDS.get(fmt)
    return [] if read is None else [k for k in record if str(k).lower() not in read]


_PARSERS = {
    "s2orc": _from_s2orc,
    "s2ag-abstracts": _from_s2ag_abstracts,
    "s2ag-s2orc": _from_s2ag_s2orc,
    "csfcube": _from_csfcube,
    "csabstruct": _from_csabstruct,
    "jsonl": _from_jsonl,
    "arxiv": _from_arxiv,
    "openalex": _from_openalex,
}


#: every input format; bibtex, ris and csl-json are whole files, read by `esqbe.ingest.library`
#: the formats whose records are JSON objects, one a line (POST /papers and `esqbe tag` read record by record)
RECORD_FORMATS = ("s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl", "arxiv", "openalex")
FORMATS = (*RECORD_FORMATS, "bibtex", "ris", "csl-json", "zotero")
