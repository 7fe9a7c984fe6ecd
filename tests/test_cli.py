"""The CLI end to end (click's runner, real model, real index on disk)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main

from .conftest import SAMPLE, shared_path


@pytest.fixture
def run(tmp_path):
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def twenty(tmp_path):
    src = tmp_path / "twenty.jsonl"
    src.write_text("\n".join(SAMPLE.read_text().splitlines()[:20]) + "\n")
    return src


def test_index_query_stats_delete(run, tmp_path, twenty):
    ix = tmp_path / "ix"
    r = run("index", "--path", ix, twenty)
    assert r.exit_code == 0, r.output
    assert "read 20, indexed 20, replaced 0, unchanged 0, skipped 0" in r.output

    r = run("index", "--path", ix, twenty, "--json")
    assert json.loads(r.output)["unchanged"] == 20

    r = run("query", "--path", ix, "--paper", "csabstruct-train-0000", "--facet", "method", "-k", "3")
    assert r.exit_code == 0, r.output
    assert "paper csabstruct-train-0000, facet method" in r.output
    assert r.output.count("query [") >= 3  # each hit shows its matched sentence pair(s)

    r = run("query", "--path", ix, "--paper", "csabstruct-train-0000", "--facet", "method", "-k", "3", "--json",
            "--rescorer", "ts")
    data = json.loads(r.output)
    assert data["rescorer"] == "ts"
    assert len(data["hits"]) == 3
    assert {"rank", "paper_id", "title", "score", "matches"} <= set(data["hits"][0])

    r = run("stats", "--path", ix, "--json")
    assert json.loads(r.output)["papers"] == 20

    r = run("delete", "--path", ix, "csabstruct-train-0001", "nope")
    assert "deleted 1 of 2" in r.output
    r = run("stats", "--path", ix, "--json")
    assert json.loads(r.output)["papers"] == 19


def test_stdin_and_text_query(run, tmp_path, twenty):
    ix = tmp_path / "ix"
    r = run("index", "--path", ix, "-", input=twenty.read_text())
    assert r.exit_code == 0 and "indexed 20" in r.output
    first = json.loads(twenty.read_text().splitlines()[3])
    r = run("query", "--path", ix, "--text", " ".join(first["sentences"]), "--json", "-k", "1")
    hits = json.loads(r.output)["hits"]
    best = max(hits, key=lambda h: h["score"])  # the paper the text is: its likely version, after the numbered hit
    assert best["paper_id"] == first["paper_id"] and best["likely_version_of"] == "(text)" and best["rank"] is None


def test_bad_lines_reported_and_strict_exit_status(run, tmp_path, twenty):
    lines = twenty.read_text().splitlines()[:3]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], "{oops", lines[1], lines[2]]) + "\n")
    r = run("index", "--path", tmp_path / "ix", bad)
    assert r.exit_code == 0
    assert f"{bad}:2: json:" in r.output
    assert "indexed 3" in r.output and "errors 1" in r.output
    r = run("index", "--path", tmp_path / "ix2", "--strict", bad)
    assert r.exit_code == 1
    assert f"{bad}:2: json:" in r.output


def test_user_errors_exit_1_without_traceback(run, tmp_path, twenty):
    r = run("query", "--path", tmp_path / "missing", "--paper", "x", "--facet", "method")
    assert r.exit_code == 1 and r.output.startswith("error: no index at")
    run("index", "--path", tmp_path / "ix", twenty)
    r = run("query", "--path", tmp_path / "ix", "--paper", "nope", "--facet", "method")
    assert r.exit_code == 1 and "paper nope is not in the index" in r.output
    r = run("query", "--path", tmp_path / "ix", "--paper", "csabstruct-train-0000", "--sentences", "a,b")
    assert r.exit_code == 2 and "--sentences" in r.output
    r = run("index", "--path", tmp_path / "ix", tmp_path / "no-such-file.jsonl")
    assert r.exit_code == 1 and "no-such-file.jsonl" in r.output


def test_config_file_sets_defaults_flags_override(run, tmp_path, twenty):
    ix = tmp_path / "ix"
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text(f"path: {ix}\nk: 2\nrescorer: ts\n")
    assert run("index", "--config", cfg, twenty).exit_code == 0
    data = json.loads(run("query", "--config", cfg, "--paper", "csabstruct-train-0000", "--facet", "method", "--json").output)
    assert len(data["hits"]) == 2 and data["rescorer"] == "ts"
    data = json.loads(run("query", "--config", cfg, "--paper", "csabstruct-train-0000", "--facet", "method", "--json",
                          "-k", "4", "--rescorer", "summax").output)
    assert len(data["hits"]) == 4 and data["rescorer"] == "summax"
    cfg.write_text("pathh: x\n")
    r = run("stats", "--config", cfg)
    assert r.exit_code == 1 and "unknown setting(s) pathh" in r.output


def test_help_teaches(run):
    r = run("--help")
    assert "esqbe query --paper" in r.output
    r = run("query", "--help")
    assert "--sentences" in r.output and "any sentences you choose" in r.output
    assert "Definition" not in r.output  # the paper's jargon, not the user's


def test_csfcube_paper_query(run, tmp_path):
    """The spine's done-criterion, on a slice: CSFCube input, then a facet query prints ranked papers."""
    src = shared_path("data", "csfcube-dev", "abstracts-csfcube-preds.jsonl")
    lines = [line for line in src.read_text().splitlines()]
    wanted = [line for line in lines if json.loads(line)["paper_id"] == "1791179"] + lines[:30]
    sl = tmp_path / "cube.jsonl"
    sl.write_text("\n".join(wanted) + "\n")
    assert run("index", "--path", tmp_path / "ix", sl).exit_code == 0
    r = run("query", "--path", tmp_path / "ix", "--paper", "1791179", "--facet", "method", "-k", "5")
    assert r.exit_code == 0, r.output
    assert "paper 1791179, facet method" in r.output
    assert "  1. " in r.output and "  5. " in r.output
