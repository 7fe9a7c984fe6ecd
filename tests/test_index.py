"""Indexing through the API against a real embedded index and the real default model."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

import esqbe
from esqbe.errors import ModelMismatchError
from esqbe.ingest.readers import InputError

from .conftest import REPO, esqbe_cli, model_copy, shared_path


def _records(sample_lines, n, start=0):
    return [json.loads(x) for x in sample_lines[start : start + n]]


def test_upsert_is_idempotent_and_replaces_changed_papers(tmp_path, encoder, sample_lines, write_jsonl):
    src = write_jsonl("a.jsonl", _records(sample_lines, 6))
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    first = index.index_files([str(src)])
    assert (first.read, first.indexed, first.replaced, first.unchanged) == (6, 6, 0, 0)
    again = index.index_files([str(src)])
    assert (again.indexed, again.replaced, again.unchanged) == (0, 0, 6)
    changed = _records(sample_lines, 6)
    changed[2]["sentences"][0] = "A completely different first sentence about graph neural networks."
    again = index.index_files([str(write_jsonl("b.jsonl", changed))])
    assert (again.indexed, again.replaced, again.unchanged) == (0, 1, 5)
    stored = index.backend.get([changed[2]["paper_id"]])[changed[2]["paper_id"]]
    assert stored.paper.sentences[0].startswith("A completely different")
    assert index.stats()["papers"] == 6


def test_delete_removes_paper_from_every_store(tmp_path, encoder, sample_lines, write_jsonl):
    recs = _records(sample_lines, 5)
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    index.index_files([str(write_jsonl("a.jsonl", recs))])
    gone = recs[1]["paper_id"]
    before = index.backend.token_counts()[1]
    assert index.delete([gone, "no-such-paper"]) == 1
    assert gone not in index.backend.get([gone])
    assert index.backend.token_counts()[1] < before
    # neither BM25 nor kNN can return it any more
    text = " ".join(recs[1]["sentences"])
    assert gone not in index.backend.bm25(text, 10)
    result = index.query(recs[0]["paper_id"], k=10)
    assert gone not in [h.paper_id for h in result.hits]
    assert index.stats()["papers"] == 4


def test_summary_accounts_for_every_line(tmp_path, encoder, sample_lines, write_jsonl):
    good = _records(sample_lines, 3)
    lines = [json.dumps(good[0]), "{not json", json.dumps({"paper_id": "x", "sentences": [], "labels": []}),
             json.dumps(good[1]), json.dumps({"paper_id": "y", "sentences": ["a b c."], "labels": ["bogus"]}),
             json.dumps(good[2])]
    src = write_jsonl("mixed.jsonl", lines)
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    report = index.index_files([str(src)])
    assert report.read == 6
    assert report.indexed == 3
    assert report.skipped == {"no abstract": 1}
    assert len(report.errors) == 2
    assert report.errors[0].startswith(f"{src}:2: json:")
    assert f"{src}:5: labels:" in report.errors[1]


def test_strict_stops_at_first_bad_line_keeping_earlier_batches(tmp_path, encoder, sample_lines, write_jsonl):
    good = _records(sample_lines, 4)
    src = write_jsonl("bad.jsonl", [json.dumps(good[0]), json.dumps(good[1]), "[1, 2]", json.dumps(good[2])])
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, commit_every=1)
    with pytest.raises(InputError) as err:
        index.index_files([str(src)], strict=True)
    assert err.value.line == 3
    assert index.stats()["papers"] == 2


def test_model_mismatch_is_a_clear_error(tmp_path, encoder, sample_lines, write_jsonl):
    src = write_jsonl("a.jsonl", _records(sample_lines, 2))
    path = str(tmp_path / "ix")
    esqbe.open_index(path, encoder=encoder).index_files([str(src)])
    # the same weights under another name are the same model: a model is identified by its fingerprint
    other = model_copy(tmp_path / "other-model")
    assert esqbe.open_index(path, model=str(other)).query(json.loads(sample_lines[0])["paper_id"]).hits
    with pytest.raises(ModelMismatchError, match="independent"):
        esqbe.open_index(path, encoder=encoder, encoder_mode="independent").index_files([str(src)])


def test_s2orc_sample_counts(tmp_path, encoder):
    """Done-criterion of the spine issue: 488 of the sample's 1,000 records are papers, 512 skipped for having no
    abstract (read whole); an index run counts the same (over the first 100 records: encoding all 488 took minutes
    of the suite for the same check)."""
    from esqbe.ingest.readers import ReadReport, read_papers

    src = shared_path("data", "s2orc", "metadata-sample.jsonl")
    read = ReadReport()
    papers = list(read_papers(str(src), report=read))
    assert (read.read, len(papers), dict(read.skipped), read.errors) == (1000, 488, {"no abstract": 512}, [])
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)[:100]
    (tmp_path / "first100.jsonl").write_text("".join(lines), encoding="utf-8")
    first = ReadReport()
    want = len(list(read_papers(str(tmp_path / "first100.jsonl"), report=first)))
    report = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder).index_files([str(tmp_path / "first100.jsonl")],
                                                                                 facets="none")
    assert (report.read, report.indexed, report.skipped, report.errors) == (100, want, first.skipped, [])
    assert 0 < want < 100


def test_killed_index_run_opens_at_last_commit_and_rerun_completes(tmp_path, sample_lines):
    """kill -9 mid-run: the index opens with whole batches only, and the same command completes it."""
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:120]) + "\n")
    path = tmp_path / "ix"
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text("commit_every: 8\nbatch_size: 8\n")
    cmd = [sys.executable, "-m", "cli", "index", "--config", str(cfg), "--path", str(path), "--quiet", str(src)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    db = path / "papers.sqlite"
    deadline = time.time() + 300
    count = 0
    while time.time() < deadline and proc.poll() is None:
        if db.exists():
            try:
                with sqlite3.connect(db) as con:
                    count = con.execute("SELECT COUNT(*) FROM papers").fetchone()[0]
            except sqlite3.OperationalError:
                count = 0
            if count >= 16:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; use more papers"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    index = esqbe.open_index(str(path))
    stats = index.stats()
    assert 16 <= stats["papers"] < 120
    assert stats["papers"] % 8 == 0  # whole committed batches, nothing half-written
    n_before = stats["papers"]
    # readers never repair; the next writer brings the text index up to the paper store first
    index.backend.delete([])
    assert index.backend.text_index.searcher().num_docs == n_before
    index.close()

    done = esqbe_cli(*cmd[3:], "--json")  # the same command, to its end (in this process: no kill this time)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["unchanged"] == n_before
    assert summary["indexed"] == 120 - n_before
    index = esqbe.open_index(str(path))
    assert index.stats()["papers"] == 120
    assert index.backend.text_index.searcher().num_docs == 120


def test_contextual_vectors_depend_on_the_abstract(encoder):
    from esqbe.domain import Paper

    s = "We train the model with stochastic gradient descent."
    a = Paper("a", "Image classification", ["Convolutional networks classify images.", s])
    b = Paper("b", "Machine translation", ["Neural networks translate sentences between languages.", s])
    va, vb = encoder.contextual_sentence_vectors([a, b])
    vi = encoder.independent_sentence_vectors([a, b])
    assert np.allclose(vi[0][1], vi[1][1], atol=1e-5)  # alone, the sentence is the same
    assert float(va[1] @ vb[1]) < 0.99  # in context, it is not
    assert np.allclose(np.linalg.norm(va, axis=1), 1.0, atol=1e-5)


def test_long_abstracts_are_encoded_in_windows(encoder):
    from esqbe.domain import Paper

    sentences = [f"Sentence number {i} describes experiment {i} with many distinct words like alpha beta gamma delta epsilon." for i in range(60)]
    paper = Paper("long", "A long abstract", sentences)
    (vectors,) = encoder.contextual_sentence_vectors([paper])
    assert vectors.shape == (60, encoder.dim)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # every sentence got tokens


def test_unlabeled_papers_are_tagged_while_indexing_and_rerun_skips_them(tmp_path, encoder, write_jsonl):
    src = write_jsonl("plain.jsonl", [
        {"id": "t1", "title": "Graph cuts for sentiment", "abstract": "Sentiment analysis is hard. We propose a graph cut method over sentences. It improves accuracy by 4 points."},
        {"id": "t2", "title": "Neural parsing", "abstract": "Parsing underlies many systems. We train a neural parser with a new loss. Results show state of the art accuracy."},
    ])
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    first = index.index_files([str(src)])  # facets=keep: no labels given, so the tagger labels them
    assert first.tagged == 2
    stored = index.backend.get(["t1"])["t1"].paper
    assert "unlabeled" not in stored.facets and stored.metadata["facets_predicted"]
    facet = next(f for f in ("background", "method", "result") if f in stored.facets)
    assert [h.paper_id for h in index.query("t1", facet=facet).hits] == ["t2"]  # facet queries work on tagged papers
    again = index.index_files([str(src)], facets="predict")
    assert (again.unchanged, again.tagged, again.indexed) == (2, 0, 0)
