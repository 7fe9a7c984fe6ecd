"""Exports that carry text exactly (item 7): BibTeX, RIS and CSL-JSON written by
`esqbe.query.export`, indexed again by esqbe's readers into a real index, then exported again: every title,
abstract, author, venue, year, DOI, arXiv id, PubMed id, key and entry type comes back identical, for any Unicode
text and LaTeX-like text (backslashes, braces, `$\\mu$`, accents, `%`, `--`, quotes). What no format's one-line value
can hold (control characters, line breaks) and runs of whitespace are made one space the same way by every writer
and reader (`esqbe.ingest.latex.carried`); that is the text compared.

RIS has no way to keep a comma inside a name from being its own family/given separator, so the generated names
have none (BibTeX braces it: `{,}`)."""
from __future__ import annotations

import itertools
import json

import bibtexparser
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pylatexenc.latex2text import LatexNodes2Text

import esqbe
from esqbe.ingest.latex import bib_escape, carried, strip_enclosing
from esqbe.ingest.latex import latex_decoder as _latex_decoder
from esqbe.ingest.sentences import split_sentences
from esqbe.query.export import export_hits

#: LaTeX-like pieces, mixed with any Unicode character
_PIECES = st.sampled_from([
    "\\", "{", "}", "$", "%", "&", "#", "_", "~", "^", "`", "'", "''", "--", "---", "``", "!`", "?`", '"', "@", ",",
    "$\\mu$", "$^{\\circ}$", "{\\textbackslash}", "21{\\textbackslash}\\%", "\\'e", "{\\'e}", "\\textbf{x}", "\\\\",
    "\\{", "\\}", "{ASR}", "é", "ü", "中文", "🎉", "\u0301", "\u00a0", "\t", "\n", "\x07", "\u2028", " and ", " AND ",
    "others", "<", ">", "|", "-", ".", " ", "x", "Kim, M. G.", "Johnson and Johnson Research"])
TEXT = st.lists(st.one_of(_PIECES, st.characters(blacklist_categories=["Cs"])), max_size=14).map("".join)
WORD = st.lists(st.one_of(_PIECES.filter(lambda p: "," not in p), st.characters(
    blacklist_categories=["Cs"], blacklist_characters=","))).map("".join).filter(lambda s: carried(s) != "")
ENTRY_TYPES = {"bibtex": ["article", "inproceedings", "phdthesis", "misc", "techreport", "book"],
               "ris": ["JOUR", "CONF", "THES", "RPRT", "GEN", "BOOK"],
               "csl-json": ["article-journal", "paper-conference", "thesis", "report", "document", "book"]}
FILE = {"bibtex": "x.bib", "ris": "x.ris", "csl-json": "x.json"}
_counter = itertools.count(1)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    """One real index for the module: each example adds its own papers (keys and identifiers never repeat)."""
    return tmp_path_factory.mktemp("exact-index") / "ix"


def _person(family: str, given_name: str) -> dict:
    return {"name": f"{given_name} {family}".strip(), "family": family, "given": given_name}


AUTHOR = st.one_of(st.builds(_person, WORD, WORD), WORD.map(lambda n: {"name": n, "literal": True}))


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_a_bibtex_value_decodes_back_to_its_text(text):
    """The writer's escaping against the reader's decoding, through bibtexparser's splitter: no index, many texts."""
    entry = f"@misc{{k,\n  title = {{{bib_escape(text)}}}\n}}\n"
    library = bibtexparser.parse_string(entry, parse_stack=[])
    assert not library.failed_blocks, entry
    raw = strip_enclosing(library.entries[0].fields_dict["title"].value)
    assert carried(_latex_decoder()(raw)) == carried(text)
    assert carried(LatexNodes2Text(math_mode="verbatim").latex_to_text(raw)).replace("ˆ", "^") == carried(text) or (
        "{\\textbraceleft}" in raw or "{\\textbraceright}" in raw)  # plain pylatexenc reads it too, but for `ˆ`


def _hit(paper) -> dict:
    return {"paper_id": paper.paper_id, "title": paper.title, "metadata": paper.metadata, "sentences": paper.sentences}


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(fmt=st.sampled_from(list(FILE)), title=TEXT, abstract=TEXT, venue=TEXT, authors=st.lists(AUTHOR, max_size=3),
       year=st.integers(1500, 2999), doi_suffix=st.from_regex(r"[A-Za-z0-9._;()<>:/\-\\%{}]{1,12}", fullmatch=True),
       kind=st.integers(0, 5), data=st.data())
