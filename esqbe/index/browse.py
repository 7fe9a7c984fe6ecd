"""Finding and inspecting papers (`esqbe search`, `esqbe show`, `esqbe list`): one paper as its numbered
sentences with facet labels and probabilities, the papers matching words (BM25, as GET /search), and the
papers of an index (ids, titles) with metadata filters. Plain data, the same for the CLI and a script."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.filters import MetadataFilter, coerce_filters, fold, matches
from ..domain import Paper
from ..query.results import SOFT_FACET_ORDER, PaperNotFoundError, jsonable, public_metadata
from ..query.search import has_soft_labels

if TYPE_CHECKING:
    from .api import Index


def paper_view(paper: Paper) -> dict:
    """`{"paper_id", "title", "facets_predicted", "sentences": [{"index", "text", "facet", "probability",
    "probabilities": {facet: p}}], "metadata"}`: the probabilities are the tagger's (null for given labels)."""
    soft = has_soft_labels(paper)
    probs = (paper.metadata or {}).get("facet_probs") if soft else None
    sentences = []
    for i, (text, facet) in enumerate(zip(paper.sentences, paper.facets)):
        row: dict = {"index": i, "text": text, "facet": facet, "probability": None, "probabilities": None}
        if probs is not None:
            named = {f: round(float(p), 4) for f, p in zip(SOFT_FACET_ORDER, probs[i])}
            row["probabilities"] = named
            row["probability"] = named.get(facet)
        sentences.append(row)
    metadata = public_metadata(paper.metadata)
    return {"paper_id": paper.paper_id, "title": paper.title,
            "facets_predicted": bool((paper.metadata or {}).get("facets_predicted")),
            "sentences": sentences, "metadata": jsonable(metadata)}


def author_names(metadata: dict | None) -> list[str]:
    """The authors' names in order, for people to read: a string as it is, an entry's `name` (an organisation's
    whole); entries without a name are skipped."""
    names = []
    for a in (metadata or {}).get("authors") or []:
        name = a.get("name") if isinstance(a, dict) else a
        if isinstance(name, str) and name.strip():
            names.append(name.strip())
    return names


def metadata_text(metadata: dict | None) -> list[tuple[str, str]]:
    """(key, value as one line of text) per metadata field, for `esqbe show`: authors by name joined with "; ",
    a BibTeX entry as written by its type, key and field names, a list of strings joined with ", ", other values as
    JSON (all of it is in `--json` as data)."""
    import json

    out = []
    for key, value in (metadata or {}).items():
        if key == "authors" and isinstance(value, list):
            text = "; ".join(author_names(metadata))
        elif key == "bibtex" and isinstance(value, dict) and isinstance(value.get("fields"), dict):
            # the entry as written (esqbe.ingest.library.AS_WRITTEN): what a BibTeX export writes back (--json: all)
            text = f"@{value.get('type')}{{{value.get('key')}}} as written: {', '.join(map(str, value['fields']))}"
        elif isinstance(value, str):
            text = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            text = ", ".join(value)
        else:
            text = json.dumps(value, ensure_ascii=False)
        out.append((key, text))
    return out


def show_paper(index: Index, paper_id: str) -> dict:
    """The paper's view; PaperNotFoundError (exit 3, HTTP 404) when it is not in the index."""
    found = index.get([paper_id])
    if paper_id not in found:
        raise PaperNotFoundError(f"paper {paper_id!r} is not in the index (find it with `esqbe search WORDS`)")
    return paper_view(found[paper_id])


