"""The CSFCube test collection in its release layout (github.com/iesl/CSFCube).

A release directory holds:

* `abstracts-csfcube-preds.jsonl`: one JSON object a line, `paper_id`, `title`, `abstract`
  (list of sentences), `pred_labels` (`background_label`, ...), `metadata`.
* `test-pid2anns-csfcube-{background,method,result}.json`: query pid -> {"cands": [pid, ...],
  "relevance_adju": [grade 0..3, ...], plus per-annotator keys we ignore}. The query id used
  everywhere (splits, runs, metrics) is "<pid>_<facet>".
* `evaluation_splits.json`: facet (and "all") -> fold name (fold1_dev, fold1_test, ...) -> qids.
* `queries-release.csv`: pid, facet, year, title, paper type.

Runs in the collection's own format (`test-pid2pool-csfcube-{method}-{facet}-ranked.json`:
query pid -> [[candidate pid, score], ...] best first) load with `load_pid2pool_run(s)`.

Every problem with a file is raised as `CSFCubeDataError` naming the file and what is wrong.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from esqbe.errors import DataError, ParameterError
from esqbe.evaluation.metrics import SCRIPT_SPLITS, Run, splits_with_all

FACETS = ("background", "method", "result")
DATASET = "csfcube"
ABSTRACTS_FILE = "abstracts-csfcube-preds.jsonl"
SPLITS_FILE = "evaluation_splits.json"
QUERIES_FILE = "queries-release.csv"
MAX_GRADE = 3


def anns_file(facet: str, dataset: str = DATASET) -> str:
    return f"test-pid2anns-{dataset}-{facet}.json"


def ranked_file(method: str, facet: str, dataset: str = DATASET) -> str:
    return f"test-pid2pool-{dataset}-{method}-{facet}-ranked.json"


def qid(pid: str, facet: str) -> str:
    """The collection's query id: "<pid>_<facet>"."""
    return f"{pid}_{facet}"


def split_qid(query_id: str) -> tuple[str, str]:
    """"<pid>_<facet>" -> (pid, facet)."""
    pid, sep, facet = str(query_id).rpartition("_")
    if not sep or not pid or facet not in FACETS:
        raise ParameterError(f"not a CSFCube query id (<pid>_<facet>, facet in {FACETS}): {query_id!r}")
    return pid, facet


