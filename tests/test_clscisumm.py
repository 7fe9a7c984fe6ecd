"""CL-SciSumm Task 1a: the official metric (conformance with task1_eval.py), the asymmetric matcher's
math, `esqbe train-words`, `esqbe cite` and `esqbe eval clscisumm` on a miniature data set."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main
from esqbe.evaluation.clscisumm import (
    parse_scores_txt,
    py2_str,
    run_csv_rows,
    score_files,
    score_run,
)
from esqbe.evaluation.clscisumm_data import CSV_HEADER, load_split, read_run
from esqbe.query.cite import CiteOptions
from esqbe.rescore.asym import TokenSet, asym_scores, bm25_scores, symm_scores

from .conftest import shared_path

# --- conformance with the official script -----------------------------------------------------------------


def _conformance_cases():
    root = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "clscisumm" / "conformance" / "official"
    names = sorted(p.name for p in root.iterdir()) if root.is_dir() else ["train-bm25-k2"]
    return names


@pytest.mark.parametrize("case", _conformance_cases())
def test_official_figures_reproduced_digit_for_digit(case):
    """Every line task1_eval.py printed for the sample run (per file and averages) comes out identical."""
    data = shared_path("data", "clscisumm")
    official = data / "conformance" / "official" / case
    name, k = case.rsplit("-k", 1)
    split = load_split(data, "train")
    run = read_run(data / "conformance" / "runs" / f"{name}.jsonl")
    got = parse_scores_txt("\n".join(score_run(split, run, int(k)).lines()))
    expected = parse_scores_txt((official / "scores.txt").read_text())
    assert len(expected) > 12
    assert got == expected
    # and the CSV files we would hand to the script answer the same citances with the same ids
    for pid, rows in run_csv_rows(split, run, int(k)).items():
        with open(official / "Task1" / f"{pid}.csv", encoding="utf-8", newline="") as fp:
            theirs = [(r["Citance Number"], r["Citing Article"], r["Reference Offset"]) for r in csv.DictReader(fp)]
        assert [(r["Citance Number"], r["Citing Article"], r["Reference Offset"]) for r in rows] == theirs


def test_training_gold_counts_as_the_readme_says():
    data = shared_path("data", "clscisumm")
    split = load_split(data, "train")
    assert len(split.citances) == 753 and len(split.papers) == 40
    gold_run = {}
    for _name, rows in split.gold_rows().items():
        for r in rows:
            gold_run[(r["Reference Article"], r["Citance Number"])] = [x.strip("'") for x in r["Reference Offset"].split(",")]
    s = score_run(split, gold_run, k=10)
    assert (s.tp, s.fp, s.fn, s.citances_counted) == (751, 0, 0, 485)
    assert s.f1 == 1.0


def _gold_row(cit, citing, offsets, text='<S sid ="1" ssid = "1">x</S>', facet="Method_Citation"):
    row = dict.fromkeys(CSV_HEADER, "")
    row.update({"Citance Number": cit, "Reference Article": "P1", "Citing Article": citing, "Reference Offset": offsets,
                "Reference Text": text, "Discourse Facet": facet})
    return row


def test_scorer_quirks_on_a_tiny_gold():
    """Only the last row per citing paper counts (gold and run); NA rows are skipped; an unparsable
    Reference Text drops the row; ZeroDivision prints 0."""
    gold = {"P1_ann.csv": [
        _gold_row("1", "C1", "'1','2'"),
        _gold_row("2", "C1", "'3'"),  # the last row of C1: the only one that counts for C1
        _gold_row("3", "C2", "'5'"),
        _gold_row("4", "C3", "NA", text="NA"),
        _gold_row("5", "C4", "'7'", text=""),  # no <S> element: the script drops the row
    ]}
    from esqbe.evaluation.clscisumm_data import ReferencePaper, Split

    paper = ReferencePaper("P1", [str(i) for i in range(10)], [f"s{i}" for i in range(10)])
    split = Split("t", [], {"P1": paper})
    template = gold["P1_ann.csv"]
    from esqbe.evaluation.clscisumm import run_rows

    run = {("P1", "1"): ["1", "2"], ("P1", "2"): ["3", "9"], ("P1", "3"): ["6", "5"], ("P1", "5"): ["7"]}
    s = score_files(gold, {"P1": run_rows(paper, template, run, 2)})
    # C1: gold {3} vs run {3, 9}: TP 1, FP 1; C2: gold {5} vs {6, 5}: TP 1, FP 1; C4 gold dropped: its id is an FP
    assert (s.tp, s.fp, s.fn) == (2, 3, 0)
    assert s.precision == 2 / 5 and s.recall == 1.0
    assert py2_str(s.precision) == "0.4" and py2_str(0) == "0" and py2_str(1.0) == "1.0"
    assert py2_str(1 / 3) == "0.333333333333"
    # a run that answers nothing: the paper's file exists but has no rows -> precision prints as integer 0
    empty = score_files(gold, {"P1": []})
    assert empty.lines()[0] == "P1_ann.csv_task1a_precision: 0"
    assert empty.recall == 0.0 and py2_str(empty.recall) == "0.0"
    del split


def test_read_run_normalises_like_the_scorer(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [
        {"reference": "P1.xml", "citance": 3, "sentences": ["4", "4", 2]},
        {"reference": "P1", "citance": "3", "sentences": ["9"]},  # repeated: the first line stands
    ]) + "\n")
    assert read_run(p) == {("P1", "3"): ["4", "2"]}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reference": "P1", "citance": "1"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field\(s\) sentences"):
        read_run(bad)


# --- the matcher's math against plain loops --------------------------------------------------------------


def _random_set(rng, lengths, dim, vocab):
    n = int(sum(lengths))
    toks = [f"w{int(i)}" for i in rng.integers(0, 12, n)]
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    return TokenSet.build([(toks[a:b], vecs[a:b]) for a, b in zip(np.cumsum([0, *lengths[:-1]]), np.cumsum(lengths))], vocab, dim)


@pytest.mark.parametrize("exact", [False, True])
def test_asym_scores_equal_the_published_formula(exact):
    rng = np.random.default_rng(0)
    vocab: dict = {}
    q = _random_set(rng, [3, 5, 1], 8, vocab)
    c = _random_set(rng, [4, 0, 7, 2], 8, vocab)
    w = rng.uniform(0.1, 1.0, len(q.tokens))
    got = asym_scores(q, w, c, 4.0, exact=exact)
    expected = np.zeros((3, 4))
    for i in range(3):
        qa = int(q.starts[i])
        for s in range(4):
            ca, cl = int(c.starts[s]), int(c.lengths[s])
            if cl == 0:
                continue
            total = 0.0
            for t in range(qa, qa + int(q.lengths[i])):
                best = max((1.0 if exact and q.tokens[t] == c.tokens[u] else float(q.vectors[t] @ c.vectors[u]))
                           for u in range(ca, ca + cl))
                total += w[t] * max(best, 0.0) ** 4
            expected[i, s] = total / w[qa : qa + int(q.lengths[i])].sum()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_symm_and_bm25_against_loops():
    rng = np.random.default_rng(1)
    vocab: dict = {}
    q = _random_set(rng, [3, 2], 6, vocab)
    c = _random_set(rng, [4, 3, 5], 6, vocab)
    sy = symm_scores(q, c)
    for i in range(2):
        mq = q.vectors[q.owner == i].mean(axis=0)
        for s in range(3):
            mc = c.vectors[c.owner == s].mean(axis=0)
            assert sy[i, s] == pytest.approx(mq @ mc / np.linalg.norm(mq) / np.linalg.norm(mc), rel=1e-5)
    bm = bm25_scores(q, c)
    docs = [c.text_tokens(s) for s in range(3)]
    avg = np.mean([len(d) for d in docs])
    for i in range(2):
        for s, doc in enumerate(docs):
            want = 0.0
            for t in q.text_tokens(i):
                df = sum(t in d for d in docs)
                tf = doc.count(t)
                idf = np.log(1 + (3 - df + 0.5) / (df + 0.5))
                want += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(doc) / avg))
            assert bm[i, s] == pytest.approx(want)


def test_options_are_checked():
    assert CiteOptions.from_params({"d": "1", "markers": "false"}).to_params() == {"d": 1.0, "markers": False}
    with pytest.raises(ValueError, match="unknown option"):
        CiteOptions.from_params({"power": 2})
    with pytest.raises(ValueError, match="method must be one of"):
        CiteOptions.from_params({"method": "greedy"})
    with pytest.raises(ValueError, match="d must be greater than 0"):
        CiteOptions.from_params({"d": 0})


# --- word vectors, esqbe cite, esqbe eval clscisumm on a miniature data set --------------------------------

PAPER_A = [
    "Word Re-ordering and DP-based Search in Statistical Machine Translation",
    "We describe a search procedure for statistical machine translation based on dynamic programming.",
    "The traveling salesman problem is an optimization problem over a set of cities.",
    "Word reordering is restricted so that the search stays efficient.",
    "A beam search with pruning thresholds speeds up the decoder considerably.",
    "Experiments are carried out on the Verbmobil task with a limited vocabulary.",
    "The word error rate drops when the reordering restrictions are relaxed.",
    "We compare our approach with the reordering used in the IBM translation model.",
    "The complexity of the algorithm is polynomial in the sentence length.",
    "Future work will address the integration of a trigram language model.",
    "Acknowledgements go to the project partners.",
]
PAPER_B = [
    "Named Entity Recognition with a Maximum Entropy Approach",
    "We present a maximum entropy classifier for named entity recognition.",
    "Global features are extracted from other occurrences of the same token in the document.",
    "Local features describe the token and its immediate neighbours.",
    "The system reaches a high F-measure on the MUC-6 and MUC-7 test data.",
    "Hidden Markov models were used by earlier named entity recognizers.",
    "Capitalisation is a strong cue for names in English text.",
    "Gazetteers of person and location names help the classifier.",
    "The classifier is trained on a small annotated corpus.",
    "Errors come mostly from organisation names.",
    "We thank the reviewers.",
]
CITANCES = [
    ("A", "1", "X1", "dynamic programming search for statistical machine translation (Tillmann and Ney, 2000)", ["1"]),
    ("A", "2", "X1", "they restrict word reordering to keep the search efficient (Tillmann and Ney, 2000)", ["3"]),
    ("A", "3", "X2", "a beam search with pruning thresholds (Tillmann and Ney, 2000)", ["4"]),
    ("B", "1", "Y1", "global features from other occurrences of the token in the document (Chieu and Ng, 2002)", ["2"]),
    ("B", "2", "Y2", "a maximum entropy classifier for named entity recognition [3]", ["1", "8"]),
]


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("clscisumm")
    derived = root / "derived"
    (derived / "Training-Gold-csv" / "Task1").mkdir(parents=True)
    with open(derived / "train-reference-sentences.jsonl", "w") as f:
        for ref, sents in (("A", PAPER_A), ("B", PAPER_B)):
            for i, s in enumerate(sents):
                f.write(json.dumps({"reference": ref, "sid": str(i), "ssid": str(i), "section": "", "text": s}) + "\n")
    with open(derived / "train-citances.jsonl", "w") as f:
        for ref, cit, citing, text, _ in CITANCES:
            f.write(json.dumps({"reference": ref, "citance": cit, "citing_article": citing, "citation_marker": "", "text": text}) + "\n")
    for ref in ("A", "B"):
        with open(derived / "Training-Gold-csv" / "Task1" / f"{ref}_ann.csv", "w", newline="") as f:
            w = csv.DictWriter(f, CSV_HEADER + ["Annotator"])
            w.writeheader()
            sents = PAPER_A if ref == "A" else PAPER_B
            for r, cit, citing, text, gold in CITANCES:
                if r == ref:
                    w.writerow({**dict.fromkeys(CSV_HEADER, ""), "Citance Number": cit, "Reference Article": ref,
                                "Citing Article": citing, "Citation Text Clean": text,
                                "Reference Offset": ",".join(f"'{g}'" for g in gold),
                                "Reference Text": "".join(f'<S sid ="{g}" ssid = "{g}">{sents[int(g)]}</S>' for g in gold),
                                "Discourse Facet": "Method_Citation", "Annotator": "test"})
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "papers.xml").write_text("<PAPER>" + "".join(f'<S sid="{i}">{s}</S>' for i, s in enumerate((PAPER_A + PAPER_B) * 3)) + "</PAPER>")
    return root


@pytest.fixture(scope="module")
def words_dir(mini_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("words") / "w"
    r = CliRunner().invoke(main, ["train-words", str(mini_data / "corpus"), str(mini_data / "derived" / "train-citances.jsonl"),
                                  "--out", str(out), "--dim", "16", "--min-count", "2", "--epochs", "2", "--workers", "1", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["vocabulary"] > 20 and summary["tokens"] > 300
    return out


def test_train_words_writes_vectors_and_counts(words_dir):
    from esqbe.rescore.words import WordVectors

    wv = WordVectors.load(words_dir)
    counts, total = wv.counts()
    assert counts["search"] >= 3 and total == sum(counts.values())
    assert "Tillmann" not in counts  # citation markers are removed before counting
    vecs, known = wv.vectors(["search", "zzz-unseen"])
    assert known.tolist() == [True, False]
    assert np.linalg.norm(vecs[0]) == pytest.approx(1.0, abs=1e-5) and not vecs[1].any()
    meta = json.loads((words_dir / "words.json").read_text())
    assert meta["dim"] == 16 and meta["cased"] is True


def test_train_words_reports_bad_sources(tmp_path):
    r = CliRunner().invoke(main, ["train-words", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "w")])
    assert r.exit_code == 1 and "nope.txt: no such file" in r.output


@pytest.fixture(scope="module")
def mini_index(mini_data, encoder, tmp_path_factory):
    import esqbe
    from esqbe.evaluation.clscisumm_data import load_split, papers_of

    path = tmp_path_factory.mktemp("cite") / "index"
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        index.add_papers(papers_of(load_split(mini_data, "train")), facets="none")
    return path


def test_cite_api_ranks_the_cited_sentence_first(mini_index, words_dir, encoder):
    import esqbe

    with esqbe.open_index(str(mini_index), encoder=encoder, config=None) as index:
        text = "a beam search with pruning thresholds (Tillmann and Ney, 2000)"
        for params in ({"words": str(words_dir)}, {}, {"method": "bm25"}, {"words": str(words_dir), "method": "symm"}):
            result = index.cite("A", text, k=3, **params)
            assert [h.rank for h in result.hits] == [1, 2, 3]
            assert result.hits[0].sentence_id == "4", params
            assert result.hits[0].score >= result.hits[1].score
        # the BM25 mix: each sentence's score is the two parts on their own scales, weighed; not scaled
        # by the other sentences' scores (so the top sentence is not pinned at 1)
        parts = {p["method"]: {h.sentence_id: h.score for h in index.cite("A", text, k=50, **p).hits}
                 for p in ({"words": str(words_dir), "method": "asym"}, {"words": str(words_dir), "method": "bm25"})}
        mixed = {h.sentence_id: h.score for h in index.cite("A", text, k=50, words=str(words_dir), bm25_weight=0.5).hits}
        assert mixed.keys() == parts["asym"].keys() and mixed["4"] == max(mixed.values()) < 1.0
        ceiling = {sid: (2 * mixed[sid] - parts["asym"][sid]) / b for sid, b in parts["bm25"].items() if b > 0}
        assert len(ceiling) > 1 and max(ceiling.values()) == pytest.approx(min(ceiling.values()))  # one per citance
        top = index.cite("A", text, k=1, words=str(words_dir)).hits[0]
        assert {"beam", "pruning", "thresholds"} <= {m.query_word for m in top.matches}
        assert all(m.query_word == m.matched_word and m.cosine == pytest.approx(1.0, abs=1e-4) for m in top.matches[:3])
        from esqbe.query.results import QueryError

        with pytest.raises(QueryError, match="paper Z is not in the index"):
            index.cite("Z", text)


def test_cite_cli(mini_index, words_dir):
    args = ["cite", "--path", str(mini_index), "--paper", "B", "-k", "2",
            "--text", "global features from other occurrences of the token (Chieu and Ng, 2002)",
            "--param", f"words={words_dir}"]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "1. " in r.output and "sentence 2: Global features" in r.output and "matched: " in r.output
    r = CliRunner().invoke(main, args + ["--json"], catch_exceptions=False)
    data = json.loads(r.stdout)
    assert [h["sentence_id"] for h in data["hits"]][0] == "2" and len(data["hits"]) == 2
    r = CliRunner().invoke(main, args[:-2] + ["--param", "d=-1"])
    assert r.exit_code == 1 and "d must be greater than 0" in r.output


def test_eval_clscisumm_end_to_end(mini_data, mini_index, words_dir, tmp_path):
    out = tmp_path / "out"
    args = ["eval", "clscisumm", "--data", str(mini_data), "--index-path", str(mini_index), "--out", str(out),
            "--param", f"words={words_dir}", "--json"]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    scores = data["splits"]["train"]["scores"]
    lines = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(lines) == len(CITANCES) and all(len(x["sentences"]) >= 10 for x in lines)
    # the figures are those of the run file, scored independently with the official rules
    split = load_split(mini_data, "train")
    again = score_run(split, read_run(out / "train.jsonl"), 2)
    assert (scores["tp"], scores["fp"], scores["fn"]) == (again.tp, again.fp, again.fn)
    assert scores["citances_counted"] == 4  # A/X1 cites twice: only its last citance counts
    assert scores["tp"] >= 3
    assert (out / "official" / "train-k2" / "res" / "Task1" / "A.csv").is_file()
    assert "--param words=" in json.loads((out / "results.json").read_text())[data["name"]]["command"]


def test_citation_marker_removal_is_linear_on_unclosed_lists():
    """A sentence cut inside a long "(e.g., A 1995; B 1994; ..." once took minutes (regex backtracking)."""
    import time

    from esqbe.rescore.asym import strip_citation_markers

    text = "advances have been made (e.g., " + "; ".join(f"Author{i} et al. {1980 + i}" for i in range(30)) + ";"
    start = time.perf_counter()
    assert strip_citation_markers(text) == text
    assert time.perf_counter() - start < 0.5
    assert strip_citation_markers("as in (Jie, Liu, and Liang 1991a, 1991b; Lua 1990, 1994, and 1995) x") == "as in x"
    assert strip_citation_markers("reported by Tillmann and Ney (2000), in which", narrative=True) == "reported by, in which"


def test_eval_trains_its_default_word_vectors_from_the_unlabelled_xml(tmp_path, monkeypatch):
    """Without a words option, eval trains word2vec once on DATA's paper XML (never the annotation files)."""
    from esqbe.evaluation.clscisumm import ensure_words, word_corpus
    from esqbe.rescore.words import WordVectors

    paper = tmp_path / "data" / "Training" / "A"
    for sub, name in (("Reference_XML", "A.xml"), ("Citance_XML", "X1.xml")):
        (paper / sub).mkdir(parents=True)
        (paper / sub / name).write_text("<PAPER>" + "".join(f'<S sid="{i}">{s}</S>' for i, s in enumerate(PAPER_A * 3)) + "</PAPER>")
    (paper / "annotation").mkdir()
    (paper / "annotation" / "A.ann.txt").write_text("Citance Number: 1 | Reference Offset: ['4'] | secretlabelword\n")
    sources = word_corpus(tmp_path / "data")
    assert [Path(s).name for s in sources] == ["Reference_XML", "Citance_XML"]
    out = ensure_words(tmp_path / "data", str(tmp_path / "w"), log=lambda m: None)
    wv = WordVectors.load(out)
    assert "search" in wv and "secretlabelword" not in wv.counts()[0]
    assert ensure_words(tmp_path / "data", out) == out  # reused, not retrained


