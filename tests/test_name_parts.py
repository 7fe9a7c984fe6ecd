"""Names keep their parts in every reader and writer: family, given, the particles (non-dropping `de Vries`, dropping
`Jean de La Fontaine`), the suffix (`King Jr.`) and an organisation's name whole (`literal`), shown as people write
them; a merge compares names by their parts, so a particle is never a conflict.

What each format holds: CSL-JSON every part under its own key (and its flags, `comma-suffix`, `static-ordering`);
BibTeX `von Last, Jr, First`, where a particle is a word in lower case (BibTeX's own rule): the non-dropping one
before the family name, the dropping one after the given name; RIS `Family, Given, Suffix`, the particles placed as
in BibTeX and told apart by the same rule (so a part holds no comma, and a particle begins in lower case)."""
from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import esqbe
from esqbe.core.names import FLAGS, PARTS, compared, parts_of, shown
from esqbe.ingest.readers import ReadReport, read_papers
from esqbe.query.export import export_hits

from .conftest import SAMPLE

GIVEN = st.sampled_from(["Johan", "Hans", "Martin Luther", "M. G.", "Łukasz", "José", "Ann-Marie", "Jean", "Zoë", "李"])
FAMILY = st.sampled_from(["Vries", "Ohain", "King", "Kowalski", "Müller", "Álvarez", "Brinch Hansen", "García-Mateo",
                          "La Fontaine", "O'Brien", "Škoda", "Johnson and Johnson", "Others", "王"])
PARTICLE = st.sampled_from(["de", "von", "van der", "de la", "di", "da", "ten", "zu", "van"])
SUFFIX = st.sampled_from(["Jr.", "Sr.", "II", "III", "IV"])
ORGANISATION = st.sampled_from(["Google AI Language", "Barnes and Noble", "The ACM Council", "Centre for Études",
                                "OpenAI", "others"])
FILES = {"bibtex": "x.bib", "ris": "x.ris", "csl-json": "x.json"}


@st.composite
def person(draw, csl: bool = False) -> dict:
    """A person's parts; for BibTeX and RIS the particles in lower case (what they hold), for CSL-JSON any."""
    parts = {"family": draw(FAMILY)}
    if draw(st.booleans()):
        parts["given"] = draw(GIVEN)
        if draw(st.integers(0, 3)) == 0:
            parts["dropping-particle"] = draw(PARTICLE) if not csl else draw(st.one_of(PARTICLE, st.just("Van")))
    if draw(st.booleans()):
        parts["non-dropping-particle"] = draw(PARTICLE) if not csl else draw(st.one_of(PARTICLE, st.just("De")))
    if draw(st.integers(0, 2)) == 0:
        parts["suffix"] = draw(SUFFIX)
    if csl:
        parts.update({flag: True for flag in FLAGS if draw(st.integers(0, 3)) == 0})
    return parts


def _author(parts: dict) -> dict:
    return {"name": parts["literal"], "literal": True} if "literal" in parts else {"name": shown(parts), **parts}


def _authors_of(fmt: str):
    people = person(csl=fmt == "csl-json")
    return st.lists(st.one_of(people, people, ORGANISATION.map(lambda n: {"literal": n})), min_size=1, max_size=4)


def _round_trip(fmt: str, authors: list[dict]) -> list[dict]:
    """The authors written in `fmt` by the export, read back by esqbe's reader."""
    meta = {"format": fmt, "authors": [_author(a) for a in authors]}
    text = export_hits({"hits": [{"paper_id": "k1", "title": "T", "metadata": meta, "sentences": ["One. Two."]}]}, fmt)
    report = ReadReport()
    [paper] = list(read_papers(io.StringIO(text), fmt, report=report))
    return paper.metadata["authors"]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), fmt=st.sampled_from(list(FILES)))
def test_parts_written_and_read_are_the_same_parts_in_every_format(data, fmt):
    authors = data.draw(_authors_of(fmt), label="authors")
    got = _round_trip(fmt, authors)
    assert [{k: a[k] for k in (*PARTS, *FLAGS) if k in a} if not a.get("literal") else {"literal": a["name"]}
            for a in got] == authors
    assert [a["name"] for a in got] == [a.get("literal") or shown(a) for a in authors]