def test_every_format_carries_every_field_through_an_index(index_dir, encoder, tmp_path_factory, fmt, title, abstract,
                                                           venue, authors, year, doi_suffix, kind, data):
    n = next(_counter)
    abstract = f"Sentence {n} opens it. {abstract}"
    key = f"key{n}-{data.draw(st.from_regex(r'[A-Za-z0-9:.+/-]{0,8}', fullmatch=True))}"
    ids = {"doi": f"10.{1000 + n}/{doi_suffix}", "arxiv": f"{1000 + n:04d}.{n:05d}", "pubmed": str(100000 + n)}
    meta = {"format": fmt, "entry_type": ENTRY_TYPES[fmt][kind], "year": year, "venue": venue, "authors": authors,
            "external_ids": ids}
    first = export_hits({"hits": [{"paper_id": key, "title": title, "metadata": meta, "sentences": [abstract]}]}, fmt)

    path = tmp_path_factory.mktemp("exact") / FILE[fmt]
    path.write_text(first, encoding="utf-8")
    with esqbe.open_index(str(index_dir), encoder=encoder, config=None) as index:
        report = index.index_files([str(path)])
        assert report.stored == 1 and not report.errors and not report.merged, report.summary()
        paper = index.get([key])[key]
    got = paper.metadata
    assert paper.title == carried(title)
    assert " ".join(paper.sentences) == " ".join(split_sentences(carried(abstract))) == carried(abstract)
    assert got["format"] == fmt and got["entry_type"] == ENTRY_TYPES[fmt][kind] and got["year"] == year
    assert got.get("venue", "") == carried(venue)
    assert got["external_ids"] == {k: carried(v) for k, v in ids.items()}
    assert [a["name"] for a in got.get("authors") or []] == [carried(a["name"]) for a in authors]
    assert [bool(a.get("literal")) for a in got.get("authors") or []] == [bool(a.get("literal")) for a in authors]
    # and the paper as indexed exports to the very same file
    assert export_hits({"hits": [_hit(paper)]}, fmt) == first


def test_an_author_with_and_in_the_name_stays_one_author(index_dir, encoder, tmp_path):
    """ `Johnson and Johnson Research` (a person's family name, and an organisation) and `Kim, M. G.`."""
    authors = [{"name": "Ann Johnson and Johnson", "family": "Johnson and Johnson", "given": "Ann"},
               {"name": "Johnson and Johnson Research", "literal": True}, _person("Kim", "M. G.")]
    meta = {"format": "bibtex", "entry_type": "article", "year": 2020, "authors": authors}
    text = export_hits({"hits": [{"paper_id": "jj2020", "title": "T", "metadata": meta,
                                  "sentences": ["One sentence of text."]}]}, "bibtex")
    assert "author = {Johnson {and} Johnson, Ann and {Johnson and Johnson Research} and Kim, M. G.}" in text
    (tmp_path / "jj.bib").write_text(text)
    with esqbe.open_index(str(index_dir), encoder=encoder, config=None) as index:
        index.index_files([str(tmp_path / "jj.bib")])
        paper = index.get(["jj2020"])["jj2020"]
    assert [{k: a[k] for k in ("name", "family", "given", "literal") if k in a} for a in paper.metadata["authors"]] \
        == authors
    # bibtexparser's own name splitting agrees: three authors
    from bibtexparser.middlewares import SeparateCoAuthors

    parsed = bibtexparser.parse_string(text, append_middleware=[SeparateCoAuthors()])
    assert len(parsed.entries[0].fields_dict["author"].value) == 3


def test_the_trial_abstracts_come_back_as_written(index_dir, encoder, tmp_path):
    """The trial's case: a Zotero-shaped entry with LaTeX in its abstract, indexed, exported, indexed again."""
    zotero = r"""@article{lee2021cells,
  title = {Cell Growth at 22 $\mu$m},
  author = {Lee, Ana},
  journal = {J. Cells},
  year = {2021},
  doi = {10.1234/cells.2021.7},
  abstract = {Cells grew to 22 $\mu$m at 37 $^{\circ}$C. Yield rose by 21{\textbackslash}\% (p {\textless} 0.05). We used the \{a, b\} set and x\_1.}
}
"""
    (tmp_path / "z.bib").write_text(zotero)
    with esqbe.open_index(str(index_dir), encoder=encoder, config=None) as index:
        index.index_files([str(tmp_path / "z.bib")])
        paper = index.get(["lee2021cells"])["lee2021cells"]
    abstract = " ".join(paper.sentences)
    assert "22 $\\mu$m at 37 $^{\\circ}$C" in abstract and "21\\%" in abstract and "{a, b}" in abstract
    for fmt in FILE:
        text = export_hits({"hits": [_hit(paper)]}, fmt)
        path = tmp_path / f"again-{FILE[fmt]}"
        path.write_text(text)
        with esqbe.open_index(str(tmp_path / f"ix-{fmt}"), encoder=encoder, config=None) as index:
            index.index_files([str(path)])
            again = index.get(["lee2021cells"])["lee2021cells"]
        assert (again.title, again.sentences) == (paper.title, paper.sentences), fmt
        if fmt == "bibtex":  # the entry as Zotero wrote it, line for line: `$\mu$` stays math
            assert text.splitlines() == zotero.splitlines()
        if fmt == "csl-json":
            assert json.loads(text)[0]["abstract"] == abstract
