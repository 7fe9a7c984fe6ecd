"""Watches: saved faceted queries that keep looking (`esqbe watch`, GET /watches/NAME.atom).

A watch is a query as `Index.query` takes it (a paper and a facet, chosen sentences or a text, or several examples
and papers to avoid; filters, rescorer, k and the other ranking settings) plus a threshold on the hits' one score
(`min_score`, the number a query's hits show and are ordered by: esqbe.query.results.ScoreFormula). Without one it
keeps what the index's own scale calls a strong match (esqbe.index.scale: the score from which a hit is "strong",
looked up at each run, so it follows the scale as the index grows). It keeps its own copy of every example's and
avoided paper's query sentences and their vectors and the model identity they were made with, so re-indexing or
deleting an example paper changes nothing, and a model change refuses the watch with the reason (never re-encodes
it).

A run (`run_watches`) looks only at the papers indexed since the watch's mark (paper numbers only grow, so they are
a range of the paper-number index): the stored query is rescored against those papers alone; only when one of them
passes the threshold is the query run against the whole index as it is now (one ordinary query), and a new paper is
reported when it is among that query's k hits with its score at or over the threshold (a paper's score is the same
in both: it depends on the query and the paper alone); a likely version of one of its examples (esqbe.query.versions:
nearly the example's sentences, under another id) or a likely duplicate of one (the same title, year and first author)
is never reported. Its cost grows with the new
papers (and the watches that any of them passes), not with the index. Each watch's matches and new mark are written
in one transaction under the index's write lock (readers never wait: SQLite WAL); a paper a watch has reported is
not reported again (re-indexed, it is a new number but the same id).
"""
from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..core.filters import FilterError
from ..core.workids import same_work
from ..domain import IndexedPaper, Paper, normalize_label
from ..errors import ModelError, ParameterError, UserError
from ..query.combine import run_examples
from ..query.results import Example, ExampleSpec, QueryError, QueryResult
from ..query.search import settings_for_facet
from .open import make_filter
from .scale import SCALE_SETTINGS

#: a watch's name: letters, digits, `_` and `-`, starting with a letter or digit (no path, no markup, no dot: the
#: feed is NAME.atom), at most this long
MAX_NAME_CHARS = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
#: the score a threshold may ask for: the score is a weighted sum of cosine-like parts in -1..1 and BM25 over its best
MIN_SCORE_RANGE = (-1.0, 1.0)
#: what a watch without a number keeps: the hits the index's own scale calls strong
STRONG = "strong"
#: new papers rescored against a watch at once (a run after a big `esqbe index` goes through them in such slices)
NEW_PAPERS_PER_PASS = 2000
#: the settings a watch may keep (what a query ranks with; `esqbe watch add` takes the flags of `esqbe query`)
WATCH_SETTING_KEYS = ("k", "rescorer", "rescorer_params", "rescore_depth", "knn_k", "bm25_k", "fusion",
                      "fusion_bm25_weight", "candidate_facet", "facet_penalty", "query_facet_threshold",
                      "final_bm25_weight", "bm25_text", "abstract_weight", "vector_centering", "prf_docs", "prf_weight",
                      "example_aggregate", "avoid_rule", "avoid_weight")


class WatchError(UserError, ValueError):
    """A watch cannot be made or used as asked."""


class WatchNameError(ParameterError):
    """A watch name outside the safe set (letters, digits, `_`, `-`; bounded length)."""


class WatchNotFoundError(WatchError):
    """No watch of that name in this index."""

    http_status: ClassVar[int] = 404


class WatchExistsError(WatchError):
    """A watch of that name exists already."""

    http_status: ClassVar[int] = 409


class WatchLimitError(WatchError):
    """The index holds `max_watches` watches already."""

    http_status: ClassVar[int] = 409


class WatchModelError(ModelError):
    """The index's model is not the one the watch's vectors were made with: the watch is refused, not re-encoded."""

    http_status: ClassVar[int] = 409


