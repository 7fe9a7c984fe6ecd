"""A record read from BibTeX goes back to BibTeX as written: every field the researcher wrote (its LaTeX, braces,
ties, dashes, math, `@string` references resolved), its entry type and citation key come out byte for byte (runs of
white space aside, which BibTeX ignores), while the decoded text is what search, display and the other formats use;
and a record from any other format goes out as BibTeX that decodes to the same text, math kept as math.

The grammar below draws LaTeX-bearing values as researchers write them: inline math, accent and symbol macros, ties,
`--`/`---`, protected capitals (`{ACM}`), escaped specials (`\\%`), nested braces and names with `{and}`."""
from __future__ import annotations

import io
import json

import bibtexparser
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pylatexenc.latex2text import LatexNodes2Text

import esqbe
from cli import main
from esqbe.domain import IndexedPaper
from esqbe.ingest.latex import carried, written
from esqbe.ingest.readers import ReadReport, read_papers
from esqbe.query.export import export_hits

# ---------------------------------------------------------------- the grammar of a BibTeX value

WORDS = st.sampled_from(["Particles", "scattering", "of", "light", "model", "We", "measure", "3D", "x", "Caf",
                         "networks", "2020", "iPhone", "e.g.", "(p", "<", "0.05)", "a/b", ":", ";", "?", "!"])
MATH = st.sampled_from(["$\\mu$", "$x^{2}$", "$\\alpha_i$", "$\\{a, b\\}$", "$10^{-3}$", "$\\mathcal{O}(n \\log n)$",
                        "$^{\\circ}$", "$\\leq$"])
ACCENTS = st.sampled_from(["{\\'e}", "\\'{e}", "{\\\"o}", "\\\"{u}", "{\\L}", "{\\o}", "\\c{c}", "\\v{S}", "{\\ss}",
                           "\\^{i}", "{\\aa}", "\\'Alvarez", "M{\\\"u}ller", "Gal{\\'i}cian"])
SYMBOLS = st.sampled_from(["\\%", "\\&", "\\_", "\\#", "\\$", "{\\textbackslash}", "\\textendash{}", "{\\textasciitilde}",
                           "\\ldots{}", "{\\textless}", "5~$\\mu$m", "~", "--", "---", "1--10", "``quoted''", "'"])
PROTECTED = st.sampled_from(["{ACM}", "{Mie}", "{BERT}-based", "{{A}ttention}", "{a {b} c}", "{\\relax Ca}", "{DNA}"])
PIECE = st.one_of(WORDS, MATH, ACCENTS, SYMBOLS, PROTECTED)
VALUE = st.lists(st.tuples(PIECE, st.sampled_from([" ", " ", "", "  ", "\n    "])), min_size=1, max_size=10).map(
    lambda pairs: "".join(p + sep for p, sep in pairs).strip())

GIVEN = st.sampled_from(["Johan", "Hans", "Martin", "M. G.", "{\\L}ukasz", "Jos{\\'e}", "Ann-Marie", "Jean", "Per"])
FAMILY = st.sampled_from(["Vries", "Ohain", "King", "Kowalski", "M{\\\"u}ller", "\\'Alvarez", "Brinch Hansen",
                          "Garc{\\'i}a-Mateo", "La Fontaine", "Johnson {and} Johnson", "O'Brien", "{\\v{S}}koda"])
VON = st.sampled_from(["de", "von", "van der", "de la", "di", "d'"])
JR = st.sampled_from(["Jr.", "Sr.", "III", "IV"])
ORGANISATION = st.sampled_from(["{Google AI Language}", "{Barnes and Noble}", "{The {ACM} Council}",
                                "{Centre for {\\'E}tudes}"])


@st.composite
def bib_name(draw) -> str:
    """One name as BibTeX takes it: `von Last, First`, `von Last, Jr, First`, `First von Last`, an organisation."""
    form = draw(st.integers(0, 4))
    given, family = draw(GIVEN), draw(FAMILY)
    von = draw(st.one_of(st.just(""), VON))
    head = f"{von} {family}".strip()
    if form == 0:
        return f"{head}, {given}"
    if form == 1:
        return f"{head}, {draw(JR)}, {given}"
    if form == 2:
        return f"{head}, {given} {draw(VON)}"  # a dropping particle after the given name
    if form == 3 and " " not in family and "{" not in family:
        return f"{given} {head}"
    return draw(ORGANISATION)


