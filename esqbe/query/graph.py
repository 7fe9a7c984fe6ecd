"""The neighbourhood of a query's hits: how the hits relate to each other in the query's aspect, as a graph.

    nodes     exactly the query's numbered hits (a QueryResult's, in its order, with its scores and bands): the graph
              is built from the result, never from a query of its own; a likely version of an example or of a hit
              (esqbe.query.versions) is no node, and the graph's JSON lists it under `versions`
    edges     between two hits, the rescorer's own similarity in the query's facet, each way: hit A's sentences of
              the facet (as a query by A would choose them) against hit B's (as the ranking sees a candidate), and
              B's against A's; the edge's weight is the mean of the two. It is a function of the two papers alone
              (and the query's facet and settings), never of which other papers were found. summax and ts are
              computed for every pair at once: the hits' sentence vectors stacked once, one matrix product, then
              per-pair max and mean by segment reductions; another rescorer is run once per hit, batched over all
              hits. Each edge names the sentence pair that makes it: the pair of highest (biased) cosine.
    kept      each hit keeps its `EDGES_PER_NODE` strongest edges among those the index's own scale places at fair
              or strong (esqbe.index.scale: the band a hit of that score gets in the list); an edge is drawn where
              either end keeps it
    groups    Louvain communities (networkx, seeded) of the kept edges, said only where the hits split: at least
              `GROUP_MIN_NODES` hits linked, at least two communities of `GROUP_MIN_SIZE`, and a split stronger
              (modularity) than every one of `NULL_SHUFFLES` seeded shuffles of the same edges gives (the
              configuration model: each hit keeps its weighted degree); else the graph says why there are no groups.
              A group is named by the sentence of a member closest, on average, to the other members (best cosine)
    layout    networkx's spring layout, seeded: identical calls, identical positions; the query's examples and
              papers to avoid take part as anchors, linked to the hits by the hits' own similarity to them

A hit takes part with at most `MAX_SENTENCES` of its sentences on each side (the query's own sentence bound), and
the node says when it was cut (`truncated`).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core import deadline
from ..core.limits import MAX_QUERY_SENTENCES
from ..domain import Candidate, IndexedPaper, normalize_label
from ..rescore.batches import CandidateBatch, QueryBatch, RescoreContext
from ..rescore.registry import make_rescorer
from ..settings.config import Settings
from .results import QueryError, QueryResult, finite, jsonable, public_metadata, result_json
from .search import _candidate_views, select_query_sentences

#: the most hits a graph has (its pairs grow as k squared)
MAX_GRAPH_HITS = 100
#: each hit keeps this many of its strongest edges at fair or above
EDGES_PER_NODE = 5
#: the sentences of a hit taking part, on each side: the query's own bound
MAX_SENTENCES = MAX_QUERY_SENTENCES
#: groups need this many hits with an edge, and communities of at least this many hits (two of them)
GROUP_MIN_NODES = 8
GROUP_MIN_SIZE = 3
#: seeded degree-preserving shuffles of the kept edges the split must beat
NULL_SHUFFLES = 20
#: the seed of the community detection, the shuffles and the layout
SEED = 0
#: the similarity of a pair where one side has no sentence to compare (as the ranking's NO_MATCH)
NO_MATCH = -1.0
#: rescorers whose pairs are computed together by segment reductions (their similarity is a max/mean of cosines)
_SEGMENT_RULES = {"summax": "mean", "ts": "max"}
#: rows of the cosine matrix computed at once (memory: rows x the hits' sentences x 4 bytes)
_CHUNK_ROWS = 1024
GRAPH_JSON_VERSION = 1


@dataclass
class HitSides:
    """Each hit's sentences on both sides of a comparison: as a query by it would choose them (`q_`), and as the
    ranking sees it as a candidate (`c_`, with the soft-facet bias); stacked, with the hit each belongs to."""

    q_vectors: np.ndarray  # (Nq, d)
    q_owner: np.ndarray  # (Nq,) which hit
    q_index: np.ndarray  # (Nq,) the sentence's index in its paper
    c_vectors: np.ndarray  # (Nc, d)
    c_owner: np.ndarray
    c_index: np.ndarray
    c_bias: np.ndarray  # (Nc,) added to every cosine with that sentence
    truncated: list[bool]
    views: list  # the candidate views (for a rescorer run per hit)
    bias: list | None
    q_lists: list[list[int]]
    q_texts: list[str]  # (Nq,) the query-side sentences' texts (a rescorer that reads words: asym_token)


def hit_sides(papers: Sequence[IndexedPaper], facet: str | None, settings: Settings, directions=None) -> HitSides:
    """The sentences of each of `papers` that take part, on each side, as the query's facet and settings choose them
    (at most MAX_SENTENCES each); `directions`: the query's corpus directions (vector_centering), applied to both."""
    facet = normalize_label(facet) if facet else None
    q_lists, truncated = [], []
    for p in papers:
        try:
            chosen = select_query_sentences(p, facet, None, settings.query_facet_threshold)
        except QueryError:  # no sentence of the facet: nothing to ask with
            chosen = []
        truncated.append(len(chosen) > MAX_SENTENCES)
        q_lists.append(chosen[:MAX_SENTENCES])
    views, bias = _candidate_views([Candidate(p.paper_id, 0.0, paper=p) for p in papers], facet, settings)
    cut_views, cut_bias = [], []
    for n, (view, keep) in enumerate(views):
        if len(keep) > MAX_SENTENCES:
            truncated[n] = True
            view = IndexedPaper(type(view.paper)(view.paper.paper_id, view.paper.title,
                                                 view.paper.sentences[:MAX_SENTENCES], view.paper.facets[:MAX_SENTENCES],
                                                 view.paper.metadata), view.vectors[:MAX_SENTENCES])
            keep = keep[:MAX_SENTENCES]
        if directions is not None:
            view = IndexedPaper(view.paper, directions.apply(view.vectors))
        cut_views.append((view, keep))
        if bias is not None:
            cut_bias.append(np.asarray(bias[n], dtype=np.float32)[:MAX_SENTENCES])
    dim = papers[0].vectors.shape[1] if papers else 0
    q_vectors = [np.asarray(p.vectors[q], dtype=np.float32).reshape(len(q), dim) for p, q in zip(papers, q_lists)]
    if directions is not None:
        q_vectors = [directions.apply(v) if len(v) else v for v in q_vectors]
    c_vectors = [np.asarray(v.vectors, dtype=np.float32).reshape(len(keep), dim) for v, keep in cut_views]
    counts_q = [len(q) for q in q_lists]
    counts_c = [len(keep) for _, keep in cut_views]
    c_bias = (np.concatenate(cut_bias) if cut_bias else np.zeros(0, dtype=np.float32)) if bias is not None \
        else np.zeros(sum(counts_c), dtype=np.float32)
    return HitSides(
        np.concatenate(q_vectors) if q_vectors else np.zeros((0, dim), np.float32),
        np.repeat(np.arange(len(papers)), counts_q), np.asarray([i for q in q_lists for i in q], dtype=np.int64),
        np.concatenate(c_vectors) if c_vectors else np.zeros((0, dim), np.float32),
        np.repeat(np.arange(len(papers)), counts_c), np.asarray([i for _, keep in cut_views for i in keep], dtype=np.int64),
        c_bias.astype(np.float32), truncated, cut_views, cut_bias if bias is not None else None, q_lists,
        [p.paper.sentences[i] for p, q in zip(papers, q_lists) for i in q])


