"""`esqbe eval csfcube --feedback P,N`: relevance feedback measured on the residual collection.

For every query: the single-paper query as the collection's protocol runs it (the baseline); a user who reads its
first 10 hits marks up to P relevant ones (grade >= 2) as further examples and up to N non-relevant ones (grade 0)
as papers to avoid, the highest ranked first; then the query of those examples (`Index.query(examples, avoid)`).
Both runs are scored over the **residual** pool, the judged pool less every marked paper (the baseline's ranking
with them removed; the feedback query never returns them): `baseline-residual.run`, `feedback.run`, and the
residual judgments in the collection's own layout (`residual-qrels/`, pid2anns files and the splits) that
`esqbe.evaluation.metrics` reads back to score both on the same papers."""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ParameterError
from ..query.results import QueryError
from ..settings.config import Settings
from .csfcube import FACETS, anns_file, load_csfcube, load_pid2anns, split_qid
from .evaluate import config_name, default_index_path, ranking_config
from .metrics import METRICS, aggregate, evaluate_run, split_folds, splits_with_all, write_trec_run

#: hits the simulated user reads
READ_DEPTH = 10
#: the grade from which a hit is relevant (the collection's RELEVANT_GRADE) and the one of a wrong hit
RELEVANT, WRONG = 2, 0
#: each feedback count's bound
MAX_FEEDBACK = 10


def parse_feedback(value: str) -> tuple[int, int]:
    """`P,N` (relevant examples added, non-relevant papers avoided) -> (P, N)."""
    parts = str(value).split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        p, n = int(parts[0]), int(parts[1])
    except ValueError:
        raise ParameterError(f"--feedback is P,N: relevant hits added as examples, non-relevant ones avoided, e.g. "
                             f"2,1 (got {value!r})") from None
    if not (0 <= p <= MAX_FEEDBACK and 0 <= n <= MAX_FEEDBACK) or p + n == 0:
        raise ParameterError(f"--feedback P,N: each 0..{MAX_FEEDBACK}, not both 0 (got {value!r})")
    return p, n


@dataclass
class FeedbackResult:
    name: str
    config: dict
    feedback: tuple[int, int]
    #: split -> "baseline" | "feedback" | "difference" -> facet -> metric -> percent
    splits: dict[str, dict[str, dict[str, dict[str, float]]]]
    #: qid -> {"marked_relevant": [...], "marked_wrong": [...], "baseline": {metric}, "feedback": {metric}}
    per_query: dict[str, dict]
    #: split -> facet -> queries where NDCG%20 went up, down, stayed
    wins: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "config": self.config, "feedback": list(self.feedback), "splits": self.splits,
                "wins": self.wins, "per_query": self.per_query, "seconds": self.seconds}


def baseline_query(index, pid: str, facet: str, pool):
    """The single-paper query over a query's pool, and the example that stands for it in the feedback query: the
    paper's facet sentences, or all its sentences where none has the facet's label (as `evaluate_csfcube`)."""
    try:
        return index.query(pid, facet=facet, restrict_to=pool, place_hits=False), {"paper_id": pid, "facet": facet}
    except QueryError:
        return index.query(pid, restrict_to=pool, place_hits=False), {"paper_id": pid}


def simulated_marks(ranking, judged: dict, n_rel: int, n_wrong: int) -> tuple[list[str], list[str]]:
    """What the simulated user marks after reading the first READ_DEPTH hits of `ranking` ((id, score) pairs): up
    to `n_rel` relevant (grade >= RELEVANT) and `n_wrong` non-relevant (grade WRONG) ones, highest ranked first."""
    read = [h for h, _ in ranking[:READ_DEPTH]]
    return ([h for h in read if judged.get(h, 0) >= RELEVANT][:n_rel],
            [h for h in read if judged.get(h, -1) == WRONG][:n_wrong])


def _facet_sentences(index, pid: str, facet: str) -> dict:
    """An example of paper `pid` for a `facet` query: its sentences of the facet, or all of them where it has none
    (a marked paper without one would otherwise be an error; the user still marked it)."""
    paper = index.get([pid]).get(pid)
    if paper is not None and facet in paper.facets:
        return {"paper_id": pid, "facet": facet}
    return {"paper_id": pid, "sentences": list(range(len(paper.sentences)))} if paper and paper.sentences \
        else {"paper_id": pid}


def write_residual_qrels(data_dir: str | Path, residual: dict[str, dict[str, int]], out: Path) -> None:
    """The residual judgments in the collection's own layout: one pid2anns file per facet ({pid: {cands,
    relevance_adju}}) and the collection's evaluation splits beside them."""
    out.mkdir(parents=True, exist_ok=True)
    for facet in FACETS:
        data = {}
        for q, judged in residual.items():
            pid, qfacet = split_qid(q)
            if qfacet == facet:
                data[pid] = {"cands": list(judged), "relevance_adju": list(judged.values())}
        (out / anns_file(facet)).write_text(json.dumps(data))
    shutil.copyfile(Path(data_dir) / "evaluation_splits.json", out / "evaluation_splits.json")


