"""CSFCube's ranking measures, computed exactly as the collection's own eval script does.

The reference is `eval_scripts/ranking_eval.py` of github.com/iesl/CSFCube together with the
`rank_metrics` module it imports (bwhite's gist, as vendored by the same authors in allenai/aspire).
Every published CSFCube figure comes from that script, so each measure below reproduces it,
quirks included:

* A query is scored on the candidates **the run ranks**, in the run's order, nothing else: the
  "pool size" is the length of the ranked list, the ideal NDCG ordering is the run's own grades
  sorted, and the relevant count behind recall / AP is the relevant candidates the run ranked.
  A pool candidate the run leaves out simply does not exist for the script.
* Binary measures count grade >= 2 as relevant (`RELEVANT_GRADE`); NDCG uses the raw grade as gain.
* `NDCG%20` cuts at int(0.2 * ranked length); rank 1 is undiscounted and rank i >= 2 is divided by
  log2(i) (the gist's `method=0`), so ranks 1 and 2 weigh the same.
* `RP`, which the script calls R-Precision, is precision at the rank of the **last** relevant
  candidate ranked (0 when there is none), not precision at R.
* `MAP` is the mean of average precision, AP dividing by the relevant candidates ranked.
* `P@20` needs at least 20 ranked candidates (the script raises); `R@20` is 0 with none relevant.

Per-query values (`evaluate_run`) are **fractions** in [0, 1]. `aggregate` follows the script's
`aggregate_metrics_crossval`: the mean over a fold's queries (for `all`, over the pooled queries of
the three facets, not the mean of facet means), then the mean over the folds of the split ("dev" =
fold1_dev; "test" = mean of the fold1_test mean and the fold2_test mean). It returns **percent**
rounded to two decimals the way the collection's reference figures are (`to_percent`).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError, ParameterError

#: binary measures count a candidate relevant from this grade up (the script's threshold_grade)
RELEVANT_GRADE = 2
#: the script's ATK, the cutoff of P@20 / R@20 / NDCG@20
ATK = 20
#: the five measures CSFCube results are reported in, in the order the project prints them
METRICS = ("RP", "P@20", "R@20", "MAP", "NDCG%20")

Run = dict[str, list[tuple[str, float]]]
Qrels = dict[str, dict[str, int]]


# --- the gist's primitives, over arrays in rank order (first element = rank 1) -----------------

def _binary(grades: np.ndarray) -> np.ndarray:
    return np.asarray(grades) >= RELEVANT_GRADE


def precision_at_k(rel: np.ndarray, k: int) -> float:
    """Fraction of the first k that are relevant; like the script, k beyond the list is an error."""
    if k < 1:
        raise ParameterError(f"precision cutoff must be >= 1, got {k}")
    if len(rel) < k:
        raise DataError(f"precision@{k} needs at least {k} ranked candidates, got {len(rel)}")
    return float(np.mean(np.asarray(rel[:k]) != 0))


def recall_at_k(rel: np.ndarray, k: int) -> float:
    """Relevant in the first k over relevant ranked (the script's recall_at_k); 0 when none is."""
    total = int(np.count_nonzero(rel))
    return float(np.count_nonzero(rel[:k])) / total if total > 0 else 0.0


def last_relevant_precision(rel: np.ndarray) -> float:
    """The script's "R-Precision": precision at the rank of the last relevant candidate."""
    hits = np.flatnonzero(rel)
    if not hits.size:
        return 0.0
    return float(np.mean(np.asarray(rel[: hits[-1] + 1]) != 0))


def average_precision(rel: np.ndarray) -> float:
    """Mean of precision at each relevant rank (denominator: relevant candidates ranked)."""
    rel = np.asarray(rel) != 0
    hits = np.flatnonzero(rel)
    if not hits.size:
        return 0.0
    precisions = np.cumsum(rel)[hits] / (hits + 1)
    return float(np.mean(precisions))


def reciprocal_rank(rel: np.ndarray) -> float:
    hits = np.flatnonzero(rel)
    return 1.0 / (hits[0] + 1) if hits.size else 0.0


def dcg_at_k(gains: np.ndarray | Sequence[float], k: int) -> float:
    """Linear-gain DCG of the first k: rank 1 undiscounted, rank i >= 2 divided by log2(i)."""
    r = np.asarray(gains, dtype=float)[:k]
    if not r.size:
        return 0.0
    return float(r[0] + np.sum(r[1:] / np.log2(np.arange(2, r.size + 1))))


def ndcg_at_k(grades: np.ndarray, k: int) -> float:
    """DCG@k over the DCG@k of the same grades sorted best first; 0 when that ideal is 0."""
    ideal = dcg_at_k(sorted(np.asarray(grades).tolist(), reverse=True), k)
    if not ideal:
        return 0.0
    return dcg_at_k(grades, k) / ideal


# --- the measures, declaratively ---------------------------------------------------------------

@dataclass(frozen=True)
class Measure:
    """One measure: `fn` maps a query's graded relevances, in the run's rank order, to a fraction.

    The script's pool is the ranked list itself, so the grades carry all the pool information a
    measure needs (its size, its ideal ordering, its relevant count)."""

    name: str
    fn: Callable[[np.ndarray], float]
    description: str
    script_key: str  # the name in the script's per-query metrics dict

    def __call__(self, grades: Sequence[int] | np.ndarray) -> float:
        return float(self.fn(np.asarray(grades)))


def _f1(grades: np.ndarray) -> float:
    p = precision_at_k(_binary(grades), ATK)
    r = recall_at_k(_binary(grades), ATK)
    return 2 * p * r / (p + r) if (p + r) > 0 else 0.0


MEASURES: dict[str, Measure] = {
    m.name: m
    for m in (
        Measure("RP", lambda g: last_relevant_precision(_binary(g)),
                "precision at the rank of the last relevant candidate (the script's R-Precision)",
                "r_precision"),
        Measure("P@20", lambda g: precision_at_k(_binary(g), ATK),
                "relevant among the top 20", "precision"),
        Measure("R@20", lambda g: recall_at_k(_binary(g), ATK),
                "relevant in the top 20 over relevant ranked", "recall"),
        Measure("MAP", lambda g: average_precision(_binary(g)),
                "average precision (mean over queries when aggregated)", "av_precision"),
        Measure("NDCG%20", lambda g: ndcg_at_k(g, int(0.20 * len(g))),
                "graded NDCG at int(0.2 * ranked length)", "ndcg%20"),
        # computed (NDCG, NDCG@20 also printed) by the script, not part of the reported five
        Measure("NDCG", lambda g: ndcg_at_k(g, len(g)), "graded NDCG over the whole ranked list", "ndcg"),
        Measure("NDCG@20", lambda g: ndcg_at_k(g, 20), "graded NDCG at 20", "ndcg@20"),
        Measure("MRR", lambda g: reciprocal_rank(_binary(g)), "reciprocal rank of the first relevant",
                "reciprocal_rank"),
        Measure("F1@20", _f1, "harmonic mean of P@20 and R@20", "f1"),
    )
}


# --- per query ---------------------------------------------------------------------------------

def ranked_grades(qid: str, ranking: Sequence[tuple[str, float]], judged: Mapping[str, int]) -> np.ndarray:
    """The grades of `ranking`'s candidates in its order; every candidate must be judged."""
    grades = []
    seen = set()
    for item in ranking:
        docid = item[0]
        if docid in seen:
            raise DataError(f"query {qid}: candidate {docid} is ranked twice")
        seen.add(docid)
        try:
            grades.append(int(judged[docid]))
        except KeyError:
            raise DataError(
                f"query {qid}: candidate {docid} is not in its judged pool "
                "(CSFCube runs re-rank the pool; the eval script fails on unjudged candidates)"
            ) from None
    return np.asarray(grades, dtype=int)


def evaluate_run(run: Mapping[str, Sequence[tuple[str, float]]], qrels: Mapping[str, Mapping[str, int]],
                 measures: Iterable[str] = METRICS) -> dict[str, dict[str, float]]:
    """Score every query of `run` -> {qid: {measure: fraction in [0, 1]}}.

    `run` maps "<pid>_<facet>" to candidates **best first**; the list order is the ranking, the
    scores are not looked at (the collection's sample runs list L2 distances, smallest first).
    Every run query must have judgements, every ranked candidate must be judged, none twice.
    """
    names = list(measures)
    unknown = [n for n in names if n not in MEASURES]
    if unknown:
        raise ParameterError(f"unknown measure(s) {unknown}; known: {list(MEASURES)}")
    missing = [q for q in run if q not in qrels]
    if missing:
        raise DataError(f"{len(missing)} run queries have no judgements: {missing[:5]}")
    out: dict[str, dict[str, float]] = {}
    for qid, ranking in run.items():
        grades = ranked_grades(qid, ranking, qrels[qid])
        try:
            out[qid] = {n: MEASURES[n](grades) for n in names}
        except ValueError as err:
            raise DataError(f"query {qid}: {err}") from None
    return out


# --- aggregation -------------------------------------------------------------------------------

#: the script's split names and the folds each averages over
SCRIPT_SPLITS = {"dev": ("fold1_dev",), "test": ("fold1_test", "fold2_test")}


def split_folds(split: str) -> tuple[str, ...]:
    """"dev" -> (fold1_dev,), "test" -> (fold1_test, fold2_test), a fold name -> itself."""
    return SCRIPT_SPLITS.get(split, (split,))


def to_percent(fraction: float) -> float:
    """A fraction as percent rounded to 2 decimals: round(100 * x, 2), ties to even (0.23125 -> 23.12).

    This is how the collection's reference figures (conformance/expected-dev-metrics.json) are
    rounded. The script itself prints the fraction with {:.4f}, which agrees except on exact ties
    of the binary value: it would print 0.2313 where the reference has 23.12 (result P@20 on dev,
    37/160). The reference also carries MAP, which the script computes but does not print.
    """
    return round(100 * fraction, 2)


def aggregate(per_query: Mapping[str, Mapping[str, float]], splits: Mapping[str, Mapping[str, Sequence[str]]],
              split: str = "dev", facets: Iterable[str] | None = None,
              measures: Iterable[str] | None = None, rounded: bool = True) -> dict[str, dict[str, float]]:
    """Per-query fractions -> {facet or "all": {measure: percent}} for one split, as the script does.

    `splits` is the collection's evaluation_splits (facet -> fold name -> qids, "all" included or
    derived); `split` is "dev", "test" or one fold name. Each fold's value is the plain mean over
    its queries; a split's value is the mean of its folds' values. With `rounded` (the default) the
    percent is rounded to 2 decimals (`to_percent`); otherwise it is the unrounded percent.
    """
    facets = list(facets) if facets is not None else list(splits_with_all(splits))
    if measures is None:
        first = next(iter(per_query.values()), {})
        measures = [m for m in MEASURES if m in first]
    measures = list(measures)
    result: dict[str, dict[str, float]] = {}
    for facet in facets:
        folds = splits_with_all(splits).get(facet)
        if folds is None:
            raise DataError(f"no evaluation splits for facet {facet!r}")
        fold_values: dict[str, list[float]] = {m: [] for m in measures}
        for fold in split_folds(split):
            qids = folds.get(fold)
            if not qids:
                raise DataError(f"split {split!r}: fold {fold!r} has no queries for facet {facet!r}")
            missing = [q for q in qids if q not in per_query]
            if missing:
                raise DataError(
                    f"split {split!r}, facet {facet!r}: {len(missing)} of {len(qids)} queries of {fold} "
                    f"were not scored: {missing[:5]}"
                )
            for m in measures:
                total = 0.0
                for q in qids:  # summed in fold order, as the script does
                    total += per_query[q][m]
                fold_values[m].append(total / len(qids))
        result[facet] = {
            m: (to_percent(statistics.mean(v)) if rounded else 100 * statistics.mean(v))
            for m, v in fold_values.items()
        }
    return result


def splits_with_all(splits: Mapping[str, Mapping[str, Sequence[str]]]) -> dict[str, dict[str, list[str]]]:
    """The splits with an "all" entry: the file's own, or each fold's facets concatenated."""
    out = {f: {s: list(q) for s, q in folds.items()} for f, folds in splits.items()}
    if "all" not in out:
        names: dict[str, list[str]] = {}
        for _facet, folds in out.items():
            for s, qids in folds.items():
                names.setdefault(s, []).extend(qids)
        out["all"] = names
    return out


# --- TREC run files ----------------------------------------------------------------------------

def write_trec_run(path: str | Path, run: Mapping[str, Sequence[tuple[str, float]]], tag: str = "esqbe") -> None:
    """Write "qid Q0 docid rank score tag" lines, rank = position in the given (best-first) order."""
    if not tag or any(c.isspace() for c in tag):
        raise ParameterError(f"run tag must be a non-empty word, got {tag!r}")
    path = Path(path)
    with path.open("w", encoding="utf-8") as fp:
        for qid, ranking in run.items():
            for rank, (docid, score) in enumerate(ranking, start=1):
                fp.write(f"{qid} Q0 {docid} {rank} {float(score)!r} {tag}\n")


def read_trec_run(path: str | Path) -> Run:
    """Read a TREC run into {qid: [(docid, score)] ordered by the rank column}.

    Order is taken from the rank column, not the scores (trec_eval re-sorts by score; our runs
    may carry distances, where smaller is better). Errors name the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: run file not found") from None
    rows: dict[str, list[tuple[int, str, float]]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise DataError(f"{path}:{lineno}: expected 'qid Q0 docid rank score tag', got {line!r}")
        qid, _, docid, rank, score, _ = parts
        try:
            rank_i, score_f = int(rank), float(score)
        except ValueError:
            raise DataError(f"{path}:{lineno}: rank must be an integer and score a number: {line!r}") from None
        if math.isnan(score_f):
            raise DataError(f"{path}:{lineno}: score is NaN")
        rows.setdefault(qid, []).append((rank_i, docid, score_f))
    run: Run = {}
    for qid, items in rows.items():
        items.sort(key=lambda t: t[0])  # stable: ties keep file order
        run[qid] = [(docid, score) for _, docid, score in items]
    return run