def _starts(owner: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each hit's segment starts in a stacked array, and which hits have none."""
    counts = np.bincount(owner, minlength=k)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64), counts == 0


def best_per_hit(sides: HitSides, k: int) -> tuple[np.ndarray, np.ndarray]:
    """R (Nq, k): each query-side sentence's best (biased) cosine with each hit's candidate-side sentences (-inf where
    the hit has none), and J (Nq, k): which candidate-side row gave it. One matrix product (in row chunks), then
    segment reductions over the columns: no loop over pairs."""
    nq, nc = len(sides.q_vectors), len(sides.c_vectors)
    best = np.full((nq, k), -np.inf, dtype=np.float32)
    which = np.zeros((nq, k), dtype=np.int64)
    if nq == 0 or nc == 0:
        return best, which
    starts, empty = _starts(sides.c_owner, k)
    cols = np.arange(nc + 1)
    for r0 in range(0, nq, _CHUNK_ROWS):
        deadline.check()  # a request past its deadline stops between blocks
        block = sides.q_vectors[r0:r0 + _CHUNK_ROWS] @ sides.c_vectors.T + sides.c_bias[None, :]
        # one column of -inf past the end: an empty last segment still has a start, and adds nothing
        block = np.concatenate([block, np.full((len(block), 1), -np.inf, dtype=np.float32)], axis=1)
        top = np.maximum.reduceat(block, starts, axis=1)
        top[:, empty] = -np.inf
        at = np.where(block == np.concatenate([top[:, sides.c_owner], np.full((len(block), 1), np.inf)], axis=1),
                      cols[None, :], nc)
        best[r0:r0 + len(block)] = top
        which[r0:r0 + len(block)] = np.minimum.reduceat(at, starts, axis=1)
    return best, which


