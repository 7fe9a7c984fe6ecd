"""A merge keeps the library's own record (issue 49, item 2), the trial's case on real files and a real index: a
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


def test_a_likely_duplicate_across_runs_is_reported_with_both_ids(tmp_path, encoder):
    """The trial's two-run duplicate: a BibTeX entry without DOI, then (another run) the S2ORC record of the same
    work (same title, year): reported with both ids, both kept."""
    record = json.loads(SAMPLE.read_text().splitlines()[0])
    abstract = " ".join(record["sentences"]) if "sentences" in record else record["abstract"]
    (tmp_path / "lib.bib").write_text(f"@article{{twin2019,\n  title = {{Facets of Scientific Papers}},\n"
                                      f"  year = {{2019}},\n  abstract = {{{abstract.replace('%', '')}}}\n}}\n")
    (tmp_path / "dump.jsonl").write_text(json.dumps({"paper_id": "s2-twin", "title": "Facets of scientific papers.",
                                                     "abstract": abstract, "year": 2019}) + "\n")
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as index:
        assert not index.index_files([str(tmp_path / "lib.bib")]).likely_duplicates
        second = index.index_files([str(tmp_path / "dump.jsonl")])
        assert sorted(index.backend.paper_ids()) == ["s2-twin", "twin2019"]
    [dup] = second.likely_duplicates
    assert (dup["id"], dup["like"]) == ("s2-twin", "twin2019")
    assert any("s2-twin ~" in line and "twin2019" in line for line in second.merge_lines())
