"""One JSON shape for a query result, shared by `esqbe query --json` and HTTP `POST /query`
(`QueryResult.to_dict()` calls `result_json`). Strict JSON: a non-finite number is null (a similarity)
or 0.0 (the other scores), metadata goes through a JSON round trip.

    {"version": 1,
     "query": {"paper_id", "title", "facet", "filters": [{key, op, value}],
               "sentences": [{index, text, facet (its label), probability (the tagger's p(query facet), or null),
                              why ("label", "probability", "most_probable", "chosen", "all"),
                              probabilities ({facet: p} where the tagger labelled it, or null)}],
               "selection": {"by" ("facet", "sentences", "all"), "rule" (in words), "threshold" (or null)},
               "examples": [{paper_id (null: a text), title, facet, sentences: [{index, text, facet}], selection}],
               "avoid": [the same, for the papers to avoid]},
     "rescorer", "rescorer_params", "similarity" (what a hit's similarity is), "match_weight" (what a pair's
     weight is), "scale" (what the hits' percentile and band are placed on: esqbe.index.scale; null from a bare
     run_query),
     "hits": [{"rank", "paper_id", "title", "similarity", "score", "first_stage_score", "bm25", "knn",
               "percentile" (among the index's own matches; null on the fixed scale), "band" (strong, fair, weak
               or null),
               "matches": [{query_index, query_sentence, candidate_index, candidate_sentence, candidate_facet,
                            weight, example (which example the query sentence is of)}],
               "example_similarities" (per example, its similarity to the hit),
               "avoided": [{paper_id, similarity, penalty (taken off the score), avoid_index, avoid_sentence,
                            candidate_index, candidate_sentence}],
               "metadata", "sentences" (null unless the papers are given)}],
     "timings_ms": {stage: milliseconds}}

`version` changes when a key is renamed or removed (not when one is added)."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.filter_check import INTERNAL_KEYS

if TYPE_CHECKING:
    from ..domain import Paper
    from .search import QueryResult

RESULT_JSON_VERSION = 1

#: what a hit's `similarity` is, per rescorer (comparable across queries of one rescorer)
SIMILARITY = {
    "ts": "best cosine of any query sentence with any candidate sentence (-1..1)",
    "summax": "mean over query sentences of the best cosine with a candidate sentence (-1..1)",
    "ot": "minus the optimal-transport cost between query and candidate sentences (L2 distances; 0 is identical)",
    "asym": "weighted mean over query sentences of the best max(cos, 0)^d (0..1)",
    "asym_token": "mean over query sentences of token-level coverage by a candidate sentence (0..1)",
    "none": "no rescorer: null (first-stage order; see knn and bm25)",
}
#: what the weight of a matched sentence pair is, per rescorer
MATCH_WEIGHT = {
    "ts": "cosine", "summax": "cosine", "ot": "transport plan mass", "asym": "max(cos, 0)^d",
    "asym_token": "token coverage", "none": "cosine",
}


def finite(x) -> float | None:
    """`x` as a float, None when it is not finite (strict JSON has no NaN or Infinity)."""
    if x is None:
        return None
    x = float(x)
    return x if np.isfinite(x) else None


def jsonable(value) -> Any:
    """`value` through a strict JSON round trip (unknown types as str); {} when it holds NaN or Infinity."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=str))
    except ValueError:
        return {}


#: metadata esqbe keeps for itself, left out of results: the tagger's flag and soft labels (given per sentence,
#: named, as `probabilities`), the hash of the input a paper was tagged from
HIDDEN_METADATA_KEYS = INTERNAL_KEYS
#: the class order of the tagger's soft labels (esqbe.query.search.SOFT_FACET_ORDER)
_SOFT_ORDER = ("background", "method", "result", "other")


def public_metadata(metadata: dict | None) -> dict:
    """A paper's metadata as a user reads it: esqbe's internals left out."""
    return {k: v for k, v in (metadata or {}).items() if k not in HIDDEN_METADATA_KEYS}


#: metadata keys whose values are paths on the machine that indexed the paper: Zotero's attachments (the indexer
#: reads an attached PDF when the paper is read; the index keeps the paths for its own user: `esqbe show`)
PATH_KEYS = ("attachments",)
#: how a path in PATH_KEYS may begin that is not a directory: Zotero's prefixes, a file URL
_PATH_PREFIXES = ("attachments:", "storage:", "file://")


def file_names_only(metadata: dict | None) -> dict:
    """`metadata` with each path under PATH_KEYS cut to its file name, without directories (`/home/me/Zotero/
    storage/ABCD2345/x.pdf`, `C:\\Users\\me\\x.pdf`, `attachments:Papers/x.pdf` -> `x.pdf`): what a server shows a
    reader who is not its operator (`esqbe serve` without `--show-paths`). A value that is not a path is left out."""
    out = dict(metadata or {})
    for key in PATH_KEYS:
        if key not in out:
            continue
        values = out[key] if isinstance(out[key], list) else [out[key]]
        names = [_file_name(v) for v in values if isinstance(v, str)]
        out[key] = [n for n in names if n]
        if not out[key]:
            del out[key]
    return out