def _rows_reduce(values: np.ndarray, owner: np.ndarray, k: int, how: str) -> np.ndarray:
    """(k, k): the rows of `values` (N, k) reduced per owning hit by `how` (mean or max); NaN for a hit with none."""
    starts, empty = _starts(owner, k)
    padded = np.concatenate([values, np.full((1, values.shape[1]), -np.inf, dtype=values.dtype)])
    if how == "max":
        out = np.maximum.reduceat(padded, starts, axis=0).astype(np.float64)
    else:
        counts = np.bincount(owner, minlength=k).astype(np.float64)
        padded[-1] = 0.0
        out = np.add.reduceat(padded.astype(np.float64), starts, axis=0) / np.maximum(counts, 1)[:, None]
    out[empty] = np.nan
    return out


def directed_similarities(sides: HitSides, best: np.ndarray, k: int, rescorer_name: str, rescorer=None) -> np.ndarray:
    """F (k, k): F[a, b] the rescorer's similarity of hit b to a query by hit a's sentences (NO_MATCH where a side has
    nothing to compare). summax / ts from the best-per-hit cosines (segment reductions); any other rescorer run once
    per hit, batched over every hit as candidates."""
    if rescorer_name in _SEGMENT_RULES:
        out = _rows_reduce(best, sides.q_owner, k, _SEGMENT_RULES[rescorer_name])
    else:
        batch = CandidateBatch.from_papers([v for v, _ in sides.views], bias=sides.bias)
        out = np.full((k, k), np.nan)
        for a in range(k):  # one rescorer call per hit, every pair of it at once
            deadline.check()
            rows = sides.q_owner == a
            if not rows.any():
                continue
            texts = [sides.q_texts[i] for i in np.flatnonzero(rows)]
            out[a] = np.asarray(rescorer(QueryBatch(sides.q_vectors[rows], texts), batch).scores, dtype=np.float64)
    return np.where(np.isfinite(out), out, NO_MATCH)


def pair_similarity(a: IndexedPaper, b: IndexedPaper, facet: str | None, settings: Settings, *,
                    context: RescoreContext | None = None, directions=None) -> float:
    """The weight of the edge between papers `a` and `b`, from the two papers alone: the rescorer's similarity of b to a
    query by a's sentences of `facet`, and of a to b's, averaged (what a graph's edge between them weighs, whatever else
    it holds). Computed by the rescorer itself (esqbe.rescore), the reference the graph's batched pairs are held to."""
    rescorer = make_rescorer(settings.rescorer, context or RescoreContext(), **(settings.rescorer_params or {}))
    if rescorer is None:
        raise QueryError("a graph's edges are the rescorer's similarity; rescorer none has none")
    sides = hit_sides([a, b], facet, settings, directions)
    batch = CandidateBatch.from_papers([v for v, _ in sides.views], bias=sides.bias)
    sims = []
    for n, other in ((0, 1), (1, 0)):
        rows = sides.q_owner == n
        if not rows.any():
            sims.append(NO_MATCH)
            continue
        texts = [sides.q_texts[i] for i in np.flatnonzero(rows)]
        got = float(np.asarray(rescorer(QueryBatch(sides.q_vectors[rows], texts), batch).scores)[other])
        sims.append(got if np.isfinite(got) else NO_MATCH)
    return (sims[0] + sims[1]) / 2


