"""Readers: every input format on the real shared samples, and every kind of bad input."""
import gzip
import io
import json
import sys

import pytest

from esqbe.ingest.formats import FORMATS, detect_format
from esqbe.ingest.readers import InputError, ReadReport, read_papers

from .conftest import SHARED as SHARED_ROOT

SHARED = SHARED_ROOT / "data"
S2ORC = SHARED / "s2orc" / "metadata-sample.jsonl"
S2AG = SHARED / "s2orc" / "s2ag-datasets-samples"
CSFCUBE = SHARED / "csfcube-dev" / "abstracts-csfcube-preds.jsonl"
CSABSTRUCT_DEV = SHARED / "csabstruct" / "dev.jsonl"

needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="shared sample data not available")


def read_all(source, **kwargs):
    report = ReadReport()
    papers = list(read_papers(source, report=report, **kwargs))
    return papers, report


def assert_accounted(report):
    """Every non-blank line was yielded, skipped or reported."""
    assert report.read == report.yielded + sum(report.skipped.values()) + len(report.errors)
    json.dumps(report.summary())


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def rec(**fields):
    return json.dumps(fields)


GOOD = rec(id="p1", title="A title", abstract=["We study X.", "We use Y."], facets=["background", "method"])


# ---------------------------------------------------------------- real samples


@needs_shared
def test_s2orc_metadata_sample_skips_missing_abstracts():
    papers, report = read_all(S2ORC)
    assert report.read == 1000
    assert report.yielded == len(papers) == 488
    assert report.skipped == {"no abstract": 512}
    assert report.errors == []
    assert all(p.sentences and set(p.facets) == {"unlabeled"} for p in papers)
    assert papers[0].metadata["format"] == "s2orc"
    assert_accounted(report)


@needs_shared
def test_s2ag_abstracts_sample():
    papers, report = read_all(S2AG / "abstracts-sample.jsonl.gz")
    # the dataset's `updated` (when S2 last changed the record) is not kept, and said
    assert report.summary() == {"read": 100, "yielded": 100, "skipped": {}, "errors": [], "not_kept": {"updated": 100}}
    first = papers[0]
    assert first.paper_id == "156832481"
    assert first.title == ""  # the abstracts dataset carries no title
    assert first.sentences[0].startswith("A large body of literature has concluded")
    assert first.metadata == {"format": "s2ag-abstracts", "external_ids": {"mag": "2418524938", "corpus_id": "156832481"}}


@needs_shared
def test_s2ag_s2orc_sample_takes_title_and_abstract_from_spans():
    papers, report = read_all(S2AG / "s2orc-sample.jsonl.gz")
    assert (report.read, report.yielded, report.errors) == (8, 8, [])
    first = papers[0]
    assert first.paper_id == "255784639"
    assert first.title == "Biomedical event extraction based on GRU integrating attention mechanism"
    assert first.sentences[0] == "Background: Biomedical event extraction is a crucial task in biomedical text mining."
    # the abstract span is listed twice in the annotations; it must be read once
    assert first.abstract.count("Biomedical event extraction is a crucial task") == 1
    assert first.sentences[-1].endswith("effectiveness of the proposed framework.")


@needs_shared
def test_s2ag_papers_records_are_refused_as_they_have_no_abstract():
    with pytest.raises(InputError) as excinfo:
        read_all(S2AG / "papers-sample.jsonl.gz", strict=True)
    assert excinfo.value.field == "format" and excinfo.value.line == 1
    assert "'papers'" in excinfo.value.reason
    papers, report = read_all(S2AG / "papers-sample.jsonl.gz")  # without strict: every line says why
    assert papers == [] and len(report.errors) == 100 and {e.field for e in report.errors} == {"format"}
    # forced, every record is accounted for as having no abstract
    papers, report = read_all(S2AG / "papers-sample.jsonl.gz", format="s2ag-abstracts")
    assert papers == [] and report.skipped == {"no abstract": 100}


@needs_shared
def test_csfcube_release():
    papers, report = read_all(CSFCUBE)
    assert (report.read, report.yielded, report.errors) == (4205, 4205, [])
    first = papers[0]
    assert first.paper_id == "388"
    assert first.title.startswith("A Sentimental Education")
    assert len(first.sentences) == 3
    assert first.facets == ["background", "method", "method"]
    assert first.metadata == {"format": "csfcube", "year": 2004}
    assert not any("objective" in p.facets for p in papers)