AUTHORS = st.lists(bib_name(), min_size=1, max_size=4).map(" and ".join)
TYPES = st.sampled_from(["article", "Article", "INPROCEEDINGS", "inproceedings", "misc", "phdthesis", "TechReport"])
KEYS = st.from_regex(r"[A-Za-z][A-Za-z0-9:_.+/-]{0,12}", fullmatch=True)


@st.composite
def bib_entry(draw) -> str:
    """An entry of hand-written BibTeX: braced and quoted values, a number, a month macro, an `@string` reference."""
    fields = [("title", "{" + draw(VALUE) + "}"), ("author", "{" + draw(AUTHORS) + "}"),
              ("journal", draw(st.sampled_from(["jacm", "{" + draw(VALUE) + "}"]))),
              ("pages", draw(st.sampled_from(["{1--10}", '"101--105"', "{e1234}"]))),
              ("Note", '"' + draw(VALUE).replace('"', "''") + '"'),
              ("month", draw(st.sampled_from(["jan", "{June}", "sep"]))), ("year", draw(st.sampled_from(["2020", "{1999}"]))),
              ("abstract", "{We measure things. " + draw(VALUE) + "}")]
    order = draw(st.permutations(fields))
    body = ",\n".join(f"  {name} = {value}" for name, value in order)
    return f"@{draw(TYPES)}{{{draw(KEYS)},\n{body}\n}}\n"


STRINGS = "@string{jacm = {Journal of the {ACM}}}\n\n"


def _fields(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """(entry type as written, key, {field: value as written, white space runs one space}) per entry, by bibtexparser."""
    library = bibtexparser.parse_string(text, parse_stack=[])
    assert not library.failed_blocks, text
    out = []
    for e in library.entries:
        kind = e.raw.split("{", 1)[0].strip().lstrip("@").strip()
        out.append((kind, e.key, {f.key: written(f.value) for f in e.fields}))
    return out


#: what the `@string` of STRINGS makes of a value: a reference, its string's value as written; `#` joined, one value
RESOLVED = {"jacm": "{Journal of the {ACM}}", '"Proc. " # jacm': "{Proc. Journal of the {ACM}}"}


def _expected(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """What the export must hold: the file's entries, `@string` references resolved (RESOLVED)."""
    return [(kind, key, {k: RESOLVED.get(v, v) for k, v in fields.items()}) for kind, key, fields in _fields(text)]


def _read(text: str, fmt: str = "bibtex"):
    report = ReadReport()
    papers = list(read_papers(io.StringIO(text), fmt, report=report))
    assert not report.errors and not report.skipped, [str(e) for e in report.errors]
    return papers


def _hit(paper) -> dict:
    return {"paper_id": paper.paper_id, "title": paper.title, "metadata": paper.metadata, "sentences": paper.sentences}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bib_entry(), min_size=1, max_size=3, unique_by=lambda e: e.split("{", 1)[1].split(",", 1)[0].lower()))
def test_every_field_goes_back_to_bibtex_as_written(entries):
    """BibTeX in -> the metadata as stored (JSON, as every backend keeps it) -> BibTeX out: the same bytes per field,
    entry type and citation key; the decoded text is what the paper holds."""
    text = STRINGS + "\n".join(entries)
    papers = [type(p).from_dict(json.loads(json.dumps(p.to_dict()))) for p in _read(text)]
    exported = export_hits({"hits": [_hit(p) for p in papers]}, "bibtex")
    assert _fields(exported) == _expected(text)
    for paper, (_, _, fields) in zip(papers, _fields(text)):  # what search, display and the other formats use
        decode = LatexNodes2Text(math_mode="verbatim", keep_braced_groups=False).latex_to_text
        assert paper.title == carried(decode(fields["title"][1:-1]))


#: decoded text as another format holds it: Unicode, inline math, TeX's specials as characters, prices, dashes
TEXT_PIECE = st.one_of(WORDS, MATH, st.sampled_from([
    "%", "&", "#", "_", "{", "}", "{a, b}", "$", "$5 and $10", "~", "\\", "\\mu", "--", "---", "``", "''", "^", "é",
    "Łukasz", "μm", "中文", "–", "Straße", "{ACM}", "50%", "C#", "x_1", "$x$5"]))
TEXT = st.lists(TEXT_PIECE, min_size=1, max_size=10).map(" ".join)


