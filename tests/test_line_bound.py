"""Lines are read under a byte bound (`max_line_bytes`) before anything parses them: a 1 MB gzip can hold a line of
gigabytes, and reading it whole took 1.2 GB of memory for a 300 MB line before any record's limit was checked. A line
past the bound is read on to its end a chunk at a time and dropped, named by file and line with the reason, and the
run goes on; JSON Lines from a file (gzipped or not), stdin or a stream, and `esqbe tag`'s, alike. The huge lines
are written as repeated gzip members, so the test files stay small and quick to make."""
from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from esqbe.ingest.readers import MAX_LINE_BYTES, InputError, ReadReport, bounded_lines, read_papers
from esqbe.settings.config import Settings

from .conftest import SAMPLE

REPO = Path(__file__).resolve().parent.parent
GOOD = SAMPLE.read_text().splitlines()[:2]


def _member(data: bytes) -> bytes:
    """`data` as one gzip member (a file of several members is one stream to every gzip reader)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def huge_line_gz(path: Path, mib: int) -> int:
    """A .jsonl.gz at `path`: a good record, a record whose abstract is `mib` MiB, another good record; the bytes
    of the huge line (its newline included)."""
    block, head, tail = _member(b"a" * (1 << 20)), b'{"paper_id": "huge", "abstract": "', b'"}\n'
    with open(path, "wb") as f:
        f.write(_member((GOOD[0] + "\n").encode() + head))
        for _ in range(mib):
            f.write(block)
        f.write(_member(tail + (GOOD[1] + "\n").encode()))
    return len(head) + (mib << 20) + len(tail)


def test_the_default_bound_is_the_settings_and_far_above_a_record_within_the_limits():
    assert Settings().max_line_bytes == MAX_LINE_BYTES
    from esqbe.domain import LIMITS

    # a record at every LIMITS bound, written with JSON's longest escape (\uXXXX) for each character
    assert 6 * (LIMITS["abstract_chars"] + LIMITS["title_chars"]) + LIMITS["metadata_bytes"] * 6 < MAX_LINE_BYTES


def test_a_huge_line_in_a_gzip_is_skipped_with_its_line_and_never_held(tmp_path):
    """`esqbe index` on a 2 MB .jsonl.gz whose second line is 2 GiB: the two good records are indexed, the line is
    reported as file:2 with the bound, and the process's peak memory stays under half the line (its model and
    index included)."""
    source = tmp_path / "papers.jsonl.gz"
    size = huge_line_gz(source, 2048)
    assert source.stat().st_size < 4 << 20
    # `esqbe index` started by a small process that waits for it and writes its peak memory (a child started from
    # this test process would count this process's memory at the fork in its own peak); on torch, whose peak is the
    # same on every machine (onnx-int8's first run here exports the model: 1.3 GB, then cached)
    measure = ("import os, subprocess, sys\n"
               "child = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1], 'wb'))\n"
               "_, status, usage = os.wait4(child.pid, 0)\n"
               "print(usage.ru_maxrss * 1024, file=sys.stderr)\n"  # kilobytes on Linux
               "sys.exit(os.waitstatus_to_exitcode(status))\n")
    r = subprocess.run([sys.executable, "-c", measure, str(tmp_path / "out.json"), sys.executable, "-m", "cli",
                        "index", "--path", str(tmp_path / "ix"), "--json", "--encoder-backend", "torch", str(source)],
                       cwd=REPO,
                       capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["indexed"] == 2 and len(report["errors"]) == 1, report
    assert report["errors"] == [f"{source}:2: line: {size:,} bytes; a line holds at most {MAX_LINE_BYTES:,} "
                                "(max_line_bytes): skipped without being parsed"]
    peak = int(r.stderr.split()[-1])
    assert peak < (2048 << 20) // 2, f"peak memory {peak / 2 ** 20:.0f} MiB for a 2048 MiB line"


@pytest.mark.parametrize("how", ["file", "gzip", "stdin", "stream"])
def test_every_source_reads_under_the_bound(how, tmp_path, monkeypatch):
    """A plain file, a gzipped one, stdin and a stream: a line of exactly the bound is read, one byte more is an
    error of its line (the bound named), the lines after it are read, and `strict` stops there."""
    bound = 4096
    record = {**json.loads(GOOD[0]), "paper_id": "exact", "pad": ""}  # padded to the bound exactly
    exact_line = json.dumps({**record, "pad": "x" * (bound - len(json.dumps(record)))})
    assert len(exact_line) == bound
    over = json.dumps({**record, "paper_id": "over", "pad": "y" * (bound + 1 - len(json.dumps(record)) + 1)})
    assert len(over) == bound + 1
    text = f"{GOOD[0]}\n{exact_line}\n{over}\n{GOOD[1]}\n".encode()
    path = tmp_path / "papers.jsonl"
    path.write_bytes(gzip.compress(text) if how == "gzip" else text)
    name = {"stdin": "<stdin>", "stream": "<stream>"}.get(how, str(path))

    def source():
        if how == "stdin":
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(open(path, "rb")))
            return "-"
        return io.BytesIO(text) if how == "stream" else str(path)

    report = ReadReport()
    ids = [p.paper_id for p in read_papers(source(), report=report, max_line_bytes=bound)]
    assert ids == [json.loads(GOOD[0])["paper_id"], "exact", json.loads(GOOD[1])["paper_id"]]
    assert [str(e) for e in report.errors] == [f"{name}:3: line: {bound + 2:,} bytes; a line holds at most "
                                               f"{bound:,} (max_line_bytes): skipped without being parsed"]
    with pytest.raises(InputError, match=":3: line: "):
        list(read_papers(source(), strict=True, max_line_bytes=bound))


def test_a_bibtex_file_with_a_line_past_the_bound_is_read_up_to_it(tmp_path):
    """A whole-file format cannot be delimited past a line it did not read: the file's error names the line, and
    the records before it are not taken from a file read halfway."""
    bib = tmp_path / "lib.bib"
    bib.write_text("@article{a,\n title = {One},\n abstract = {A first abstract. It has two sentences.}}\n\n"
                   "@article{b,\n title = {" + "T" * 5000 + "},\n abstract = {Another abstract.}}\n")
    report = ReadReport()
    assert list(read_papers(str(bib), report=report, max_line_bytes=2048)) == []
    assert len(report.errors) == 1 and str(report.errors[0]).startswith(f"{bib}:6: line: ")


def test_bounded_lines_hold_no_more_than_the_bound():
    """The reader asks for at most bound + 1 bytes of a line, then chunks of the rest, which it drops."""
    asked = []

    class Counting(io.BytesIO):
        def readline(self, size=-1):
            asked.append(size)
            return super().readline(size)

    lines = list(bounded_lines(Counting(b"short\n" + b"z" * (5 << 20) + b"\nafter"), 1000))
    assert lines[0] == b"short\n" and lines[1].size == (5 << 20) + 1 and lines[2] == b"after"
    assert asked and all(0 < size <= 1 << 20 for size in asked)


def test_tag_reports_a_line_past_the_bound_and_tags_the_rest(tmp_path, encoder):
    from esqbe.tagger.files import tag_file

    source = tmp_path / "papers.jsonl"
    source.write_text(f"{GOOD[0]}\n{{\"paper_id\": \"long\", \"abstract\": \"{'w' * 3000}\"}}\n{GOOD[1]}\n")
    out = tmp_path / "tagged.jsonl"
    summary = tag_file(str(source), str(out), encoder=encoder, max_line_bytes=2048)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["tagged"] == 2 and summary["errors"] == [rows[1]["error"]]
    assert rows[1]["error"].startswith(f"{source}:2: line: ") and rows[0]["facets"] and rows[2]["facets"]
