"""Property-based tests (hypothesis) over the readers: any JSON value in any field of any input format.

Every non-blank line ends yielded as a paper, skipped with a reason, or reported as `file:line:
field: reason`; reading never raises without --strict, and --strict raises exactly the first error.
Bounded (max_examples, no deadline) so the suite stays fast.
"""
from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from esqbe.domain import FACET_LABELS
from esqbe.ingest.library import WHOLE_FILE_FORMATS, sniff_format
from esqbe.ingest.readers import FORMATS, InputError, ReadReport, read_papers

# text as JSON can carry it: including lone surrogates (`"\ud800"` is valid JSON, not valid Unicode)
texts = st.text(max_size=30) | st.sampled_from(["\ud800", "A sentence. \udfff Another one.", "x\u0000y", "\u2028"])
# any JSON value, small
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
sentences = st.lists(st.text(min_size=0, max_size=40) | texts, max_size=5)
labels = st.lists(st.sampled_from(["background", "method", "result", "objective", "other", "bogus", "", "METHODS"]), max_size=5)
span = st.fixed_dictionaries({"start": st.integers(-2, 50), "end": st.integers(-2, 60)})

# per format: each field either a plausible value or any JSON value
FIELDS = {
    "jsonl": {"id": st.text(max_size=8) | st.integers(), "title": st.text(max_size=20),
              "abstract": st.text(max_size=80) | sentences, "facets": labels, "year": st.integers(1900, 2030)},
    "s2orc": {"paper_id": st.text(max_size=8), "title": texts, "abstract": st.text(max_size=80) | texts,
              "year": st.integers(1900, 2030)},
    "s2ag-abstracts": {"corpusid": st.integers(0, 10**9), "abstract": st.text(max_size=80), "year": st.integers()},
    "s2ag-s2orc": {"corpusid": st.integers(0, 10**9),
                   "content": st.fixed_dictionaries({"text": st.text(max_size=60),
                                                     "annotations": st.fixed_dictionaries({
                                                         "title": st.lists(span, max_size=2).map(json.dumps),
                                                         "abstract": st.lists(span, max_size=3).map(json.dumps)})})},
    "csfcube": {"paper_id": st.text(max_size=8), "title": st.text(max_size=20), "abstract": sentences,
                "pred_labels": labels, "metadata": st.fixed_dictionaries({"year": st.integers()})},
    "csabstruct": {"paper_id": st.text(max_size=8), "sentences": sentences, "labels": labels},
    "arxiv": {"id": st.text(max_size=10), "title": texts, "abstract": st.text(max_size=80) | texts,
              "categories": st.text(max_size=12), "authors": st.text(max_size=30),
              "authors_parsed": st.lists(st.lists(st.text(max_size=8), max_size=3), max_size=3),
              "versions": st.lists(st.fixed_dictionaries({"version": st.just("v1"), "created": st.text(max_size=30)}),
                                   max_size=2), "doi": st.text(max_size=12)},
    "openalex": {"id": st.text(max_size=10).map(lambda s: "https://openalex.org/W" + s), "title": texts,
                 "publication_year": st.integers(1900, 2030),
                 "abstract_inverted_index": st.dictionaries(st.text(max_size=8),
                                                            st.lists(st.integers(-1, 30), max_size=3), max_size=6),
                 "authorships": st.lists(st.fixed_dictionaries({"author": st.fixed_dictionaries(
                     {"display_name": texts})}), max_size=2)},
}


@st.composite
def records(draw, fmt: str):
    record = {}
    for key, plausible in FIELDS[fmt].items():
        choice = draw(st.sampled_from(["plausible", "plausible", "any", "absent"]))
        if choice == "plausible":
            record[key] = draw(plausible)
        elif choice == "any":
            record[key] = draw(json_values)
    if draw(st.booleans()):
        record[draw(st.text(max_size=6))] = draw(json_values)  # an extra key
    return record


@st.composite
def files(draw):
    fmt = draw(st.sampled_from([f for f in FORMATS if f not in (*WHOLE_FILE_FORMATS, "zotero")]))  # whole files: below
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["record"] * 6 + ["json", "junk", "blank"]))
        if kind == "record":
            lines.append(json.dumps(draw(records(fmt))))
        elif kind == "json":
            lines.append(json.dumps(draw(json_values)))
        elif kind == "junk":
            lines.append(draw(st.text(max_size=30)).replace("\n", " ").replace("\r", " "))
        else:
            lines.append("")
    given_format = draw(st.sampled_from([None, fmt]))
    first = next((line for line in lines if line.strip()), "")
    assume(given_format is not None or sniff_format(first) is None)  # else read as a BibTeX/RIS/CSL-JSON file
    return fmt, given_format, lines