class WatchesUnsupportedError(WatchError):
    """This index keeps no watches (an attached engine index; an engine index whose mapping lacks indexed_at)."""

    http_status: ClassVar[int] = 501


def check_name(name: str) -> str:
    """`name` if it is a valid watch name, else WatchNameError saying why."""
    if not isinstance(name, str) or not name:
        raise WatchNameError("a watch needs a name")
    if len(name) > MAX_NAME_CHARS:
        raise WatchNameError(f"watch name has {len(name)} characters; at most {MAX_NAME_CHARS}")
    if not _NAME.fullmatch(name):
        bad = next((c for c in name if not (c.isascii() and (c.isalnum() or c in "_-"))), name[0])
        raise WatchNameError(f"watch name {ascii(name)}: {ascii(bad)} is not allowed; use letters, digits, '_' and "
                             "'-', starting with a letter or digit")
    return name


def check_min_score(value: Any) -> float | None:
    """A threshold: None (the index's strong matches) or a finite number in MIN_SCORE_RANGE, else WatchError."""
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise WatchError(f"min_score must be a number (got {value!r})") from None
    lo, hi = MIN_SCORE_RANGE
    if not math.isfinite(x) or not lo <= x <= hi:
        raise WatchError(f"min_score must be a finite number in {lo:g}..{hi:g}, the score hits show (got {value!r})")
    return x


@dataclass
class Watch:
    """A saved query as stored with the index."""

    name: str
    #: the query (of several examples: the first): paper_id (None for a text), title, facet, chosen (the sentence
    #: indices asked, or None), and the query's own copy of its sentences: [[index, text], ...] and their facet labels
    query: dict
    #: the ranking settings given when it was made (the index's settings give the rest at each run)
    settings: dict
    #: the metadata filter's conditions, as dicts (esqbe.core.filters)
    filters: list
    #: the score a new paper must reach; None: what the index's own scale calls strong at each run
    min_score: float | None
    #: the model identity the vectors were made with: model, dim, encoder_mode, fingerprint, adapter
    model: dict
    #: the paper number from which papers are new to it
    mark: int
    created: float
    last_run: float | None
    #: the secret in its feed's URL on a private server (`?key=`)
    feed_key: str
    #: how many papers it has found
    found: int = 0
    #: the rows of every example's query sentences, then every avoided paper's, in order
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32), repr=False)
    #: a query of several examples or with papers to avoid: each example and each paper to avoid as `query` is
    #: (the first example is `query`); empty for the query of one paper or text
    examples: list = field(default_factory=list)
    avoid: list = field(default_factory=list)

    def parts(self) -> tuple[list[dict], list[dict]]:
        """The examples and the papers to avoid (one example, `query`, and none to avoid for a single query)."""
        return (self.examples or [self.query]), self.avoid

    @property
    def threshold(self) -> str:
        """The threshold in words: the number, or the index's strong matches."""
        return f"score >= {self.min_score:g}" if self.min_score is not None else \
            "strong matches (score >= the index's own scale's strong cut, looked up at each run)"

    def to_dict(self, *, with_key: bool = False) -> dict:
        d = {"name": self.name, "query": self.query, "settings": self.settings, "filters": self.filters,
             "min_score": self.min_score, "min_sim": self.min_score, "threshold": self.threshold, "model": self.model,
             "mark": self.mark, "created": self.created,
             "last_run": self.last_run, "found": self.found}
        if self.examples or self.avoid:
            d.update(examples=self.examples, avoid=self.avoid)
        if with_key:
            d["feed_key"] = self.feed_key
        return d


