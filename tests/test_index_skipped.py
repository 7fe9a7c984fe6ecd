"""Nothing skipped unnamed: `esqbe index` names every record it skips (file:line, key or
id, reason): the first 10 in the text summary then "and N more", all of them in `--json`, and `--skipped FILE`
writes them as JSON Lines. Through the real CLI on real BibTeX, RIS and JSON Lines files."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli import main

from .conftest import REPO, SAMPLE

N_BIB_SKIPPED = 12


@pytest.fixture
def library(tmp_path):
    """A BibTeX file of one paper and 12 entries without an abstract (entry i starts on line 1 + 3 * i), and a
    JSON Lines file of 2 papers and one record without an abstract (line 2)."""
    bib = tmp_path / "my-library.bib"
    entries = ["@article{kept2020,\n title = {Kept},\n abstract = {We keep this paper. It has an abstract.}}"]
    entries += [f"@article{{noabs{i:02d},\n title = {{No Abstract {i}}},\n year = 2019}}" for i in range(N_BIB_SKIPPED)]
    bib.write_text("\n".join(entries) + "\n")
    jsonl = tmp_path / "papers.jsonl"
    lines = SAMPLE.read_text().splitlines()[:2]
    jsonl.write_text("\n".join([lines[0], json.dumps({"paper_id": "bare-1", "title": "Bare", "sentences": []}), lines[1]]) + "\n")
    return bib, jsonl


def _expected(bib, jsonl) -> list[dict]:
    return ([{"file": str(bib), "line": 4 + 3 * i, "id": f"noabs{i:02d}", "title": f"No Abstract {i}",
              "reason": "no abstract"} for i in range(N_BIB_SKIPPED)]
            + [{"file": str(jsonl), "line": 2, "id": "bare-1", "title": "Bare", "reason": "no abstract"}])


def test_text_summary_names_the_first_ten_then_how_many_more(tmp_path, library):
    bib, jsonl = library
    r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix"), "-q", str(bib), str(jsonl)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "read 16, indexed 3, replaced 0, unchanged 0, skipped 13 (13 no abstract)" in r.output
    named = [line.strip() for line in r.output.splitlines() if line.startswith("  ") and "not kept" not in line]
    assert named == [f'skipped {bib}:{4 + 3 * i}: noabs{i:02d} "No Abstract {i}": no abstract' for i in range(10)] + [
        "and 3 more (all of them: --json, or --skipped FILE)"]
    # what the CSAbstruct records carry that no paper keeps: said, per file
    assert f"  not kept from {jsonl} (fields esqbe does not read): confs (" in r.output


def test_json_and_skipped_file_name_every_one(tmp_path, library):
    bib, jsonl = library
    out = tmp_path / "skipped.jsonl"
    r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix"), "--json", "--skipped", str(out),
                                  str(bib), str(jsonl)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["skipped"] == {"no abstract": 13}
    assert summary["skipped_records"] == _expected(bib, jsonl)
    assert [json.loads(line) for line in out.read_text().splitlines()] == _expected(bib, jsonl)


def test_ris_record_without_id_is_named_by_its_title(tmp_path):
    """RIS names no key: the title (and the line its record starts on) is what the user finds it by."""
    ris = tmp_path / "lib.ris"
    ris.write_text("TY  - JOUR\nTI  - Has One\nAB  - It has an abstract. Two sentences.\nER  - \n\n"
                   "TY  - CONF\nTI  - A Paper Without an Abstract\nAU  - Roe, Richard\nER  - \n")
    r = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix"), "-q", str(ris)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert f'  skipped {ris}:6: "A Paper Without an Abstract": no abstract' in r.output.splitlines()


def test_skipped_file_in_a_subprocess_and_a_bad_folder_refused_first(tmp_path):
    """The console script itself: a run that only skips loads no model, writes the file and exits 0; a
    --skipped path in a missing folder is refused before anything is read (usage, exit 2)."""
    src = tmp_path / "only-bare.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"b{i}", "title": f"T\x1b[31m{i}"}) for i in range(3)) + "\n")
    out = tmp_path / "skipped.jsonl"
    cmd = [sys.executable, "-m", "cli", "index", "--path", str(tmp_path / "ix"), "-q", "--skipped", str(out), str(src)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["b0", "b1", "b2"]
    assert "\x1b" not in p.stdout and f'  skipped {src}:1: b0 "T\\x1b[31m0": no abstract' in p.stdout.splitlines()
    bad = tmp_path / "no-such-dir" / "s.jsonl"
    cmd[4] = str(tmp_path / "ix2")
    p = subprocess.run([*cmd[:-3], "--skipped", str(bad), str(src)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "--skipped" in p.stderr and not (tmp_path / "ix2").exists()
