"""Records without an abstract, with a PDF: a BibTeX `file` (Zotero's and JabRef's forms) or an
RIS `L1` names the PDF; its abstract (and title, if the record has none) is read from the PDF's first page and the
paper is marked `abstract_source: pdf` and counted. The PDFs are real LaTeX output (one and two columns, IEEE-style
inline headings; made from
CSAbstruct abstracts: tests/data/pdf/README.md) and a scanned page (an image, no text), which is skipped with that
reason, as are a missing, an unparsable and an oversized PDF."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from cli import main
from esqbe.ingest import pdf
from esqbe.ingest.readers import ReadReport, read_papers

from .conftest import REPO

PDFS = REPO / "tests" / "data" / "pdf"
EXPECTED = json.loads((PDFS / "abstracts.json").read_text())
ONE_TITLE = "Evaluating a Gamified Multiple Choice Quiz in Undergraduate IT Courses"
TWO_TITLE = "3D Face Recognition with a Deep Convolutional Neural Network and Expression Augmentation"


@pytest.fixture
def library(tmp_path):
    """A Zotero-style export: my-library.bib beside files/<n>/<name>.pdf, one entry per case."""
    for n, name in [(12, "one-column"), (13, "two-column"), (14, "scanned")]:
        (tmp_path / "files" / str(n)).mkdir(parents=True)
        shutil.copy(PDFS / f"{name}.pdf", tmp_path / "files" / str(n) / f"{name}.pdf")
    (tmp_path / "files" / "15").mkdir()
    (tmp_path / "files" / "15" / "broken.pdf").write_text("%PDF-1.5\nthis is not a PDF body\n")
    with open(tmp_path / "files" / "15" / "huge.pdf", "wb") as f:  # sparse: over the bound without the disk
        f.truncate(pdf.MAX_PDF_BYTES + 1)
    os.mkfifo(tmp_path / "files" / "15" / "fifo.pdf")  # not a regular file: never opened (would block)
    entries = {
        "zotero": "title = {" + ONE_TITLE + "},\n file = {Full Text:files/12/one-column.pdf:application/pdf}",
        "jabref": "file = {Snapshot:files/13/page.html:text/html;:files/13/two-column.pdf:PDF}",  # no title; 2 files
        "scanned": "title = {A Scanned Paper},\n file = {Full Text:files/14/scanned.pdf:application/pdf}",
        "missing": "title = {Moved Away},\n file = {Full Text:files/99/gone.pdf:application/pdf}",
        "broken": "title = {Broken},\n file = {Full Text:files/15/broken.pdf:application/pdf}",
        "huge": "title = {Huge},\n file = {Full Text:files/15/huge.pdf:application/pdf}",
        "fifo": "title = {Fifo},\n file = {Full Text:files/15/fifo.pdf:application/pdf}",
        "own": "title = {Own Abstract},\n abstract = {This record has its own abstract. The PDF is not read.},\n"
               " file = {Full Text:files/14/scanned.pdf:application/pdf}",
    }
    bib = tmp_path / "my-library.bib"
    bib.write_text("".join(f"@article{{{key},\n {body}}}\n\n" for key, body in entries.items()))
    return bib


def _read(source) -> tuple[dict, ReadReport]:
    report = ReadReport()
    return {p.paper_id: p for p in read_papers(source, report=report)}, report


def test_one_and_two_column_pdfs_give_the_abstract_and_a_missing_title(library):
    papers, report = _read(library)
    one, two = papers["zotero"], papers["jabref"]
    assert " ".join(one.sentences) == EXPECTED["one-column"]  # "di-\nmensions" joined, "IT-related" kept
    assert " ".join(two.sentences) == EXPECTED["two-column"]  # cut before the column's "Keywords:"
    assert one.title == ONE_TITLE  # the record's own title is kept
    assert two.title == TWO_TITLE  # none in the record: the PDF's largest text above its abstract
    assert one.metadata["abstract_source"] == two.metadata["abstract_source"] == "pdf"
    assert papers["own"].sentences[0] == "This record has its own abstract."
    assert "abstract_source" not in papers["own"].metadata
    assert report.abstracts_from_pdf == 2 and report.summary()["abstracts_from_pdf"] == 2


def test_unreadable_pdfs_skip_their_record_with_the_reason(library):
    papers, report = _read(library)
    assert set(papers) == {"zotero", "jabref", "own"}
    reasons = {r["id"]: r["reason"] for r in report.skipped_records}
    files = library.parent / "files"  # each record's reason names the PDF where it was looked for
    assert reasons == {"scanned": f"{pdf.NO_TEXT}: {files / '14' / 'scanned.pdf'}",
                       "missing": f"{pdf.MISSING}: {files / '99' / 'gone.pdf'}",
                       "broken": f"{pdf.UNPARSABLE}: {files / '15' / 'broken.pdf'}",
                       "huge": f"{pdf.TOO_LARGE}: {files / '15' / 'huge.pdf'}",
                       "fifo": f"{pdf.MISSING}: {files / '15' / 'fifo.pdf'}"}
    # the run counts them by reason (the paths are the records' own)
    assert report.skipped == {pdf.NO_TEXT: 1, pdf.MISSING: 2, pdf.UNPARSABLE: 1, pdf.TOO_LARGE: 1}
    assert report.errors == []


def test_ris_l1_relative_and_file_url(tmp_path):
    shutil.copy(PDFS / "two-column.pdf", tmp_path / "a.pdf")
    ris = tmp_path / "export.ris"
    ris.write_text("TY  - JOUR\nID  - rel\nTI  - Relative\nL1  - snapshot.html\nL1  - a.pdf\nER  - \n\n"
                   f"TY  - CONF\nID  - url\nL1  - file://{tmp_path / 'a.pdf'}\nER  - \n\n"
                   "TY  - JOUR\nID  - web\nTI  - Only a web link\nL1  - https://example.org/a.pdf\nER  - \n")
    papers, report = _read(ris)
    assert " ".join(papers["rel"].sentences) == EXPECTED["two-column"] and papers["rel"].title == "Relative"
    assert papers["url"].title == TWO_TITLE and papers["url"].metadata["abstract_source"] == "pdf"
    assert [(r["id"], r["reason"]) for r in report.skipped_records] == [  # never fetched
        ("web", f"{pdf.MISSING}: https://example.org/a.pdf (a web link: not fetched)")]


def test_a_relative_path_from_stdin_is_not_resolved(library, monkeypatch):
    import io
    import sys

    monkeypatch.chdir(library.parent)  # even where the path would resolve: stdin names no folder
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(library.read_bytes())))
    papers, report = _read("-")
    assert set(papers) == {"own"}
    assert {r["id"]: r["reason"] for r in report.skipped_records}["zotero"] == (
        f"{pdf.MISSING}: files/12/one-column.pdf (a relative path, and no folder to take it from: stdin, or Zotero's "
        "base directory)")


def test_inline_headings_and_a_title_that_starts_with_abstract(tmp_path):
    """IEEE's layout: "Abstract—We ..." inline, ended by "Index Terms—", under a title starting "Abstract"."""
    shutil.copy(PDFS / "ieee-style.pdf", tmp_path / "p.pdf")
    (tmp_path / "lib.bib").write_text("@inproceedings{ieee,\n file = {:p.pdf:PDF}}\n")
    papers, _ = _read(tmp_path / "lib.bib")
    assert " ".join(papers["ieee"].sentences) == EXPECTED["ieee-style"]
    assert papers["ieee"].title == "Abstract Models of Passivity Based Control for Flexible Joint Robots"