def best_pairs(sides: HitSides, best: np.ndarray, which: np.ndarray, k: int):
    """For every ordered pair (a, b): the highest cosine of a query-side sentence of a with a candidate-side sentence
    of b (k, k), and those two sentences' indices in their papers (k, k each; -1 where there is none)."""
    top = _rows_reduce(best, sides.q_owner, k, "max")  # (k, k)
    nq = len(best)
    if nq == 0:
        return top, np.full((k, k), -1), np.full((k, k), -1)
    starts, empty = _starts(sides.q_owner, k)
    rows = np.arange(nq + 1)[:, None]
    target = np.concatenate([top[sides.q_owner], np.full((1, k), np.inf)])
    padded = np.concatenate([best, np.full((1, k), -np.inf, dtype=best.dtype)])
    at = np.where(padded.astype(np.float64) == target, rows, nq)
    row = np.minimum.reduceat(at, starts, axis=0)  # (k, k): the best row of a's segment for b
    ok = (row < nq) & np.isfinite(top) & ~empty[:, None]
    row = np.where(ok, row, 0)
    col = which[row, np.arange(k)[None, :]]
    q_idx = np.where(ok, sides.q_index[row], -1) if len(sides.q_index) else np.full((k, k), -1)
    c_ok = ok & (col < len(sides.c_index))
    c_idx = np.where(c_ok, sides.c_index[np.minimum(col, max(len(sides.c_index) - 1, 0))], -1) \
        if len(sides.c_index) else np.full((k, k), -1)
    return np.where(ok, top, -np.inf), q_idx, c_idx


def kept_edges(weights: np.ndarray, eligible: np.ndarray, per_node: int = EDGES_PER_NODE) -> np.ndarray:
    """(k, k) bool, symmetric: the edges drawn. Each node keeps its `per_node` strongest eligible edges (ties: the
    better-ranked neighbour first); an edge is drawn where either end keeps it."""
    k = len(weights)
    w = np.where(eligible & ~np.eye(k, dtype=bool), weights, -np.inf)
    order = np.argsort(-w, axis=1, kind="stable")[:, :per_node]
    keep = np.zeros((k, k), dtype=bool)
    rows = np.repeat(np.arange(k), order.shape[1])
    keep[rows, order.ravel()] = True
    keep &= np.isfinite(w)
    return keep | keep.T


def find_groups(k: int, edges: Sequence[tuple[int, int, float]], *, seed: int = SEED) -> tuple[list[list[int]], dict]:
    """Communities of the hits by their kept edges (Louvain, networkx), said only where the hits split (see the
    module's docstring): (the groups, each a list of hit positions, largest first; what was found, in words)."""
    import networkx as nx

    graph: nx.Graph = nx.Graph()
    graph.add_nodes_from(range(k))
    graph.add_weighted_edges_from(edges)
    linked = sum(1 for n in graph if graph.degree(n) > 0)
    info: dict = {"method": f"Louvain communities (networkx), seed {seed}", "linked": linked, "modularity": None,
                  "null_modularity_max": None, "shuffles": NULL_SHUFFLES}
    if linked < GROUP_MIN_NODES:
        info.update(status="too_few", note=f"no groups: {linked} of the {k} hits have an edge at fair or above; groups "
                    f"need at least {GROUP_MIN_NODES} linked hits")
        return [], info
    core = graph.subgraph([n for n in graph if graph.degree(n) > 0]).copy()
    parts = nx.community.louvain_communities(core, weight="weight", seed=seed)
    q = float(nx.community.modularity(core, parts, weight="weight"))
    info["modularity"] = round(q, 4)
    big = [sorted(p) for p in parts if len(p) >= GROUP_MIN_SIZE]
    if len(big) < 2:
        info.update(status="no_split", note=f"no groups: the {linked} linked hits do not split into two or more "
                    f"communities of {GROUP_MIN_SIZE} or more (one neighbourhood)")
        return [], info
    null = _null_modularities(core, seed)
    info["null_modularity_max"] = round(max(null), 4) if null else None
    if null and q <= max(null):
        info.update(status="no_split", note=f"no groups: the split's modularity {q:.3f} is no stronger than the same "
                    f"links shuffled give (up to {max(null):.3f} over {len(null)} shuffles, each hit keeping its links' "
                    "total weight): one neighbourhood, not groups")
        return [], info
    big.sort(key=lambda p: (-len(p), p[0]))
    info.update(status="grouped", note=f"{len(big)} groups: modularity {q:.3f}, above every one of {len(null)} "
                f"shuffles of the same links (at most {max(null):.3f})" if null else f"{len(big)} groups: modularity "
                f"{q:.3f}")
    return big, info