def _file_name(path: str) -> str:
    for prefix in _PATH_PREFIXES:
        if path.lower().startswith(prefix):
            path = path[len(prefix):]
    return re.split(r"[\\/]", path)[-1].strip()


def soft_probabilities(paper: Paper) -> list[dict[str, float]] | None:
    """Each sentence's probability of every facet, {facet: p}, where esqbe's tagger labelled the paper; else None."""
    probs = (paper.metadata or {}).get("facet_probs")
    if probs is None or len(probs) != len(paper.sentences):
        return None
    return [{name: round(float(p), 4) for name, p in zip(_SOFT_ORDER, row)} for row in probs]


def sentences_json(paper: Paper) -> list[dict]:
    """Each sentence with its facet and, where esqbe's tagger labelled it, `probabilities` {facet: p}."""
    soft = soft_probabilities(paper)
    return [{"index": i, "text": s, "facet": f, "probabilities": soft[i] if soft else None}
            for i, (s, f) in enumerate(zip(paper.sentences, paper.facets))]


def _example_json(example) -> dict:
    """One example of the query (or paper to avoid, esqbe.query.combine.Example): which sentences, and why."""
    paper, sel = example.paper.paper, example.selection
    return {"paper_id": paper.paper_id if example.indexed else None, "title": paper.title, "facet": example.facet,
            "sentences": [{"index": i, "text": paper.sentences[i], "facet": paper.facets[i]} for i in example.indices],
            "selection": {"by": sel.by, "rule": sel.rule, "threshold": sel.threshold} if sel else None}


def result_json(result: QueryResult, papers: Mapping[str, Paper] | None = None) -> dict:
    """The JSON of a query result; with `papers` (paper id -> Paper), each hit among them gets its sentences."""
    hits = []
    for h in result.hits:
        hits.append({
            "rank": h.rank, "paper_id": h.paper_id, "title": h.title, "similarity": finite(h.similarity),
            "score": finite(h.score) or 0.0, "first_stage_score": finite(h.first_stage_score) or 0.0,
            "bm25": finite(h.bm25) or 0.0, "knn": finite(h.knn) or 0.0,
            "matches": [dict(query_index=m.query_index, query_sentence=m.query_sentence,
                             candidate_index=m.candidate_index, candidate_sentence=m.candidate_sentence,
                             candidate_facet=m.candidate_facet, weight=finite(m.weight) or 0.0, example=m.example)
                        for m in h.matches],
            "example_similarities": [finite(x) for x in h.example_similarities],
            "avoided": [dict(paper_id=a.paper_id, similarity=finite(a.similarity), penalty=finite(a.penalty) or 0.0,
                             avoid_index=a.avoid_index, avoid_sentence=a.avoid_sentence,
                             candidate_index=a.candidate_index, candidate_sentence=a.candidate_sentence)
                        for a in h.avoided],
            "percentile": finite(h.percentile), "band": h.band,
            "metadata": jsonable(public_metadata(h.metadata)),
            "sentences": sentences_json(papers[h.paper_id]) if papers and h.paper_id in papers else None,
        })
    facets = result.query_facets or ["unlabeled"] * len(result.query_sentences)
    why = {s.index: s for s in result.selection.sentences} if result.selection else {}
    soft = result.query_probabilities
    sentences = []
    for j, ((i, t), f) in enumerate(zip(result.query_sentences, facets)):
        known = why.get(i)
        sentences.append({"index": i, "text": t, "facet": f,
                          "probability": finite(known.probability) if known else None,
                          "why": known.why if known else None,
                          "probabilities": soft[j] if soft and j < len(soft) else None})
    sel = result.selection
    rescorer = result.rescorer
    return {
        "version": RESULT_JSON_VERSION,
        "query": {"paper_id": result.query_paper_id,
                  "title": result.query_title,
                  "facet": result.facet,
                  "filters": list(result.filters),
                  "sentences": sentences,
                  "selection": {"by": sel.by, "rule": sel.rule, "threshold": sel.threshold} if sel else None,
                  "examples": [_example_json(e) for e in result.examples],
                  "avoid": [_example_json(e) for e in result.avoid]},
        "rescorer": rescorer,
        "rescorer_params": jsonable(result.rescorer_params or {}) if rescorer != "none" else {},
        "similarity": SIMILARITY.get(rescorer, "the rescorer's score"),
        "match_weight": MATCH_WEIGHT.get(rescorer, "weight"),
        "scale": jsonable(result.scale) if result.scale is not None else None,
        "hits": hits,
        "timings_ms": dict(result.timings),
    }
