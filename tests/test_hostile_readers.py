""" hostile records in every reader and over POST /papers. Every bound in LIMITS holds
for every format before its expensive step (LaTeX decoding, @string expansion, OpenAlex's inverted index, span
copies, metadata recursion); hostile local files are per-record errors through the real `esqbe index`; and a
real server on 127.0.0.1 reads a POST's records off its event loop, one JSON object a record."""
from __future__ import annotations

import io
import json
import threading
import time
import tracemalloc

import httpx
import pytest

from esqbe.domain import LIMITS
from esqbe.ingest.formats import FORMATS
from esqbe.ingest.readers import ReadReport, read_papers

from .test_hostile_http import _copy, _serve
from .test_hostile_input import _cli

# --- one record in each format -------------------------------------------------------------------------------


def _inverted(text: str) -> dict:
    index: dict[str, list[int]] = {}
    for i, word in enumerate(text.split()):
        index.setdefault(word, []).append(i)
    return index


def _record(fmt: str, pid: str, title: str, abstract, venue: str = "", meta: dict | None = None) -> str:
    """`abstract`: a text, or a list of sentences for the formats that take one; `meta`: free-form metadata, for
    the formats that keep it (jsonl, csfcube); `venue`: a venue or journal, in the field each format names it."""
    text = abstract if isinstance(abstract, str) else " ".join(abstract)
    sentences = abstract if isinstance(abstract, list) else [abstract]
    if fmt == "bibtex":
        return f"@article{{{pid},\n title = {{{title}}},\n abstract = {{{text}}},\n journal = {{{venue}}}\n}}\n"
    if fmt == "ris":
        return f"TY  - JOUR\nID  - {pid}\nTI  - {title}\nAB  - {text}\nJO  - {venue}\nER  - \n"
    record: dict = {
        "s2orc": lambda: {"paper_id": pid, "title": title, "abstract": text, "venue": venue},
        "s2ag-abstracts": lambda: {"corpusid": pid, "title": title, "abstract": text, "venue": venue},
        "s2ag-s2orc": lambda: {"corpusid": pid, "venue": venue, "content": {"text": f"{title}\n{text}", "annotations": {
            "title": json.dumps([{"start": 0, "end": len(title)}]),
            "abstract": json.dumps([{"start": len(title) + 1, "end": len(title) + 1 + len(text)}])}}},
        "csfcube": lambda: {"paper_id": pid, "title": title, "abstract": sentences,
                            "metadata": {**(meta or {}), **({"venue": venue} if venue else {})}},
        "csabstruct": lambda: {"paper_id": pid, "sentences": sentences},
        "jsonl": lambda: {"id": pid, "title": title, "abstract": text, "venue": venue, "metadata": meta or {}},
        "arxiv": lambda: {"id": pid, "title": title, "abstract": text, "categories": "cs.CL", "versions": [],
                          "journal-ref": venue},
        "openalex": lambda: {"id": f"https://openalex.org/{pid}", "title": title, "abstract_inverted_index":
                             abstract if isinstance(abstract, dict) else _inverted(text),
                             "primary_location": {"source": {"display_name": venue}}},
        "csl-json": lambda: {"id": pid, "title": title, "abstract": text, "container-title": venue},
    }[fmt]()
    return json.dumps(record)


def _file(fmt: str, records: list[str]) -> str:
    if fmt == "csl-json":
        return "[\n" + ",\n".join(records) + "\n]\n"
    return "\n".join(records) + "\n"


OK_ABSTRACT = "We parse graphs with a new parser. It is fast."
LIST_FORMATS = ("csfcube", "csabstruct")
FREE_METADATA = ("jsonl", "csfcube")
#: what exceeds each bound ten times over (far enough that decoding it first would show), per format
FAR = 10