@dataclass
class WatchRun:
    """What one run of one watch found: the new papers it looked at, the matches (each a hit's JSON with
    `found`, the time esqbe found it), and whether the mark moved; `refused` says why a watch could not run."""

    name: str
    new_papers: int = 0
    #: new papers at or over the threshold (each then checked for its rank over the whole index)
    passed: int = 0
    matches: list[dict] = field(default_factory=list)
    mark_from: int = 0
    mark_to: int = 0
    advanced: bool = False
    refused: str | None = None
    #: the score a new paper had to reach in this run (its `min_score`, or the index's strong cut now)
    threshold: float | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "new_papers": self.new_papers, "passed": self.passed, "matches": self.matches,
                "mark_from": self.mark_from, "mark_to": self.mark_to, "advanced": self.advanced, "refused": self.refused,
                "threshold": self.threshold}

    def as_result(self) -> dict:
        """The matches in a query result's JSON shape (hits), what esqbe.query.export writes."""
        return {"hits": self.matches}


def _store(index):
    """The backend's watch store (the embedded index's SQLite, an engine index's companion index), or
    WatchesUnsupportedError saying why this index keeps none."""
    backend = index.backend
    why = getattr(backend, "watches_unsupported", lambda: None)()
    if why is None and not getattr(backend, "keeps_watches", False):
        why = f"watches are not kept on the {index.settings.backend} backend"
    if why is not None:
        raise WatchesUnsupportedError(why)
    return backend


def _model_identity(meta) -> dict:
    return {"model": meta.model, "dim": meta.dim, "encoder_mode": meta.encoder_mode, "fingerprint": meta.fingerprint,
            "adapter": meta.adapter}


def _watch(row: dict) -> Watch:
    spec = row["spec"]
    dim = int(spec["model"]["dim"])
    vectors = np.frombuffer(row["vectors"], dtype=np.float32).reshape(-1, dim) if dim else np.zeros((0, 0), np.float32)
    given = spec.get("min_score", spec.get("min_sim"))  # `min_sim`: a watch kept before the one score
    return Watch(row["name"], spec["query"], spec["settings"], spec["filters"], None if given is None else float(given),
                 spec["model"],
                 row["mark"], row["created"], row["last_run"], row["feed_key"], row["found"], vectors,
                 list(spec.get("examples") or []), list(spec.get("avoid") or []))


def model_problem(watch: Watch, meta) -> str | None:
    """Why `watch` cannot run on an index of `meta` (its vectors are of another model), or None."""
    if meta is None:
        return "the index is empty"
    now, then = _model_identity(meta), watch.model
    same = (now["fingerprint"] == then["fingerprint"]) if now["fingerprint"] and then["fingerprint"] \
        else now["model"] == then["model"]
    if same and (now["dim"], now["encoder_mode"], now["adapter"]) == (then["dim"], then["encoder_mode"], then["adapter"]):
        return None
    return (f"watch {watch.name}'s query vectors were made with model {then['model']!r} ({then['dim']}-d, "
            f"{then['encoder_mode']}, adapter {then['adapter'] or 'none'}); the index is now {now['model']!r} "
            f"({now['dim']}-d, {now['encoder_mode']}, adapter {now['adapter'] or 'none'}): it is not re-encoded; "
            f"remove it and add it again (`esqbe watch remove {watch.name}`, then `esqbe watch add {watch.name} ...`)")


def list_watches(index) -> list[Watch]:
    """The index's watches, by name."""
    return [_watch(r) for r in _store(index).watch_rows()]


def get_watch(index, name: str) -> Watch:
    rows = _store(index).watch_rows(check_name(name))
    if not rows:
        raise WatchNotFoundError(f"no watch named {name} in this index (`esqbe watch list` lists them)")
    return _watch(rows[0])