def _null_modularities(graph, seed: int) -> list[float]:
    """The best split's modularity of NULL_SHUFFLES seeded shuffles of `graph`: its edges' ends paired again at random,
    their weights shuffled over them (the configuration model, modularity's own null: each node keeps its weighted
    degree; a pair drawn twice adds its weights, a loop stays a loop)."""
    import networkx as nx

    rng = np.random.default_rng(seed)
    index = {n: i for i, n in enumerate(graph)}
    stubs = np.array([index[x] for u, v in graph.edges() for x in (u, v)], dtype=np.int64)
    weights = np.array([d["weight"] for _, _, d in graph.edges(data=True)], dtype=np.float64)
    out = []
    for _ in range(NULL_SHUFFLES):
        pairs = np.sort(rng.permutation(stubs).reshape(-1, 2), axis=1)
        unique, which = np.unique(pairs, axis=0, return_inverse=True)
        summed = np.bincount(which.ravel(), weights=rng.permutation(weights), minlength=len(unique))
        h: nx.Graph = nx.Graph()
        h.add_nodes_from(range(len(index)))
        h.add_weighted_edges_from((int(u), int(v), float(w)) for (u, v), w in zip(unique, summed))
        parts = nx.community.louvain_communities(h, weight="weight", seed=seed)
        out.append(float(nx.community.modularity(h, parts, weight="weight")))
    return out


def group_names(sides: HitSides, best: np.ndarray, groups: Sequence[Sequence[int]], k: int) -> list[tuple[int, int]]:
    """Per group, the sentence its members share most: (hit position, sentence index) of the member sentence whose best
    cosine with each other member is highest on average. All groups at once: one product with the membership."""
    if not groups or not len(best):
        return []
    r = np.where(np.isfinite(best), best, NO_MATCH).astype(np.float64)
    r[np.arange(len(r)), sides.q_owner] = 0.0  # a sentence against its own paper does not count
    member = np.zeros((k, len(groups)))
    for g, hits in enumerate(groups):
        member[list(hits), g] = 1.0
    own = member[sides.q_owner]  # (Nq, G): whether the sentence's paper is in the group
    mean = (r @ member) / np.maximum(member.sum(axis=0)[None, :] - own, 1)
    mean = np.where(own > 0, mean, -np.inf)
    at = mean.argmax(axis=0)
    return [(int(sides.q_owner[i]), int(sides.q_index[i])) for i in at]


@dataclass
class QueryGraph:
    """A query's hits as a graph (see the module's docstring); `to_dict()` is its JSON shape (`esqbe graph --json`,
    POST /graph), which formats.py turns into GraphML and SVG."""

    result: QueryResult
    nodes: list[dict]
    edges: list[dict]
    anchors: list[dict]
    anchor_links: list[dict]
    groups: list[dict]
    grouping: dict
    edge_rule: dict
    layout: dict
    timings: dict = field(default_factory=dict)

    def to_dict(self, papers: Mapping | None = None) -> dict:
        result = result_json(self.result, papers)
        return {"version": GRAPH_JSON_VERSION, "query": result["query"], "rescorer": result["rescorer"],
                "similarity": result["similarity"], "scale": result["scale"], "edge_rule": dict(self.edge_rule),
                "nodes": [dict(n) for n in self.nodes], "edges": [dict(e) for e in self.edges],
                "groups": [dict(g) for g in self.groups], "grouping": dict(self.grouping),
                "anchors": [dict(a) for a in self.anchors], "anchor_links": [dict(x) for x in self.anchor_links],
                "layout": dict(self.layout), "result": result, "timings_ms": dict(self.timings),
                # the hits that are likely versions of an example or of a node: in `result`, listed here, not drawn
                "versions": [{"id": h["paper_id"], "likely_version_of": h["likely_version_of"],
                              "version_overlap": h["version_overlap"]} for h in result["hits"] if h["rank"] is None]}


def _year(metadata: dict) -> int | None:
    year = (metadata or {}).get("year")
    try:
        return int(str(year).strip()[:4]) if year is not None and str(year).strip()[:4].isdigit() else None
    except ValueError:
        return None


def graph_facet(result: QueryResult) -> str | None:
    """The facet the hits are compared in: the one the query's examples share (none: every sentence, as the ranking
    compares a query of chosen sentences or of mixed facets)."""
    facets = {normalize_label(e.facet) if e.facet else None for e in result.examples}
    return facets.pop() if len(facets) == 1 else None