def test_cite_shows_words_not_wordpieces_and_says_what_its_numbers_are(mini_index):
    """ `cite` showed wordpieces (`classification~##ego`) and called every number a cosine."""
    from esqbe.query.cite import whole_word

    assert whole_word("##ego", "held in San Diego, CA") == "Diego"
    assert whole_word("classification", "text classification works") == "classification"
    assert whole_word("##zz", "no such piece") == "##zz"
    base = ["cite", "--path", str(mini_index), "--paper", "B", "-k", "2",
            "--text", "globalisation featurisation from reoccurrences of tokenisations (Chieu and Ng, 2002)"]
    data = json.loads(CliRunner().invoke(main, base + ["--json"], catch_exceptions=False).stdout)
    words = [w for h in data["hits"] for m in h["matches"] for w in (m["query_word"], m["matched_word"])]
    assert words and not [w for w in words if w.startswith("##")], words
    out = CliRunner().invoke(main, base, catch_exceptions=False).output
    assert "score: the sentence's asym match score" in out and "(cosine, weight: the citing word's share)" in out
    out = CliRunner().invoke(main, base + ["--param", "method=bm25"], catch_exceptions=False).output
    assert "score: the sentence's BM25 score for the citing words; matched: the citing words it shares" in out
    assert "(1.00, w 0.00)" not in out


