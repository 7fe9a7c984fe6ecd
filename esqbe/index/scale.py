"""Where a hit's score stands against the index's own matches: a weak match looks weak.

A score means little alone (0.09 and 0.56 look alike): summax cosines of one model and corpus sit in a narrow band,
another model's or corpus's elsewhere, and `ot` or `asym` have scales of their own. So each index measures its own:
a seeded sample of up to `SAMPLE_PAPERS` of its papers, each queried by each facet it has (the rescorer, its
parameters, the vector settings and the score's weights of the query being placed; `TOP_K` hits; no filters), and
the scores of those hits, the index's matches, are kept as percentiles (p0..p100). A hit is placed by its score's
percentile among them: **strong** at or above p75 (higher than three quarters of the index's matches), **weak**
below p25, **fair** between. The score is the one that orders the hits (esqbe.query.results.ScoreFormula: a
function of the query and the paper alone), so the band never improves down a list.

The scale is stored with the index (`Backend.write_note`: the embedded index's directory; an engine keeps it in
this process only), keyed by the model, the rescorer and its parameters (`SCALE_SETTINGS`: what decides a match's
similarity; the measuring queries take the index's settings for the rest), and measured again once the index holds
`STALE_CHANGE` (20%) more or fewer papers than it was measured on. It is measured the first time a query needs it:
on the calling thread where the index says it may wait (`Index.scale_waits`: the CLI and the Python API, within
`BUDGET_S`, unless the query runs under a deadline or the backend keeps no note), else (the server's readers) on a
thread of its own with a backend of its own, while queries go on with the scale already stored (or the fixed one)
and say so. An index of fewer than `MIN_PAPERS` papers has too few matches to tell: it gets the shipped fixed scale
(`FIXED`, summax and ts only), which says so; so does one whose measurement ran out of time (remembered for its
paper count).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..domain import QUERY_FACETS
from ..query.combine import run_examples
from ..query.results import Example, QueryError
from ..query.search import select_query_sentences, settings_for_facet
from ..settings.config import Settings

if TYPE_CHECKING:
    from ..backends.base import Backend

log = logging.getLogger("esqbe.scale")

#: papers whose facet queries measure the scale (every paper of a smaller index)
SAMPLE_PAPERS = 100
#: hits per measuring query: the matches a user sees on a page of results
TOP_K = 10
#: below this many papers the index's own matches are too few to place a hit by: the fixed scale
MIN_PAPERS = 20
#: seconds a measurement may take; it keeps what it measured by then (at least `MIN_QUERIES` queries)
BUDGET_S = 20.0
MIN_QUERIES = 10
#: measured again once the index's paper count has changed by more than this fraction since
STALE_CHANGE = 0.2
#: how often (seconds) a process looks at the index's paper count again to see whether its scale is stale
RECHECK_S = 30.0
#: a hit's band by its percentile among the index's matches
STRONG_FROM, WEAK_BELOW = 75.0, 25.0
NOTE = "similarity_scale"
#: the shipped fixed scale (cosine rescorers only), measured once on the bundled sample (300 CSAbstruct abstracts,
#: the default model all-MiniLM-L6-v2, method queries by 58 of its papers against every paper): 80% of papers scored
#: below 0.3, 94% below 0.4 (measured on the similarity; applied to the score, which with the default weights is
#: 0.9 x the similarity + 0.1 x BM25 over the query's best, 0..1)
FIXED = {"summax": (0.3, 0.4), "ts": (0.3, 0.4)}


@dataclass(frozen=True)
class SimilarityScale:
    """What a hit's score is placed against: the index's own matches (`source` "index"), the shipped fixed
    scale ("fixed"), or nothing ("none": a rescorer without similarities, or one the fixed scale has no cuts for)."""

    source: str
    rescorer: str
    #: the scale in words, for a tooltip or a script's reader
    description: str
    #: p0..p100 of the index's matches' similarities (source "index")
    quantiles: tuple[float, ...] = ()
    papers: int = 0  # papers in the index when it was measured
    queries: int = 0  # facet queries measured
    matches: int = 0  # hits' similarities they gave
    key: str = ""
    measured_at: float = 0.0
    #: true while the index's own scale is being measured (again) on another thread
    measuring: bool = False
    extra: dict = field(default_factory=dict)

    def place(self, score: float | None) -> tuple[float | None, str | None]:
        """A score's percentile among the index's matches (None on the fixed scale) and its band."""
        if score is None or not np.isfinite(score):
            return None, None
        if self.source == "index" and len(self.quantiles) == 101:
            q = np.maximum.accumulate(np.asarray(self.quantiles, dtype=np.float64))
            pct = float(np.interp(float(score), q, np.arange(101.0)))
            band = "strong" if pct >= STRONG_FROM else "weak" if pct < WEAK_BELOW else "fair"
            return round(pct, 1), band
        if self.source == "fixed" and self.rescorer in FIXED:
            fair, strong = FIXED[self.rescorer]
            return None, "strong" if score >= strong else "fair" if score >= fair else "weak"
        return None, None

    def bands(self, scores) -> list[str | None]:
        """`place`'s band of each of `scores` (an array of any shape, flattened), all at once."""
        x = np.asarray(scores, dtype=np.float64).ravel()
        out: list[str | None] = [None] * len(x)
        ok = np.isfinite(x)
        if self.source == "index" and len(self.quantiles) == 101:
            q = np.maximum.accumulate(np.asarray(self.quantiles, dtype=np.float64))
            pct = np.interp(x, q, np.arange(101.0))
            names = np.where(pct >= STRONG_FROM, "strong", np.where(pct < WEAK_BELOW, "weak", "fair"))
        elif self.source == "fixed" and self.rescorer in FIXED:
            fair, strong = FIXED[self.rescorer]
            names = np.where(x >= strong, "strong", np.where(x >= fair, "fair", "weak"))
        else:
            return out
        return [str(n) if good else None for n, good in zip(names, ok)]

    def strong_from(self) -> float | None:
        """The lowest score this scale calls strong (p75 of the index's matches, or the fixed scale's cut); None
        without a scale."""
        if self.source == "index" and len(self.quantiles) == 101:
            return float(np.maximum.accumulate(np.asarray(self.quantiles, dtype=np.float64))[int(STRONG_FROM)])
        if self.source == "fixed" and self.rescorer in FIXED:
            return float(FIXED[self.rescorer][1])
        return None

    def public(self) -> dict:
        """The scale as a query result's JSON carries it (`scale`)."""
        pct = None
        if self.source == "index" and len(self.quantiles) == 101:
            pct = {str(p): round(float(self.quantiles[p]), 4) for p in (5, 25, 50, 75, 95)}
        cuts = None
        if self.source == "fixed" and self.rescorer in FIXED:
            cuts = {"fair": FIXED[self.rescorer][0], "strong": FIXED[self.rescorer][1]}
        return {"source": self.source, "rescorer": self.rescorer, "description": self.description,
                "papers": self.papers, "queries": self.queries, "matches": self.matches, "percentiles": pct,
                "cuts": cuts, "measuring": self.measuring,
                "bands": {"strong": f"percentile >= {STRONG_FROM:g}", "fair": f"{WEAK_BELOW:g} <= percentile < "
                          f"{STRONG_FROM:g}", "weak": f"percentile < {WEAK_BELOW:g}"} if pct else None}

    def stored(self) -> dict:
        if "unmeasured" in self.extra:
            return {"unmeasured": self.extra["unmeasured"], "papers": self.papers, "rescorer": self.rescorer}
        return {"quantiles": [round(float(x), 6) for x in self.quantiles], "papers": self.papers,
                "queries": self.queries, "matches": self.matches, "rescorer": self.rescorer,
                "measured_at": self.measured_at, "sampled": int(self.extra.get("sampled", 0))}

    @classmethod
    def from_stored(cls, key: str, d: dict) -> SimilarityScale | None:
        """A stored scale, or None when the note is not one (hand-edited, another version's)."""
        if isinstance(d.get("unmeasured"), str) and isinstance(d.get("papers"), int) and d["papers"] > 0:
            return _unmeasured(str(d.get("rescorer")), d["unmeasured"], d["papers"], key)
        try:
            quantiles = tuple(float(x) for x in d["quantiles"])
            papers, queries, matches = int(d["papers"]), int(d["queries"]), int(d["matches"])
            rescorer = str(d["rescorer"])
        except (KeyError, TypeError, ValueError):
            return None
        if len(quantiles) != 101 or not all(np.isfinite(quantiles)) or papers < 1:
            return None
        sampled = int(d.get("sampled") or 0)
        return cls("index", rescorer, _described(matches, queries, papers, sampled), quantiles, papers, queries,
                   matches, key, float(d.get("measured_at") or 0.0), extra={"sampled": sampled})


