"""CL-SciSumm data: the derived split files (reference papers, citances), the gold and run CSVs, and run files;
malformed files raise `ClScisummDataError` naming the file (and line). Scoring lives in clscisumm.py."""
from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from esqbe.errors import DataError

#: the official CSV header (run files); gold files add `Annotator`
CSV_HEADER = ["Citance Number", "Reference Article", "Citing Article", "Citation Marker Offset", "Citation Marker",
              "Citation Offset", "Citation Text", "Citation Text Clean", "Reference Offset", "Reference Text",
              "Discourse Facet"]


_GOLD_DIRS = {"train": "Training-Gold-csv"}


class ClScisummDataError(DataError):
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
    for _lineno, rec in _read_jsonl(path, ("reference", "sid", "text")):
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


def papers_of(split: Split) -> list:
    """The split's reference papers as esqbe papers: every named sentence in document order, its sid
    kept in `metadata["sentence_ids"]` (so answers name sentences the way the task does)."""
    from ..domain import Paper

    return [Paper(p.paper_id, p.title, list(p.sentences), ["unlabeled"] * len(p.sentences),
                  {"sentence_ids": list(p.sids), "source": "clscisumm"})
            for p in split.papers.values()]