@settings(max_examples=120, deadline=None)
@given(fmt=st.sampled_from(["csl-json", "ris", "jsonl"]), title=TEXT, venue=TEXT, abstract=TEXT)
def test_another_formats_text_goes_out_as_bibtex_that_decodes_to_it(fmt, title, venue, abstract):
    """A record from another format: its text out as BibTeX and read back decoded is the same text; inline math is
    written as math (not escaped into text), everything else escaped so that LaTeX prints it as it is."""
    meta = {"format": fmt, "venue": venue, "year": 2020}
    text = export_hits({"hits": [{"paper_id": "k", "title": title, "metadata": meta,
                                  "sentences": [f"It opens. {abstract}"]}]}, "bibtex")
    [paper] = _read(text)
    assert paper.title == carried(title)
    assert paper.metadata["venue"] == carried(venue)
    assert " ".join(paper.sentences) == carried(f"It opens. {abstract}")
    for math in ("$\\mu$", "$x^{2}$", "$\\alpha_i$", "$\\mathcal{O}(n \\log n)$"):
        if math in title:
            assert math in text.split("title = ", 1)[1].split("\n", 1)[0]  # math stays math


def test_the_cases_of_the_trial_come_back_byte_for_byte():
    text = r"""@Article{kowalski2020,
  title = {Particles at 5~$\mu$m: {ACM} and {Mie} scattering},
  author = {{\L}ukasz Kowalski and de Vries, Johan and King, Jr., Martin and {Google AI Language}},
  journal = {J. {ACM}},
  pages = {1--10},
  year = {2020},
  abstract = {We measure particles at 5~$\mu$m. They scatter light.}
}
"""
    [paper] = _read(text)
    assert paper.title == "Particles at 5 $\\mu$m: ACM and Mie scattering" and paper.metadata["pages"] == "1–10"
    assert [a["name"] for a in paper.metadata["authors"]] == ["Łukasz Kowalski", "Johan de Vries", "Martin King Jr.",
                                                           "Google AI Language"]
    assert export_hits({"hits": [_hit(paper)]}, "bibtex") == text
    # the other formats carry the decoded text; BibTeX made from it (no entry kept as written) keeps math as math
    stripped = {k: v for k, v in paper.metadata.items() if k != "bibtex"}
    again = export_hits({"hits": [{**_hit(paper), "metadata": stripped}]}, "bibtex")
    assert "title = {Particles at 5 $\\mu$m: {ACM} and Mie scattering}" in again
    assert "author = {Kowalski, Łukasz and de Vries, Johan and King, Jr., Martin and {Google AI Language}}" in again
    [back] = _read(again)
    assert (back.title, back.sentences, back.metadata["authors"]) == (paper.title, paper.sentences,
                                                                      paper.metadata["authors"])


def test_fields_merged_in_are_added_and_scores_never_overwrite_a_note():
    """A field the entry lacks (a venue from a dump merged in) is added from its text; `--with-scores` puts esqbe's
    rank in a field the entry does not hold."""
    text = "@misc{k,\n  title = {A {BERT} model},\n  note = {my own note},\n  abstract = {It works. It is fast.}\n}\n"
    [paper] = _read(text)
    paper.metadata["venue"] = "Proc. of 50% & more"
    paper.metadata["external_ids"] = {"doi": "10.1/x_y"}
    out = export_hits({"hits": [{**_hit(paper), "rank": 1, "score": 0.5, "similarity": 0.5}]}, "bibtex",
                      with_scores=True)
    [(kind, key, fields)] = _fields(out)
    assert (kind, key) == ("misc", "k")
    assert fields["title"] == "{A {BERT} model}" and fields["note"] == "{my own note}"
    assert fields["booktitle"] == "{Proc. of 50\\% \\& more}" and fields["doi"] == "{10.1/x\\_y}"
    assert fields["annote"].startswith("{esqbe rank 1, score 0.5")


def test_an_entry_as_written_from_other_metadata_cannot_break_the_file():
    """Metadata that claims to be an entry as written (a JSON Lines record, POST /papers) is written only where each
    value is one balanced BibTeX value; else its text is escaped: the file still holds one entry per hit."""
    hostile = {"type": "misc}\n@evil{", "key": "a,b}", "fields": {
        "title": "{x}},\n@misc{forged, title={y}", "note": "{a} # {b", "year": "2020 }", "ok": "{fine {one}}",
        "bad name}": "{z}"}}
    out = export_hits({"hits": [{"paper_id": "p1", "title": "T", "metadata": {"bibtex": hostile}, "sentences": ["S."]},
                                {"paper_id": "p2", "title": "U", "metadata": {}, "sentences": ["S."]}]}, "bibtex")
    library = bibtexparser.parse_string(out, parse_stack=[])
    assert not library.failed_blocks and [e.key for e in library.entries] == ["a_b_", "p2"]
    fields = {f.key: f.value for f in library.entries[0].fields}
    assert fields["ok"] == "{fine {one}}" and "@" not in "".join(k for k in fields)


