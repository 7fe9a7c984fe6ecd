"""One paper per paper, through the real CLI on a real embedded index: records naming the same
work by DOI or arXiv id (written differently: a resolver address, upper case, `arXiv:` and a version) are one paper,
the later record updating it; both ids find it, in this run and later ones (the alias table in the index's SQLite,
filled for an index made before it); the summary names each merge; a shared title and year without a shared
identifier is reported, never merged."""
from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from click.testing import CliRunner

from cli import main

from .conftest import REPO

DATA = REPO / "tests" / "data" / "library"
DUP_RIS = """TY  - CONF
ID  - vaswani-ris
TI  - Attention is all you need
AU  - Vaswani, Ashish
PY  - 2017
DO  - https://doi.org/10.48550/ARXIV.1706.03762
AB  - We propose the Transformer, a network architecture based solely on attention. It trains faster.
ER  -

TY  - JOUR
ID  - bert-again
TI  - BERT: pre-training of deep bidirectional transformers for language understanding
AU  - Devlin, Jacob
PY  - 2019
AB  - We introduce a new language representation model. It is called BERT.
ER  -
"""
ARXIV_BIB = """@article{balazs2007,
  title = {Calculation of prompt diphoton production cross sections},
  author = {Bal{\\'a}zs, C.},
  year = {2007},
  eprint = {arXiv:0704.0001v2},
  archivePrefix = {arXiv},
  abstract = {A fully differential calculation is presented. It predicts diphoton rates at the LHC.}
}
"""


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args], env={"ESQBE_CONFIG": None})
    assert r.exit_code == 0, r.output
    return r


def ids(ix) -> list[str]:
    return [line.split("\t")[0] for line in run("list", "--path", ix).stdout.splitlines()]


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    (root / "dup.ris").write_text(DUP_RIS)
    (root / "arxiv.bib").write_text(ARXIV_BIB)
    for name in ("zotero.bib", "zotero-csl.json", "arxiv-snapshot.jsonl"):
        shutil.copy(DATA / name, root / name)
    r = run("index", "--path", root / "ix", root / "zotero.bib", root / "zotero-csl.json", root / "arxiv-snapshot.jsonl",
            root / "dup.ris", root / "arxiv.bib")
    return root, r.stdout


def test_records_of_one_work_are_one_paper_and_the_summary_says_so(merged):
    root, out = merged
    assert (f"  merged 2: {root / 'dup.ris'}:1 vaswani-ris into vaswani2017attention (read at {root / 'zotero.bib'}:3; "
            f"same doi 10.48550/arxiv.1706.03762); {root / 'arxiv.bib'}:1 balazs2007 into 0704.0001 (read at "
            f"{root / 'arxiv-snapshot.jsonl'}:1; same arxiv 0704.0001)\n") in out, out
    # the same title and year without a shared identifier: said, not merged
    assert (f"  likely duplicate, not merged (same title and year, no shared DOI, arXiv or PubMed id): "
            f"{root / 'dup.ris'}:10 bert-again, read at {root / 'zotero-csl.json'}:2 as ABCD2345\n") in out, out
    # a conflict in words, each value with its file; BibTeX `inproceedings` and RIS `CONF` are one type, no conflict
    assert (f'  merge conflict, {root / "dup.ris"}:1 into vaswani2017attention: authors: kept "Ashish Vaswani; Noam '
            f'Shazeer; Niki Parmar" ({root / "zotero.bib"}), not "Ashish Vaswani" ({root / "dup.ris"})\n') in out, out
    assert "entry_type" not in out and "{'" not in out, out
    assert ids(root / "ix") == ["0704.0001", "ABCD2345", "bert-again", "vaswani2017attention"]
    # both records are the library's: the first keeps its fields, the later one is a source of
    # it; either id finds it
    for pid in ("vaswani2017attention", "vaswani-ris"):
        shown = json.loads(run("show", "--path", root / "ix", pid, "--json").stdout)
        assert shown["paper_id"] == "vaswani2017attention" and shown["title"] == "Attention Is All You Need"
        assert shown["metadata"]["format"] == "bibtex"
        assert shown["metadata"]["sources"][0]["format"] == "bibtex"  # and every source (below)
    hits = json.loads(run("query", "--path", root / "ix", "--paper", "balazs2007", "--no-server", "--json").stdout)
    assert hits["query"]["paper_id"] == "0704.0001"
    assert "0704.0001" not in [h["paper_id"] for h in hits["hits"]]  # the query paper is not its own hit