def _accounted(report):
    """Every line read is yielded, skipped or one line error; at most one error is about the source as
    a whole (it cannot be read further), and it comes last."""
    source_errors = [e for e in report.errors if e.field == "file"]
    assert len(source_errors) <= 1 and (not source_errors or report.errors[-1] is source_errors[0])
    assert report.read == report.yielded + sum(report.skipped.values()) + len(report.errors) - len(source_errors)


def _read(path, fmt, strict=False):
    report = ReadReport()
    papers = list(read_papers(str(path), fmt, strict=strict, report=report))
    return papers, report


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=files())
def test_every_line_is_yielded_skipped_or_reported_never_an_exception(tmp_path, case):
    _, given_format, lines = case
    path = tmp_path / "in.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass")
    papers, report = _read(path, given_format)
    non_blank = [i + 1 for i, line in enumerate(lines) if line.encode("utf-8", "surrogatepass").strip()]  # ASCII blanks
    assert report.read == len(non_blank)
    _accounted(report)
    assert len(papers) == report.yielded
    if not non_blank:  # an input with no records says so, as the one error about the source
        assert [(e.line, e.field, e.reason) for e in report.errors] == [(None, "file", "no records: the input is empty")]
        return
    for error in report.errors:
        assert error.line in non_blank
        assert str(error).startswith(f"{path}:{error.line}: {error.field}: ") and error.reason
    for paper in papers:
        assert isinstance(paper.paper_id, str) and paper.paper_id
        assert paper.sentences and all(isinstance(s, str) and s.strip() for s in paper.sentences)
        assert len(paper.facets) == len(paper.sentences) and set(paper.facets) <= set(FACET_LABELS)
        paper.content_hash()  # storable: valid Unicode throughout
    json.dumps(report.summary())
    # --strict yields the same papers up to the first error, then raises exactly that error
    strict_papers = []
    try:
        for paper in read_papers(str(path), given_format, strict=True):
            strict_papers.append(paper)
    except InputError as e:
        assert report.errors and str(e) == str(report.errors[0])
        assert [p.paper_id for p in strict_papers] == [p.paper_id for p in papers][: len(strict_papers)]
    else:
        assert not report.errors and [p.paper_id for p in strict_papers] == [p.paper_id for p in papers]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_are_reported_not_raised(tmp_path, raw):
    path = tmp_path / "in.bin"
    path.write_bytes(raw)
    papers, report = _read(path, None)
    _accounted(report)
    assert all(str(e).startswith(f"{path}:") for e in report.errors)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=files())
def test_every_line_ends_indexed_skipped_or_reported_through_the_index(tmp_path_factory, encoder, case):
    """The same through `Index.index_files` with the real model: nothing read is unaccounted for."""
    import esqbe

    _, given_format, lines = case
    root = tmp_path_factory.mktemp("prop")
    path = root / "in.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    index = esqbe.open_index(str(root / "ix"), encoder=encoder, facets="none")
    report = index.index_files([str(path)], format=given_format)
    line_errors = [e for e in report.errors if ": file: " not in e]
    assert report.read == report.stored + sum(report.skipped.values()) + len(line_errors)
    assert report.failed == (bool(report.errors) and report.stored == 0)
    assert all(e.startswith(f"{path}:") for e in report.errors)
    if report.stored:
        assert index.stats()["papers"] == report.indexed
    index.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(WHOLE_FILE_FORMATS),
       body=st.lists(st.sampled_from(["@article{k1,", "  title = {T},", "  abstract = {We do X. We find Y.}", "}",
                                      "TY  - JOUR", "TI  - T", "AB  - We do X.", "ER  - ", "[", "{", "]", "},",
                                      '"id": "a", "abstract": "We do X."', '  "author": 3,', "@misc{", "%"])
                     | st.text(max_size=20), max_size=12))
def test_whole_files_are_read_record_by_record_never_an_exception(tmp_path, fmt, body):
    """BibTeX, RIS, CSL-JSON: any text given as one is read into papers, skips and located errors."""
    path = tmp_path / "in.txt"
    path.write_text("\n".join(body) + "\n", encoding="utf-8", errors="surrogatepass")
    papers, report = _read(path, fmt)
    _accounted(report)
    n_lines = len(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()) + 1
    assert all(e.line is not None and 1 <= e.line <= n_lines for e in report.errors if e.reason
               not in ("no records in it", "no records: the input is empty")), report.errors
    assert all(p.paper_id and p.sentences for p in papers)
