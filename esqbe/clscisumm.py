"""CL-SciSumm Task 1a (cited text identification): the data, the run format, the official metric.

A data directory (`../shared/data/clscisumm`) holds, under `derived/`, for every split:

* `<split>-citances.jsonl`: one citing sentence a line, `{"reference", "citance", "citing_article",
  "citation_marker", "text"}`;
* `<split>-reference-sentences.jsonl`: the reference papers' sentences in document order,
  `{"reference", "sid", "ssid", "section", "text"}`;
* the gold, where it is released, in the official CSV layout: `derived/Training-Gold-csv/Task1/`
  for `train` (`<paper>_<annotator>.csv`), `derived/<split>-gold-csv/Task1/` for any other split.

A run is one JSON line per citing sentence, `{"reference", "citance", "sentences"}` (sentence
ids, best first). `score_run` scores the first K ids of every citance exactly as the shared task's
`task1_eval.py` (2018) does, quirks included:

* rows are keyed by (reference, citing paper) only, so when a citing paper cites the reference
  several times only its last row counts, in the gold and in the run;
* a row whose `Reference Text` the script cannot parse into non-empty `<S>` elements is dropped
  (the key's earlier row, if any, stands); gold rows whose `Reference Text` is `NA` are skipped;
* TP/FN/FP are summed over every gold file (annotator), micro-averaged; a paper without a run
  file is skipped (we always write one); ZeroDivision yields the integer 0, as printed.

`OfficialScores.lines()` are the `task1a_*`/`task1b_*` lines of the script's `scores.txt`,
formatted as Python 2 prints them (12 significant digits), so figures compare digit for digit.
Malformed files raise `ClScisummDataError` naming the file (and line) and the reason.
"""
from __future__ import annotations

import csv
import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

#: the official CSV header (run files); gold files add `Annotator`
CSV_HEADER = ["Citance Number", "Reference Article", "Citing Article", "Citation Marker Offset", "Citation Marker",
              "Citation Offset", "Citation Text", "Citation Text Clean", "Reference Offset", "Reference Text",
              "Discourse Facet"]
#: sentence ids a run must list per citance (the run format asks for at least 10, best first)
RUN_DEPTH = 10
DEFAULT_K = 2
_GOLD_DIRS = {"train": "Training-Gold-csv"}


class ClScisummDataError(ValueError):
    """A CL-SciSumm file is missing or malformed; the message names the file (and line) and why."""


@dataclass
class Citance:
    reference: str
    citance: str
    citing_article: str
    text: str
    citation_marker: str = ""


@dataclass
class ReferencePaper:
    """A reference paper: its sentences in document order and their `sid`s (sentences without a sid,
    which no answer can name, are left out)."""

    paper_id: str
    sids: list[str]
    sentences: list[str]
    sections: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.sentences[self.sids.index("0")] if "0" in self.sids else ""

    def text_of(self) -> dict[str, str]:
        return dict(zip(self.sids, self.sentences))


@dataclass
class Split:
    name: str
    citances: list[Citance]
    papers: dict[str, ReferencePaper]
    gold_dir: Path | None = None

    def gold_rows(self) -> dict[str, list[dict]]:
        """Gold file name -> its rows (dicts by header), in file order; {} without gold."""
        if self.gold_dir is None:
            return {}
        return {name: read_csv_rows(self.gold_dir / name) for name in gold_files(self.gold_dir)}


def normalize_paper_id(value) -> str:
    """`C02-1025.xml` / `C02-1025.txt` -> `C02-1025` (files spell ids both ways)."""
    return re.sub(r"\.(xml|txt)$", "", str(value).strip())