def add_watch(index, name: str, *, paper_id: str | None = None, facet: str | None = None,
              sentences: Sequence[int] | None = None, text: str | Sequence[str] | None = None, title: str = "",
              examples: Sequence | None = None, avoid: Sequence | None = None, filters=None,
              min_score: float | None = None, min_sim: float | None = None, now: float | None = None,
              **overrides) -> tuple[Watch, QueryResult]:
    """Save a query as watch `name` (what `Index.query` takes: one paper or text, or `examples` and `avoid`;
    `overrides` among WATCH_SETTING_KEYS) with the threshold `min_score` on the hits' score (`min_sim`: its old
    name; neither: the index's strong matches); papers indexed from now on are new to it. A name already taken is
    refused before anything else is looked at. Returns the watch and the query's result now (the hits it would match
    if they were new, placed on the index's scale). Written in one transaction; refused past the `max_watches`
    setting."""
    check_name(name)
    store = _store(index)
    if store.watch_rows(name):
        raise WatchExistsError(f"a watch named {name} exists already (`esqbe watch remove {name}` first)")
    if min_score is not None and min_sim is not None and float(min_score) != float(min_sim):
        raise WatchError("give min_score (or its old name min_sim), not both")
    min_score = check_min_score(min_score if min_score is not None else min_sim)
    unknown = sorted(set(overrides) - set(WATCH_SETTING_KEYS))
    if unknown:
        raise WatchError(f"a watch cannot keep {', '.join(unknown)}; it keeps {', '.join(WATCH_SETTING_KEYS)}")
    settings = settings_for_facet(index.settings, facet).replace(**overrides)
    if not settings.rescorer or settings.rescorer == "none":
        raise WatchError("a watch's threshold is on the hits' score: rescorer none gives an order, not a score; choose "
                         "a rescorer (e.g. summax)")
    try:
        flt = make_filter(filters, settings=settings)
    except FilterError as e:
        raise WatchError(str(e)) from None
    conditions = [c.to_dict() for c in flt.conditions] if flt else []
    several = examples is not None or bool(avoid)
    result = index.query(paper_id, facet=facet, sentences=sentences, text=text, title=title, examples=examples,
                         avoid=avoid, filters=conditions or None, **overrides)  # every part checked as a query is
    if min_score is None and strong_cut(index, result_settings(index, facet, overrides)) is None:
        raise WatchError(f"the index has no scale for the {settings.rescorer} rescorer's scores to call a match strong "
                         "by: give a threshold (--min-score)")
    meta = index.backend.meta()
    if several:  # what was asked of each (the query chose their sentences: result.examples / result.avoid)
        asked = [ExampleSpec.of(x) for x in (examples or [])], [ExampleSpec.of(x) for x in (avoid or [])]
    else:
        asked = [ExampleSpec(None if paper_id is None else str(paper_id), facet,
                             None if sentences is None else tuple(sentences))], []
    parts: tuple[list[dict], list[dict]] = ([], [])
    rows = []
    for group, chosen_parts, out in ((result.examples, asked[0], parts[0]), (result.avoid, asked[1], parts[1])):
        for ex, want in zip(group, chosen_parts):
            out.append({"paper_id": ex.paper_id if ex.indexed else None, "title": ex.paper.paper.title or "",
                        "facet": ex.facet, "chosen": list(map(int, want.sentences)) if want.sentences is not None else None,
                        "sentences": [[int(i), s] for i, s in zip(ex.indices, ex.sentences)],
                        "facets": [ex.paper.paper.facets[i] for i in ex.indices]})
            rows.append(ex.paper.vectors[ex.indices])
    vectors = np.ascontiguousarray(np.concatenate(rows) if rows else np.zeros((0, meta.dim)), dtype=np.float32)
    head = dict(parts[0][0])
    if not several:  # as a watch of one paper or text has always been kept
        head.update(title=result.query_title or title, facet=normalize_label(facet) if facet else None)
    spec = {"query": head, "settings": dict(overrides), "filters": conditions, "min_score": min_score,
            "model": _model_identity(meta)}
    if several:
        spec.update(examples=parts[0], avoid=parts[1])
    created = time.time() if now is None else float(now)
    row = {"name": name, "spec": spec, "vectors": vectors.tobytes(), "mark": store.next_paper_number(),
           "created": created, "feed_key": secrets.token_urlsafe(24)}
    reason = store.watch_insert(row, int(index.settings.max_watches))
    if reason == "exists":
        raise WatchExistsError(f"a watch named {name} exists already (`esqbe watch remove {name}` first)")
    if reason == "full":
        raise WatchLimitError(f"the index holds {index.settings.max_watches} watches, its limit (the max_watches "
                              "setting, ESQBE_MAX_WATCHES); remove one first")
    return get_watch(index, name), result