@pytest.fixture(scope="module")
def library_index(tmp_path_factory, encoder):
    """A hand-written library (the grammar's cases, @string, month macros, quoted values) indexed in a real index."""
    root = tmp_path_factory.mktemp("as-written")
    entries = [r"""@Article{kowalski2020,
  title = {Particles at 5~$\mu$m: {ACM} and {Mie} scattering},
  author = {{\L}ukasz Kowalski and de Vries, Johan and von Ohain, Hans and King, Jr., Martin and La Fontaine, Jean de},
  journal = jacm,
  pages = {1--10},
  month = jan,
  year = 2020,
  file = {Full Text:/home/me/papers/kowalski.pdf:application/pdf},
  abstract = {We measure particles at 5~$\mu$m with 50\% yield. The {Mie} model fits.}
}""", r"""@inproceedings{garcia2021,
  title = "Streaming {ASR} for Gal{\'i}cian --- a {BERT}-based rescorer",
  author = {Garc{\'i}a-Mateo, Carmen and {Barnes and Noble} and \'Alvarez, M.},
  booktitle = "Proc. " # jacm,
  keywords = {speech, {ASR}},
  abstract = {We rescore hypotheses with a {BERT} model. Word error rates fall by 8\% relative.}
}"""]
    (root / "lib.bib").write_text(STRINGS + "\n\n".join(entries) + "\n")
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(root / "lib.bib")])
        assert report.stored == 2 and not report.errors, report.summary()
    return root


def test_the_embedded_index_keeps_the_entries_as_written(library_index):
    """Through a real index and the CLI: `esqbe query --format bibtex` writes each entry back as it was written."""
    want = {key: (kind, fields) for kind, key, fields in _expected((library_index / "lib.bib").read_text())}
    for query, hit in (("kowalski2020", "garcia2021"), ("garcia2021", "kowalski2020")):
        r = CliRunner().invoke(main, ["query", "--path", str(library_index / "ix"), "--paper", query, "--format",
                                      "bibtex", "--no-server"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        [(kind, key, fields)] = _fields(r.stdout)
        assert key == hit and (kind, fields) == want[hit]
    assert want["garcia2021"][1]["booktitle"] == "{Proc. Journal of the {ACM}}"  # `#` joined, the @string resolved


def test_the_engine_documents_keep_the_entries_as_written(library_index, encoder):
    """Elasticsearch and OpenSearch keep a paper's metadata in `_source` (`enabled: false`): the entry as written
    comes back from a document as it went in (JSON, as the engines answer it)."""
    from esqbe.backends.engines.documents import doc_to_text, paper_to_doc

    with esqbe.open_index(str(library_index / "ix"), encoder=encoder, config=None) as index:
        papers = index.get(["kowalski2020", "garcia2021"])
    for paper in papers.values():
        doc = json.loads(json.dumps(paper_to_doc(IndexedPaper(paper, np.zeros((len(paper.sentences), 4))))))
        assert doc_to_text(doc).metadata == paper.metadata
        assert "bibtex" not in doc.get("meta_kw", {}) and not any(k.startswith("bibtex") for k in doc.get("meta_kw", {}))
    entry = papers["kowalski2020"].metadata["bibtex"]
    assert entry["type"] == "Article" and entry["fields"]["month"] == "jan"
    assert entry["fields"]["title"] == "{Particles at 5~$\\mu$m: {ACM} and {Mie} scattering}"


def test_a_server_that_hides_paths_leaves_out_the_file_field(library_index):
    from esqbe.query.results import file_names_only

    with esqbe.open_index(str(library_index / "ix"), config=None) as index:
        meta = index.get(["kowalski2020"])["kowalski2020"].metadata
    assert "file" in meta["bibtex"]["fields"]
    assert "file" not in file_names_only(meta)["bibtex"]["fields"] and "/home/me" not in json.dumps(file_names_only(meta))
