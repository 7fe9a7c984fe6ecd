"""An embedded index is created whole or not at all: `esqbe index` killed the moment `papers.sqlite` appears, a
`papers.sqlite` an older esqbe left half made, two `esqbe index` creating one path at once, a writer's bounded
wait for another (pre-encoded Parquet input: no model needed)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

import esqbe
from esqbe.backends.embedded.backend import EmbeddedBackend
from esqbe.errors import BackendError

from .conftest import REPO
from .test_storage import ENV, _cli, _papers, _parquet

CLI = [sys.executable, "-m", "cli"]


def _papers_in(path) -> int:
    """The papers a reader of the index at `path` sees (a reader that fails fails the test)."""
    reader = EmbeddedBackend(path, create=False)
    try:
        return reader.paper_count()
    finally:
        reader.close()


def test_index_killed_as_its_database_appears_is_created_by_the_next_run(tmp_path):
    """kill -9 the moment `new/papers.sqlite` exists (polled): then the same command completes the index. Repeated,
    so that the kill lands at several points of the creation."""
    src = _parquet(tmp_path / "x.parquet", _papers(6))
    caught = 0
    for attempt in range(3):
        new = tmp_path / f"new{attempt}"
        db = new / "papers.sqlite"
        proc = subprocess.Popen([*CLI, "index", "--path", str(new), "--quiet", str(src)], cwd=REPO, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not db.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)  # the window between the file and its tables was a few milliseconds
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if db.exists():
            caught += 1
            # what a reader sees at once is a complete index (empty, or with the papers committed), never an error
            assert _papers_in(new) in (0, 6)
        with esqbe.open_index(str(new)) as again:  # what `esqbe index --path new x.parquet` runs
            again.index_files([str(src)])
        assert _papers_in(new) == 6
        assert not (new / "papers.sqlite.creating").exists()
    assert caught, "no run was killed after its papers.sqlite appeared"


def test_the_database_is_put_in_place_already_in_wal_mode(tmp_path):
    """A database switched to WAL in place went through a rollback journal: a writer killed within the switch left
    `papers.sqlite` beside a hot journal, and every read-only reader failed ("attempt to write a readonly database")
    until a writer came. The creator switches it under its temporary name, so nothing but WAL is ever in place."""
    from esqbe.backends.embedded.layout import create_database

    create_database(tmp_path)
    header = (tmp_path / "papers.sqlite").read_bytes()[:20]
    assert header[18:20] == b"\x02\x02"  # the file format's read and write versions: 2 is WAL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["papers.sqlite"]  # no journal, WAL or -shm left beside it
    assert _papers_in(tmp_path) == 0


def test_a_half_made_database_from_an_older_esqbe_is_finished_by_a_writer(tmp_path):
    """`mkdir new; touch new/papers.sqlite`, and a database with some of the tables but no settings and no papers:
    a reader refuses it naming the command that finishes it; `esqbe index` finishes it."""
    src = _parquet(tmp_path / "x.parquet", _papers(4))
    empty, partial = tmp_path / "empty", tmp_path / "partial"
    empty.mkdir()
    (empty / "papers.sqlite").touch()
    partial.mkdir()
    with sqlite3.connect(partial / "papers.sqlite") as con:  # as an older esqbe killed between its CREATE statements
        con.execute("CREATE TABLE papers (paper_id TEXT PRIMARY KEY, pno INTEGER NOT NULL UNIQUE, title TEXT NOT NULL, "
                    "sentences TEXT NOT NULL, facets TEXT NOT NULL, metadata TEXT NOT NULL, content_hash TEXT NOT NULL, "
                    "token_counts TEXT, row_start INTEGER NOT NULL, n_rows INTEGER NOT NULL, "
                    "text_indexed INTEGER NOT NULL DEFAULT 0)")
    con.close()
    done = _cli("stats", "--path", empty)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (f"error: the creation of the index at {empty} was interrupted (papers.sqlite has no "
                                   f"papers and not all of its tables); `esqbe index --path {empty} FILE` finishes it")
    with pytest.raises(BackendError, match=f"^the creation of the index at {partial} was interrupted"):
        EmbeddedBackend(partial, create=False)
    done = _cli("index", "--path", empty, "--json", src)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["indexed"] == 4 and _papers_in(empty) == 4
    with esqbe.open_index(str(partial)) as index:
        assert index.index_files([str(src)]).indexed == 4
    assert _papers_in(partial) == 4


def test_a_database_with_papers_but_no_settings_is_refused_and_left_alone(tmp_path):
    src = _parquet(tmp_path / "x.parquet", _papers(4))
    path = tmp_path / "other"
    path.mkdir()
    with sqlite3.connect(path / "papers.sqlite") as con:
        con.execute("CREATE TABLE papers (paper_id TEXT PRIMARY KEY)")
        con.execute("INSERT INTO papers VALUES ('mine')")
    con.close()
    before = (path / "papers.sqlite").read_bytes()
    for args in (("stats",), ("index", src)):
        done = _cli(*args, "--path", path)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == (f"error: {path} is not an esqbe index: its papers.sqlite holds 1 papers but no "
                                       f"settings table; move it aside (`mv {path} {path}.old`) and run "
                                       f"`esqbe index --path {path} FILE` to make a new one")
    assert (path / "papers.sqlite").read_bytes() == before


def test_a_second_writer_during_the_creation_waits_and_both_runs_are_kept(tmp_path):
    """A second writer opening the index the moment the first's `papers.sqlite` appears (polled) waits for the
    first's lock and adds its papers: both runs' papers are in the index."""
    a = _parquet(tmp_path / "a.parquet", _papers(5))
    b = _parquet(tmp_path / "b.parquet", _papers(5, start=5))
    for attempt in range(3):
        new = tmp_path / f"new{attempt}"
        db = new / "papers.sqlite"
        first = subprocess.Popen([*CLI, "index", "--path", str(new), "--json", str(a)], cwd=REPO, env=ENV,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not db.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        with esqbe.open_index(str(new)) as second:
            assert second.index_files([str(b)]).indexed == 5
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
        assert json.loads(out)["indexed"] == 5
        assert _papers_in(new) == 10


def test_a_writer_waits_for_another_within_its_bound(tmp_path):
    """The wait for another writer is bounded by write_lock_wait (--lock-wait): past it the run stops, naming it."""
    path = tmp_path / "ix"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.test_storage import _papers, META
        from esqbe.backends.embedded.backend import EmbeddedBackend
        b = EmbeddedBackend({str(path)!r})
        b.ensure(META)
        b.upsert(_papers(3))
        print("holding", flush=True)
        sys.stdin.readline()
        b.close()
    """)], cwd=REPO, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        src = _parquet(tmp_path / "x.parquet", _papers(2, start=3))
        t0 = time.monotonic()
        done = _cli("index", "--path", path, "--lock-wait", "0.5", src)
        assert done.returncode == 1, done.stderr
        assert f"is writing to {path}; waiting for it to finish (at most 0.5s: write_lock_wait)" in done.stderr
        assert (f"error: another writer (pid {holder.pid}) has held the write lock of {path} for over 0.5s; run again "
                "once it has finished, or wait longer with --lock-wait SECONDS") in done.stderr
        assert time.monotonic() - t0 < 60
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    with esqbe.open_index(str(path), write_lock_wait=0.5) as index:  # the lock is free: no wait
        assert index.index_files([str(src)]).indexed == 2
    assert _papers_in(path) == 5


@pytest.mark.parametrize("bad", ["-1", "nan", "1e9"])
def test_lock_wait_out_of_range_is_a_usage_error(tmp_path, bad):
    done = _cli("index", "--path", tmp_path / "ix", "--lock-wait", bad, tmp_path / "none.jsonl")
    assert done.returncode == 2 and "lock-wait" in done.stderr, done.stderr