def test_an_abstract_that_runs_on_to_the_second_page(tmp_path):
    """Its first line at the foot of page 1, the rest on page 2: both pages read, the page number between dropped."""
    shutil.copy(PDFS / "runs-on.pdf", tmp_path / "p.pdf")
    (tmp_path / "lib.ris").write_text("TY  - JOUR\nID  - runs-on\nL1  - p.pdf\nER  - \n")
    papers, _ = _read(tmp_path / "lib.ris")
    assert " ".join(papers["runs-on"].sentences) == EXPECTED["runs-on"]
    assert papers["runs-on"].title == "Sustainable Manufacturing in the Automotive Industry"


@pytest.mark.parametrize("field, paths", [
    ("Full Text:files/12/x.pdf:application/pdf", ["files/12/x.pdf"]),
    (r":C\:/Users/me/x.pdf:PDF", ["C:/Users/me/x.pdf"]),  # JabRef on Windows: the drive's colon escaped
    ("Snapshot:s.html:text/html;Full Text PDF:a/b.pdf:application/pdf;:c.PDF:PDF", ["a/b.pdf", "c.PDF"]),
    ("paper.pdf", ["paper.pdf"]),
    ("Notes:notes.txt:text/plain", []),
])
def test_bibtex_file_field_forms(field, paths):
    assert pdf.bibtex_files(field) == paths