def _described(matches: int, queries: int, papers: int, sampled: int) -> str:
    return (f"this index's own matches: the scores of the top {TOP_K} hits of {queries} facet queries by "
            f"{sampled} of its {papers} papers ({matches} matches)")


def fixed_scale(rescorer: str, why: str) -> SimilarityScale:
    """The shipped fixed scale for `rescorer` (no band where it has no cuts), saying why it is used."""
    if rescorer not in FIXED:
        return SimilarityScale("none", rescorer, f"no scale: {why}; the {rescorer} rescorer's similarities are on a "
                               "scale of their own, and the fixed scale is for cosines (summax, ts) only")
    fair, strong = FIXED[rescorer]
    return SimilarityScale("fixed", rescorer, f"the shipped fixed scale ({why}): strong from {strong:g}, fair from "
                           f"{fair:g}, measured once on the bundled sample with the default model all-MiniLM-L6-v2 "
                           "(80% of papers scored below 0.3 against a method query, 94% below 0.4)")


def _unmeasured(rescorer: str, why: str, papers: int, key: str) -> SimilarityScale:
    """The fixed scale where the index's own could not be measured, remembered (stored) for its paper count."""
    found = fixed_scale(rescorer, why)
    return SimilarityScale(**{**found.__dict__, "papers": papers, "key": key, "extra": {"unmeasured": why}})