def _read_jsonl(path: Path, required: tuple[str, ...]) -> Iterable[tuple[int, dict]]:
    if not path.is_file():
        raise ClScisummDataError(f"{path}: missing")
    with path.open(encoding="utf-8") as fp:
        for lineno, line in enumerate(fp, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ClScisummDataError(f"{path}:{lineno}: not valid JSON: {e}") from None
            if not isinstance(rec, dict):
                raise ClScisummDataError(f"{path}:{lineno}: expected a JSON object")
            missing = [k for k in required if k not in rec]
            if missing:
                raise ClScisummDataError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
            yield lineno, rec


def available_splits(data_dir: str | Path) -> list[str]:
    """Splits under DATA/derived/ that have both a citances and a reference-sentences file."""
    derived = Path(data_dir) / "derived"
    if not derived.is_dir():
        raise ClScisummDataError(f"{derived}: missing (expected derived/<split>-citances.jsonl and "
                                 "derived/<split>-reference-sentences.jsonl)")
    names = sorted(p.name[: -len("-citances.jsonl")] for p in derived.glob("*-citances.jsonl"))
    return [n for n in names if (derived / f"{n}-reference-sentences.jsonl").is_file()]


def gold_dir_for(data_dir: str | Path, split: str) -> Path | None:
    derived = Path(data_dir) / "derived"
    for name in (_GOLD_DIRS.get(split), f"{split}-gold-csv", f"{split.capitalize()}-Gold-csv"):
        if name and (derived / name / "Task1").is_dir():
            return derived / name / "Task1"
    return None


def load_split(data_dir: str | Path, split: str) -> Split:
    derived = Path(data_dir) / "derived"
    papers: dict[str, ReferencePaper] = {}
    path = derived / f"{split}-reference-sentences.jsonl"
    for lineno, rec in _read_jsonl(path, ("reference", "sid", "text")):
        ref = normalize_paper_id(rec["reference"])
        paper = papers.setdefault(ref, ReferencePaper(ref, [], [], []))
        sid = str(rec["sid"]).strip()
        if not sid:
            continue  # a sentence without a sid cannot be named by any answer
        paper.sids.append(sid)
        paper.sentences.append(" ".join(str(rec["text"]).split()))
        paper.sections.append(str(rec.get("section") or ""))
    citances = []
    path = derived / f"{split}-citances.jsonl"
    for lineno, rec in _read_jsonl(path, ("reference", "citance", "text")):
        ref = normalize_paper_id(rec["reference"])
        if ref not in papers:
            raise ClScisummDataError(f"{path}:{lineno}: reference {ref} has no sentences in {split}-reference-sentences.jsonl")
        citances.append(Citance(ref, str(rec["citance"]), normalize_paper_id(rec.get("citing_article", "")),
                                str(rec["text"]), str(rec.get("citation_marker") or "")))
    return Split(split, citances, papers, gold_dir_for(data_dir, split))


# --- runs ------------------------------------------------------------------------------------------

Run = dict  # (reference, citance) -> [sentence id, ...] best first


def read_run(path: str | Path) -> Run:
    """A run file (JSONL `{"reference", "citance", "sentences"}`), normalised as the scorer reads it:
    `.xml` suffixes dropped, ids as strings, a repeated (reference, citance) keeps its first line,
    repeated ids keep their first place."""
    run: Run = {}
    for lineno, rec in _read_jsonl(Path(path), ("reference", "citance", "sentences")):
        if not isinstance(rec["sentences"], list):
            raise ClScisummDataError(f"{path}:{lineno}: sentences must be a list of sentence ids")
        key = (normalize_paper_id(rec["reference"]), str(rec["citance"]).strip())
        if key not in run:
            run[key] = list(dict.fromkeys(str(s).strip() for s in rec["sentences"]))
    return run


def write_run(path: str | Path, run: Run) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fp:
        for (ref, cit), ids in run.items():
            fp.write(json.dumps({"reference": ref, "citance": cit, "sentences": list(ids)}) + "\n")


# --- the official CSV layout ------------------------------------------------------------------------


def gold_files(gold_dir: Path) -> list[str]:
    return sorted(f for f in os.listdir(gold_dir) if not f.startswith(".") and (gold_dir / f).is_file())


def read_csv_rows(path: Path) -> list[dict]:
    """Rows as dicts by header; a row whose length differs from the header's is dropped (as the script does)."""
    try:
        with path.open(encoding="utf-8", newline="") as fp:
            rows = list(csv.reader(fp))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ClScisummDataError(f"{path}: cannot read as CSV: {e}") from None
    if not rows:
        raise ClScisummDataError(f"{path}: empty (expected the official CSV header)")
    header = rows[0]
    missing = [c for c in ("Reference Article", "Citing Article", "Reference Offset", "Reference Text") if c not in header]
    if missing:
        raise ClScisummDataError(f"{path}: header lacks {', '.join(missing)}")
    return [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]


def _xml_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def run_rows(paper: ReferencePaper | None, template: list[dict], run: Run, k: int = DEFAULT_K) -> list[dict]:
    """The run CSV rows for one reference paper: one per citance of `template` (its gold/task rows,
    file order) that the run answers, the first eight columns copied, the first `k` ids as
    `'1','94'` and their text as `<S sid=".." ssid="">..</S>` elements (text escaped, so the script
    always parses them; an id the paper does not have reads `(no text)` and costs a false positive).
    A citance the run leaves out or answers with no id gets no row (an empty answer would cost an FP)."""
    texts = paper.text_of() if paper is not None else {}
    rows, seen = [], set()
    for t in template:
        ref = normalize_paper_id(t["Reference Article"])
        cit = str(t.get("Citance Number", "")).strip()
        if (ref, cit) in seen:
            continue
        seen.add((ref, cit))
        ids = run.get((ref, cit), [])[:k]
        if not ids:
            continue
        row = {c: t.get(c, "") for c in CSV_HEADER[:8]}
        row["Reference Article"] = ref
        row["Reference Offset"] = ",".join(f"'{i}'" for i in ids)
        row["Reference Text"] = "".join(f'<S sid="{i}" ssid="">{_xml_text(texts.get(i) or "(no text)")}</S>' for i in ids)
        row["Discourse Facet"] = ""
        rows.append(row)
    return rows


def write_official_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fp:
        w = csv.DictWriter(fp, CSV_HEADER, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


# --- the official metric (task1_eval.py, 2018), reproduced --------------------------------------------


def _strip_one_quote(x: str) -> str:
    if x.startswith(("'", '"')):
        x = x[1:]
    if x.endswith(("'", '"')):
        x = x[:-1]
    return x


def parse_offsets(value: str) -> list[str]:
    """`['1','94']` / `'1','94'` -> ["1", "94"] the script's way (an empty value yields [""])."""
    if value.startswith("["):
        value = value[1:]
    if value.endswith("]"):
        value = value[:-1]
    return [_strip_one_quote(x.strip()) for x in value.split(",")]


def parse_facets(value: str) -> list[str]:
    if not value:
        return []
    inner = value[1:-1] if value[0] == "[" else value
    return [_strip_one_quote(x.strip().lower().replace(" ", "_")) for x in inner.split(",")]


_S_OPEN = re.compile(r"<S\b[^>]*>\s*([^<\s])?")


def reference_text_parses(text: str) -> bool:
    """Whether the script keeps a row: its `Reference Text`, wrapped in <root> with `&` escaped,
    must hold <S> elements that all have text. Well-formed XML is checked exactly; the script reads
    malformed text through BeautifulSoup's recovering parser, which keeps every <S> it opens, so
    there the row counts when every <S> tag is followed by some text."""
    line = ("<root>" + text + "</root>").replace("&amp;", "&").replace("&", "&amp;")
    try:
        root = ET.fromstring(line)
    except ET.ParseError:
        found = _S_OPEN.findall(text)
        return bool(found) and all(found)
    sentences = root.findall("S")
    return bool(sentences) and all(s.text for s in sentences)


def _parse_rows(rows: list[dict]) -> dict:
    """The script's `parse_csv`: (reference, citing paper) -> {"offsets", "facets", "comparable"}."""
    data: dict = {}
    for row in rows:
        if row["Reference Text"] == "NA":
            continue
        key = (row["Reference Article"].replace(".xml", ""), row["Citing Article"].replace(".xml", ""))
        entry = data.setdefault(key, {"comparable": False})
        offsets = parse_offsets(row["Reference Offset"])
        if not reference_text_parses(row["Reference Text"]):
            continue
        entry["offsets"] = offsets
        if "Discourse Facet" in row:
            entry["facets"] = parse_facets(row["Discourse Facet"])
    return data


def _ratio(a, b):
    """a / float(b), or the integer 0 on ZeroDivision (as the script prints it)."""
    return a / float(b) if b else 0


def _f1(p, r):
    return 2.0 * p * r / float(p + r) if (p + r) else 0


def _calculate(gold: dict, submit: dict) -> tuple:
    tp = fn = fp = tp_f = fn_f = fp_f = 0
    for key, g in gold.items():
        if "offsets" not in g:
            continue
        s = submit.get(key)
        for ref in g["offsets"]:
            if s is not None and "offsets" in s:
                if ref in s["offsets"]:
                    tp += 1
                    g["comparable"] = True
                else:
                    fn += 1
            else:
                fn += 1
    for key, s in submit.items():
        if "offsets" not in s:
            continue
        g = gold.get(key)
        for ref in s["offsets"]:
            if g is None or "offsets" not in g or ref not in g["offsets"]:
                fp += 1
    for key, g in gold.items():
        for facet in g.get("facets", ()):
            if g["comparable"]:
                s = submit.get(key, {})
                if facet in s.get("facets", ()):
                    tp_f += 1
                else:
                    fn_f += 1
            else:
                fn_f += 1
    for key, s in submit.items():
        for facet in s.get("facets", ()):
            g = gold.get(key)
            if g is None or "facets" not in g:
                fp_f += 1
            elif g["comparable"] and facet not in g["facets"]:
                fp_f += 1
    p, r = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    pf, rf = _ratio(tp_f, tp_f + fp_f), _ratio(tp_f, tp_f + fn_f)
    return p, r, _f1(p, r), pf, rf, _f1(pf, rf), tp, fp, fn, tp_f, fp_f, fn_f


def py2_str(x) -> str:
    """str(x) as Python 2 prints a number: floats with 12 significant digits."""
    if isinstance(x, int):
        return str(x)
    s = "%.12g" % x
    return s if any(c in s for c in ".enai") else s + ".0"


def _mean(values: list):
    """sum(values) / len(values) with Python 2 semantics (int / int floors), 0 for no values."""
    if not values:
        return 0
    total = sum(values)
    return total // len(values) if isinstance(total, int) else total / len(values)


@dataclass
class OfficialScores:
    """What `task1_eval.py` computes for a run; `precision`/`recall`/`f1` are the micro averages
    (the official Task 1a figures)."""

    tp: int
    fp: int
    fn: int
    precision: float
    recall: float
    f1: float
    precision_macro: float
    recall_macro: float
    f1_macro: float
    per_file: dict[str, tuple]  # gold file -> (p, r, f1, p_facet, r_facet, f1_facet, tp, fp, fn, ...)
    task1b: tuple = (0, 0, 0, 0, 0, 0)  # micro p, macro p, micro r, macro r, micro f1, macro f1
    k: int = DEFAULT_K
    citances_counted: int = 0

    def lines(self) -> list[str]:
        """The lines of the script's scores.txt (per gold file, then the averages)."""
        out = []
        for name, v in self.per_file.items():
            for label, x in zip(("task1a_precision", "task1a_recall", "task1a_f1", "task1b_precision",
                                 "task1b_recall", "task1b_f1"), v[:6]):
                out.append(f"{name}_{label}: {py2_str(x)}")
        b = self.task1b
        out += [f"task1a_precision_micro_avg: {py2_str(self.precision)}",
                f"task1a_precision_macro_avg: {py2_str(self.precision_macro)}",
                f"task1a_recall_micro_avg: {py2_str(self.recall)}",
                f"task1a_recall_macro_avg: {py2_str(self.recall_macro)}",
                f"task1a_f1_micro_avg: {py2_str(self.f1)}",
                f"task1a_f1_macro_avg: {py2_str(self.f1_macro)}",
                f"task1b_precision_micro_avg: {py2_str(b[0])}", f"task1b_precision_macro_avg: {py2_str(b[1])}",
                f"task1b_recall_micro_avg: {py2_str(b[2])}", f"task1b_recall_macro_avg: {py2_str(b[3])}",
                f"task1b_f1_micro_avg: {py2_str(b[4])}", f"task1b_f1_macro_avg: {py2_str(b[5])}"]
        return out

    def to_dict(self) -> dict:
        return {"k": self.k, "precision": self.precision, "recall": self.recall, "f1": self.f1,
                "precision_macro": self.precision_macro, "recall_macro": self.recall_macro,
                "f1_macro": self.f1_macro, "tp": self.tp, "fp": self.fp, "fn": self.fn,
                "citances_counted": self.citances_counted}


def score_files(gold: dict[str, list[dict]], submitted: dict[str, list[dict] | None]) -> OfficialScores:
    """The script's `main` over in-memory CSV rows: `gold` gold file name -> rows, `submitted`
    paper id -> its run file's rows (None: no run file, the paper is skipped)."""
    per_file = {}
    for name, rows in gold.items():
        sub = submitted.get(name.split("_")[0])
        if sub is None:
            continue
        per_file[name] = _calculate(_parse_rows(rows), _parse_rows(sub))
    cols = list(zip(*per_file.values())) if per_file else [[] for _ in range(12)]
    tp, fp, fn, tpf, fpf, fnf = (sum(cols[i]) for i in range(6, 12))
    p, r = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    pm, rm = _mean(list(cols[0])), _mean(list(cols[1]))
    pf, rf = _ratio(tpf, tpf + fpf), _ratio(tpf, tpf + fnf)
    pfm, rfm = _mean(list(cols[3])), _mean(list(cols[4]))
    counted = sum(len(_parse_rows(rows)) for name, rows in gold.items() if name.split("_")[0] in submitted)
    return OfficialScores(tp, fp, fn, p, r, _f1(p, r), pm, rm, _f1(pm, rm), per_file,
                          (pf, pfm, rf, rfm, _f1(pf, rf), _f1(pfm, rfm)), citances_counted=counted)


def run_csv_rows(split: Split, run: Run, k: int = DEFAULT_K) -> dict[str, list[dict]]:
    """Paper id -> the run CSV rows the scorer writes for it (every paper of the gold gets a file)."""
    gold = split.gold_rows()
    templates: dict[str, list[dict]] = {}
    for name, rows in gold.items():
        templates.setdefault(name.split("_")[0], rows)
    return {pid: run_rows(split.papers.get(pid), rows, run, k) for pid, rows in templates.items()}


def score_run(split: Split, run: Run, k: int = DEFAULT_K, *, csv_dir: str | Path | None = None) -> OfficialScores:
    """Score the first `k` ids of each citance as `task1_eval.py` does; with `csv_dir`, also write the
    official files (`csv_dir/res/Task1/<paper>.csv` and the gold under `csv_dir/ref/Task1/`) so the
    script itself can be run on them: `python2 task1_eval.py CSV_DIR OUTPUT`."""
    if split.gold_dir is None:
        raise ClScisummDataError(f"split {split.name} has no gold (derived/<split>-gold-csv/Task1)")
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    submitted = run_csv_rows(split, run, k)
    if csv_dir is not None:
        import shutil

        for pid, rows in submitted.items():
            write_official_csv(Path(csv_dir) / "res" / "Task1" / f"{pid}.csv", rows)
        ref = Path(csv_dir) / "ref" / "Task1"
        ref.mkdir(parents=True, exist_ok=True)
        for name in gold_files(split.gold_dir):
            shutil.copyfile(split.gold_dir / name, ref / name)
    scores = score_files(split.gold_rows(), submitted)
    scores.k = k
    return scores


def parse_scores_txt(text: str) -> dict[str, str]:
    """`name: value` lines of an official scores.txt."""
    out = {}
    for line in text.splitlines():
        if ": " in line:
            name, value = line.split(": ", 1)
            out[name.strip()] = value.strip()
    return out