def _past(fmt: str, key: str):
    """(kwargs for `_record`, expected field, a fragment of the expected reason) for a record past LIMITS[key]."""
    n = LIMITS[key] * FAR
    sentence_list = fmt in LIST_FORMATS
    if key == "id_chars":
        return {"pid": "x" * n}, "paper_id", f"at most {LIMITS[key]}"
    if key == "title_chars":
        if fmt == "bibtex":
            return {"title": "word " * (n // 5)}, "title", "before decoding"
        if fmt == "s2ag-s2orc":
            return {"title": "word " * (n // 5)}, "content.annotations.title", "at most"
        return {"title": "word " * (n // 5)}, "title", f"at most {LIMITS[key]}"
    if key == "sentences":
        many = ["We parse it."] * (LIMITS[key] + 1)
        return {"abstract": many if sentence_list else " ".join(many)}, "sentences", f"at most {LIMITS[key]}"
    if key == "abstract_chars":
        if sentence_list:  # a list is read as it is; its characters are counted before anything is encoded
            return {"abstract": ["word " * 999 + "end."] * (n // 5000)}, "sentences", f"at most {LIMITS[key]}"
        if fmt == "openalex":  # one long word at many positions: small to send, huge once rebuilt
            return ({"abstract": {"w" * 1000: list(range(n // 20))}}, "abstract_inverted_index",
                    "rebuilds to over")
        field = {"s2ag-s2orc": "content.annotations.abstract", "ris": "AB"}.get(fmt, "abstract")
        reason = {"bibtex": "before decoding", "ris": "as written", "s2ag-s2orc": "spans cover"}.get(fmt, "at most")
        return {"abstract": "word " * (n // 5)}, field, reason
    if key == "metadata_bytes":
        venue = "v" * (3 * LIMITS[key])  # 3 MB: past what BibTeX may hold even before decoding
        return {"venue": venue}, "journal" if fmt == "bibtex" else "metadata", "at most"
    if key == "metadata_depth":
        deep: object = 1
        for _ in range(500):  # past Python's recursion in a naive walk, far past the bound
            deep = [deep]
        return {"meta": {"deep": deep}}, "deep", f"nested deeper than {LIMITS[key]} levels"
    raise AssertionError(key)


CASES = [(fmt, key) for fmt in FORMATS if fmt != "zotero" for key in LIMITS  # a database: tests/test_zotero.py
         if not (fmt == "csabstruct" and key in ("title_chars", "metadata_bytes"))  # it has neither
         and not (key == "metadata_depth" and fmt not in FREE_METADATA)]  # fixed shapes: their depth is the format's


@pytest.mark.parametrize(("fmt", "key"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_every_limit_holds_in_every_format_before_its_expensive_step(fmt, key):
    kwargs, field, reason = _past(fmt, key)
    bad = _record(fmt, **{"pid": "bad", "title": "A title", "abstract": OK_ABSTRACT, **kwargs})
    text = _file(fmt, [bad, _record(fmt, "ok", "A title", [OK_ABSTRACT] if fmt in LIST_FORMATS else OK_ABSTRACT)])
    report = ReadReport()
    tracemalloc.start()
    try:
        papers = list(read_papers(io.StringIO(text), fmt, report=report))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [p.paper_id for p in papers] == ["ok"], report.errors
    [error] = report.errors
    assert (error.line, error.field.split("[")[0].split(".")[0] if key == "metadata_depth" else error.field) \
        == (2 if fmt == "csl-json" else 1, field), error
    assert reason in error.reason, error
    # refused before it was rebuilt or decoded: reading holds a few copies of the input, not what it would expand to
    assert peak < 8 * len(text) + 16_000_000, f"{peak / 1e6:.0f} MB to read {len(text) / 1e6:.1f} MB"


# --- item 2 and 8: BibTeX @string reuse, CSL-JSON, deep and huge numbers -----------------------------------


def test_bibtex_string_reuse_is_bounded_before_it_is_expanded():
    """One 95 KB @string used by 200 entries asked for 19 MB of LaTeX decoding (3 s per use over HTTP): references
    now expand at most to twice the file, each distinct string is decoded once, and a string past a field's bound
    is refused before it is copied."""
    body = "Word {\\'e}t{\\'e}. " * 5_500  # ~95 KB of LaTeX
    text = '@string{s = "' + body + '"}\n@string{huge = "' + "word " * 50_000 + '"}\n'
    text += "".join(f"@article{{e{i}, title = {{Entry {i}}}, abstract = s}}\n" for i in range(200))
    text += "@article{big, title = {Big}, abstract = huge}\n@article{ok, title = {Ok}, abstract = {Fine. Text.}}\n"
    report = ReadReport()
    started = time.monotonic()
    papers = list(read_papers(io.StringIO(text), "bibtex", report=report))
    elapsed = time.monotonic() - started
    assert papers[-1].paper_id == "ok" and papers[-1].sentences == ["Fine.", "Text."]
    by_line = {e.line: e for e in report.errors}
    expanded = [e for e in report.errors if "@string references in this file expand to more than twice" in e.reason]
    assert len(expanded) > 150 and all(e.field == "abstract" for e in expanded)  # the file allows ~3 uses
    assert by_line[203].field == "abstract" and "(after @string expansion); at most 200000 before decoding" \
        in by_line[203].reason
    assert report.read == 202 and len(papers) + len(report.errors) == 202
    assert elapsed < 60, f"{elapsed:.0f} s"  # generous: decoding every use took minutes


def test_hostile_local_files_are_per_record_errors_and_the_rest_is_indexed(tmp_path):
    """Through the real `esqbe index`: a 3 MB BibTeX abstract (10 MB took over 300 s), a 5,000-digit integer and
    a record 500 and 100,000 levels deep in JSON Lines (exit 70, nothing after it indexed), CSL-JSON items
    likewise: each is its own error at its file:line with its field, the rest is indexed, exit 0."""
    bib = tmp_path / "lib.bib"
    bib.write_text("@article{huge, title = {Huge}, abstract = {" + "word. " * 500_000 + "}}\n"
                   "@article{bib-ok, title = {Graph parsing}, abstract = {We parse graphs. It is fast.}}\n")
    deep500 = "[" * 500 + "]" * 500
    deep100k = "[" * 100_000 + "]" * 100_000
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join([
        '{"id": "digits", "abstract": "A b.", "n": ' + "9" * 5000 + "}",
        '{"id": "deep500", "abstract": "A b.", "x": ' + deep500 + "}",
        '{"id": "deep100k", "abstract": "A b.", "x": ' + deep100k + "}",
        json.dumps({"id": "jl-ok", "abstract": "We rank papers. It is fast."}),
    ]) + "\n")
    items = [json.dumps({"id": f"n{i}", "title": "No abstract"}) for i in range(2000)]
    items += ['{"id": "c-digits", "abstract": "A b.", "note": ' + "9" * 5000 + "}",
              '{"id": "c-deep", "abstract": "A b.", "note": ' + deep100k + "}",
              json.dumps({"id": "csl-ok", "abstract": "We cut graphs. It is fast."})]
    csl = tmp_path / "lib.json"
    csl.write_text("[\n" + ",\n".join(items) + "\n]\n")
    r = _cli("index", "--path", tmp_path / "ix", bib, jsonl, csl)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for expected in (f"{bib}:1: abstract: 3000002 characters of LaTeX; at most 200000 before decoding",
                     f"{jsonl}:1: json: Exceeds the limit (4300 digits) for integer string conversion",
                     f"{jsonl}:2: x[0][0]", f"nested deeper than {LIMITS['metadata_depth']} levels",
                     f"{jsonl}:3: json: nested too deeply",
                     f"{csl}:2002: json: item 2000: Exceeds the limit (4300 digits)",
                     f"{csl}:2003: json: item 2001: nested too deeply"):
        assert expected in r.stderr, (expected, r.stderr[-3000:])
    assert "indexed 3," in r.stdout, r.stdout


# --- item 1: POST /papers on a real server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(index_dir_30, encoder, tmp_path_factory):
    path = _copy(index_dir_30, tmp_path_factory, "hostile-readers")
    with _serve(path, encoder, max_batch_records=5) as url:
        yield url


NDJSON = {"content-type": "application/x-ndjson"}


def test_one_line_of_bibtex_is_one_record_not_a_library_past_the_batch_bound(server):
    """A line starting with `@` was parsed as BibTeX: 20 entries on one line passed --max-batch-records 5."""
    line = " ".join(f"@article{{lib-{i}, title = {{Paper {i}}}, abstract = {{We study {i}. It works.}}}}"
                    for i in range(20))
    r = httpx.post(server + "/papers", content=line + "\n", headers=NDJSON, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["read"], out["indexed"], out["errors"]) == (1, 0, 1), out
    assert out["records"][0]["field"] == "json" and "one JSON object" in out["records"][0]["reason"]
    assert httpx.get(server + "/papers/lib-0").status_code == 404
    # nor a CSL-JSON array
    r = httpx.post(server + "/papers", content=json.dumps([{"id": f"csl-{i}", "abstract": "A b. C d."}
                                                            for i in range(20)]) + "\n", headers=NDJSON, timeout=120)
    assert r.json()["records"][0]["field"] == "record" and r.json()["indexed"] == 0, r.text


def test_openalex_inverted_index_over_http_is_refused_before_it_is_rebuilt(server):
    record = {"id": "https://openalex.org/W1", "title": "T", "abstract_inverted_index": {"w" * 1000: list(range(20_000))}}
    r = httpx.post(server + "/papers?format=openalex", content=json.dumps(record) + "\n", headers=NDJSON, timeout=120)
    outcome = r.json()["records"][0]
    assert (outcome["status"], outcome["field"]) == ("error", "abstract_inverted_index"), r.text
    assert "rebuilds to over" in outcome["reason"]


def test_health_answers_while_a_post_is_being_read(index_dir_30, encoder, tmp_path_factory):
    """The records of a POST are read off the event loop: a 15 MB batch takes a while to read (every record is
    refused only once its abstract is split), and /health answers meanwhile instead of after it."""
    path = _copy(index_dir_30, tmp_path_factory, "hostile-readers-loop")
    body = "\n".join(json.dumps({"id": f"big-{i}", "abstract": "Word word word. " * 6_000})
                     for i in range(160)).encode()
    with _serve(path, encoder) as url:
        done: dict = {}

        def post():
            t0 = time.monotonic()
            done["response"] = httpx.post(url + "/papers", content=body, headers=NDJSON, timeout=300)
            done["seconds"] = time.monotonic() - t0

        thread = threading.Thread(target=post)
        thread.start()
        latencies = []
        while thread.is_alive():
            t0 = time.monotonic()
            assert httpx.get(url + "/health", timeout=300).status_code == 200
            if thread.is_alive():  # answered while the POST was still in flight
                latencies.append(time.monotonic() - t0)
            time.sleep(0.02)
        thread.join()
    r = done["response"]
    assert r.status_code == 200 and r.json()["errors"] == 160, r.text[:500]
    assert {o["field"] for o in r.json()["records"]} == {"sentences"}
    assert len(latencies) >= 2, (latencies, done["seconds"])
    assert max(latencies) < done["seconds"] / 3, (latencies, done["seconds"])


def test_reading_a_batch_stops_at_the_request_deadline(index_dir_30, encoder, tmp_path_factory):
    """The same batch under a 0.2 s request timeout: 504 at the deadline (the reader stops before its next
    record), and the server goes on answering."""
    path = _copy(index_dir_30, tmp_path_factory, "hostile-readers-deadline")
    body = "\n".join(json.dumps({"id": f"big-{i}", "abstract": "Word word word. " * 6_000})
                     for i in range(160)).encode()
    with _serve(path, encoder, request_timeout=0.2) as url:
        r = httpx.post(url + "/papers", content=body, headers=NDJSON, timeout=300)
        assert r.status_code == 504, r.text[:500]
        assert "reading the records took longer than this server's 0.2 s request timeout" in r.json()["error"]["message"]
        assert httpx.get(url + "/health", timeout=60).status_code == 200