def build_graph(result: QueryResult, papers: Mapping[str, IndexedPaper], settings: Settings, scale, *,
                context: RescoreContext | None = None, directions=None) -> QueryGraph:
    """The graph of `result`'s hits (see the module's docstring). `papers`: the hits' stored papers (with vectors,
    fetched once); `settings`: those the query ran with; `scale`: what its hits were placed on
    (esqbe.index.scale.SimilarityScale: `bands(values)`, the band of each); `directions`: the query's corpus
    directions, if it centred."""
    t0 = time.perf_counter()
    numbered = [h for h in result.hits if h.rank is not None]  # the likely versions (esqbe.query.versions) are no nodes
    if len(numbered) > MAX_GRAPH_HITS:
        raise QueryError(f"a graph has at most {MAX_GRAPH_HITS} hits (got {len(numbered)})")
    rescorer = make_rescorer(settings.rescorer, context or RescoreContext(), **(settings.rescorer_params or {}))
    if rescorer is None:
        raise QueryError("a graph's edges are the rescorer's similarity, and rescorer none has none: choose a "
                         "rescorer (summax, the default)")
    hits = [h for h in numbered if h.paper_id in papers]
    if len(hits) != len(numbered):
        gone = [h.paper_id for h in numbered if h.paper_id not in papers]
        raise QueryError(f"hit(s) {', '.join(gone[:3])} left the index while the graph was drawn; ask again")
    k = len(hits)
    facet = graph_facet(result)
    stored = [papers[h.paper_id] for h in hits]
    sides = hit_sides(stored, facet, settings, directions)
    best, which = best_per_hit(sides, k)
    forward = directed_similarities(sides, best, k, settings.rescorer, rescorer)
    weights = (forward + forward.T) / 2
    top, q_idx, c_idx = best_pairs(sides, best, which, k)
    t_pairs = time.perf_counter()

    flat = scale.bands(weights)  # the list's own bands, for every pair at once
    bands = [flat[r * k:(r + 1) * k] for r in range(k)]
    eligible = np.isin(np.array(flat, dtype=object), ["fair", "strong"]).reshape(k, k)
    keep = kept_edges(weights, eligible)
    pairs = [(int(a), int(b)) for a, b in zip(*np.nonzero(np.triu(keep, 1)))]
    edges = []
    for a, b in pairs:
        # the sentence pair that makes the edge: the stronger of a's best against b and b's best against a
        forward_pair = top[a, b] >= top[b, a]
        sa, sb = (q_idx[a, b], c_idx[a, b]) if forward_pair else (c_idx[b, a], q_idx[b, a])
        pa, pb = stored[a].paper, stored[b].paper
        edges.append({"source": hits[a].paper_id, "target": hits[b].paper_id, "weight": round(float(weights[a, b]), 6),
                      "band": bands[a][b], "forward": round(float(forward[a, b]), 6),
                      "backward": round(float(forward[b, a]), 6),
                      "pair": {"source_index": int(sa), "source_sentence": pa.sentences[sa] if sa >= 0 else None,
                               "target_index": int(sb), "target_sentence": pb.sentences[sb] if sb >= 0 else None,
                               "cosine": finite(round(float(max(top[a, b], top[b, a])), 6))}})
    t_edges = time.perf_counter()

    deadline.check()
    groups, grouping = find_groups(k, [(a, b, float(weights[a, b])) for a, b in pairs])
    named = group_names(sides, best, groups, k)
    group_of = {n: g for g, members in enumerate(groups) for n in members}
    group_list = [{"id": g, "size": len(members), "members": [hits[n].paper_id for n in members],
                   "name": stored[named[g][0]].paper.sentences[named[g][1]], "name_paper": hits[named[g][0]].paper_id,
                   "name_index": named[g][1]} for g, members in enumerate(groups)]
    t_groups = time.perf_counter()

    deadline.check()
    anchors, links = _anchors(result, hits, scale)
    positions = _layout([h.paper_id for h in hits], [a["id"] for a in anchors],
                        [(e["source"], e["target"], e["weight"]) for e in edges]
                        + [(x["anchor"], x["target"], x["weight"]) for x in links])
    for anchor in anchors:
        anchor["x"], anchor["y"] = positions[anchor["id"]]
    nodes = []
    for n, h in enumerate(hits):
        x, y = positions[h.paper_id]
        meta = public_metadata(h.metadata)
        nodes.append({"id": h.paper_id, "rank": h.rank, "title": h.title, "score": finite(h.score) or 0.0,
                      "similarity": finite(h.similarity), "band": h.band, "percentile": finite(h.percentile),
                      "year": _year(meta), "group": group_of.get(n), "x": x, "y": y,
                      "degree": int(keep[n].sum()), "sentences": [len(sides.q_lists[n]), int((sides.c_owner == n).sum())],
                      "truncated": bool(sides.truncated[n]), "metadata": jsonable(meta)})
    t_end = time.perf_counter()
    rule = (f"each hit keeps its {EDGES_PER_NODE} strongest edges whose weight the index's scale places at fair or "
            f"strong; an edge's weight is the {settings.rescorer} similarity of each hit to a query by the other's "
            f"{facet or 'every'} sentence{'s' if facet else ''}, averaged over both ways")
    return QueryGraph(result, nodes, edges, anchors, links, group_list, grouping,
                      {"rule": rule, "per_node": EDGES_PER_NODE, "facet": facet, "rescorer": settings.rescorer,
                       "bands": ["fair", "strong"], "max_sentences": MAX_SENTENCES, "pairs": k * (k - 1) // 2,
                       "pair": "the sentence pair of highest cosine (with the soft-facet bias where the ranking has "
                               "one), either way"},
                      {"method": f"spring layout (networkx), seed {SEED}", "x": [0, 1], "y": [0, 1]},
                      {"pairs": round(1000 * (t_pairs - t0), 2), "edges": round(1000 * (t_edges - t_pairs), 2),
                       "groups": round(1000 * (t_groups - t_edges), 2), "layout": round(1000 * (t_end - t_groups), 2)})