def test_a_later_run_merges_into_the_paper_indexed_before_and_json_names_it(merged, tmp_path):
    root, _ = merged
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    r = run("index", "--path", ix, root / "dup.ris", "--json")
    report = json.loads(r.stdout)
    assert report["merged"] == [{"file": str(root / "dup.ris"), "line": 1, "id": "vaswani-ris",
                                 "into": "vaswani2017attention", "into_record": None,
                                 "by": "doi 10.48550/arxiv.1706.03762"}]
    assert report["unchanged"] == 2 and report["indexed"] == 0
    assert ids(ix) == ["0704.0001", "ABCD2345", "bert-again", "vaswani2017attention"]
    text = run("index", "--path", ix, root / "dup.ris").stdout
    assert (f"  merged 1: {root / 'dup.ris'}:1 vaswani-ris into vaswani2017attention (already in the index; "
            f"same doi 10.48550/arxiv.1706.03762)\n") in text, text


def test_an_index_made_before_the_alias_table_gets_its_papers_identifiers(tmp_path):
    ix = tmp_path / "ix"
    run("index", "--path", ix, DATA / "zotero.bib")
    with sqlite3.connect(ix / "papers.sqlite") as db:  # as an esqbe before the table left it
        db.execute("DROP TABLE aliases")
        db.execute("DELETE FROM settings WHERE key = 'aliases_filled'")
    (tmp_path / "dup.ris").write_text(DUP_RIS)
    out = run("index", "--path", ix, tmp_path / "dup.ris").stdout
    assert "merged 1: " in out and "vaswani-ris into vaswani2017attention (already in the index" in out, out
    assert ids(ix) == ["bert-again", "vaswani2017attention"]


def test_identifiers_are_compared_normalised():
    from esqbe.core.workids import title_key, work_keys

    meta = {"external_ids": {"doi": "https://dx.doi.org/10.1088/1742-6596/ABC", "arxiv": "arXiv:2101.00001v3",
                             "pubmed": 31452104}}
    assert work_keys(meta) == ["doi:10.1088/1742-6596/abc", "arxiv:2101.00001", "pubmed:31452104"]
    assert work_keys({"external_ids": {"doi": "not a doi", "arxiv": "x" * 400}}) == []
    assert title_key("Caf\u00e9 Networks: a Study!", 2019) == title_key("cafe networks - A study", 2019)
    assert title_key("Caf\u00e9 Networks: a Study!", 2019) != title_key("Caf\u00e9 Networks: a Study!", 2020)
    assert title_key("Introduction", 2019) is None  # too short a title to say anything


def test_deleting_by_a_merged_id_deletes_the_paper_it_names(merged, tmp_path):
    """`esqbe delete vaswani-ris` (a record merged into vaswani2017attention) deletes vaswani2017attention, as `show`
    and `query --paper` find it by that id; the paper's identifiers name no paper afterwards, so the record indexed
    again is a paper of its own, under its own id, not the deleted one brought back."""
    root, _ = merged
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    out = run("delete", "--path", ix, "vaswani-ris", "nope").stdout
    assert out == "deleted 1 of 2; vaswani-ris: merged into paper vaswani2017attention, deleted; not in the index: nope\n"
    assert ids(ix) == ["0704.0001", "ABCD2345", "bert-again"]
    r = CliRunner().invoke(main, ["show", "--path", str(ix), "vaswani-ris"], env={"ESQBE_CONFIG": None})
    assert r.exit_code != 0 and "Traceback" not in r.output  # gone by either id
    with sqlite3.connect(ix / "papers.sqlite") as db:
        assert db.execute("SELECT key FROM aliases WHERE paper_id = 'vaswani2017attention'").fetchall() == []
    report = json.loads(run("index", "--path", ix, root / "dup.ris", "--json").stdout)
    assert report["merged"] == [] and report["indexed"] == 1 and report["unchanged"] == 1
    assert ids(ix) == ["0704.0001", "ABCD2345", "bert-again", "vaswani-ris"]


def test_deleting_by_an_identifier_deletes_the_paper_it_names(merged, tmp_path):
    """`esqbe delete` takes what `show` takes: a paper's DOI (any case, as a resolver address) deletes that paper,
    and says by which id; a DOI of no paper is named as not in the index; the library counts the paper once."""
    import esqbe

    root, _ = merged
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    doi = "https://doi.org/10.48550/ARXIV.1706.03762"
    shown = CliRunner().invoke(main, ["show", "--path", str(ix), doi, "--json"], env={"ESQBE_CONFIG": None})
    assert shown.exit_code == 0 and json.loads(shown.output)["paper_id"] == "vaswani2017attention", shown.output
    out = run("delete", "--path", ix, doi, "10.1/none").stdout
    assert out == (f"deleted 1 of 2; {doi}: an identifier of paper vaswani2017attention, deleted; "
                   "not in the index: 10.1/none\n"), out
    assert ids(ix) == ["0704.0001", "ABCD2345", "bert-again"]
    shutil.rmtree(ix)
    shutil.copytree(root / "ix", ix)
    with esqbe.open_index(str(ix), config=None) as index:
        assert index.delete(["doi:10.48550/arxiv.1706.03762", "vaswani2017attention"]) == 1
        assert "vaswani2017attention" not in index.get(["vaswani2017attention"])