def remove_watch(index, name: str) -> None:
    if not _store(index).watch_delete(check_name(name)):
        raise WatchNotFoundError(f"no watch named {name} in this index (`esqbe watch list` lists them)")


def revoke_feed_key(index, name: str) -> str:
    """Give watch `name` a new feed secret (the old URL stops working); returns the new one."""
    key = secrets.token_urlsafe(24)
    if not _store(index).watch_set_key(check_name(name), key):
        raise WatchNotFoundError(f"no watch named {name} in this index (`esqbe watch list` lists them)")
    return key


def feed_key_ok(watch: Watch, given: str | None) -> bool:
    """Whether `given` is the watch's feed secret (compared in constant time)."""
    return bool(given) and secrets.compare_digest(str(given).encode(), watch.feed_key.encode())


def watch_matches(index, name: str, limit: int) -> list[dict]:
    """What watch `name` found, newest first, at most `limit`: each a hit's JSON with `found` (when)."""
    get_watch(index, name)
    return [{**hit, "found": found} for _pid, found, hit in _store(index).watch_matches(name, limit)]


def with_abstracts(index, hits: list[dict]) -> list[dict]:
    """`hits` (a run's matches or a watch's finds) each with its abstract's `sentences`, read from the index where the
    paper is still in it (an export writes each hit's abstract); a paper deleted since keeps none."""
    from ..query.results import sentences_json

    papers = index.get([h["paper_id"] for h in hits if not h.get("sentences")]) if hits else {}
    return [{**h, "sentences": sentences_json(papers[h["paper_id"]])} if not h.get("sentences")
            and h["paper_id"] in papers else h for h in hits]


def _examples_of(watch: Watch) -> tuple[list, list]:
    """The watch's own copy of its query: its examples and papers to avoid (esqbe.query.results.Example), each a paper
    whose sentences are its query sentences, with the stored vectors."""
    examples, avoid = watch.parts()
    out: tuple[list, list] = ([], [])
    row = 0
    for n, (group, into) in enumerate(((examples, out[0]), (avoid, out[1]))):
        for x, part in enumerate(group):
            sents = [s for _, s in part["sentences"]]
            vectors = watch.vectors[row : row + len(sents)]
            row += len(sents)
            pid = part["paper_id"] or (f"watch:{watch.name}" if n == 0 and x == 0 else f"watch:{watch.name}:{n}.{x}")
            paper = Paper(pid, part.get("title") or "", sents, list(part["facets"]))
            into.append(Example(IndexedPaper(paper, vectors), list(range(len(sents))), part["facet"],
                                indexed=part["paper_id"] is not None))
    if row != len(watch.vectors):
        raise QueryError(f"its stored vectors hold {len(watch.vectors)} rows for {row} query sentences")
    return out


class _Plan:
    """One watch's query as a run uses it: settings, filter, the stored examples and papers to avoid."""

    def __init__(self, index, watch: Watch):
        self.watch = watch
        # the settings of the examples' one facet, as `Index.query` chooses them (none when they differ)
        self.settings = watch_settings(index, watch)
        try:
            self.filter = make_filter(watch.filters or None)
        except FilterError as e:
            raise QueryError(f"its filters no longer parse: {e}") from None
        self.examples, self.avoid = _examples_of(watch)
        #: each example's title and metadata (an indexed paper's as stored): a likely duplicate of one is never new
        full = index.backend.get([e.paper.paper_id for e in self.examples if e.indexed])
        stored = {pid: ip.paper for pid, ip in full.items()}
        self.twins_of = [(stored[e.paper.paper_id].title, stored[e.paper.paper_id].metadata)
                         if e.paper.paper_id in stored else (e.paper.paper.title, {}) for e in self.examples]
        #: what a likely version is told by (esqbe.query.versions): each example's whole stored paper (its every
        #: sentence), else its own copy of the query sentences; a version of one is never new either
        self.originals = [Example(full[e.paper.paper_id], list(range(len(full[e.paper.paper_id].paper.sentences))),
                                  e.facet) if e.paper.paper_id in full else e for e in self.examples]
        self.example_ids = {e.paper_id if e.indexed else "(text)" for e in self.examples}
        #: each part's own sentence numbers (in its paper or text), to report the matched pairs by
        self.original = [[int(i) for i, _ in p["sentences"]] for p in watch.parts()[0]], \
            [[int(i) for i, _ in p["sentences"]] for p in watch.avoid]

        #: the score a new paper must reach (the index's strong cut now, for a watch without a number)
        threshold = watch.min_score if watch.min_score is not None else strong_cut(index, self.settings)
        if threshold is None:
            raise QueryError("it keeps strong matches, and the index has no scale for its rescorer's scores now; "
                             "remove it and add it again with --min-score")
        self.threshold: float = threshold

    def run(self, index, context, **kw) -> QueryResult:
        return run_examples(index.backend, self.examples, self.avoid, self.settings, context=context,
                            originals=self.originals, **kw)


