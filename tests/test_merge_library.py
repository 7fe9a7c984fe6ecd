"""A merge keeps the library's own record, the trial's case on real files and a real index: a
BibTeX library is indexed, then (in a second run) an S2ORC dump that shares its DOIs. The library's papers keep
their key, entry type, url, authors as written and format; the dump fills the venue; the conflict is reported;
each paper remembers both sources; and the README's "finds not in my library" filter keeps every library paper
out of a query's finds."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import esqbe
from cli import main

from .conftest import SAMPLE

N_LIB = 4


@pytest.fixture(scope="module")
def merged(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("mergelib")
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:10]]
    abstracts = [" ".join(r["sentences"]) if "sentences" in r else r["abstract"] for r in records]
    bib = "".join(f"""@inproceedings{{lib{i},
  title = {{Library Paper {i}}},
  author = {{Kim, M. G. and van der Berg, Anna}},
  url = {{https://example.org/lib{i}}},
  year = {{2020}},
  doi = {{10.5555/LIB.{i}}},
  abstract = {{{abstracts[i].replace('%', '')}}}
}}

""" for i in range(N_LIB))
    (root / "my-library.bib").write_text(bib)
    dump = [{"paper_id": f"s2-{i}", "title": f"library paper {i} (dump)", "abstract": abstracts[i], "year": 2020,
             "venue": "Dump Venue", "doi": f"10.5555/lib.{i}", "authors": [{"first": "M.", "last": "Kim"}]}
            for i in range(N_LIB)]
    dump += [{"paper_id": f"s2-{i}", "title": f"Other paper {i}", "abstract": abstracts[i], "year": 2021}
             for i in range(N_LIB, 10)]
    (root / "dump.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dump))
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        first = index.index_files([str(root / "my-library.bib")])
        second = index.index_files([str(root / "dump.jsonl")])
        papers = index.get(sorted(index.backend.paper_ids()))
    return root, first, second, papers


def test_the_library_record_keeps_its_fields_and_the_dump_fills_the_rest(merged):
    root, first, second, papers = merged
    assert first.stored == N_LIB and len(second.merged) == N_LIB, second.summary()
    assert sorted(papers) == sorted([f"lib{i}" for i in range(N_LIB)] + [f"s2-{i}" for i in range(N_LIB, 10)])
    for i in range(N_LIB):
        meta = papers[f"lib{i}"].metadata
        assert papers[f"lib{i}"].title == f"Library Paper {i}"
        assert meta["format"] == "bibtex" and meta["entry_type"] == "inproceedings"
        assert meta["url"] == f"https://example.org/lib{i}"
        assert [a["name"] for a in meta["authors"]] == ["M. G. Kim", "Anna van der Berg"]
        assert meta["venue"] == "Dump Venue" and meta["in_library"] is True  # filled by the dump
        assert [s["format"] for s in meta["sources"]] == ["bibtex", "s2orc"]
        assert meta["sources"][0]["file"].endswith("my-library.bib") and meta["sources"][1]["file"].endswith("dump.jsonl")
    conflicts = {(c["id"], c["field"]) for c in second.merge_conflicts}
    assert ("lib0", "authors") in conflicts
    assert any("merge conflict" in line for line in second.merge_lines())


def test_finds_not_in_my_library_leave_out_every_library_paper(merged):
    root, _, _, papers = merged
    r = CliRunner().invoke(main, ["query", "--path", str(root / "ix"), "--paper", "s2-5", "-k", "20", "--json",
                                  "--no-server", "--filter", "in_library!=true"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    hits = [h["paper_id"] for h in json.loads(r.stdout)["hits"]]
    assert hits and not any(h.startswith("lib") for h in hits), hits
    assert set(hits) == {f"s2-{i}" for i in range(N_LIB, 10)} - {"s2-5"}


def test_a_likely_duplicate_across_runs_is_reported_with_both_ids_and_a_watch_never_reports_it(tmp_path, encoder):
    """The trial's two-run duplicate: a BibTeX entry without DOI, then (another run) the S2ORC record of the same
    work (same title, year, first author): reported with both ids, both kept. A paper of that title and year by
    another first author is another work. A watch on the BibTeX paper reports the new papers that match it, never
    its own twin."""
    from esqbe.index.watches import add_watch, run_watches

    record, other, third = (json.loads(line) for line in SAMPLE.read_text().splitlines()[:3])
    abstract = " ".join(record["sentences"]) if "sentences" in record else record["abstract"]
    (tmp_path / "lib.bib").write_text(f"@article{{twin2019,\n  title = {{Facets of Scientific Papers}},\n"
                                      f"  author = {{Smith, John and Doe, Jane}},\n"
                                      f"  year = {{2019}},\n  abstract = {{{abstract.replace('%', '')}}}\n}}\n")
    dump = [{"paper_id": "s2-twin", "title": "Facets of scientific papers.", "abstract": abstract, "year": 2019,
             "authors": [{"first": "J.", "last": "Smith"}]},
            # (their own abstracts: the twin's, nearly the same sentences, would be a likely version besides)
            {"paper_id": "s2-namesake", "title": "Facets of Scientific Papers", "abstract": " ".join(other["sentences"]),
             "year": 2019, "authors": [{"first": "Ada", "last": "Jones"}]},
            {"paper_id": "s2-other", "title": "Another view of the same facets", "abstract": " ".join(third["sentences"]),
             "year": 2020}]
    (tmp_path / "dump.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dump))
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as index:
        assert not index.index_files([str(tmp_path / "lib.bib")]).likely_duplicates
        add_watch(index, "mine", paper_id="twin2019", min_score=0.0, k=10)
        second = index.index_files([str(tmp_path / "dump.jsonl")])
        assert sorted(index.backend.paper_ids()) == ["s2-namesake", "s2-other", "s2-twin", "twin2019"]
        [run] = run_watches(index)
    assert len(second.likely_duplicates) == 1, second.likely_duplicates
    [dup] = second.likely_duplicates
    assert (dup["id"], dup["like"]) == ("s2-twin", "twin2019")
    assert any(line.endswith("s2-twin, already in the index as twin2019") for line in second.merge_lines()), \
        second.merge_lines()
    assert sorted(m["paper_id"] for m in run.matches) == ["s2-namesake", "s2-other"]


def test_an_index_made_before_title_keys_finds_a_likely_duplicate_of_its_papers(tmp_path, encoder):
    """An index of an esqbe before title keys (no `title:` aliases, no flag) gets its papers' title keys on the next
    run that writes it, so that run's record of the same work is reported."""
    import sqlite3

    record = json.loads(SAMPLE.read_text().splitlines()[0])
    record = {"abstract": " ".join(record["sentences"]) if "sentences" in record else record["abstract"], "year": 2019}
    (tmp_path / "lib.jsonl").write_text(json.dumps({**record, "paper_id": "old", "title": "Facets of Scientific Papers"}))
    (tmp_path / "dump.jsonl").write_text(json.dumps({**record, "paper_id": "new", "title": "FACETS of scientific papers"}))
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as index:
        index.index_files([str(tmp_path / "lib.jsonl")])
    with sqlite3.connect(tmp_path / "ix" / "papers.sqlite") as db:  # as an esqbe before title keys left it
        assert db.execute("DELETE FROM aliases WHERE key LIKE 'title:%'").rowcount == 1
        db.execute("DELETE FROM settings WHERE key = 'title_keys_filled'")
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(tmp_path / "dump.jsonl")])
    assert [(d["id"], d["like"]) for d in report.likely_duplicates] == [("new", "old")]


def test_same_work_compares_title_year_and_first_author():
    from esqbe.core.workids import first_author, same_work

    assert [first_author({"authors": a}) for a in ([{"name": "Kim, M. G."}], ["M. G. Kim"], [{"family": "van der Berg",
            "name": "Anna van der Berg"}], [], None, [7])] == ["kim", "kim", "berg", None, None, None]
    title = "Facets of Scientific Papers"
    assert same_work(title, {"year": 2019, "authors": ["Smith, J."]}, "facets of scientific papers!", {"year": 2019})
    assert same_work(title, {"authors": ["J. Smith"]}, title, {"year": 2019, "authors": [{"name": "Smith, John"}]})
    assert not same_work(title, {"year": 2019}, title, {"year": 2020})
    assert not same_work(title, {"authors": ["Ada Jones"]}, title, {"authors": ["J. Smith"]})
    assert not same_work("Introduction", {}, "Introduction", {})  # too short a title to say anything