def test_the_library_deletes_by_a_merged_id_and_counts_the_paper_once(merged, tmp_path):
    import esqbe

    root, _ = merged
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    with esqbe.open_index(str(ix), config=None) as index:
        # both ids of one paper: one paper deleted; a merged-away id of 0704.0001 (balazs2007) deletes it too
        assert index.delete(["vaswani-ris", "vaswani2017attention", "balazs2007", "nope"]) == 2
        assert sorted(index.get(["ABCD2345", "bert-again", "vaswani2017attention", "0704.0001"])) == \
            ["ABCD2345", "bert-again"]


def test_a_paper_lists_every_source_merged_into_it(merged, tmp_path):
    """A record of another file merged into a paper without changing its content (the library's record keeps its
    fields) is not encoded again, yet the paper names it among its sources: in the run that read both, in a later run
    of that file alone, and a later run of the library's file alone takes none away."""
    root, _ = merged
    shown = json.loads(run("show", "--path", root / "ix", "vaswani2017attention", "--json").stdout)
    assert shown["metadata"]["sources"] == [{"file": str(root / "zotero.bib"), "format": "bibtex"},
                                            {"file": str(root / "dup.ris"), "format": "ris"}]
    ix = tmp_path / "ix"
    run("index", "--path", ix, root / "zotero.bib")
    (tmp_path / "copy.ris").write_text(DUP_RIS)
    for source in (tmp_path / "copy.ris", tmp_path / "copy.ris", root / "zotero.bib"):
        report = json.loads(run("index", "--path", ix, source, "--json").stdout)
        assert report["replaced"] == 0 and report["unchanged"] >= 1, report  # nothing encoded again
        shown = json.loads(run("show", "--path", ix, "vaswani-ris", "--json").stdout)
        assert [s["file"] for s in shown["metadata"]["sources"]] == [str(root / "zotero.bib"),
                                                                      str(tmp_path / "copy.ris")], source


SMITH_A = """@article{{smith2020,
  title = {{Sentence Facets for Retrieval}},
  author = {{Smith, John}},
  year = {{2020}},
  doi = {{10.5555/facets.a}},
  abstract = {{{a}}}
}}
"""
SMITH_B = """@inproceedings{{smith2020,
  title = {{{title}}},
  author = {{Smith, Jane}},
  year = {{2021}},
  doi = {{10.5555/facets.b}},
  abstract = {{{b}}}
}}
"""
SMITH_RIS = """TY  - JOUR
ID  - smith2020
TI  - Sentence facets for retrieval
AU  - Smith, John
PY  - 2020
DO  - 10.5555/FACETS.A
AB  - {a}
ER  -
"""


def _abstract(i: int) -> str:
    record = json.loads((REPO / "samples" / "csabstruct-sample.jsonl").read_text().splitlines()[i])
    return " ".join(record["sentences"]).replace("%", "")