def evaluate_feedback(data_dir: str, settings: Settings, feedback: tuple[int, int], *, facets: str = "keep",
                      index_path: str | None = None, out: str | None = None, progress: bool = False,
                      log=None) -> FeedbackResult:
    """The baseline and the feedback run over the residual pool of every query of the complete splits, scored
    by the collection's measures from the residual judgments as written."""
    from ..index.api import open_index

    log = log or (lambda msg: print(msg, file=sys.stderr))
    n_rel, n_wrong = feedback
    cube = load_csfcube(data_dir)
    splits = cube.scorable_splits()
    path = index_path or default_index_path(settings, facets)
    settings = settings.replace(backend="embedded", path=path)
    baseline, fed, marks = {}, {}, {}
    t0 = time.perf_counter()
    with open_index(path, settings=settings) as index:
        log(f"indexing {data_dir} into {path} (unchanged papers are skipped)")
        index.add_papers(cube.papers(), facets=facets, progress=progress)
        qids = list(dict.fromkeys(q for s in splits for q in cube.query_ids(s)))
        for qid in qids:
            pid, facet = split_qid(qid)
            judged, pool = cube.qrels[qid], cube.pools[qid]
            first, query = baseline_query(index, pid, facet, pool)
            ranking = [(h.paper_id, h.score) for h in first.hits]
            good, bad = simulated_marks(ranking, judged, n_rel, n_wrong)
            marked = set(good) | set(bad)
            marks[qid] = {"marked_relevant": good, "marked_wrong": bad}
            baseline[qid] = [(h, s) for h, s in ranking if h not in marked]
            if marked:
                result = index.query(examples=[query, *(_facet_sentences(index, g, facet) for g in good)],
                                     avoid=[_facet_sentences(index, b, facet) for b in bad],
                                     facet=facet, restrict_to=[c for c in pool if c not in marked], place_hits=False)
                fed[qid] = [(h.paper_id, h.score) for h in result.hits]
            else:  # nothing to mark: the user asks nothing more; the run is the baseline's
                fed[qid] = baseline[qid]
    seconds = {"queries": round(time.perf_counter() - t0, 1)}
    residual = {q: {c: g for c, g in cube.qrels[q].items() if c not in set(marks[q]["marked_relevant"])
                    | set(marks[q]["marked_wrong"])} for q in baseline}
    if out:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_trec_run(out_dir / "baseline-residual.run", baseline, tag="esqbe-baseline-residual")
        write_trec_run(out_dir / "feedback.run", fed, tag=f"esqbe-feedback-{n_rel}-{n_wrong}")
        write_residual_qrels(data_dir, residual, out_dir / "residual-qrels")
        qrels = {}
        for facet in FACETS:  # scored from the files as written: what the collection's script would read
            qrels.update(load_pid2anns(out_dir / "residual-qrels" / anns_file(facet), facet)[0])
    else:
        qrels = residual
    per_base, per_fed = evaluate_run(baseline, qrels), evaluate_run(fed, qrels)
    by_split: dict = {}
    wins: dict = {}
    for s in splits:
        b = aggregate(per_base, cube.splits, s, rounded=False)
        f = aggregate(per_fed, cube.splits, s, rounded=False)
        by_split[s] = {"baseline": _round(b), "feedback": _round(f),
                       "difference": {fc: {m: round(f[fc][m] - b[fc][m], 2) for m in b[fc]} for fc in b}}
        wins[s] = {}
        for fc, folds in splits_with_all(cube.splits).items():
            qs = [q for fold in split_folds(s) for q in folds.get(fold, [])]
            d = [per_fed[q]["NDCG%20"] - per_base[q]["NDCG%20"] for q in qs]
            wins[s][fc] = {"up": sum(x > 1e-12 for x in d), "down": sum(x < -1e-12 for x in d),
                           "same": sum(abs(x) <= 1e-12 for x in d),
                           "mean_difference": round(100 * statistics.mean(d), 2) if d else 0.0}
    per_query = {q: {**marks[q], "baseline": per_base[q], "feedback": per_fed[q]} for q in baseline}
    name = f"feedback-{n_rel}-{n_wrong}-" + config_name(settings, facets)
    result = FeedbackResult(name, ranking_config(settings, facets), feedback, by_split, per_query, wins, seconds)
    if out:
        (Path(out) / "feedback.json").write_text(json.dumps(result.to_dict(), indent=1))
    return result


def _round(table: dict) -> dict:
    return {fc: {m: round(v, 2) for m, v in ms.items()} for fc, ms in table.items()}


def format_feedback(result: FeedbackResult) -> str:
    p, n = result.feedback
    lines = []
    for split, runs in result.splits.items():
        lines.append(f"{result.name} — split {split}, residual pool (feedback: up to {p} relevant as examples, "
                     f"{n} non-relevant avoided, from the first {READ_DEPTH})")
        lines.append(f"{'facet':<12}{'run':<10}" + "".join(f"{m:>9}" for m in METRICS))
        for facet in ("background", "method", "result", "all"):
            if facet not in runs["baseline"]:
                continue
            for run in ("baseline", "feedback", "difference"):
                label = "diff" if run == "difference" else run
                lines.append(f"{facet if run == 'baseline' else '':<12}{label:<10}"
                             + "".join(f"{runs[run][facet][m]:>+9.2f}" if run == "difference"
                                       else f"{runs[run][facet][m]:>9.2f}" for m in METRICS))
            w = result.wins.get(split, {}).get(facet)
            if w:
                lines.append(f"{'':<12}NDCG%20 per query: {w['up']} up, {w['down']} down, {w['same']} same")
    return "\n".join(lines)
