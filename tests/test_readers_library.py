"""A researcher's library in: BibTeX, RIS, CSL-JSON, the arXiv metadata snapshot and
OpenAlex works, on small samples written from each format's documentation (tests/data/library/)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from esqbe.ingest.formats import detect_format
from esqbe.ingest.library import sniff_format
from esqbe.ingest.readers import InputError, ReadReport, read_papers

DATA = Path(__file__).parent / "data" / "library"


def read_all(source, fmt=None):
    report = ReadReport()
    papers = list(read_papers(source, fmt, report=report))
    assert report.read == report.yielded + sum(report.skipped.values()) + len(report.errors)
    return papers, report


def test_bibtex_zotero_export():
    papers, report = read_all(DATA / "zotero.bib")
    assert [p.paper_id for p in papers] == ["vaswani2017attention"]
    p = papers[0]
    assert p.title == "Attention Is All You Need"
    assert p.sentences[1] == "We propose a new simple network architecture, the Transformer, based solely on attention mechanisms."
    assert p.metadata["format"] == "bibtex" and p.metadata["year"] == 2017
    assert p.metadata["authors"] == [{"name": "Ashish Vaswani", "family": "Vaswani", "given": "Ashish"},
                                     {"name": "Noam Shazeer", "family": "Shazeer", "given": "Noam"},
                                     {"name": "Niki Parmar", "family": "Parmar", "given": "Niki"}]
    assert p.metadata["venue"] == "Advances in Neural Information Processing Systems"
    assert p.metadata["external_ids"] == {"doi": "10.48550/arXiv.1706.03762", "arxiv": "1706.03762"}
    # a reference manager's `url` is a plain url: it says nothing about open access
    assert p.metadata["url"].startswith("https://proceedings.neurips.cc/paper/2017/")
    assert "open_access_url" not in p.metadata
    assert report.skipped == {"no abstract": 1}  # mueller2019
    assert [str(e) for e in report.errors] == [
        f"{DATA / 'zotero.bib'}:26: entry: not a valid BibTeX entry: Unexpectedly reached end of file."]


def test_bibtex_latex_is_decoded_and_names_turned_round():
    text = ("@article{k,\n title={Caf{\\'e} {M}odels},\n author={M{\\\"u}ller, J{\\\"o}rg and Ada Lovelace and others},\n"
            " journal={J. of {X}}, year={2019},\n abstract={We study caf{\\'e}s. They are nice.}\n}\n")
    [paper], _ = read_all(io.StringIO(text))
    assert paper.title == "Café Models"
    assert paper.sentences == ["We study cafés.", "They are nice."]
    assert paper.metadata["authors"] == [{"name": "Jörg Müller", "family": "Müller", "given": "Jörg"},
                                         {"name": "Ada Lovelace", "given": "Ada", "family": "Lovelace"}]
    assert paper.metadata["venue"] == "J. of X"


def test_bibtex_repeated_key_is_an_error_at_its_line():
    text = "@article{a, abstract={X is y.}}\n\n@article{a, abstract={X is z.}}\n"
    papers, report = read_all(io.StringIO(text), "bibtex")
    assert [p.paper_id for p in papers] == ["a"]
    assert [(e.line, e.field) for e in report.errors] == [(3, "entry")]
    assert "Duplicate entry key 'a'" in report.errors[0].reason


def test_ris_zotero_export():
    papers, report = read_all(DATA / "zotero.ris")
    [p] = papers
    assert p.paper_id == "10.1109/CVPR.2016.90"  # no ID tag: the DOI is the id
    assert p.title == "Deep Residual Learning for Image Recognition"
    assert p.metadata["authors"] == [{"name": "Kaiming He", "family": "He", "given": "Kaiming"},
                                     {"name": "Xiangyu Zhang", "family": "Zhang", "given": "Xiangyu"}]
    assert p.metadata["year"] == 2016 and p.metadata["external_ids"] == {"doi": "10.1109/CVPR.2016.90"}
    assert p.metadata["venue"].startswith("Proceedings of the IEEE Conference")
    assert p.metadata["url"] == "https://doi.org/10.1109/CVPR.2016.90" and "open_access_url" not in p.metadata
    assert report.skipped == {"no abstract": 1}
    assert [(e.line, e.field) for e in report.errors] == [(19, "TY"), (20, "ER")]


def test_ris_without_id_or_doi_gets_a_stable_id():
    text = "TY  - JOUR\nTI  - Some Title\nPY  - 2001\nAB  - We do things.\nER  - \n"
    [a], _ = read_all(io.StringIO(text))
    [b], _ = read_all(io.StringIO(text))
    assert a.paper_id == b.paper_id and a.paper_id.startswith("ris-")


def test_csl_json_zotero_export():
    papers, report = read_all(DATA / "zotero-csl.json")
    [p] = papers
    assert p.paper_id == "ABCD2345"
    assert p.metadata["authors"] == [{"name": "Jacob Devlin", "family": "Devlin", "given": "Jacob"},
                                     {"name": "Ming-Wei Chang", "family": "Chang", "given": "Ming-Wei"},
                                     {"name": "Google AI Language", "literal": True}]  # an organisation: kept whole
    assert p.metadata["year"] == 2019 and p.metadata["publication_date"] == "2019-06"
    assert p.metadata["external_ids"] == {"doi": "10.18653/v1/N19-1423"}
    assert p.metadata["venue"] == "Proceedings of NAACL-HLT"
    assert p.metadata["url"] == "https://aclanthology.org/N19-1423" and "open_access_url" not in p.metadata
    assert report.skipped == {"no abstract": 1}
    assert [str(e) for e in report.errors] == [
        f"{DATA / 'zotero-csl.json'}:24: author[0]: expected an object with family/given, got str"]


def test_csl_json_broken_array_reports_the_line_and_keeps_what_came_before():
    text = '[\n{"id": "a", "abstract": "We do X."},\n{"id": "b", "abstract": \n'
    papers, report = read_all(io.StringIO(text), "csl-json")
    assert [p.paper_id for p in papers] == ["a"]
    assert [(e.line, e.field) for e in report.errors] == [(4, "json")]


def test_arxiv_metadata_snapshot():
    papers, report = read_all(DATA / "arxiv-snapshot.jsonl")
    [p] = papers
    assert p.paper_id == "0704.0001"
    assert p.title == "Calculation of prompt diphoton production cross sections at Tevatron and LHC energies"
    assert p.metadata["year"] == 2007 and p.metadata["publication_date"] == "2007-04-02"
    assert p.metadata["authors"][0] == {"name": "C. Balázs", "family": "Balázs", "given": "C."}  # [last, first, suffix]
    assert p.metadata["external_ids"] == {"arxiv": "0704.0001", "doi": "10.1103/PhysRevD.76.013009"}
    assert p.metadata["fields_of_study"] == ["hep-ph"]
    assert p.metadata["open_access_url"] == "https://arxiv.org/pdf/0704.0001"  # every arXiv paper is open
    assert report.skipped == {"no abstract": 1}
    assert [(e.line, e.field) for e in report.errors] == [(3, "title")]


def test_openalex_abstract_rebuilt_in_word_order():
    papers, report = read_all(DATA / "openalex-works.jsonl")
    [p] = papers
    assert p.paper_id == "W2741809807"
    assert " ".join(p.sentences).startswith("Despite growing interest in Open Access (OA) to scholarly literature, there is")
    assert p.sentences[-1] == "We address this using oaDOI."  # "need" at 14 only; words placed by position, not key order
    assert p.metadata["authors"] == [{"name": "Heather Piwowar", "id": "A5048491430"},
                                     {"name": "Jason Priem", "id": "A5023888391"}]
    assert p.metadata["venue"] == "PeerJ" and p.metadata["year"] == 2018
    assert p.metadata["external_ids"]["doi"] == "10.7717/peerj.4375"
    assert p.metadata["open_access_url"] == "https://peerj.com/articles/4375.pdf"  # open_access.oa_url
    assert p.metadata["open_access_status"] == "gold"
    assert report.skipped == {"no abstract": 1}
    assert [(e.line, e.field) for e in report.errors] == [(3, "abstract_inverted_index")]


def test_openalex_shuffled_inverted_index():
    record = {"id": "https://openalex.org/W1", "title": "t",
              "abstract_inverted_index": {"world.": [1], "Hello": [0], "again": [3], "Hi": [2]}}
    [p], _ = read_all(io.StringIO(json.dumps(record) + "\n"))
    assert " ".join(p.sentences) == "Hello world. Hi again"


def test_detection_from_the_file():
    assert sniff_format("@article{x,") == "bibtex" and sniff_format("% comment") == "bibtex"
    assert sniff_format("TY  - JOUR") == "ris"
    assert sniff_format("[") == "csl-json" and sniff_format('[{"id": 1}]') == "csl-json"
    assert sniff_format('{"id": 1}') is None and sniff_format("[1, 2]") is None
    assert detect_format(json.loads((DATA / "arxiv-snapshot.jsonl").read_text().splitlines()[0])) == "arxiv"
    assert detect_format(json.loads((DATA / "openalex-works.jsonl").read_text().splitlines()[0])) == "openalex"
    assert detect_format({"id": "x", "abstract": "y", "categories": "cs.CL"}) == "jsonl"  # a plain JSONL key


def test_strict_raises_the_first_error():
    with pytest.raises(InputError, match=r"zotero.ris:19: TY: "):
        list(read_papers(DATA / "zotero.ris", strict=True))


def test_cli_indexes_a_bibtex_file_and_finds_its_papers(tmp_path, encoder):
    """From a BibTeX export to an index: detected from the file, metadata kept, skips and errors reported."""
    ix = tmp_path / "ix"
    r = CliRunner().invoke(main, ["index", "--path", str(ix), str(DATA / "zotero.bib"), str(DATA / "zotero-csl.json"),
                                  "--json"], catch_exceptions=False)
    out = json.loads(r.stdout)
    assert out["indexed"] == 2, r.output
    assert out["skipped"] == {"no abstract": 2}
    assert any("zotero.bib:26: entry:" in e for e in out["errors"])
    import esqbe

    with esqbe.open_index(str(ix), encoder=encoder) as index:
        got = index.get(["vaswani2017attention"])["vaswani2017attention"]
        assert got.metadata["external_ids"]["doi"] == "10.48550/arXiv.1706.03762"


def test_a_whole_file_format_moves_its_position_with_the_records(tmp_path):
    """Progress counts the papers done, not bytes read ahead, for BibTeX/RIS/CSL-JSON too: the
    file is read whole before its records are parsed, so the position used to say the whole file (100%) at the
    first paper. Now it is the bytes before each record as it is handed on, and the file's size at the end."""
    path = tmp_path / "lib.bib"
    path.write_text("".join(f"@article{{k{i},\n  title = {{Paper {i}}},\n  author = {{Doe, Jane}},\n"
                            f"  abstract = {{We study thing {i}. It works.}}\n}}\n\n" for i in range(6)))
    report = ReadReport()
    seen = [report.position for _ in read_papers(str(path), report=report)]
    size = path.stat().st_size
    assert len(seen) == 6 and seen == sorted(seen) and len(set(seen)) == 6
    assert seen[0] == 0 and seen[-1] < size and report.position == size
