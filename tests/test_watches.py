"""Watches: saved queries on a real embedded index with the real default model; runs that report the
papers indexed since the last one; bad input refused precisely; real `esqbe watch` processes killed mid-work."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

import esqbe
from esqbe.index.watches import (
    WatchError,
    WatchExistsError,
    WatchLimitError,
    WatchNameError,
    WatchNotFoundError,
    add_watch,
    get_watch,
    list_watches,
    remove_watch,
    revoke_feed_key,
    run_watches,
    watch_matches,
)

from .conftest import REPO, SAMPLE, esqbe_cli

QUERY = "csabstruct-train-0000"


def _records(start: int, n: int) -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()[start : start + n]]


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def index(tmp_path, index_dir_30, encoder):
    """A writable copy of the 30-paper index."""
    shutil.copytree(index_dir_30, tmp_path / "ix")
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as ix:
        yield ix


def test_a_run_reports_new_papers_that_pass_and_rank_within_k_once(index, tmp_path, monkeypatch):
    watch, now = add_watch(index, "methods", paper_id=QUERY, facet="method", min_sim=0.1, k=8)
    assert [s for _, s in watch.query["sentences"]] == [s for _, s in now.query_sentences]
    assert watch.vectors.shape == (len(now.query_sentences), 384)
    assert [r.matches for r in run_watches(index)] == [[]]  # nothing indexed since: the 30 papers are not new

    new = _records(30, 10)
    index.index_files([_write(tmp_path / "new.jsonl", new)])
    dry = run_watches(index, dry_run=True)[0]
    assert dry.new_papers == 10 and not dry.advanced
    import esqbe.index.watches as watches_module

    monkeypatch.setattr(watches_module, "NEW_PAPERS_PER_PASS", 3)  # the new papers read in slices: the same answer
    sliced = run_watches(index, dry_run=True)[0]
    assert sliced.new_papers == 10 and [m["paper_id"] for m in sliced.matches] == [m["paper_id"] for m in dry.matches]
    monkeypatch.undo()
    run = run_watches(index, ["methods"], now=1000.0)[0]
    assert run.advanced and run.mark_to > run.mark_from
    assert [m["paper_id"] for m in run.matches] == [m["paper_id"] for m in dry.matches]  # a dry run changed nothing
    # the rank as it is now: exactly the new papers among the same query's top k over the whole index, at min_sim
    top = index.query(QUERY, facet="method", k=8)
    expect = [h.paper_id for h in top.hits if h.paper_id in {r["paper_id"] for r in new} and h.score >= 0.1]
    assert expect and [m["paper_id"] for m in run.matches] == expect
    for m in run.matches:
        assert m["found"] == 1000.0 and m["score"] >= 0.1 and m["matches"]
        assert all(p["query_index"] in {i for i, _ in watch.query["sentences"]} for p in m["matches"])
    assert run_watches(index)[0].matches == []  # the mark moved: not reported again

    # re-indexed (a new paper number) and a deleted one: the reported paper is not reported twice
    reported = run.matches[0]["paper_id"]
    changed = next(r for r in new if r["paper_id"] == reported)
    changed = {**changed, "sentences": changed["sentences"] + ["A sentence added later to the abstract."],
               "labels": changed["labels"] + ["result"]}
    index.index_files([_write(tmp_path / "again.jsonl", [changed])])
    assert run_watches(index)[0].new_papers == 1
    assert [m["paper_id"] for m in watch_matches(index, "methods", 100)] == [m["paper_id"] for m in run.matches]
    # the example paper deleted: the watch has its own copy of the query
    index.delete_papers([QUERY])
    assert run_watches(index)[0].refused is None
    assert get_watch(index, "methods").query["sentences"] == watch.query["sentences"]


def test_watches_are_bounded_and_bad_input_is_said_precisely(index):
    for name, words in (("../etc", "'.' is not allowed"), ("a" * 65, "at most 64"), ("<b>x</b>", "'<' is not allowed"),
                        ("", "needs a name"), ("x.atom", "'.' is not allowed"), ("nul\x00", "'\\x00' is not allowed")):
        with pytest.raises(WatchNameError, match=re.escape(words)):
            add_watch(index, name, paper_id=QUERY, facet="method", min_sim=0.5)
    for bad in (math.nan, math.inf, -math.inf, 1.5, -2, "x"):
        with pytest.raises(WatchError, match="min_score must be"):
            add_watch(index, "ok", paper_id=QUERY, facet="method", min_sim=bad)
    with pytest.raises(WatchError, match="rescorer none gives an order"):
        add_watch(index, "ok", paper_id=QUERY, facet="method", min_sim=0.5, rescorer="none")
    with pytest.raises(WatchError, match="cannot keep"):
        add_watch(index, "ok", paper_id=QUERY, facet="method", min_sim=0.5, path="/elsewhere")
    assert list_watches(index) == []  # nothing refused was stored

    index.settings = index.settings.replace(max_watches=2)
    add_watch(index, "one", paper_id=QUERY, facet="method", min_sim=0.5)
    with pytest.raises(WatchExistsError, match="named one exists already"):
        add_watch(index, "one", paper_id=QUERY, facet="result", min_sim=0.5)
    add_watch(index, "two", text="We study graphs. We propose a method for colouring them.", min_sim=0.5)
    with pytest.raises(WatchLimitError, match="holds 2 watches, its limit .*max_watches"):
        add_watch(index, "three", paper_id=QUERY, facet="method", min_sim=0.5)
    with pytest.raises(WatchNotFoundError, match="no watch named nope"):
        run_watches(index, ["nope"])
    old = get_watch(index, "one").feed_key
    assert revoke_feed_key(index, "one") != old
    remove_watch(index, "one")
    with pytest.raises(WatchNotFoundError):
        remove_watch(index, "one")
    assert [w.name for w in list_watches(index)] == ["two"]


def test_a_watch_made_with_another_model_is_refused_with_the_reason(index, tmp_path):
    add_watch(index, "m", paper_id=QUERY, facet="method", min_sim=0.0)
    index.index_files([_write(tmp_path / "new.jsonl", _records(30, 3))])
    db = sqlite3.connect(index.settings.path + "/papers.sqlite")
    spec = json.loads(db.execute("SELECT spec FROM watches WHERE name = 'm'").fetchone()[0])
    spec["model"].update(model="all-mpnet-base-v2", fingerprint="sha256:another", dim=384)
    with db:
        db.execute("UPDATE watches SET spec = ? WHERE name = 'm'", (json.dumps(spec),))
    db.close()
    run = run_watches(index)[0]
    assert run.refused and "'all-mpnet-base-v2'" in run.refused and "not re-encoded" in run.refused
    assert not run.advanced and get_watch(index, "m").mark == run.mark_from  # the mark stays
    index.close()  # the command line says it too: on stderr, with exit status 1 (cron mails it)
    proc = _esqbe("watch", "run", "--path", index.settings.path, "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and json.loads(out)[0]["refused"] == run.refused and "watch m refused" in err, err


# ------------------------------------------------------------------------ the command line (killed: real processes)


def _esqbe(*args, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "cli", *map(str, args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _state(path) -> dict:
    """Each watch's mark and the ids it found, read through SQLite directly (a reader, as any query is)."""
    db = sqlite3.connect(f"file:{path}/papers.sqlite?mode=ro", uri=True)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'watches'").fetchone():
            return {}
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        marks = dict(db.execute("SELECT name, mark FROM watches"))
        found = {n: sorted(p for (p,) in db.execute("SELECT paper_id FROM watch_matches WHERE name = ?", (n,)))
                 for n in marks}
        for (n, spec, vectors) in db.execute("SELECT name, spec, vectors FROM watches"):  # a whole row or none
            s = json.loads(spec)
            assert len(vectors) == 4 * s["model"]["dim"] * len(s["query"]["sentences"]), n
        return {n: (marks[n], found[n]) for n in marks}
    finally:
        db.close()