def test_index_summary_counts_and_names(tmp_path, library):
    r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix"), "-q", str(library)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "read 8, indexed 3," in r.output and ", abstracts from PDFs 2 in " in r.output
    scanned = library.parent / "files" / "14" / "scanned.pdf"
    assert f'skipped {library}:8: scanned "A Scanned Paper": {pdf.NO_TEXT}: {scanned}' in [
        s.strip() for s in r.output.splitlines()]
    r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix2"), "--json", str(library)],
                           catch_exceptions=False)
    summary = json.loads(r.output)
    assert summary["abstracts_from_pdf"] == 2 and summary["indexed"] == 3
    assert summary["skipped"][pdf.NO_TEXT] == 1


# ---------------------------------------------------------------- a PDF too costly to read

def xobject_bomb(draws: int = 5000, ops: int = 20_000) -> bytes:
    """A valid one-page PDF of a few KB whose page draws one form XObject `draws` times (pypdf's cap is 5,000); the
    form holds `ops` text-showing operators (compressed). pypdf's extract_text parses the form again at each drawing:
    seconds a drawing (contended), hours a file."""
    import zlib

    form = zlib.compress(b"BT /F1 1 Tf 0 0 Td (a) Tj ET\n" * ops, 9)
    page = zlib.compress(b"q /X0 Do Q\n" * draws, 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /XObject << /X0 5 0 R >> "
        b"/Font << /F1 6 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(page), page),
        b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 6 0 R >> >> "
        b"/Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(form), form),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.7\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_a_pdf_that_costs_hours_is_stopped_and_named_and_the_run_goes_on(tmp_path):
    """Through `esqbe index`: a .bib entry without an abstract whose `file` is a 3 KB PDF drawing
    one form XObject 5,000 times is skipped at --pdf-timeout with that reason and its path; the PDF after it (a new
    child process) and the rest of the run are read."""
    import faulthandler
    import time

    import pypdf

    bomb = tmp_path / "files" / "1" / "bomb.pdf"
    bomb.parent.mkdir(parents=True)
    bomb.write_bytes(xobject_bomb())
    page = pypdf.PdfReader(bomb).pages[0]  # a PDF pypdf reads: one page, one form drawn 5,000 times
    assert bomb.stat().st_size < 5000 and page.get_contents().get_data().count(b"/X0 Do") == 5000
    shutil.copy(PDFS / "one-column.pdf", tmp_path / "files" / "1" / "good.pdf")
    bib = tmp_path / "lib.bib"
    bib.write_text("@article{bomb,\n title = {Drawn Five Thousand Times},\n file = {Full Text:files/1/bomb.pdf:"
                   "application/pdf}}\n\n@article{after,\n title = {" + ONE_TITLE + "},\n file = {Full Text:files/1/"
                   "good.pdf:application/pdf}}\n\n@article{own,\n title = {Own Abstract},\n abstract = {This record "
                   "has its own abstract. The PDF is not read.}}\n")
    faulthandler.dump_traceback_later(600, exit=True)  # a bound that fails must fail the run, not hang it
    try:
        started = time.monotonic()
        r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix"), "--pdf-timeout", "2", "--json",
                                      str(bib)], catch_exceptions=False)
        seconds = time.monotonic() - started
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    reason = pdf.TOO_SLOW.format(seconds=2)
    assert [(s["id"], s["reason"]) for s in out["skipped_records"]] == [("bomb", f"{reason}: {bomb}")]
    assert out["skipped"] == {reason: 1} and out["indexed"] == 2 and out["abstracts_from_pdf"] == 1
    assert seconds < 120, f"{seconds:.0f} s (contended)"