def test_names_are_shown_as_people_write_them_and_read_back_from_bibtex():
    text = ("@article{k,\n  author = {de Vries, Johan and von Ohain, Hans and King, Jr., Martin and La Fontaine, Jean de"
            " and {Google AI Language} and others},\n  abstract = {One. Two.}\n}\n")
    [paper] = list(read_papers(io.StringIO(text), "bibtex", report=ReadReport()))
    authors = paper.metadata["authors"]
    assert [a["name"] for a in authors] == ["Johan de Vries", "Hans von Ohain", "Martin King Jr.",
                                           "Jean de La Fontaine", "Google AI Language"]
    assert authors[0] == {"name": "Johan de Vries", "given": "Johan", "non-dropping-particle": "de", "family": "Vries"}
    assert authors[2]["suffix"] == "Jr." and authors[3]["dropping-particle"] == "de" and authors[4]["literal"] is True
    out = export_hits({"hits": [{"paper_id": "k", "title": "", "metadata": {**paper.metadata, "bibtex": None},
                                 "sentences": paper.sentences}]}, "bibtex")
    assert ("author = {de Vries, Johan and von Ohain, Hans and King, Jr., Martin and La Fontaine, Jean de and "
            "{Google AI Language}}") in out


def test_csl_json_names_keep_the_keys_they_were_read_with():
    """The trial's case: a Zotero CSL-JSON export's parts are kept, shown and written back under the same keys."""
    names = [{"family": "Vries", "given": "Johan", "non-dropping-particle": "de"},
             {"family": "Fontaine", "given": "Jean", "dropping-particle": "de La"},
             {"family": "King", "given": "Martin", "suffix": "Jr.", "comma-suffix": True},
             {"family": "Mao", "given": "Zedong", "static-ordering": True}, {"literal": "Google AI Language"}]
    text = json.dumps([{"id": "k", "type": "article-journal", "title": "T", "abstract": "One. Two.", "author": names}])
    [paper] = list(read_papers(io.StringIO(text), "csl-json", report=ReadReport()))
    assert [a["name"] for a in paper.metadata["authors"]] == [
        "Johan de Vries", "Jean de La Fontaine", "Martin King, Jr.", "Mao Zedong", "Google AI Language"]
    out = json.loads(export_hits({"hits": [{"paper_id": "k", "title": "T", "metadata": paper.metadata,
                                            "sentences": paper.sentences}]}, "csl-json"))
    assert out[0]["author"] == names


def test_formats_that_give_parts_keep_them():
    """S2ORC's first/middle/last/suffix, the arXiv snapshot's [last, first, suffix] and JSON Lines objects with CSL's
    keys keep their parts; names given whole stay whole, and an author given by parts only gets its name from them."""
    s2orc = {"paper_id": "1", "title": "T", "abstract": "One. Two.",
             "authors": [{"first": "Martin", "middle": ["Luther"], "last": "King", "suffix": "Jr."}]}
    arxiv = {"id": "0704.0001", "title": "T", "abstract": "One. Two.", "categories": "hep-ph", "versions": [],
             "authors_parsed": [["Vries", "Johan", ""], ["King", "Martin", "Jr."]]}
    jsonl = {"id": "j", "title": "T", "abstract": "One. Two.",
             "authors": ["Ada Lovelace", {"family": "Vries", "given": "Johan", "non-dropping-particle": "de"}]}
    papers = {p.paper_id: p.metadata["authors"] for fmt, record in (("s2orc", s2orc), ("arxiv", arxiv), ("jsonl", jsonl))
              for p in read_papers(io.StringIO(json.dumps(record) + "\n"), fmt, report=ReadReport())}
    assert papers["1"] == [{"name": "Martin Luther King Jr.", "given": "Martin Luther", "family": "King",
                            "suffix": "Jr."}]
    assert papers["0704.0001"][1] == {"name": "Martin King Jr.", "given": "Martin", "family": "King", "suffix": "Jr."}
    assert papers["j"] == [{"name": "Ada Lovelace"}, {"name": "Johan de Vries", "given": "Johan",
                                                      "non-dropping-particle": "de", "family": "Vries"}]