def _passing(index, plan: _Plan, new: list[tuple[int, str, dict]], context) -> set[str]:
    """Of one slice of new papers (number, id, metadata), those the watch has not reported that its filters allow
    and its stored query, rescored against them alone, finds at or over its threshold."""
    w = plan.watch
    candidates = [pid for _, pid, meta in new if plan.filter is None or plan.filter.matches(meta)]
    reported = index.backend.watch_reported(w.name, candidates)
    candidates = [pid for pid in candidates if pid not in reported]
    if not candidates:
        return set()
    scored = plan.run(index, context, restrict_to=candidates)
    allowed = set(candidates)
    return _not_twins(index, plan, {h.paper_id for h in scored.hits if h.paper_id in allowed and h.score >= plan.threshold
                                    and h.likely_version_of not in plan.example_ids})  # (a version of an example: not new)


def _not_twins(index, plan: _Plan, ids: set[str]) -> set[str]:
    """`ids` less the likely duplicates of the watch's examples (esqbe.core.workids.same_work: the same title, year and
    first author wherever both give one): the example's own twin from another file is not a new find."""
    if not ids or not any(title for title, _ in plan.twins_of):
        return ids
    found = index.get(sorted(ids))
    return {pid for pid in ids if pid not in found or not any(
        same_work(found[pid].title, found[pid].metadata, title, meta) for title, meta in plan.twins_of)}


def _original(numbers: list[int], i):
    return numbers[i] if i is not None and 0 <= i < len(numbers) else i


def _ranked(index, plan: _Plan, passing: set[str], context) -> list[dict]:
    """The passing papers that rank within the watch's k over the whole index as it is now (the same query, its
    filters too, as `esqbe query` would answer), as hits' JSON, best first."""
    full = plan.run(index, context, filter=plan.filter)
    meta = index.backend.meta()
    scale = index._scale(plan.settings, meta, context) if meta is not None else None
    out = []
    examples, avoided = plan.original
    for hit in full.hits:
        if hit.paper_id in passing and hit.score >= plan.threshold and hit.likely_version_of not in plan.example_ids:
            if scale is not None:  # its band, as a query's hit has it
                hit.percentile, hit.band = scale.place(hit.score)
            for m in hit.matches:  # the query sentences' own numbers in their example
                m.query_index = _original(examples[m.example] if 0 <= m.example < len(examples) else [], m.query_index)
            for j, a in enumerate(hit.avoided or []):
                a.avoid_index = _original(avoided[j] if j < len(avoided) else [], a.avoid_index)
            out.append(hit.to_dict())
    return out


def result_settings(index, facet: str | None, overrides: dict):
    """The settings a watch made with `facet` and `overrides` ranks with (as `Index.query` chooses them)."""
    return settings_for_facet(index.settings, facet).replace(**overrides)


