"""Finding and inspecting papers (`esqbe search`, `esqbe show`, `esqbe list`): one paper as its numbered
sentences with facet labels and probabilities, the papers matching words (BM25, as GET /search), and the
papers of an index (ids, titles) with metadata filters. Plain data, the same for the CLI and a script."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.filters import coerce_filters, matches
from ..domain import Paper
from ..query.result_json import jsonable, public_metadata
from ..query.search import SOFT_FACET_ORDER, PaperNotFoundError, has_soft_labels

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
    a list of strings joined with ", ", other values as JSON (all of it is in `--json` as data)."""
    import json

    out = []
    for key, value in (metadata or {}).items():
        if key == "authors" and isinstance(value, list):
            text = "; ".join(author_names(metadata))
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
    """An exact paper id first, then BM25 over title and abstract words: `{"paper_id", "title", "score",
    "match": "id" | "words", "sentences", "first_sentence"}` (GET /search's hits)."""
    exact = index.get([text.strip()]) if text.strip() else {}
    found = [(p, 0.0, "id") for p in exact.values()]
    found += [(p, s, "words") for p, s in index.search(text, k) if p.paper_id not in exact]
    return [{"paper_id": p.paper_id, "title": p.title, "score": round(float(s), 4), "match": how,
             "sentences": len(p.sentences), "first_sentence": p.sentences[0] if p.sentences else ""}
            for p, s, how in found[:k]]


def list_papers(index: Index, filters: Sequence | None = None, limit: int | None = None) -> tuple[list[dict], int]:
    """(papers in id order, `{"paper_id", "title", "year", "sentences"}`, at most `limit`; how many match in all)."""
    conditions = coerce_filters(filters) if filters else ()
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