@needs_shared
def test_csfcube_raw_labels_keep_objective():
    papers, _ = read_all(CSFCUBE, raw_labels=True)
    assert sum(p.facets.count("objective") for p in papers) == 2225


@needs_shared
def test_csabstruct_folds_objective_into_background():
    papers, report = read_all(CSABSTRUCT_DEV)
    assert (report.read, report.yielded, report.errors) == (295, 295, [])
    first = papers[0]
    assert first.paper_id == "csabstruct-dev-0000" and first.title == ""
    assert first.facets[0] == "background"  # "objective" in the file
    counts = {f: sum(p.facets.count(f) for p in papers) for f in ("background", "objective")}
    assert counts == {"background": 681 + 244, "objective": 0}  # README: 681 background, 244 objective


@needs_shared
def test_csabstruct_raw_labels_keep_objective():
    papers, _ = read_all(CSABSTRUCT_DEV, raw_labels=True)
    assert papers[0].facets[0] == "objective"
    assert sum(p.facets.count("objective") for p in papers) == 244
    assert sum(p.facets.count("background") for p in papers) == 681


# ---------------------------------------------------------------- detection and override


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"paper_id": "1", "title": "t", "abstract": None, "year": 1975}, "s2orc"),
        ({"corpusid": 1, "openaccessinfo": {}, "abstract": "x"}, "s2ag-abstracts"),
        ({"corpusId": 1, "abstract": "x"}, "s2ag-abstracts"),
        ({"corpusid": 1, "externalids": {}, "content": {}}, "s2ag-s2orc"),
        ({"paper_id": "1", "title": "t", "abstract": ["s"], "pred_labels": ["method_label"]}, "csfcube"),
        ({"paper_id": "1", "title": "t", "abstract": ["s"]}, "csfcube"),
        ({"paper_id": "1", "sentences": ["s"], "labels": ["method"], "confs": [1.0]}, "csabstruct"),
        ({"id": "1", "title": "t", "abstract": "x"}, "jsonl"),
    ],
)
def test_detect_format(record, expected):
    assert detect_format(record) == expected


def test_detect_format_names_the_keys_it_saw():
    with pytest.raises(ValueError, match=r"\['body', 'doc'\]"):
        detect_format({"doc": 1, "body": "x"})


def test_undetectable_line_is_reported_with_location_and_detection_goes_on(tmp_path):
    path = write_lines(tmp_path / "odd.jsonl", ["", rec(doc=1, body="x"), GOOD])
    with pytest.raises(InputError) as excinfo:
        read_all(path, strict=True)
    assert str(excinfo.value).startswith(f"{path}:2: format: cannot detect the input format from keys ['body', 'doc']")
    papers, report = read_all(path)
    assert [p.paper_id for p in papers] == ["p1"]
    assert [str(e) for e in report.errors] == [str(excinfo.value)]
    assert_accounted(report)