# --- gold shapes the official script reads: several annotators, NA rows, unparsable text ------------------


def _official_scores(tmp_path, gold: dict[str, list[dict]], run_files: dict[str, list[dict]]) -> dict[str, str]:
    """Run the organisers' own task1_eval.py (the Python 3 copy of 2020, which reads `<paper>.annv3.csv` run
    files; same logic as 2018's) on these gold and run rows and return its scores.txt lines."""
    import subprocess
    import sys

    pytest.importorskip("bs4")
    pytest.importorskip("lxml")
    script = shared_path("data", "clscisumm", "evaluation-scripts", "2020-python3", "task1_eval.py")
    ref, res, out = tmp_path / "in" / "ref" / "Task1", tmp_path / "in" / "res" / "Task1", tmp_path / "out"
    for d in (ref, res, out):
        d.mkdir(parents=True)
    for name, rows in gold.items():
        with open(ref / name, "w", newline="", encoding="utf-8") as fp:
            w = csv.DictWriter(fp, CSV_HEADER + ["Annotator"], extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    from esqbe.evaluation.clscisumm import write_official_csv

    for pid, rows in run_files.items():
        write_official_csv(res / f"{pid}.annv3.csv", rows)
    subprocess.run([sys.executable, str(script), str(tmp_path / "in"), str(out)], check=True, capture_output=True)
    return parse_scores_txt((out / "scores.txt").read_text())


def _training_gold_shapes():
    """Two training papers' real gold rows as three shapes: a second annotator who answers some citances
    differently, skips some (NA) and has a citance the first annotator does not; rows whose Reference Text the
    official parser rejects (no <S> element, an <S> without text, unclosed markup)."""
    data = shared_path("data", "clscisumm")
    split = load_split(data, "train")
    gold = {name: rows for name, rows in split.gold_rows().items() if name.split("_")[0] in ("C90-2039", "J98-2005")}
    assert len(gold) == 2
    a = gold["C90-2039_ann.csv"]
    second = []
    for i, row in enumerate(a):
        row = dict(row)
        if i % 4 == 1:
            row["Reference Offset"], row["Reference Text"] = "NA", "NA"
        elif i % 4 == 2:
            row["Reference Offset"] = "'5'"
            row["Reference Text"] = f'<S sid ="5" ssid = "5">{split.papers["C90-2039"].text_of()["5"]}</S>'
        second.append(row)
    # only in the second annotator's file: a citance of a citing paper no other row names
    extra = dict(a[0], **{"Citance Number": "99", "Citing Article": "Z99-9999", "Reference Offset": "'7'",
                          "Reference Text": '<S sid ="7" ssid = "7">seven</S>'})
    second.insert(3, extra)
    gold["C90-2039_ann2.csv"] = second
    j = [dict(r) for r in gold["J98-2005_ann.csv"]]
    j[0]["Reference Text"] = "no sentence element here"
    j[1]["Reference Text"] = '<S sid ="3" ssid = "3"></S>'
    j[2]["Reference Text"] = '<S sid ="4" ssid = "4">open <i>markup</S>'
    gold["J98-2005_ann.csv"] = j
    return split, gold, extra


def test_scoring_matches_the_official_script_on_training_gold_shapes(tmp_path):
    """Several annotator files per paper (the run file answers every citance any of them names, so a citance
    only the second annotator has is not a free false negative), NA rows, reference text the official parser
    rejects: esqbe's figures equal those task1_eval.py prints for the same gold and the run files esqbe writes."""
    from esqbe.evaluation.clscisumm_data import Split

    split, gold, extra = _training_gold_shapes()
    split = Split("train", split.citances, split.papers, None)
    # a run answering each citance with its first annotator's ids (the first two), and the extra citance right
    run = {}
    for rows in gold.values():
        for r in rows:
            ids = [x.strip().strip("'") for x in r["Reference Offset"].split(",")]
            run.setdefault((r["Reference Article"], r["Citance Number"]), [i for i in ids if i != "NA"] or ["1"])
    submitted = run_csv_rows(split, run, 2, gold=gold)
    ours = score_files(gold, submitted)
    assert ("C90-2039", "99") in {(r["Reference Article"], r["Citance Number"]) for r in submitted["C90-2039"]}
    official = _official_scores(tmp_path, gold, submitted)
    mine = parse_scores_txt("\n".join(ours.lines()))
    # the Python 3 copy prints repr-length floats, the 2018 script (and esqbe) Python 2's 12 digits
    names = ["task1a_precision_micro_avg", "task1a_recall_micro_avg", "task1a_f1_micro_avg"]
    names += [f"{name}_task1a_{m}" for name in gold for m in ("precision", "recall", "f1")]
    for name in names:
        assert mine[name] == py2_str(float(official[name])), name
    assert ours.tp > 0 and ours.fp > 0 and ours.fn > 0


def test_eval_clscisumm_without_gold_writes_the_run_and_says_so(mini_data, mini_index, words_dir, tmp_path):
    """A user's own citances have no gold: the run is still written, and the command says it was not scored."""
    import shutil

    data = tmp_path / "data"
    (data / "derived").mkdir(parents=True)
    for kind in ("citances", "reference-sentences"):
        shutil.copyfile(mini_data / "derived" / f"train-{kind}.jsonl", data / "derived" / f"mine-{kind}.jsonl")
    out = tmp_path / "out"
    base = ["eval", "clscisumm", "--data", str(data), "--index-path", str(mini_index), "--param", f"words={words_dir}"]
    r = CliRunner().invoke(main, base + ["--out", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "mine: 5 citances ranked, not scored (no gold for this split)" in r.output
    assert str(out / "mine.jsonl") in r.output
    assert len((out / "mine.jsonl").read_text().splitlines()) == len(CITANCES)
    # without --out the run still goes somewhere, and the message names where
    r = CliRunner().invoke(main, base + ["--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    entry = json.loads(r.stdout)["splits"]["mine"]
    assert entry["scores"] is None and entry["scored"] is False and Path(entry["run"]).is_file()


def test_eval_clscisumm_prints_a_command_that_reproduces_the_run(mini_data, tmp_path):
    """ the printed command (and run name) of `esqbe eval clscisumm` left out the runtime flags that made
    the run (--encoder-backend torch, --encoder-mode, --batch-size): run as printed, it ranked with another encoder
    runtime (onnx-int8 under `auto` on CPU) under the same name. The printed command, run again on a fresh index,
    gives the same name and the same figures."""
    import shlex

    flags = ["--encoder-backend", "torch", "--encoder-mode", "independent", "--batch-size", "8"]
    base = ["eval", "clscisumm", "--data", str(mini_data), "--param", "method=bm25", "--param", "bm25_weight=0.5"]

    def run(args, where):
        out = tmp_path / f"out-{where}"
        r = CliRunner().invoke(main, args + ["--index-path", str(tmp_path / f"index-{where}"), "--out", str(out)],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        (name, entry), = json.loads((out / "results.json").read_text()).items()
        return r.output, name, entry

    text, name, entry = run(base + flags, "first")
    for flag, value in zip(flags[::2], flags[1::2]):
        assert f"{flag} {value}" in entry["command"], entry["command"]
    assert "backend-torch" in name and "independent" in name, name
    assert f"{name} ({entry['command']})" in text, text
    printed = shlex.split(entry["command"])
    assert printed[:3] == ["esqbe", "eval", "clscisumm"]
    _, again_name, again = run(printed[1:], "again")
    assert again_name == name and again["command"] == entry["command"]
    assert again["splits"]["train"]["scores"] == entry["splits"]["train"]["scores"]