def _anchors(result: QueryResult, hits, scale) -> tuple[list[dict], list[dict]]:
    """The query's examples and papers to avoid, as marked points, each linked to the hits most like it by the hits'
    own similarity to it (the list's `example_similarities`, `avoided`): its EDGES_PER_NODE strongest at fair or
    above."""
    anchors, links = [], []
    for role, group in (("example", result.examples), ("avoid", result.avoid)):
        for j, ex in enumerate(group):
            aid = f"{role}-{j}"
            anchors.append({"id": aid, "role": role, "paper_id": ex.paper_id if ex.indexed else None,
                            "title": ex.paper.paper.title, "facet": ex.facet})
            sims = np.array([_anchor_similarity(h, role, j) for h in hits], dtype=np.float64)
            bands = scale.bands(sims)
            order = sorted((n for n in range(len(hits)) if bands[n] in ("fair", "strong")), key=lambda n: (-sims[n], n))
            links += [{"anchor": aid, "target": hits[n].paper_id, "weight": round(float(sims[n]), 6), "band": bands[n]}
                      for n in order[:EDGES_PER_NODE]]
    return anchors, links


def _anchor_similarity(hit, role: str, j: int) -> float:
    """The hit's similarity to example `j` (role "example") or to paper to avoid `j`, as the list gives it (NaN: none)."""
    got = (hit.example_similarities[j] if j < len(hit.example_similarities) else None) if role == "example" else \
        (hit.avoided[j].similarity if j < len(hit.avoided) else None)
    return float("nan") if got is None else float(got)


def _layout(hit_ids: Sequence[str], anchor_ids: Sequence[str], edges) -> dict[str, tuple[float, float]]:
    """Seeded spring layout (networkx), fitted into [0, 1] x [0, 1] and rounded: identical calls, identical positions."""
    import networkx as nx

    graph: nx.Graph = nx.Graph()
    graph.add_nodes_from([*hit_ids, *anchor_ids])
    graph.add_weighted_edges_from(edges)
    if len(graph) == 1:
        return {n: (0.5, 0.5) for n in graph}
    pos = nx.spring_layout(graph, seed=SEED, weight="weight", iterations=100)
    xy = np.array([pos[n] for n in graph], dtype=np.float64)
    low, span = xy.min(axis=0), np.maximum(xy.max(axis=0) - xy.min(axis=0), 1e-9)
    fitted = (xy - low) / span
    return {n: (round(float(x), 4), round(float(y), 4)) for n, (x, y) in zip(graph, fitted)}