def _kill_once_locked(proc: subprocess.Popen, lock, delay: float) -> None:
    """SIGKILL `proc` `delay` seconds after it holds the index's write lock (its pid in write.lock), or once it ends."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if lock.exists() and lock.read_text().strip() == str(proc.pid):
            time.sleep(delay)
            break
        time.sleep(0.002)
    proc.kill()
    proc.communicate(timeout=60)


def test_kill_9_during_watch_add_and_run_leaves_the_old_or_the_new_state(tmp_path, index_dir_30):
    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    lock = path / "write.lock"
    base = ("--path", path)
    add = esqbe_cli("watch", "add", "first", *base, "--paper", QUERY, "--facet", "method", "--min-sim", "0.1", "-k", "20")
    assert add.returncode == 0, add.stderr
    assert esqbe_cli("index", *base, _write(tmp_path / "new.jsonl", _records(30, 10))).returncode == 0
    before = _state(path)
    expect = esqbe_cli("watch", "run", *base, "--dry-run", "--json")
    assert expect.returncode == 0, expect.stderr
    want = sorted(m["paper_id"] for m in json.loads(expect.stdout)[0]["matches"])
    assert want, "the test needs a run that finds something"

    outcomes = set()
    for delay in (0.0, 0.05, 0.2):
        _kill_once_locked(_esqbe("watch", "run", *base), lock, delay)
        state = _state(path)
        assert state["first"] == before["first"] or state["first"][1] == want, state  # the old state or the new
        outcomes.add("new" if state["first"] != before["first"] else "old")
        if state != before:
            break
        _kill_once_locked(_esqbe("watch", "add", f"second{int(delay * 100)}", *base, "--paper", QUERY, "--facet",
                                 "result", "--min-sim", "0.2"), lock, delay)
        after = _state(path)
        assert set(after) - {"first"} <= {f"second{int(delay * 100)}"}  # the new watch whole, or absent
        assert after["first"] == before["first"]
    done = esqbe_cli("watch", "run", *base, "--json")  # a later run repairs and completes
    assert done.returncode == 0, done.stderr
    assert _state(path)["first"][1] == want
    assert "old" in outcomes  # at least one kill landed before the commit (the new state is checked just above)


def test_watch_commands_print_text_json_and_exports(tmp_path, index_dir_30):
    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    base = ("--path", path)
    add = esqbe_cli("watch", "add", "w1", *base, "--paper", QUERY, "--facet", "method", "--min-sim", "0.1", "--json")
    assert add.returncode == 0, add.stderr
    made = json.loads(add.stdout)
    assert made["feed"] == f"/watches/w1.atom?key={made['feed_key']}" and made["min_sim"] == 0.1
    assert esqbe_cli("index", *base, _write(tmp_path / "new.jsonl", _records(30, 10))).returncode == 0
    bib = esqbe_cli("watch", "run", *base, "--dry-run", "--format", "bibtex")
    assert bib.returncode == 0 and bib.stdout.count("@") >= 1, bib.stderr
    [planned] = json.loads(esqbe_cli("watch", "run", *base, "--dry-run", "--json").stdout)
    text = esqbe_cli("watch", "run", *base)
    out, err = text.stdout, text.stderr
    assert text.returncode == 0 and "watch w1: 10 new paper(s)" in out and "~ [" in out, (out, err)
    found = int(re.search(r"(\d+) match\(es\) with score >= 0\.1000", out).group(1))
    assert found >= 1 and planned["threshold"] == 0.1 and len(planned["matches"]) == found
    for m in planned["matches"]:  # the number it thresholds is the number printed, its parts as `query` prints them
        assert re.search(rf"score {m['score']:.4f}  (\[\w+, p\d+\]  )?{m['paper_id']}", out) and m["score"] >= 0.1, out
        assert f"(sim {m['similarity']:.4f}, bm25 {m['bm25']:.1f})" in out
    assert not re.search(r"\d\. sim ", out)
    again = esqbe_cli("watch", "run", *base, "--format", "bibtex")  # nothing new since: said on stderr, exit 0
    out, err = again.stdout, again.stderr
    assert again.returncode == 0 and out == "" and "nothing new" in err and "0 new paper(s)" in err, (out, err)
    # past finds exported, each with its abstract, in every format
    records = {r["paper_id"]: r for r in _records(30, 10)}
    exports = {}
    for fmt in ("bibtex", "ris", "csl-json", "csv"):
        show = esqbe_cli("watch", "show", "w1", *base, "--format", fmt)
        exports[fmt] = show.stdout
        assert show.returncode == 0 and "Traceback" not in show.stderr, show.stderr
    csl = json.loads(exports["csl-json"])
    assert len(csl) == found and {x["id"] for x in csl} <= set(records)
    for item in csl:
        assert item["abstract"].startswith(records[item["id"]]["sentences"][0][:40])
    assert exports["bibtex"].count("@") == found and exports["ris"].count("ER  -") == found
    assert len(exports["csv"].strip().splitlines()) == found + 1
    one = esqbe_cli("watch", "show", "w1", *base, "--format", "ris", "--limit", "1")
    assert one.stdout.count("ER  -") == 1
    both = esqbe_cli("watch", "show", "w1", *base, "--format", "ris", "--json")
    assert both.returncode == 2 and "not both" in both.stderr
    bad = esqbe_cli("watch", "add", "w2", *base, "--paper", QUERY, "--facet", "method", "--min-sim", "nan")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "min_score must be a finite number" in bad.stderr, \
        bad.stderr


def test_watch_run_waits_for_another_writer_while_readers_go_on(tmp_path, index_dir_30, encoder):
    import select

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        add_watch(index, "w", paper_id=QUERY, facet="method", min_sim=0.1)
    writer = esqbe.open_index(str(path), encoder=encoder, config=None)
    writer.backend.begin_write()  # what `esqbe index` holds while it runs
    try:
        proc = _esqbe("watch", "run", "--path", path)
        said, deadline = "", time.monotonic() + 120
        while "waiting" not in said and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 1.0)[0]:
                said += proc.stderr.readline()
        assert "is writing to" in said and "waiting for it to finish" in said, said
        with esqbe.open_index(str(path), config=None, create=False) as reader:  # a reader meanwhile: not blocked
            assert reader.query(QUERY, facet="method", k=3).hits
        assert proc.poll() is None  # still waiting for the writer
    finally:
        writer.close()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "watch w: 0 new paper(s)" in out, (out, err)


def test_a_watch_keeps_its_filters_and_applies_them_to_new_papers(index, tmp_path):
    def with_year(recs, first):
        return [{"id": f"y-{first + i}", "title": f"paper {first + i}", "abstract": r["sentences"], "facets": r["labels"],
                 "metadata": {"year": 2020 + (first + i) % 5}} for i, r in enumerate(recs)]

    index.index_files([_write(tmp_path / "a.jsonl", with_year(_records(30, 3), 0))])  # the key exists: it can be asked
    watch, _ = add_watch(index, "recent", paper_id=QUERY, facet="method", min_sim=-1.0, k=100,
                         filters=["year>=2022"])
    assert watch.filters == [{"key": "year", "op": ">=", "value": "2022"}]  # as the grammar parsed it
    index.index_files([_write(tmp_path / "b.jsonl", with_year(_records(33, 7), 3))])
    found = {m["paper_id"]: m["metadata"]["year"] for m in run_watches(index)[0].matches}
    assert found and all(year >= 2022 for year in found.values())
    assert set(found) == {f"y-{i}" for i in range(3, 10) if 2020 + i % 5 >= 2022}