def test_an_author_stored_without_parts_still_reads():
    """An index written before parts were kept holds {"name"} (and {"name", "family", "given"}): its parts are told
    from the name by BibTeX's rules wherever a format needs them."""
    authors = [{"name": "Johan de Vries"}, {"name": "Vries, Johan de"}, {"name": "Ashish Vaswani"}, {"name": "Plato"},
               {"name": "Laurens van der Maaten", "family": "van der Maaten", "given": "Laurens"}]
    assert parts_of(authors[0]) == {"given": "Johan", "non-dropping-particle": "de", "family": "Vries"}
    hit = {"paper_id": "k", "title": "T", "metadata": {"format": "jsonl", "authors": authors}, "sentences": ["S."]}
    csl = json.loads(export_hits({"hits": [hit]}, "csl-json"))[0]["author"]
    assert csl == [{"given": "Johan", "non-dropping-particle": "de", "family": "Vries"},
                   {"given": "Johan", "dropping-particle": "de", "family": "Vries"},
                   {"given": "Ashish", "family": "Vaswani"}, {"literal": "Plato"},
                   {"given": "Laurens", "family": "van der Maaten"}]
    assert "AU  - de Vries, Johan\n" in export_hits({"hits": [hit]}, "ris")
    assert "author = {de Vries, Johan and Vries, Johan de and Vaswani, Ashish and Plato and van der Maaten, Laurens}" \
        in export_hits({"hits": [hit]}, "bibtex")


def test_names_compare_by_their_parts():
    same = ["Johan de Vries", "de Vries, Johan", "Johan Vries", {"family": "Vries", "given": "Johan",
                                                                "non-dropping-particle": "de"},
            {"family": "de Vries", "given": "Johan"}, {"name": "Johan de Vries", "family": "Vries", "given": "Johan"}]
    assert len({compared(a) for a in same}) == 1
    assert compared("Martin King Jr.") == compared({"family": "King", "given": "Martin", "suffix": "Jr."})
    assert compared("Johan de Vries") != compared("Jan de Vries") != compared("Martin King")


@pytest.fixture(scope="module")
def merged(tmp_path_factory, encoder):
    """A CSL-JSON library (names with particles and a suffix), then a dump of the same works (same DOIs) that writes
    the names otherwise: `Last, First`, the particle dropped, and, for the second work, another author."""
    root = tmp_path_factory.mktemp("names-merge")
    abstracts = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:2]]
    abstracts = [" ".join(r["sentences"]) if "sentences" in r else r["abstract"] for r in abstracts]
    library = [{"id": f"lib{i}", "type": "article-journal", "title": f"Library paper {i}", "abstract": abstracts[i],
                "DOI": f"10.5555/names.{i}", "issued": {"date-parts": [[2020]]},
                "author": [{"family": "Vries", "given": "Johan", "non-dropping-particle": "de"},
                           {"family": "King", "given": "Martin", "suffix": "Jr."}]} for i in range(2)]
    (root / "library.json").write_text(json.dumps(library))
    dump = [{"id": "d0", "title": "Library paper 0", "abstract": abstracts[0],
             "external_ids": {"doi": "10.5555/names.0"}, "authors": ["de Vries, Johan", "Martin King Jr."]},
            {"id": "d1", "title": "Library paper 1", "abstract": abstracts[1],
             "external_ids": {"doi": "10.5555/names.1"}, "authors": ["Johan Vries", "Ada Lovelace"]}]
    (root / "dump.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dump))
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(root / "library.json"), str(root / "dump.jsonl")])
        papers = index.get(["lib0", "lib1"])
    return report, papers


def test_a_particle_is_never_a_merge_conflict(merged):
    report, papers = merged
    assert len(report.merged) == 2, report.summary()
    conflicts = json.dumps([c for c in report.merge_conflicts if "authors" in json.dumps(c)])
    assert "lib1" in conflicts  # another author is a conflict, named
    assert "lib0" not in conflicts  # `de Vries, Johan` and `Martin King Jr.` are the library's names
    for paper in papers.values():  # the library's record keeps its names, parts and all
        assert paper.metadata["authors"][0] == {"name": "Johan de Vries", "given": "Johan",
                                                "non-dropping-particle": "de", "family": "Vries"}
