"""The identifiers that name a work, normalised so that one work read from two files compares
equal: `doi:10.1088/1742-6596/1` (a resolver address, `doi:` and case dropped), `arxiv:1706.03762` (`arXiv:`, an
abs/pdf address and the version dropped), `pubmed:12345`; a value holding a control, bidirectional or invisible
character (esqbe.core.textsafe.NOT_IN_ID) names no work (on screen it would read as another one's). A normalised
title and year (`title_key`) only ever flags a likely duplicate (`same_work`: the first author's family name must
agree too where both records name one): records are merged by identifier, never by title."""
from __future__ import annotations

import re

from .filters import fold
from .textsafe import NOT_IN_ID

_DOI = re.compile(r"(?:https?://(?:dx\.)?doi\.org/|doi:\s*)?(10\.\d{4,9}/\S+)", re.IGNORECASE)
_ARXIV = re.compile(r"(?:arxiv:\s*|https?://(?:export\.)?arxiv\.org/(?:abs|pdf)/)?"
                    r"(\d{4}\.\d{4,5}|[a-z][a-z.\-]*/\d{7})(?:v\d+)?(?:\.pdf)?", re.IGNORECASE)
_PUBMED = re.compile(r"(?:pmid:\s*)?(\d{1,12})", re.IGNORECASE)
_WORD = re.compile(r"\w+")
#: the longest identifier kept as a key (a longer one is no identifier)
MAX_KEY = 300


def work_keys(metadata: dict | None) -> list[str]:
    """The normalised identifiers in a paper's metadata (`external_ids.doi`, `.arxiv`, `.pubmed`), DOI first."""
    ids = (metadata or {}).get("external_ids")
    if not isinstance(ids, dict):
        return []
    out = []
    for kind, pattern in (("doi", _DOI), ("arxiv", _ARXIV), ("pubmed", _PUBMED)):
        value = ids.get(kind)
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or len(value) > MAX_KEY or NOT_IN_ID.search(value):
            continue  # a value with a control or an invisible character is no identifier: it is not read as it is
        match = pattern.fullmatch(value.strip())
        if match:
            out.append(f"{kind}:{match.group(1).lower()}")
    return out


def identifier_keys(text: str) -> list[str]:
    """The normalised identifiers a string given as a paper's id may be: a DOI (any case, with or
    without `doi:` or a resolver address), an arXiv id (with or without `arXiv:`, an address or a version) or a PubMed
    id (digits, with or without `PMID:`). `show`, `query --paper` and `--not` look these up once no paper has the id."""
    text = (text or "").strip()
    if not text or len(text) > MAX_KEY:
        return []
    return work_keys({"external_ids": {"doi": text, "arxiv": text, "pubmed": text}})


def described(key: str) -> str:
    """`doi:10.1/x` as people read it in a summary: `doi 10.1/x`."""
    kind, _, value = key.partition(":")
    return f"{kind} {value}"


def title_key(title: str, year) -> str | None:
    """A title's words folded (case, accents, punctuation ignored) with the year: two records with the same one are
    likely the same work. None for a title of fewer than three words (too common to say so)."""
    words = _WORD.findall(fold(title or ""))
    if len(words) < 3:
        return None
    return " ".join(words) + f" ({year if isinstance(year, int) and not isinstance(year, bool) else '-'})"


def first_author(metadata: dict | None) -> str | None:
    """The first author's family name folded to its last word (`Kim, M. G.`, `M. G. Kim`, {"family": "van der
    Berg"} -> `kim`, `kim`, `berg`), or None where the record names no author."""
    authors = (metadata or {}).get("authors")
    first = authors[0] if isinstance(authors, list) and authors else None
    if isinstance(first, dict):
        name = first.get("family") if isinstance(first.get("family"), str) else first.get("name")
    else:
        name = first
    if not isinstance(name, str):
        return None
    family = name.partition(",")[0] if "," in name else name
    words = _WORD.findall(fold(family[:MAX_KEY]))
    return words[-1] if words else None


def same_work(title: str, metadata: dict | None, other_title: str, other_metadata: dict | None) -> bool:
    """Whether two records are likely one work: the same folded title (three words or more), the same year and first
    author wherever both records give one."""
    a, b = _WORD.findall(fold(title or "")), _WORD.findall(fold(other_title or ""))
    if len(a) < 3 or a != b:
        return False
    years = [(m or {}).get("year") for m in (metadata, other_metadata)]
    if all(isinstance(y, int) and not isinstance(y, bool) for y in years) and years[0] != years[1]:
        return False
    authors = [first_author(metadata), first_author(other_metadata)]
    return None in authors or authors[0] == authors[1]