class CSFCubeDataError(DataError):
    """A collection or run file is missing or malformed; `path` says which, the message why."""

    def __init__(self, path: str | Path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class CSFCubeMissingFile(CSFCubeDataError, FileNotFoundError):
    """A file the release layout needs is not there (also a FileNotFoundError)."""


def _load_json(path: Path, what: str):
    if not path.is_file():
        raise CSFCubeMissingFile(path, f"missing ({what})")
    try:
        with path.open(encoding="utf-8") as fp:
            return json.load(fp)
    except json.JSONDecodeError as err:
        raise CSFCubeDataError(path, f"not valid JSON ({what}): {err}") from None
    except UnicodeDecodeError as err:
        raise CSFCubeDataError(path, f"not UTF-8 text ({what}): {err}") from None


# --- judgements ----------------------------------------------------------------------------------

def load_pid2anns(path: str | Path, facet: str) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """One facet's pid2anns file -> (qrels {qid: {cand: grade}}, pools {qid: [cand, ...]})."""
    path = Path(path)
    data = _load_json(path, f"{facet} judgements")
    if not isinstance(data, dict):
        raise CSFCubeDataError(path, "expected an object of query pid -> {cands, relevance_adju}")
    qrels: dict[str, dict[str, int]] = {}
    pools: dict[str, list[str]] = {}
    for pid, entry in data.items():
        where = f"query {pid}"
        if not isinstance(entry, dict) or "cands" not in entry or "relevance_adju" not in entry:
            raise CSFCubeDataError(path, f"{where}: expected keys 'cands' and 'relevance_adju'")
        cands, grades = entry["cands"], entry["relevance_adju"]
        if not isinstance(cands, list) or not isinstance(grades, list):
            raise CSFCubeDataError(path, f"{where}: 'cands' and 'relevance_adju' must be lists")
        if len(cands) != len(grades):
            raise CSFCubeDataError(path, f"{where}: {len(cands)} cands but {len(grades)} grades")
        judged: dict[str, int] = {}
        for cand, grade in zip(cands, grades):
            if isinstance(grade, bool) or not isinstance(grade, int) or not 0 <= grade <= MAX_GRADE:
                raise CSFCubeDataError(path, f"{where}: grade {grade!r} of {cand} is not an integer 0..{MAX_GRADE}")
            cand = str(cand)
            if cand in judged:
                raise CSFCubeDataError(path, f"{where}: candidate {cand} appears twice in the pool")
            judged[cand] = grade
        q = qid(str(pid), facet)
        qrels[q] = judged
        pools[q] = list(judged)
    return qrels, pools


def load_splits(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """evaluation_splits.json -> {facet and "all": {fold name: [qid, ...]}} ("all" derived if absent)."""
    path = Path(path)
    data = _load_json(path, "evaluation splits")
    if not isinstance(data, dict):
        raise CSFCubeDataError(path, "expected an object of facet -> split name -> [qid, ...]")
    for facet, folds in data.items():
        if facet not in FACETS and facet != "all":
            raise CSFCubeDataError(path, f"unknown facet {facet!r}")
        if not isinstance(folds, dict):
            raise CSFCubeDataError(path, f"{facet}: expected an object of split name -> [qid, ...]")
        for name, qids in folds.items():
            if not isinstance(qids, list) or not all(isinstance(q, str) for q in qids):
                raise CSFCubeDataError(path, f"{facet}/{name}: expected a list of '<pid>_<facet>' strings")
            for q in qids:
                try:
                    _, qfacet = split_qid(q)
                except ValueError as err:
                    raise CSFCubeDataError(path, f"{facet}/{name}: {err}") from None
                if facet != "all" and qfacet != facet:
                    raise CSFCubeDataError(path, f"{facet}/{name}: query {q} is of another facet")
    return splits_with_all(data)


def load_queries(path: str | Path) -> dict[str, dict[str, str]]:
    """queries-release.csv -> {qid: row} (row keys: pid, facet, year, title, paper type)."""
    path = Path(path)
    if not path.is_file():
        raise CSFCubeMissingFile(path, "missing (query list)")
    with path.open(encoding="utf-8", newline="") as fp:
        reader = csv.DictReader(fp)
        if not reader.fieldnames or not {"pid", "facet"} <= set(reader.fieldnames):
            raise CSFCubeDataError(path, f"expected a CSV header with 'pid' and 'facet', got {reader.fieldnames}")
        out = {}
        for lineno, row in enumerate(reader, start=2):
            if row["facet"] not in FACETS:
                raise CSFCubeDataError(path, f"line {lineno}: unknown facet {row['facet']!r}")
            out[qid(row["pid"], row["facet"])] = row
    return out


def read_abstracts(path: str | Path) -> Iterator[dict]:
    """The abstracts file's records as raw dicts, lazily; malformed lines raise with their number."""
    path = Path(path)
    if not path.is_file():
        raise CSFCubeMissingFile(path, "missing (abstracts)")
    with path.open(encoding="utf-8") as fp:
        for lineno, line in enumerate(fp, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise CSFCubeDataError(path, f"line {lineno}: not valid JSON: {err}") from None
            if not isinstance(rec, dict) or "paper_id" not in rec or not isinstance(rec.get("abstract"), list):
                raise CSFCubeDataError(path, f"line {lineno}: expected an object with 'paper_id' and an 'abstract' list")
            labels = rec.get("pred_labels")
            if labels is not None and len(labels) != len(rec["abstract"]):
                raise CSFCubeDataError(
                    path, f"line {lineno}: paper {rec['paper_id']}: {len(rec['abstract'])} sentences "
                    f"but {len(labels)} pred_labels")
            rec["paper_id"] = str(rec["paper_id"])
            yield rec


# --- the collection ------------------------------------------------------------------------------

@dataclass
class CSFCube:
    """A loaded release: judgements, pools, splits and query list; abstracts are read on demand."""

    root: Path
    qrels: dict[str, dict[str, int]]  # "<pid>_<facet>" -> {candidate pid: grade 0..3}
    pools: dict[str, list[str]]  # "<pid>_<facet>" -> candidate pids in release order
    splits: dict[str, dict[str, list[str]]]  # facet and "all" -> fold name -> qids
    queries: dict[str, dict[str, str]] = field(default_factory=dict)  # qid -> queries-release.csv row
    _abstracts: dict[str, dict] | None = field(default=None, repr=False)

    @property
    def abstracts_path(self) -> Path:
        return self.root / ABSTRACTS_FILE

    def iter_abstracts(self) -> Iterator[dict]:
        return read_abstracts(self.abstracts_path)

    def abstracts(self) -> dict[str, dict]:
        """All abstracts as raw dicts keyed by paper id (read once, then cached)."""
        if self._abstracts is None:
            self._abstracts = {rec["paper_id"]: rec for rec in self.iter_abstracts()}
        return self._abstracts

    def papers(self):
        """The abstracts as `esqbe.domain.Paper` (via `esqbe.ingest.readers`, strict), lazily."""
        from esqbe.ingest.readers import read_papers

        return read_papers(self.abstracts_path, format="csfcube", strict=True)

    def query_ids(self, split: str = "dev", facet: str = "all") -> list[str]:
        """Queries of a split ("dev", "test" or a fold name) for one facet or "all", in split order."""
        folds = self.splits.get(facet)
        if folds is None:
            raise KeyError(f"no splits for facet {facet!r}")
        out: list[str] = []
        for fold in SCRIPT_SPLITS.get(split, (split,)):
            if fold not in folds:
                raise KeyError(f"split {fold!r} not in {self.root / SPLITS_FILE} for facet {facet!r}")
            out.extend(q for q in folds[fold] if q not in out)
        return out

    def complete_splits(self) -> list[str]:
        """Fold names whose queries, over every facet, all have judgements (fold1_dev in the dev release)."""
        names: list[str] = []
        for folds in self.splits.values():
            names.extend(n for n in folds if n not in names)
        return [n for n in names if self._complete((n,))]

    def scorable_splits(self) -> list[str]:
        """The script's splits ("dev" = fold1_dev, "test" = fold1_test + fold2_test) that can be scored."""
        return [s for s, folds in SCRIPT_SPLITS.items() if self._complete(folds)]

    def _complete(self, folds: Iterable[str]) -> bool:
        for fold in folds:
            for facet in FACETS:
                qids = self.splits.get(facet, {}).get(fold)
                if not qids or any(q not in self.qrels for q in qids):
                    return False
        return True


def load_csfcube(root: str | Path, facets: Iterable[str] = FACETS) -> CSFCube:
    """Load judgements, pools, splits and the query list from a release directory."""
    root = Path(root)
    if not root.is_dir():
        raise CSFCubeMissingFile(root, "CSFCube release directory not found")
    qrels: dict[str, dict[str, int]] = {}
    pools: dict[str, list[str]] = {}
    for facet in facets:
        if facet not in FACETS:
            raise ParameterError(f"unknown facet {facet!r}; CSFCube facets are {FACETS}")
        fq, fp = load_pid2anns(root / anns_file(facet), facet)
        qrels.update(fq)
        pools.update(fp)
    splits = load_splits(root / SPLITS_FILE)
    queries = load_queries(root / QUERIES_FILE) if (root / QUERIES_FILE).is_file() else {}
    if not (root / ABSTRACTS_FILE).is_file():
        raise CSFCubeMissingFile(root / ABSTRACTS_FILE, "missing (abstracts)")
    return CSFCube(root=root, qrels=qrels, pools=pools, splits=splits, queries=queries)


# --- the collection's run format -----------------------------------------------------------------

def load_pid2pool_run(path: str | Path, facet: str) -> Run:
    """A `test-pid2pool-*-{facet}-ranked.json` file -> {"<pid>_<facet>": [(cand, score), ...]}.

    The file order is the ranking (best first); scores are kept as given (the sample SPECTER
    runs list L2 distances, ascending)."""
    path = Path(path)
    if facet not in FACETS:
        raise ParameterError(f"unknown facet {facet!r}; CSFCube facets are {FACETS}")
    data = _load_json(path, f"{facet} ranked pools")
    if not isinstance(data, dict):
        raise CSFCubeDataError(path, "expected an object of query pid -> [[candidate pid, score], ...]")
    run: Run = {}
    for pid, ranking in data.items():
        if not isinstance(ranking, list):
            raise CSFCubeDataError(path, f"query {pid}: expected a list of [candidate pid, score]")
        items = []
        for i, pair in enumerate(ranking):
            if (not isinstance(pair, list | tuple) or len(pair) != 2 or isinstance(pair[1], bool)
                    or not isinstance(pair[1], int | float)):
                raise CSFCubeDataError(path, f"query {pid}, rank {i + 1}: expected [candidate pid, score], got {pair!r}")
            items.append((str(pair[0]), float(pair[1])))
        run[qid(str(pid), facet)] = items
    return run


def load_pid2pool_runs(run_dir: str | Path, method: str, facets: Iterable[str] = FACETS,
                       dataset: str = DATASET) -> Run:
    """All facets of a method's ranked-pool files in `run_dir`, merged into one run."""
    run: Run = {}
    for facet in facets:
        run.update(load_pid2pool_run(Path(run_dir) / ranked_file(method, facet, dataset), facet))
    return run