def test_one_citation_key_for_two_works_in_two_files_indexes_both_and_a_rerun_changes_nothing(tmp_path):
    """A citation key names a record within its file: two library files that use `smith2020` for two works (another
    DOI and title) index two papers, the second under a derived id the run reports once; a third file's `smith2020`
    of the first work (its DOI) is merged into it, not renamed; a dump sharing that DOI is merged too. Re-runs of the
    unchanged files, in any order, report every paper unchanged (they said `replaced 2` every time); --json names the
    ids replaced and merged."""
    a, b = _abstract(1), _abstract(2)
    (tmp_path / "a.bib").write_text(SMITH_A.format(a=a))
    (tmp_path / "b.bib").write_text(SMITH_B.format(title="Facets of Another Kind", b=b))
    (tmp_path / "c.ris").write_text(SMITH_RIS.format(a=a))
    (tmp_path / "dump.jsonl").write_text(json.dumps({"paper_id": "s2-9", "title": "Sentence facets for retrieval",
                                                     "abstract": a, "year": 2020, "venue": "Dump Venue",
                                                     "doi": "10.5555/facets.a"}) + "\n")
    files = [tmp_path / n for n in ("a.bib", "b.bib", "c.ris", "dump.jsonl")]
    ix = tmp_path / "ix"
    first = run("index", "--path", ix, *files)
    said = [line for line in first.stdout.splitlines() if "renamed" in line]
    assert said == [f"  renamed: {tmp_path / 'b.bib'}:1 smith2020 is indexed as smith2020@b: the key is "
                    f"{tmp_path / 'a.bib'}:1's, another work (doi 10.5555/facets.b, not 10.5555/facets.a)"], first.stdout
    assert ids(ix) == ["smith2020", "smith2020@b"]
    shown = {pid: json.loads(run("show", "--path", ix, pid, "--json").stdout) for pid in ("smith2020", "smith2020@b")}
    assert shown["smith2020"]["title"] == "Sentence Facets for Retrieval"
    assert [s["format"] for s in shown["smith2020"]["metadata"]["sources"]] == ["bibtex", "ris", "s2orc"]
    assert shown["smith2020"]["metadata"]["venue"] == "Dump Venue"  # filled by the dump
    assert shown["smith2020@b"]["title"] == "Facets of Another Kind"
    assert shown["smith2020@b"]["metadata"]["external_ids"]["doi"] == "10.5555/facets.b"
    for order in (files, files[::-1], [files[2], files[0], files[3], files[1]]):
        again = json.loads(run("index", "--path", ix, *order, "--json").stdout)
        assert (again["indexed"], again["replaced"], again["unchanged"], again["tagged"]) == (0, 0, 4, 0), again
        assert again["replaced_ids"] == [] and [r["id"] for r in again["renamed"]] == ["smith2020@b"]
        assert {(m["id"], m["into"]) for m in again["merged"]} == {("smith2020", "smith2020"), ("s2-9", "smith2020")}
    assert ids(ix) == ["smith2020", "smith2020@b"]
    (tmp_path / "b.bib").write_text(SMITH_B.format(title="Facets of Another Kind, Revised", b=b))
    changed = json.loads(run("index", "--path", ix, *files, "--json").stdout)
    assert changed["replaced_ids"] == ["smith2020@b"] and changed["replaced"] == 1, changed
    assert json.loads(run("show", "--path", ix, "smith2020@b", "--json").stdout)["title"] == \
        "Facets of Another Kind, Revised"


def test_every_jsonl_shape_keeps_title_year_authors_and_ids_and_the_summary_names_what_it_does_not(tmp_path):
    """The pre-split `sentences` shape (CSAbstruct's) kept only the sentences and labels: a title and year given with
    them were lost unsaid. Now they are kept as plain JSON Lines keeps them, and what no shape keeps (CSAbstruct's
    per-sentence `confs`, S2ORC's citation lists) is named per file in the run's summary."""
    record = json.loads((REPO / "samples" / "csabstruct-sample.jsonl").read_text().splitlines()[3])
    (tmp_path / "split.jsonl").write_text(json.dumps({
        "paper_id": "split-1", "title": "Pre-split Sentences Keep Their Title", "year": 2019,
        "authors": ["Ada Lovelace"], "doi": "10.5555/split.1", "sentences": record["sentences"],
        "labels": record["labels"], "confs": record["confs"]}) + "\n"
        + json.dumps({"id": "split-2", "title": "Plain JSON Lines Ids", "year": 2018, "sentences": record["sentences"],
                      "facets": record["labels"]}) + "\n")
    (tmp_path / "s2.jsonl").write_text(json.dumps({
        "paper_id": "s2-1", "title": "An S2ORC Record", "abstract": " ".join(record["sentences"]), "year": 2017,
        "inbound_citations": ["x"], "has_pdf_parse": False}) + "\n")
    ix = tmp_path / "ix"
    report = json.loads(run("index", "--path", ix, tmp_path / "split.jsonl", tmp_path / "s2.jsonl", "--json").stdout)
    assert report["indexed"] == 3, report
    assert report["not_kept"] == {str(tmp_path / "split.jsonl"): {"confs": 1},
                                  str(tmp_path / "s2.jsonl"): {"inbound_citations": 1, "has_pdf_parse": 1}}
    one = json.loads(run("show", "--path", ix, "split-1", "--json").stdout)
    assert one["title"] == "Pre-split Sentences Keep Their Title" and one["metadata"]["year"] == 2019
    assert one["metadata"]["authors"] == [{"name": "Ada Lovelace"}] and one["metadata"]["doi"] == "10.5555/split.1"
    assert [s["facet"] for s in one["sentences"]] == [lab if lab != "objective" else "background"
                                                     for lab in record["labels"]]
    two = json.loads(run("show", "--path", ix, "split-2", "--json").stdout)
    assert two["title"] == "Plain JSON Lines Ids" and two["metadata"]["year"] == 2018
    text = run("index", "--path", ix, tmp_path / "split.jsonl").stdout
    assert f"  not kept from {tmp_path / 'split.jsonl'} (fields esqbe does not read): confs (2 records)" in text \
        or f"  not kept from {tmp_path / 'split.jsonl'} (fields esqbe does not read): confs (1 record)" in text, text
