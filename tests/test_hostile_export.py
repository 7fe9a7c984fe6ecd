""" exports of hostile papers. No CSV cell is a formula a spreadsheet runs (OWASP), every
exported value is one line (a text year must not forge RIS records, a title must not close its BibTeX entry),
from `esqbe query --format` and from POST /query's `format` (what the page's download asks for); and no reader
lets a control character into a paper id. A real index of hostile records (tests/conftest.py), the real CLI,
a real server on 127.0.0.1, real files in every input format."""
from __future__ import annotations

import csv
import io
import json
import re

import bibtexparser
import httpx
import pytest
import rispy
from click.testing import CliRunner

from cli import main
from esqbe.core.textsafe import csv_cell, one_line
from esqbe.ingest.library import carried
from esqbe.ingest.readers import ReadReport, read_papers
from esqbe.query.export import CSV_COLUMNS, export_hits

from .conftest import FORMULA_PAYLOADS, LiveServer

_FORMULA_START = tuple("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _query_json(ix) -> dict:
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--no-server", "--paper", "paper-0", "-k", "9", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _export(ix, fmt: str) -> str:
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--no-server", "--paper", "paper-0", "-k", "9",
                                  "--format", fmt], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.stdout_bytes.decode()


def _check_csv(text: str, hits: list[dict]) -> None:
    """One physical line per hit; no cell a formula (a plain number excepted); each hostile title kept, behind `'`."""
    assert text.count("\r\n") == len(hits) + 1 and "\n" not in text.replace("\r\n", "")
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == len(hits) + 1
    for row in rows[1:]:
        for cell in row:
            assert not _CONTROL.search(cell), cell
            assert _NUMBER.fullmatch(cell.strip()) or not cell.lstrip(" ").startswith(_FORMULA_START), cell
    by_id = {row[CSV_COLUMNS.index("paper_id")]: dict(zip(CSV_COLUMNS, row)) for row in rows[1:]}
    assert list(by_id) == [one_line(h["paper_id"]) for h in hits]
    for h in hits:
        assert by_id[one_line(h["paper_id"])]["title"].lstrip("'") == carried(h["title"])
    if len(hits) == 9:  # the hostile index: every hit's title starts with a formula
        assert all(row["title"].startswith("'") for row in by_id.values())


def _check_ris(text: str, hits: list[dict]) -> None:
    """As many records as hits, in order, none with a URL (no hit has one: a forged `UR` would show), and every
    line a tag line or empty."""
    records = rispy.loads(text)
    assert [r["id"] for r in records] == [h["paper_id"] for h in hits]
    assert not any("urls" in r for r in records)
    assert all(re.match(r"[A-Z][A-Z0-9]  - ", line) or line == "" for line in text.split("\n"))  # no `1.` lines
    assert {r["title"] for r in records} == {carried(h["title"]) for h in hits}


def _check_bibtex(text: str, hits: list[dict]) -> None:
    library = bibtexparser.parse_string(text)
    assert not library.failed_blocks and len(library.blocks) == len(library.entries) == len(hits)
    assert not any("url" in e.fields_dict for e in library.entries)
    for entry in library.entries:
        assert all(not _CONTROL.search(f.value) for f in entry.fields), entry.key


def test_cli_exports_of_hostile_papers(hostile_index_dir):
    hits = _query_json(hostile_index_dir)["hits"]
    assert len(hits) == 9
    _check_csv(_export(hostile_index_dir, "csv"), hits)
    _check_ris(_export(hostile_index_dir, "ris"), hits)
    _check_bibtex(_export(hostile_index_dir, "bibtex"), hits)


def test_http_exports_of_hostile_papers(hostile_server):
    """POST /query with `format` (the page's CSV / BibTeX / RIS download is this request)."""
    body = {"paper_id": "paper-0", "k": 9}
    hits = httpx.post(hostile_server + "/query", json=body, timeout=60).json()["hits"]
    assert len(hits) == 9
    for fmt, check in (("csv", _check_csv), ("ris", _check_ris), ("bibtex", _check_bibtex)):
        r = httpx.post(hostile_server + "/query", json={**body, "format": fmt}, timeout=60)
        assert r.status_code == 200, r.text
        check(r.text, hits)