#: the settings a scale is measured for (the rest, e.g. a query's candidate depth, do not change what a match is)
SCALE_SETTINGS = ("rescorer", "rescorer_params", "vector_centering", "candidate_facet", "facet_penalty",
                  "final_bm25_weight", "abstract_weight", "bm25_text")
#: what a scale measures: the score (a note keyed without it measured the similarity and is not reused)
MEASURES = "score"


def scale_key(settings: Settings, model: str) -> str:
    """What a scale is measured for: the model, the rescorer and its parameters, and the vector settings that change
    a similarity."""
    params = json.dumps(settings.rescorer_params or {}, sort_keys=True, default=str)
    return "|".join([MEASURES, model, settings.rescorer, params, str(settings.vector_centering),
                     str(settings.candidate_facet), f"{float(settings.facet_penalty or 0):g}",
                     f"{float(settings.final_bm25_weight or 0):g}", f"{float(settings.abstract_weight or 0):g}",
                     str(settings.bm25_text)])


def measure(backend: Backend, settings: Settings, *, context=None, sample: int = SAMPLE_PAPERS, seed: int = 0,
            budget_s: float = BUDGET_S, key: str = "") -> SimilarityScale:
    """The index's own scale for `settings`' rescorer and score: facet queries by a seeded sample of its papers, the
    scores of their top `TOP_K` hits, kept as percentiles (see the module's docstring)."""
    start = time.monotonic()
    ids, corpus = backend.sample_papers(sample, seed)
    sims: list[float] = []
    queries = sampled = 0
    for pid in ids:
        if time.monotonic() - start > budget_s:
            break
        paper = backend.get([pid]).get(pid)
        if paper is None:
            continue
        sampled += 1
        for facet in QUERY_FACETS:
            if facet not in paper.paper.facets and "facet_probs" not in (paper.paper.metadata or {}):
                continue
            own = settings_for_facet(settings, facet).replace(k=TOP_K, **{k: getattr(settings, k) for k in
                                                                          SCALE_SETTINGS})
            try:
                indices = select_query_sentences(paper, facet, None, own.query_facet_threshold)
            except QueryError:
                continue
            if time.monotonic() - start > budget_s:
                break
            result = run_examples(backend, [Example(paper, indices, facet)], [], own, context=context)
            queries += 1
            # its TOP_K best scores (a likely version of the paper or of a hit, listed after the numbered hits, is a
            # match by its score as it was before versions were told apart: the scale is of scores)
            sims += sorted((float(h.score) for h in result.hits if np.isfinite(h.score)), reverse=True)[:TOP_K]
    if queries < MIN_QUERIES and time.monotonic() - start > budget_s:
        return _unmeasured(settings.rescorer, f"measuring this index's own took longer than {budget_s:g} s "
                           f"({queries} facet queries)", corpus, key)
    if not sims:
        return _unmeasured(settings.rescorer, "no facet query of this index's papers found a match to measure",
                           corpus, key)
    # as stored (esqbe's note): a process that measured it places a hit as one that reads it
    quantiles = tuple(round(float(x), 6) for x in np.percentile(np.asarray(sims), np.arange(101)))
    return SimilarityScale("index", settings.rescorer, _described(len(sims), queries, corpus, sampled), quantiles,
                           corpus, queries, len(sims), key, round(time.time(), 3), extra={"sampled": sampled})


# --- the scales this process knows, and the measurements under way ----------------------------------------------
_lock = threading.Lock()
_known: dict[tuple[str, str], tuple[SimilarityScale, float]] = {}  # (index, key) -> (scale, when its count was seen)
_running: set[tuple[str, str]] = set()


