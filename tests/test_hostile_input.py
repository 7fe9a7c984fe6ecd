"""Hostile input files and storage: a bad Parquet row never wedges the index, non-finite numbers
are refused (and an index already holding one still answers), sizes are bounded, and a read-only index
named by a relative path can be queried. Real files in tmp dirs, the real embedded index, the real CLI."""
from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

from esqbe.backends.embedded.backend import EmbeddedBackend
from esqbe.domain import LIMITS
from esqbe.ingest.readers import ReadReport, read_papers

from .conftest import REPO, esqbe_cli
from .test_storage import META, _make_read_only, _make_writable, _papers, _parquet


def _cli(*args, cwd=REPO):
    return esqbe_cli(*args, cwd=cwd)  # the command in this process: what it prints and its status are the point


def _rewrite(src: Path, dst: Path, edit, schema=None) -> Path:
    """A copy of a Parquet file with its rows edited (`edit(rows)`), under the same (or another) schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    rows = table.to_pylist()
    edit(rows)
    schema = schema if schema is not None else table.schema
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), dst)
    return dst


def _bm25_ids(path: Path, text: str) -> set[str]:
    b = EmbeddedBackend(path, create=False)
    try:
        return set(b.bm25(text, 50))
    finally:
        b.close()


# --- item 5: one bad Parquet row ---------------------------------------------------------------------


def test_a_null_sentence_is_a_row_error_and_the_rest_of_the_batch_is_searchable(tmp_path):
    src = _parquet(tmp_path / "ok.parquet", _papers(3))

    def null_sentence(rows):
        rows[1]["sentences"][0] = None

    bad = _rewrite(src, tmp_path / "bad.parquet", null_sentence)
    ix = tmp_path / "ix"
    r = _cli("index", "--path", ix, bad)
    assert r.returncode == 0, r.stderr
    assert f"{bad}:2: sentences: sentence 0 is null, expected a string" in r.stderr and "Traceback" not in r.stderr
    assert "indexed 2," in r.stdout
    # every later write works, and the good papers of the same batch are in BM25
    good = _parquet(tmp_path / "good.parquet", _papers(2, start=10))
    r = _cli("index", "--path", ix, good)
    assert r.returncode == 0 and "indexed 2," in r.stdout, r.stderr
    r = _cli("delete", "--path", ix, "p000010")
    assert r.returncode == 0, r.stderr
    assert {"p000000", "p000002"} <= _bm25_ids(ix, "study 0 2 part")
    assert "p000011" in _bm25_ids(ix, "study 11")


def test_an_index_wedged_by_an_unchecked_row_recovers_on_the_next_write(tmp_path):
    """A row the text index cannot take, already committed to SQLite (as an esqbe without the checks did)."""
    ix = tmp_path / "ix"
    b = EmbeddedBackend(ix)
    b.ensure(META)
    b.upsert(_papers(3))
    b.close()
    with sqlite3.connect(ix / "papers.sqlite") as con:
        con.execute("UPDATE papers SET sentences = '[null, \"graph study\"]', text_indexed = 0 WHERE paper_id = 'p000001'")
    good = _parquet(tmp_path / "good.parquet", _papers(2, start=10))
    r = _cli("index", "--path", ix, good)
    assert r.returncode == 0 and "indexed 2," in r.stdout, r.stderr
    assert "warning: paper p000001" in r.stderr and "left out of BM25" in r.stderr and "Traceback" not in r.stderr
    r = _cli("delete", "--path", ix, "p000010")
    assert r.returncode == 0, r.stderr
    assert "p000001" not in r.stderr  # reported once, never replayed
    assert "p000011" in _bm25_ids(ix, "study 11")
    r = _cli("stats", "--path", ix, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["papers"] == 4, r.stderr


def test_parquet_columns_of_the_wrong_type_and_null_elements_are_errors_not_tracebacks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = _parquet(tmp_path / "ok.parquet", _papers(4))
    # vectors as list<float>: one vector per paper, not one per sentence
    schema = pq.read_schema(src)
    flat = pa.schema([f if f.name != "vectors" else pa.field("vectors", pa.list_(pa.float32())) for f in schema],
                     metadata=schema.metadata)

    def flatten(rows):
        for row in rows:
            row["vectors"] = row["vectors"][0]

    bad_type = _rewrite(src, tmp_path / "flat.parquet", flatten, schema=flat)
    r = _cli("index", "--path", tmp_path / "ix", bad_type)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{bad_type}: vectors: expected list<list<float32>> (one vector per sentence), got list<" in r.stderr

    def nulls(rows):
        rows[0]["facets"][1] = None  # a null label
        rows[1]["vectors"][0][3] = None  # a null vector element
        rows[2]["metadata"] = '{"year": NaN, "venue": "ACL"}'

    bad = _rewrite(src, tmp_path / "nulls.parquet", nulls)
    r = _cli("index", "--path", tmp_path / "ix", "--json", bad)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    errors = json.loads(r.stdout)["errors"]
    assert errors == [
        f"{bad}:1: facets: label 1 is null; esqbe labels are background, method, result, other, unlabeled",
        f"{bad}:2: vectors: null, NaN or infinite values",
        f"{bad}:3: year: nan is not a finite number (NaN, Infinity and numbers past 1.8e308 are refused)",
    ]
    assert json.loads(r.stdout)["indexed"] == 1
    r = _cli("index", "--path", tmp_path / "ix2", "--strict", bad)
    assert r.returncode == 1 and ":1: facets: label 1 is null" in r.stderr and "Traceback" not in r.stderr


def test_the_python_api_cannot_store_a_paper_the_text_index_cannot_take(tmp_path):
    b = EmbeddedBackend(tmp_path / "ix")
    b.ensure(META)
    good, bad, nan = _papers(3)
    bad.paper.sentences[0] = None
    nan.paper.metadata = {"year": float("inf")}
    result = b.upsert([good, bad, nan])
    assert result.added == 1
    assert result.errors == ["p000001: sentences: sentence 0 is null, expected a string (not stored)",
                             "p000002: year: inf is not a finite number (NaN, Infinity and numbers past 1.8e308 are refused) (not stored)"]
    assert b.paper_ids() == ["p000000"]
    assert b.upsert(_papers(1, start=5)).added == 1  # the next write works
    b.close()


# --- item 6: NaN and Infinity in metadata ------------------------------------------------------------


def test_non_finite_numbers_are_refused_per_record(write_jsonl):
    src = write_jsonl("p.jsonl", [
        '{"id": "a1", "abstract": "We parse graphs. It works.", "year": NaN}',
        '{"id": "a2", "abstract": "We cut graphs. It works.", "metadata": {"scores": [1, 1e400]}}',
        '{"id": "a3", "abstract": "We rank graphs. It works.", "stats": {"x": -Infinity}}',
        '{"id": "a4", "abstract": "We sort graphs. It works.", "year": 2020, "score": 0.5}',
    ])
    report = ReadReport()
    papers = list(read_papers(str(src), report=report))
    assert [p.paper_id for p in papers] == ["a4"]
    assert [str(e) for e in report.errors] == [
        f"{src}:1: year: nan is not a finite number (NaN, Infinity and numbers past 1.8e308 are refused)",
        f"{src}:2: scores[1]: inf is not a finite number (NaN, Infinity and numbers past 1.8e308 are refused)",
        f"{src}:3: stats.x: -inf is not a finite number (NaN, Infinity and numbers past 1.8e308 are refused)",
    ]


def test_an_index_holding_nan_still_answers_stats_papers_and_refuses_new_nan_over_http(tmp_path, encoder, sample_lines):
    from fastapi.testclient import TestClient

    import esqbe
    from esqbe.server.app import ServeOptions, create_app

    path = tmp_path / "ix"
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:3]) + "\n")
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 3
    pid = json.loads(sample_lines[0])["paper_id"]
    with sqlite3.connect(path / "papers.sqlite") as con:  # as an esqbe that did not refuse NaN stored it
        con.execute("UPDATE papers SET metadata = '{\"year\": NaN, \"venue\": \"ACL\", \"format\": \"csabstruct\"}' "
                    "WHERE paper_id = ?", (pid,))
    r = _cli("stats", "--path", path, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["papers"] == 3
    app = create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/stats").status_code == 200
        got = client.get(f"/papers/{pid}").json()
        assert got["metadata"] == {"year": None, "venue": "ACL", "format": "csabstruct"}
        line = '{"id": "n1", "title": "T", "abstract": "We parse graphs. It works.", "year": NaN}'
        r = client.post("/papers", content=line + "\n", headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 200, r.text
        [outcome] = r.json()["records"]
        assert (outcome["status"], outcome["field"]) == ("error", "year") and "not a finite number" in outcome["reason"]
        assert client.get("/papers/n1").status_code == 404


# --- bounds on what one record carries ---------------------------------------------------------------


def test_records_past_the_limits_are_refused_with_their_field(write_jsonl):
    src = write_jsonl("big.jsonl", [
        {"id": "x" * (LIMITS["id_chars"] + 1), "abstract": "Fine. Text."},
        {"id": "b", "abstract": "word " * (LIMITS["abstract_chars"] // 5 + 1)},
        {"id": "c", "abstract": ["Sentence."] * (LIMITS["sentences"] + 1)},
        {"id": "d", "abstract": "Fine. Text.", "metadata": {"deep": json.loads("[" * 40 + "1" + "]" * 40)}},
        '{"id": "e", "abstract": "Fine.", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        {"id": "f", "title": "t" * (LIMITS["title_chars"] + 1), "abstract": "Fine. Text."},
        {"id": "ok", "abstract": "Fine. Text."},
    ])
    report = ReadReport()
    assert [p.paper_id for p in read_papers(str(src), report=report)] == ["ok"]
    got = [(e.line, e.field, e.reason) for e in report.errors]
    assert got == [
        (1, "paper_id", f"{LIMITS['id_chars'] + 1} characters; at most {LIMITS['id_chars']}"),
        (2, "abstract", f"{5 * (LIMITS['abstract_chars'] // 5 + 1)} characters; at most {LIMITS['abstract_chars']}"),
        (3, "sentences", f"{LIMITS['sentences'] + 1} sentences; at most {LIMITS['sentences']}"),
        (4, got[3][1], f"nested deeper than {LIMITS['metadata_depth']} levels"),
        (5, "json", "nested too deeply"),
        (6, "title", f"{LIMITS['title_chars'] + 1} characters; at most {LIMITS['title_chars']}"),
    ]
    assert got[3][1].startswith("deep[0]")


# --- item 9: a read-only index named by a relative path ----------------------------------------------


def test_a_read_only_index_at_a_relative_path_can_be_queried():
    base = Path(tempfile.mkdtemp(prefix="esqbe-ro-rel-"))
    try:
        b = EmbeddedBackend(base / "ro")
        b.ensure(META)
        b.upsert(_papers(30))
        b.close()
        _make_read_only(base / "ro")
        r = _cli("query", "--path", "ro", "--paper", "p000001", "--facet", "background", "--json", cwd=base)
        assert r.returncode == 0, r.stderr
        hits = json.loads(r.stdout)["hits"]
        assert hits and all(h["paper_id"] != "p000001" for h in hits)
        assert any(h["bm25"] > 0 for h in hits), hits  # BM25 read the text index through its links
    finally:
        _make_writable(base)
        shutil.rmtree(base)