def test_page_downloads_of_hostile_papers(hostile_server, browser, tmp_path):
    """The page's CSV and RIS buttons (real Chromium) save what POST /query answers, neutralised: the page builds
    no CSV of its own, so the server's one writer is the page's too."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    browser.get(hostile_server + "/#paper=paper-0&sentences=0,1&k=9")
    WebDriverWait(browser, 60).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#hits .hit")) == 9)
    body = browser.execute_script("return state.lastQuery")
    hits = httpx.post(hostile_server + "/query", json=body, timeout=60).json()["hits"]
    for fmt, check in (("csv", _check_csv), ("ris", _check_ris)):
        before = set(tmp_path.iterdir())
        browser.find_element(By.CSS_SELECTOR, f'.export-btn[data-format="{fmt}"]').click()

        def saved(_, before=before):
            return [p for p in set(tmp_path.iterdir()) - before if not p.name.endswith((".crdownload", ".tmp"))]

        WebDriverWait(browser, 30).until(saved)
        check(saved(None)[0].read_bytes().decode(), hits)


def _hit(rank, title, score=0.5, similarity=0.25, **meta) -> dict:
    return {"rank": rank, "paper_id": f"p{rank}", "title": title, "score": score, "similarity": similarity,
            "metadata": meta}


def test_csv_formulas_are_neutralised_and_numbers_stay_numbers():
    """OWASP's starts (= + - @ tab CR, and after spaces) get a leading `'`; a negative similarity, score or year
    is a number and no formula, so it stays one; every cell is quoted."""
    result = {"hits": [_hit(i + 1, p, venue=p, authors=[p]) for i, p in enumerate(FORMULA_PAYLOADS)]
              + [_hit(9, "Negative", score=-1.5, similarity=-0.1234, year=-44),
                 _hit(10, "-0.5", year="+1e-07"), _hit(11, "－1+1 full width", venue="＝HYPERLINK(1)")]}
    rows = list(csv.DictReader(io.StringIO(export_hits(result, "csv", with_scores=True))))
    for row, payload in zip(rows, FORMULA_PAYLOADS):
        assert row["title"] == row["venue"] == row["authors"] == "'" + carried(payload)
    neg = rows[len(FORMULA_PAYLOADS)]
    assert (neg["score"], neg["similarity"], neg["year"]) == ("-1.5", "-0.1234", "-44")
    assert (rows[-2]["title"], rows[-2]["year"]) == ("-0.5", "+1e-07")
    assert rows[-1]["title"].startswith("'－") and rows[-1]["venue"].startswith("'＝")
    assert export_hits({"hits": []}, "csv") == ",".join(f'"{c}"' for c in CSV_COLUMNS) + "\r\n"
    assert [csv_cell(v) for v in ("plain", "a=b", "", None, 3, "1-2")] == ["plain", "a=b", "", "", "3", "1-2"]


def test_an_id_or_year_with_line_breaks_forges_nothing():
    """Ids and years from an index written before ids were checked: still one record per hit, in every format."""
    forged = "x\nER  - \n\nTY  - JOUR\nUR  - http://evil.example\n"
    result = {"hits": [{**_hit(1, "A}\n@misc{evil, url={http://evil.example}}\n", year=forged), "paper_id": forged},
                       {**_hit(2, "B\u2028UR  - http://evil.example", year="2019\rUR  - http://evil.example"),
                        "paper_id": "b\x85c"}]}
    hits = result["hits"]
    records = rispy.loads(export_hits(result, "ris"))
    assert [r["id"] for r in records] == [one_line(forged).strip(), "b c"] and not any("urls" in r for r in records)
    _check_bibtex(export_hits(result, "bibtex"), hits)
    _check_csv(export_hits(result, "csv"), hits)


# --- item 5: no reader lets a control character into a paper id --------------------------------------------

_ABSTRACT = "We study things with a new method. It works well on two tasks."


@pytest.mark.parametrize("name, text, bad_line", [
    ("ids.jsonl", "".join(json.dumps({"id": pid, "title": "T", "abstract": _ABSTRACT}) + "\n"
                          for pid in ("ok-1", "a\nUR  - http://evil.example", "b\x1b]0;x\x07", "c\td", "d\x9be",
                                      "e\u2028f", "ok-2")), None),
    ("ids.json", json.dumps([{"id": "ok-1", "type": "article-journal", "title": "T", "abstract": _ABSTRACT},
                             {"id": "x\ny", "type": "article-journal", "title": "T", "abstract": _ABSTRACT},
                             {"id": "ok-2", "type": "article-journal", "title": "T", "abstract": _ABSTRACT}]), None),
    ("ids.bib", f"@article{{ok-1, title={{T}}, abstract={{{_ABSTRACT}}}}}\n\n"
                f"@article{{x\x1by, title={{T}}, abstract={{{_ABSTRACT}}}}}\n\n"
                f"@article{{ok-2, title={{T}}, abstract={{{_ABSTRACT}}}}}\n", 3),
    ("ids.ris", f"TY  - JOUR\nID  - ok-1\nTI  - T\nAB  - {_ABSTRACT}\nER  - \n\n"
                f"TY  - JOUR\nID  - x\x1b[2Jy\nTI  - T\nAB  - {_ABSTRACT}\nER  - \n\n"
                f"TY  - JOUR\nID  - ok-2\nTI  - T\nAB  - {_ABSTRACT}\nER  - \n", 7),
    ("ids.openalex.jsonl", "".join(json.dumps({"id": pid, "display_name": "T", "publication_year": 2020,
                                               "abstract_inverted_index": {"We": [0], "study.": [1]}}) + "\n"
                                   for pid in ("https://openalex.org/W1", "https://openalex.org/W2\x1b]0;x\x07",
                                               "https://openalex.org/W3")), 2),
])
def test_every_reader_refuses_control_characters_in_ids(tmp_path, name, text, bad_line):
    """Each bad id is its own error (file:line, the id's field as the format names it, the character) and the good
    records around it are read."""
    path = tmp_path / name
    path.write_text(text)
    report = ReadReport()
    papers = list(read_papers(path, None, report=report))
    assert len(papers) == 2, [str(e) for e in report.errors]
    assert all(not _CONTROL.search(p.paper_id) for p in papers)
    field = {"ids.bib": "key", "ids.ris": "ID"}.get(name, "id")
    bad = [e for e in report.errors if e.field == field]
    assert len(bad) == len(report.errors) == (5 if name == "ids.jsonl" else 1), [str(e) for e in report.errors]
    assert all("control character U+" in e.reason and e.source == str(path) for e in bad)
    if name == "ids.jsonl":
        assert [e.line for e in bad] == [2, 3, 4, 5, 6]
        assert [e.reason.split()[2] for e in bad] == ["U+000A", "U+001B", "U+0009", "U+009B", "U+2028"]
    elif bad_line is not None:
        assert bad[0].line == bad_line


def test_post_papers_refuses_a_control_character_in_an_id(tmp_path, encoder):
    """The same check on the HTTP path: the bad record is a per-record error naming its id field, the others indexed."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    app = create_app(str(tmp_path / "ix"), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        records = [{"id": "ok", "title": "T", "abstract": _ABSTRACT},
                   {"id": "a\nUR  - http://evil.example", "title": "T", "abstract": _ABSTRACT}]
        r = httpx.post(url + "/papers", json={"records": records}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["indexed"] == 1, body
        text = json.dumps(body)
        assert "paper_id" in text and "control character U+000A" in text