def test_detection_uses_first_parseable_record(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", ["{not json", GOOD])
    papers, report = read_all(path)
    assert [p.paper_id for p in papers] == ["p1"]
    assert [e.line for e in report.errors] == [1]


def test_format_override(tmp_path):
    # a plain-JSONL record that also has `paper_id` is detected as s2orc; forcing jsonl reads `id`
    path = write_lines(tmp_path / "p.jsonl", [rec(paper_id="s2", id="mine", title="T", abstract="One. Two.")])
    assert read_all(path)[0][0].paper_id == "s2"
    papers, _ = read_all(path, format="jsonl")
    assert papers[0].paper_id == "mine" and papers[0].metadata["format"] == "jsonl"


def test_unknown_format_name_is_refused_at_once():
    with pytest.raises(ValueError, match="valid formats: s2orc, s2ag-abstracts, s2ag-s2orc, csfcube, csabstruct, jsonl"):
        read_papers("does-not-matter.jsonl", format="pubmed")


# ---------------------------------------------------------------- plain jsonl and sources


def test_plain_jsonl_string_and_list_abstracts(tmp_path):
    path = write_lines(
        tmp_path / "p.jsonl",
        [
            GOOD,
            "",
            "   ",
            rec(id=7, title=None, abstract="First sentence here. Second one follows.", year=2020),
        ],
    )
    papers, report = read_all(path)
    assert report.summary() == {"read": 2, "yielded": 2, "skipped": {}, "errors": []}
    assert papers[0].facets == ["background", "method"]
    assert papers[1].paper_id == "7" and papers[1].title == ""
    assert papers[1].sentences == ["First sentence here.", "Second one follows."]
    assert papers[1].facets == ["unlabeled", "unlabeled"]
    assert papers[1].metadata == {"format": "jsonl", "year": 2020}


def test_plain_jsonl_raw_labels(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [rec(id="1", abstract=["a.", "b."], facets=["objective", "results"])])
    assert read_all(path)[0][0].facets == ["background", "result"]
    assert read_all(path, raw_labels=True)[0][0].facets == ["objective", "result"]


@pytest.mark.parametrize("abstract", [None, "", "  \n ", [], ["", "  "]])
def test_missing_abstract_is_skipped_and_counted(tmp_path, abstract):
    path = write_lines(tmp_path / "p.jsonl", [rec(id="1", title="t", abstract=abstract), rec(id="2", title="t")])
    papers, report = read_all(path, strict=True)
    assert papers == []
    assert report.skipped == {"no abstract": 2}


def test_gzip_source(tmp_path):
    lines = [GOOD, rec(id="p2", abstract="Only one sentence.")]
    for name in ("p.jsonl.gz", "gzipped-without-suffix.jsonl"):
        path = tmp_path / name
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        papers, report = read_all(path)
        assert [p.paper_id for p in papers] == ["p1", "p2"] and report.errors == []


def test_truncated_gzip_is_reported(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    payload = "".join(rec(id=f"p{i}", abstract=f"Sentence number {i} is here.") + "\n" for i in range(2000))
    data = gzip.compress(payload.encode())
    path.write_bytes(data[: len(data) // 2])
    papers, report = read_all(path)
    assert 0 < len(papers) < 2000
    [error] = report.errors
    assert (error.field, error.line) == ("file", len(papers) + 1)  # the first line it could not read
    assert "cannot read further" in error.reason
    with pytest.raises(InputError):
        read_all(path, strict=True)


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(GOOD + "\n[1, 2]\n"))
    papers, report = read_all("-")
    assert [p.paper_id for p in papers] == ["p1"]
    assert [str(e) for e in report.errors] == ["<stdin>:2: record: expected a JSON object, got list"]


def test_open_text_stream():
    papers, report = read_all(io.StringIO(GOOD + "\n"))
    assert [p.paper_id for p in papers] == ["p1"] and report.yielded == 1


def test_utf8_bom_and_bad_encoding(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n" + b'{"id": "x", "abstract": "caf\xe9."}\n')
    papers, report = read_all(path)
    assert [p.paper_id for p in papers] == ["p1"]
    assert report.errors[0].line == 2 and report.errors[0].field == "encoding"


# ---------------------------------------------------------------- bad input


BAD_RECORDS = [
    ('{"id": "1", "abstract": "x"', "json", "Expecting"),
    ('"just a string"', "record", "expected a JSON object, got str"),
    (rec(title="t", abstract="Text."), "id", "missing"),
    (rec(id="  ", abstract="Text."), "id", "missing"),
    (rec(id=["1"], abstract="Text."), "id", "expected a string or integer, got list"),
    (rec(id="1", abstract=42), "abstract", "expected a string or a list of sentences, got int"),
    (rec(id="1", abstract=["ok.", 3]), "abstract", "sentence 1 is int, expected a string"),
    (rec(id="1", abstract=["ok.", " "]), "abstract", "sentence 1 is empty"),
    (rec(id="1", title=5, abstract="Text."), "title", "expected a string, got int"),
    (rec(id="1", abstract=["a.", "b."], facets=["method"]), "facets", "1 labels for 2 sentences"),
    (rec(id="1", abstract=["a.", "b."], facets=["method", "novelty"]), "facets", "label 1: unknown facet label 'novelty'"),
    (rec(id="1", abstract="A. B.", facets=["method", "result"]), "facets", "only valid with an abstract given as a list"),
    (rec(id="1", abstract=["a."], facets="method"), "facets", "expected a list of labels, got str"),
]


@pytest.mark.parametrize("bad_line, field, reason", BAD_RECORDS)
def test_bad_line_is_reported_and_reading_goes_on(tmp_path, bad_line, field, reason):
    path = write_lines(tmp_path / "in.jsonl", [GOOD, "", bad_line, rec(id="p3", abstract="Still read.")])
    papers, report = read_all(path, format="jsonl")
    assert [p.paper_id for p in papers] == ["p1", "p3"]
    [error] = report.errors
    assert (error.source, error.line, error.field) == (str(path), 3, field)
    assert reason in error.reason
    assert str(error) == f"{path}:3: {field}: {error.reason}"
    assert isinstance(error, ValueError)
    assert_accounted(report)


@pytest.mark.parametrize("bad_line, field, reason", BAD_RECORDS[:3])
def test_strict_raises_at_first_bad_line(tmp_path, bad_line, field, reason):
    path = write_lines(tmp_path / "in.jsonl", [GOOD, bad_line, "{also bad"])
    seen = []
    with pytest.raises(InputError) as excinfo:
        for paper in read_papers(path, format="jsonl", strict=True):
            seen.append(paper.paper_id)
    assert seen == ["p1"]
    assert (excinfo.value.line, excinfo.value.field) == (2, field)


def test_bad_records_in_other_formats(tmp_path):
    lines = [
        rec(paper_id="1", title="t", abstract=["a.", "b."], pred_labels=["method_label"]),
        rec(paper_id="2", title="t", abstract="not a list", pred_labels=["method_label"]),
        rec(paper_id="3", title="t", abstract=["a."], pred_labels=["claim_label"]),
    ]
    _, report = read_all(write_lines(tmp_path / "c.jsonl", lines))
    assert [(e.line, e.field) for e in report.errors] == [(1, "pred_labels"), (2, "abstract"), (3, "pred_labels")]

    _, report = read_all(write_lines(tmp_path / "s.jsonl", [rec(paper_id="1", title="t", abstract=["x"], year=1)]), format="s2orc")
    assert [(e.field, e.reason) for e in report.errors] == [("abstract", "expected a string, got list")]

    lines = [rec(paper_id="1", sentences=["a.", "b."], labels=["method", "objective", "result"])]
    _, report = read_all(write_lines(tmp_path / "a.jsonl", lines))
    assert [(e.field, e.reason) for e in report.errors] == [("labels", "3 labels for 2 sentences")]


def test_s2ag_s2orc_edge_cases(tmp_path):
    text = "Title here\nAbstract sentence one. Abstract sentence two."
    ok = {"corpusid": 1, "content": {"text": text, "annotations": {"title": '[{"start":0,"end":10}]', "abstract": '[{"start":11,"end":56}]'}}}
    no_abstract = {"corpusid": 2, "content": {"text": text, "annotations": {"title": '[{"start":0,"end":10}]', "abstract": None}}}
    no_content = {"corpusid": 3, "content": None}
    bad_span = {"corpusid": 4, "content": {"text": text, "annotations": {"abstract": '[{"start":11,"end":999}]'}}}
    path = write_lines(tmp_path / "s2.jsonl", [json.dumps(r) for r in (ok, no_abstract, no_content, bad_span)])
    papers, report = read_all(path)
    assert [(p.paper_id, p.title, p.sentences) for p in papers] == [
        ("1", "Title here", ["Abstract sentence one.", "Abstract sentence two."])
    ]
    assert report.skipped == {"no abstract": 2}
    assert [(e.line, e.field) for e in report.errors] == [(4, "content.annotations.abstract")]


def test_formats_constant():
    assert FORMATS == ("s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl", "arxiv", "openalex",
                       "bibtex", "ris", "csl-json", "zotero")


def test_an_empty_input_says_so(tmp_path):
    """ an empty file (or one of blank lines) was read as "read 0" without a word."""
    for text in ("", "\n\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(text)
        papers, report = read_all(path)
        assert papers == [] and [str(e) for e in report.errors] == [f"{path}: file: no records: the input is empty"]
        with pytest.raises(InputError, match="no records"):
            list(read_papers(path, strict=True))
    bib = tmp_path / "comments.bib"
    bib.write_text("% only a comment\n")
    _, report = read_all(bib)
    assert [e.reason for e in report.errors] == ["no records in it"]