def test_a_pdf_given_to_index_says_how_pdfs_are_read(tmp_path):
    """ `esqbe index paper.pdf` is told how esqbe reads PDFs, not that the file is not UTF-8."""
    from esqbe.ingest.readers import PDF_ON_ITS_OWN

    paper = tmp_path / "paper.pdf"
    shutil.copy(PDFS / "one-column.pdf", paper)
    r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix"), str(paper)], catch_exceptions=False)
    assert r.exit_code != 0
    assert f"{paper}: file: {PDF_ON_ITS_OWN}" in r.output and "UTF-8" not in r.output, r.output
    _, report = _read(paper)
    assert [str(e) for e in report.errors] == [f"{paper}: file: {PDF_ON_ITS_OWN}"]


# ---------------------------------------------------------------- the reader's child: its own clock, its parent's life

def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _running(pid: int) -> tuple[bool, float]:
    """(whether `pid` is a process that runs, not gone nor a zombie; the CPU seconds it used)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return False, 0.0
    return fields[0] != "Z", (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the process table from /proc (Linux)")
def test_the_pdf_reader_dies_with_a_killed_esqbe_index(tmp_path):
    """`kill -9` of `esqbe index` while its PDF reader works on a PDF that costs hours: the reader is gone within
    seconds (it kept a core busy past --pdf-timeout, for as long as the PDF took)."""
    import signal
    import subprocess
    import sys
    import time

    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(xobject_bomb())
    bib = tmp_path / "lib.bib"
    bib.write_text("@article{bomb,\n title = {Drawn Five Thousand Times},\n file = {Full Text:bomb.pdf:application/pdf}}\n")
    parent = subprocess.Popen([sys.executable, "-m", "cli", "index", "--path", str(tmp_path / "ix"), "--pdf-timeout",
                               "3600", str(bib)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    child = None
    try:
        deadline = time.monotonic() + 120
        while child is None or _running(child)[1] < 0.5:  # until the reader has worked on the PDF a while
            assert time.monotonic() < deadline and parent.poll() is None, "no PDF reader started"
            found = [c for c in _children(parent.pid) if b"pdf_child" in open(f"/proc/{c}/cmdline", "rb").read()]
            child = found[0] if found else None
            time.sleep(0.1)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone_by = time.monotonic() + 10
        while _running(child)[0] and time.monotonic() < gone_by:
            time.sleep(0.05)
        assert not _running(child)[0], "the PDF reader outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and _running(child)[0]:
            os.kill(child, signal.SIGKILL)


def test_the_pdf_reader_keeps_its_own_clock(tmp_path):
    """A reader whose parent lives but stops reading its answers still stops at the request's clock: SIGALRM ends
    it, whatever pypdf was doing."""
    import signal
    import subprocess
    import sys
    import time

    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(xobject_bomb())
    script = REPO / "esqbe" / "ingest" / "pdf_child.py"
    child = subprocess.Popen([sys.executable, str(script), str(os.getpid())], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    try:
        child.stdin.write(json.dumps({"path": str(bomb), "pages": 2, "max_bytes": pdf.MAX_PDF_BYTES,
                                      "seconds": 1.5}).encode() + b"\n")
        child.stdin.flush()
        status = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert status == -signal.SIGALRM and time.monotonic() - started < 60