def search_papers(index: Index, text: str, k: int = 10) -> list[dict]:
    """An exact paper id first, then the papers an identifier names (a DOI, with or without `https://doi.org/`; an
    arXiv id, with or without `arXiv:` or its version; any other external id), then those with an author whose name
    has every word of `text` (case and accents ignored: `garcia-mateo` finds "Carmen García-Mateo"), then BM25 over
    title and abstract words: `{"paper_id", "title", "score", "match": "id" | "identifier" | "author" | "words",
    "sentences", "first_sentence"}` (GET /search's hits). Identifiers and authors: on the embedded backend."""
    q = text.strip()
    exact = index.get([q]) if q else {}
    found = [(p, 0.0, "id" if p.paper_id == q else "identifier") for p in exact.values()]
    seen = {p.paper_id for p in exact.values()}  # the paper's own id: a DOI asked for names it, listed once
    for how, ids in (("identifier", _by_identifier(index, q)), ("author", _by_author(index, q))):
        ids = [pid for pid in dict.fromkeys(ids) if pid not in seen][:k]
        papers = index.get(ids) if ids else {}
        found += [(papers[pid], 0.0, how) for pid in ids if pid in papers]
        seen.update(ids)
    if len(found) < k:
        found += [(p, s, "words") for p, s in index.search(text, k) if p.paper_id not in seen]
    return [{"paper_id": p.paper_id, "title": p.title, "score": round(float(s), 4), "match": how,
             "sentences": len(p.sentences), "first_sentence": p.sentences[0] if p.sentences else ""}
            for p, s, how in found[:k]]


def list_papers(index: Index, filters: Sequence | None = None, limit: int | None = None) -> tuple[list[dict], int]:
    """(papers in id order, `{"paper_id", "title", "year", "sentences"}`, at most `limit`; how many match in all)."""
    conditions = coerce_filters(filters, max_values=index.settings.filter_max_values,
                                max_bytes=index.settings.filter_max_bytes) if filters else ()
    if conditions:  # a key no paper has (a typo) is said, with the index's keys, as a query says it
        index.backend.check_filter(MetadataFilter(tuple(conditions)))
    ids = sorted(index.backend.paper_ids())
    out: list[dict] = []
    total = 0
    for start in range(0, len(ids), 256):
        batch = index.get(ids[start:start + 256])
        for pid in ids[start:start + 256]:
            paper = batch.get(pid)
            if paper is None or (conditions and not matches(paper.metadata or {}, conditions)):
                continue
            total += 1
            if limit is None or len(out) < limit:
                out.append({"paper_id": pid, "title": paper.title, "year": (paper.metadata or {}).get("year"),
                            "sentences": len(paper.sentences)})
    return out, total


_DOI = re.compile(r"(?:https?://(?:dx\.)?doi\.org/|doi:\s*)?(10\.\d{4,9}/\S+)", re.IGNORECASE)
_ARXIV = re.compile(r"(?:arxiv:\s*|https?://arxiv\.org/abs/)?(\d{4}\.\d{4,5}|[a-z][a-z.\-]*/\d{7})(?:v\d+)?",
                    re.IGNORECASE)
_VERSION = re.compile(r"v\d+$")
_NAME_WORDS = re.compile(r"[\s\-]+")


def _by_identifier(index: Index, q: str) -> list[str]:
    """Papers whose DOI, arXiv id or another external id is `q` (compared folded; a DOI's case never matters)."""
    if not q or len(q) > 300 or " " in q:
        return []
    doi, arxiv = _DOI.fullmatch(q), _ARXIV.fullmatch(q)
    if doi:
        want = fold(doi.group(1)).rstrip(".")
        return index.backend.ids_where("external_ids.doi", lambda s: s == want)
    if arxiv:
        want = fold(arxiv.group(1))
        return index.backend.ids_where("external_ids.arxiv", lambda s: _VERSION.sub("", s) == want)
    want = fold(q)
    return index.backend.ids_where("external_ids", lambda s: s == want)


def _by_author(index: Index, q: str) -> list[str]:
    """Papers with an author whose name has every word of `q` (`García-Mateo`, `carmen garcia mateo`)."""
    words = [w for w in _NAME_WORDS.split(fold(q)) if w]
    if not words or len(words) > 8:
        return []
    return index.backend.ids_where("authors.name", lambda name: all(w in _NAME_WORDS.split(name) for w in words))