def watch_settings(index, watch: Watch):
    """The settings `watch` ranks with now (its facet's, its own overrides)."""
    examples, _ = watch.parts()
    shared = {p["facet"] for p in examples if p["facet"]} if watch.examples else {watch.query["facet"]} - {None}
    return settings_for_facet(index.settings, shared.pop() if len(shared) == 1 else None).replace(**watch.settings)


def strong_cut(index, settings) -> float | None:
    """The score from which the index's own scale (esqbe.index.scale, for `settings`) calls a match strong: what a
    watch without a number keeps; None where there is no scale to say."""
    meta = index.backend.meta()
    if meta is None:
        return None
    return index.similarity_scale(wait=None, **{k: getattr(settings, k) for k in SCALE_SETTINGS}).strong_from()


def _new_slices(store, mark: int, end: int):
    """The papers numbered in [mark, end), NEW_PAPERS_PER_PASS at a time (whatever arrived since a mark, memory
    stays bounded)."""
    while mark < end:
        rows = store.papers_since(mark, end, NEW_PAPERS_PER_PASS)
        if not rows:
            return
        yield rows
        mark = rows[-1][0] + 1


def run_watches(index, names: Sequence[str] | None = None, *, dry_run: bool = False,
                now: float | None = None) -> list[WatchRun]:
    """Run the named watches (all, if none named): per watch, the papers indexed since its mark that pass its
    threshold and rank within its k against the index now. Unless `dry_run`, each watch's matches and new mark are
    stored in one transaction, under the write lock (taken first, so no paper arrives mid-run). The new papers are
    read in slices, each slice rescored against every watch, so a run after a bulk load needs no more memory."""
    from ..rescore.batches import RescoreContext
    from .api import _LazyEncoder

    store = _store(index)
    wanted = [check_name(n) for n in dict.fromkeys(names or ())]
    if not dry_run:
        store.begin_write()  # like any writer: waits for `esqbe index`; readers go on (WAL)
    watches = list_watches(index)
    if wanted:
        missing = [n for n in wanted if n not in {w.name for w in watches}]
        if missing:
            raise WatchNotFoundError(f"no watch named {', '.join(missing)} in this index (`esqbe watch list`)")
        watches = [w for w in watches if w.name in wanted]
    meta = index.backend.meta()
    end = store.next_paper_number()
    when = time.time() if now is None else float(now)
    context = RescoreContext(encoder=_LazyEncoder(index), backend=index.backend)
    runs = {w.name: WatchRun(w.name, mark_from=w.mark, mark_to=w.mark) for w in watches}
    plans: dict[str, _Plan] = {}
    for w in watches:
        runs[w.name].refused = model_problem(w, meta)
        if runs[w.name].refused is None:
            try:
                plans[w.name] = _Plan(index, w)
                runs[w.name].threshold = plans[w.name].threshold
            except UserError as e:  # its filters or settings no longer valid
                runs[w.name].refused = f"watch {w.name}: its query no longer runs: {e}"
    passing: dict[str, set[str]] = {name: set() for name in plans}
    first = min((plan.watch.mark for plan in plans.values()), default=end)
    for chunk in _new_slices(store, first, end):
        for name, plan in list(plans.items()):
            new = [p for p in chunk if p[0] >= plan.watch.mark]
            runs[name].new_papers += len(new)
            try:
                passing[name] |= _passing(index, plan, new, context) if new else set()
            except QueryError as e:
                runs[name].refused = f"watch {name}: its query no longer runs: {e}"
                del plans[name]
    for name, plan in plans.items():
        run = runs[name]
        run.passed = len(passing[name])
        try:
            found = _ranked(index, plan, passing[name], context) if passing[name] else []
        except QueryError as e:
            run.refused = f"watch {name}: its query no longer runs: {e}"
            continue
        run.matches = [{**m, "found": when} for m in found]
        run.mark_to = end
        if not dry_run:
            run.advanced = store.watch_record(name, end, when, [
                (m["paper_id"], json.dumps(m, ensure_ascii=False, allow_nan=False)) for m in run.matches])
    return [runs[w.name] for w in watches]