def _stale(scale: SimilarityScale, papers: int) -> bool:
    return abs(papers - scale.papers) > STALE_CHANGE * scale.papers


def _stored(backend: Backend, key: str) -> SimilarityScale | None:
    note = backend.read_note(NOTE) or {}
    entry = note.get(key) if isinstance(note, dict) else None
    return SimilarityScale.from_stored(key, entry) if isinstance(entry, dict) else None


def _store(backend: Backend, scale: SimilarityScale) -> None:
    note = backend.read_note(NOTE) or {}
    note = note if isinstance(note, dict) else {}
    note[scale.key] = scale.stored()
    backend.write_note(NOTE, note)


def similarity_scale(backend: Backend, settings: Settings, model: str, where: str, *, wait: bool,
                     context=None, opener=None) -> SimilarityScale:
    """The scale a query of `settings` places its hits on (see the module's docstring). `where` names the index
    (the process's memo); `wait`: measure now where due, else on a thread of its own with `opener()`'s backend."""
    if settings.rescorer == "none":
        return SimilarityScale("none", "none", "no scale: the rescorer `none` gives no similarity")
    key = scale_key(settings, model)
    now = time.monotonic()
    with _lock:
        memo = _known.get((where, key))
    if memo is not None and now - memo[1] < RECHECK_S:
        return memo[0]
    papers = backend.paper_count()
    if papers < MIN_PAPERS:
        return fixed_scale(settings.rescorer, f"this index has {papers} papers, fewer than the {MIN_PAPERS} its own "
                                              "scale needs")
    known = [x for x in (_stored(backend, key), memo[0] if memo is not None else None) if x is not None
             and (x.source == "index" or "unmeasured" in x.extra)]  # the stored one first: another process may
    # have measured it since
    fresh = next((x for x in known if not _stale(x, papers)), None)
    if fresh is not None:
        with _lock:
            _known[(where, key)] = (fresh, now)
        return fresh
    scale = next((x for x in known if x.source == "index"), None)
    if wait:
        scale = measure(backend, settings, context=context, key=key)
        if scale.source == "index" or "unmeasured" in scale.extra:
            try:
                _store(backend, scale)
            except OSError as e:  # a read-only index: kept in this process only
                log.info("the similarity scale is not stored with the index: %s", e)
        with _lock:
            _known[(where, key)] = (scale, now)
        return scale
    _measure_elsewhere(where, key, settings, opener)
    if scale is not None:  # the stored one, measured on another paper count: placed by it until the new one is in
        return SimilarityScale(**{**scale.__dict__, "measuring": True,
                                  "description": scale.description + "; being measured again"})
    found = fixed_scale(settings.rescorer, "this index's own scale is being measured")
    return SimilarityScale(**{**found.__dict__, "measuring": True})


def _measure_elsewhere(where: str, key: str, settings: Settings, opener) -> None:
    """Measure on a daemon thread of its own, with a backend of its own (`opener()`), once at a time per scale."""
    if opener is None:
        return
    with _lock:
        if (where, key) in _running:
            return
        _running.add((where, key))

    def run():
        try:
            backend = opener()
            try:
                scale = measure(backend, settings, key=key)
                if scale.source == "index" or "unmeasured" in scale.extra:
                    try:
                        _store(backend, scale)
                    except OSError as e:
                        log.info("the similarity scale is not stored with the index: %s", e)
                    with _lock:
                        _known[(where, key)] = (scale, time.monotonic())
            finally:
                backend.close()
        except Exception as e:  # a query reports its own errors; this one only leaves the scale unmeasured
            log.warning("measuring the index's similarity scale failed: %s: %s", type(e).__name__, e)
            with _lock:  # not tried again for RECHECK_S
                _known[(where, key)] = (fixed_scale(settings.rescorer, f"measuring this index's own failed: {e}"),
                                        time.monotonic())
        finally:
            with _lock:
                _running.discard((where, key))

    threading.Thread(target=run, name="esqbe-scale", daemon=True).start()


def recheck(where: str) -> None:
    """Papers were written to the index named `where` through this process: its next query looks at the paper count
    again (rather than within `RECHECK_S`) to see whether its scale is stale."""
    with _lock:
        for k in [k for k in _known if k[0] == where]:
            scale, _ = _known[k]
            _known[k] = (scale, float("-inf"))


def measuring(where: str) -> bool:
    """Whether a scale of the index named `where` is being measured on a thread of this process."""
    with _lock:
        return any(w == where for w, _ in _running)
