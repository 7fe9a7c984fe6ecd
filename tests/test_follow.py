"""New papers arrive by themselves (`esqbe follow`): arXiv's OAI-PMH, OpenAlex's works API, a Zotero library, a
folder; each indexed as `esqbe index` does, its mark moved only after what precedes it is committed, every watch run
on what arrived.

The services cannot be reached from here: tests/fakes/services.py stands in for them on 127.0.0.1, answering as their
documentation shows (these are not integration tests; docs/follow.md has the real commands). Zotero databases are
real ones made with Zotero's own schema (tests/test_zotero.py's Library), folders real folders; the index, the model
and the server are the real ones."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys

import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.index.follow import FollowExistsError, FollowSpecError, add_source, list_sources
from esqbe.index.follow_run import run_follow

from .conftest import REPO, SAMPLE
from .fakes.services import OaiPmh, OpenAlex, openalex_work
from .test_zotero import ATTENTION, BERT, DIPHOTON, Library

LINES = [json.loads(line) for line in SAMPLE.read_text().splitlines()[200:230]]  # abstracts not in index_dir_30
MAILTO = "me@example.org"
QUERY = "csabstruct-train-0000"  # a paper of index_dir_30


def text(i: int) -> str:
    return " ".join(LINES[i]["sentences"])


def rec(i: int, day: str = "2024-05-02", cats: str = "cs.CL cs.LG", **kw) -> dict:
    """An arXiv record of the stand-in: sample abstract i, arXiv id 2405.0000i."""
    return {"id": f"2405.{i:05d}", "datestamp": day, "title": f"A study of case {i}", "abstract": text(i),
            "categories": cats, "authors": [("Lovelace", "Ada"), ("Turing", "Alan", "Jr")], "created": "2024-05-01",
            **kw}


def gone(arxiv_id: str, day: str = "2024-05-02") -> dict:
    return {"id": arxiv_id, "datestamp": day, "deleted": True}


def open_ix(path, encoder, **settings):
    base = {"arxiv_interval": 0.05, "openalex_interval": 0.05, "follow_mailto": MAILTO, **settings}
    return esqbe.open_index(str(path), encoder=encoder, config=None, **base)


@pytest.fixture
def ix(tmp_path, index_dir_30):
    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    return path


def test_arxiv_pages_retry_after_deleted_records_and_new_versions(ix, encoder):
    pages = [[rec(0), rec(1), rec(2, cats="cs.CV")], [rec(3), gone("2401.00001")]]
    with OaiPmh(pages) as oai, open_ix(ix, encoder, arxiv_interval=0.2) as index:
        oai.busy["t1"] = 1  # the second page: 503 with Retry-After: 1 first
        add_source(index, "cl", "arxiv:cs.CL", url=oai.url + "/oai", since="2024-05-01")
        before = index.stats()["papers"]
        run = run_follow(index)
        (s,) = run.sources
        asked = oai.asked()
        assert [r["params"] for r in asked] == [
            {"verb": "ListRecords", "metadataPrefix": "arXiv", "set": "cs", "from": "2024-05-01"},
            {"verb": "ListRecords", "resumptionToken": "t1"}, {"verb": "ListRecords", "resumptionToken": "t1"}]
        assert all(r["headers"]["User-Agent"] == f"esqbe/0.1.0 (+mailto:{MAILTO})" for r in asked)
        gaps = [b["at"] - a["at"] for a, b in zip(asked, asked[1:])]
        assert gaps[1] >= 1.0 and min(gaps) >= 0.2  # Retry-After honoured; one request per interval, never sooner
        assert s.waited == [1.0] and s.complete and not s.error and s.pages == 2
        assert (s.fetched, s.filtered, s.indexed, s.replaced) == (3, 1, 3, 0)  # cs.CV is of the set, not followed
        assert s.deleted == [{"id": "2401.00001", "when": "2024-05-02", "how": "deleted at the source",
                              "action": "not in the index"}]
        assert index.stats()["papers"] == before + 3
        paper = index.get(["2405.00001"])["2405.00001"]
        assert paper.title == "A study of case 1" and " ".join(paper.sentences) == text(1)
        meta = paper.metadata
        assert meta["sources"] == [{"file": "arxiv:cs.CL", "format": "arxiv"}]
        assert [a["name"] for a in meta["authors"]] == ["Ada Lovelace", "Alan Turing Jr"]
        assert meta["publication_date"] == "2024-05-01" and meta["external_ids"]["arxiv"] == "2405.00001"
        (source,) = list_sources(index)
        assert source.state["mark"] == "2024-05-03" and "run" not in source.state  # the repository's responseDate

        # the next harvest asks from the mark: a new version updates its paper, a withdrawn one is named and kept
        oai.pages = [[rec(1, day="2024-05-03", abstract=text(9), updated="2024-05-03"), gone("2405.00000", "2024-05-03")]]
        s = run_follow(index).sources[0]
        assert oai.asked()[-1]["params"]["from"] == "2024-05-03"
        assert (s.fetched, s.indexed, s.replaced) == (1, 0, 1) and index.stats()["papers"] == before + 3
        assert " ".join(index.get(["2405.00001"])["2405.00001"].sentences) == text(9)
        assert s.deleted[0]["action"] == "kept (follow_deleted=keep)" and index.get(["2405.00000"])

        assert run_follow(index).sources[0].deleted == []  # the mark's day again: the deletion is named once
        oai.pages[0].append(gone("2405.00003", "2024-05-03"))
        index.settings = index.settings.replace(follow_deleted="remove")  # the setting says: remove
        s = run_follow(index).sources[0]
        assert [(d["id"], d["action"]) for d in s.deleted] == [("2405.00003", "removed")]
        assert not index.get(["2405.00003"]) and index.get(["2405.00000"])
        assert (s.fetched, s.unchanged) == (1, 1)  # the day's records come again: found unchanged, not indexed again

        oai.pages = [[rec(4, day="2024-05-01")]]  # nothing since the mark: noRecordsMatch
        s = run_follow(index).sources[0]
        assert s.complete and s.fetched == 0 and s.mark == "2024-05-03" and not s.error

        # a harvest stopped at a token the repository has forgotten since: that harvest again, from its day
        oai.pages = [[rec(5, day="2024-05-04")], [rec(6, day="2024-05-04")]]
        oai.response_date = "2024-05-05T08:00:00Z"
        stopped = {"from": "2024-05-04", "started": "2024-05-05", "token": "x1", "page": 1}
        index.backend.follow_save("cl", {**list_sources(index)[0].state, "run": stopped})
        n = len(oai.asked())
        s = run_follow(index).sources[0]
        asked = [r["params"].get("resumptionToken", r["params"].get("from")) for r in oai.asked()[n:]]
        assert asked == ["x1", "2024-05-04", "t1"]  # badResumptionToken: asked again from the harvest's day
        assert "has expired: asked again from 2024-05-04" in s.notes[0] and s.complete and not s.error
        assert (s.fetched, s.indexed, s.mark) == (2, 2, "2024-05-05")


BOMB = (b'<?xml version="1.0"?><!DOCTYPE OAI-PMH [<!ENTITY a "aaaaaaaaaa">' + b"".join(
    f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(8))
        + b']><OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>&i;</responseDate></OAI-PMH>')


def test_hostile_answers_are_refused_with_source_and_page_and_the_run_goes_on(ix, encoder):
    huge = [rec(0, abstract="word " * 40_000)]  # 200,000 characters: the page is past 150,000 bytes
    long = [rec(1, abstract="word " * 20_001), rec(2)]  # a record past the 100,000 characters of an abstract
    with OaiPmh([[]]) as bomb, OaiPmh([[]]) as broken, OaiPmh([[]]) as html, OaiPmh([huge, [rec(5)]]) as big, \
            OaiPmh([long]) as one, OpenAlex([[]]) as nan, \
            OpenAlex([[openalex_work("W7", "A good work", text(7))]]) as good, \
            open_ix(ix, encoder, follow_max_page_bytes=150_000) as index:
        bomb.raw["first"] = BOMB
        broken.raw["first"] = b'<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><ListRecords><record>'
        html.raw["first"] = b"<html><body>Down for maintenance</body></html>"
        nan.raw["*"] = b'{"meta": {"next_cursor": null, "count": NaN}, "results": []}'
        for name, stand in (("a-bomb", bomb), ("b-broken", broken), ("c-html", html), ("d-big", big), ("d-one", one)):
            add_source(index, name, "arxiv:cs.CL", url=stand.url + "/oai", since="2024-05-01")
        add_source(index, "e-nan", "openalex:type:article", url=nan.url)
        add_source(index, "f-good", "openalex:type:article", url=good.url)
        run = run_follow(index)
        errors = {s.name: s.error for s in run.sources}
        assert "a-bomb (arxiv:cs.CL): page 1: the answer declares a DTD" in errors["a-bomb"]
        assert "b-broken (arxiv:cs.CL): page 1: the answer is not well-formed XML" in errors["b-broken"]
        assert "c-html (arxiv:cs.CL): page 1: not an OAI-PMH answer (its root is <html>)" in errors["c-html"]
        assert "d-big (arxiv:cs.CL)" in errors["d-big"] and "at most 150,000 are read" in errors["d-big"]
        one_run = next(s for s in run.sources if s.name == "d-one")  # that record's error; the rest of its page indexed
        assert errors["d-one"] is None and one_run.indexed == 1 and one_run.errors == [
            f"arxiv:cs.CL page 1:1: abstract: {len(long[0]['abstract'].strip())} characters; at most 100000"]
        assert "e-nan (openalex:type:article): page 1: not the works API's JSON" in errors["e-nan"]
        assert errors["f-good"] is None and run.sources[-1].indexed == 1 and run.failed
        # the failed ones moved no mark; each keeps its error for GET /stats and `follow list`
        kept = {s.name: s for s in list_sources(index)}
        assert all("mark" not in kept[n].state and kept[n].last["error"] == errors[n] for n in errors if errors[n])
        assert kept["f-good"].last["error"] is None and kept["f-good"].state["mark"]


def test_openalex_cursor_pages_polite_pool_and_corrected_works(ix, encoder):
    pages = [[openalex_work("W1", "Work one", text(1), doi="10.1234/one"), openalex_work("W2", "Work two", text(2))],
             [openalex_work("W3", "Work three", text(3))]]
    with OpenAlex(pages) as oa, open_ix(ix, encoder, openalex_per_page=2) as index:
        add_source(index, "nlp", "openalex:concepts.id:C41008148,type:article", url=oa.url, since="2024-05-01")
        s = run_follow(index).sources[0]
        sent = [r["params"] for r in oa.requests]
        assert [p["cursor"] for p in sent] == ["*", "c1", "c2"]  # until meta.next_cursor is null
        assert all(p["filter"] == "concepts.id:C41008148,type:article,from_publication_date:2024-05-01"
                   and p["per-page"] == "2" and p["mailto"] == MAILTO and "abstract_inverted_index" in p["select"]
                   for p in sent)
        assert (s.fetched, s.indexed, s.pages) == (3, 3, 3) and s.complete
        work = index.get(["W1"])["W1"]
        assert " ".join(work.sentences) == text(1) and work.metadata["external_ids"]["doi"] == "10.1234/one"
        assert work.metadata["sources"] == [{"file": "openalex:concepts.id:C41008148,type:article",
                                             "format": "openalex"}]
        oa.pages = [[openalex_work("W1", "Work one, corrected", text(1), doi="10.1234/one")]]
        s = run_follow(index).sources[0]
        assert (s.replaced, s.indexed) == (1, 0) and index.get(["W1"])["W1"].title == "Work one, corrected"
        assert oa.requests[-1]["params"]["filter"].endswith(f"from_publication_date:{s.mark}")


def _stamp(lib: Library, item: int, when: str) -> None:
    lib.db.execute("UPDATE items SET dateAdded = ?, dateModified = ?, clientDateModified = ? WHERE itemID = ?",
                   (when, when, when, item))


def test_a_zotero_library_that_grows_between_runs(tmp_path, ix, encoder):
    lib = Library(tmp_path / "zotero.sqlite")
    bert = lib.item("conferencePaper", "ABCD2345", {"title": BERT[0], "abstractNote": BERT[1], "DOI": "10.18653/v1/N19-1423"},
                    [("Jacob", "Devlin", 0, "author")])
    attention = lib.item("preprint", "ATTN2345", {"title": ATTENTION[0], "abstractNote": ATTENTION[1]})
    for item in (bert, attention):
        _stamp(lib, item, "2024-01-01 00:00:00")
    lib.close()
    with open_ix(ix, encoder) as index:
        add_source(index, "mine", f"zotero:{lib.path}")
        s = run_follow(index).sources[0]
        assert (s.fetched, s.indexed) == (2, 2) and list_sources(index)[0].state["mark"] == "2024-01-01 00:00:00"
        assert index.get(["ABCD2345"])["ABCD2345"].metadata["in_library"] is True

        lib.db = sqlite3.connect(lib.path)  # Zotero adds an item, edits one, trashes one
        new = lib.item("journalArticle", "GRP23456", {"title": DIPHOTON[0], "abstractNote": DIPHOTON[1]})
        _stamp(lib, new, "2024-02-01 09:00:00")
        value = lib.db.execute("INSERT INTO itemDataValues (value) VALUES (?)", (ATTENTION[1] + " We also show more.",))
        lib.db.execute("UPDATE itemData SET valueID = ? WHERE itemID = ? AND fieldID = ?",
                       (value.lastrowid, attention, 100 + 3 * 1))  # abstractNote
        _stamp(lib, attention, "2024-02-01 09:30:00")
        lib.db.execute("INSERT INTO deletedItems (itemID, dateDeleted) VALUES (?, '2024-02-01 10:00:00')", (bert,))
        lib.db.execute("UPDATE items SET clientDateModified = '2024-02-01 10:00:00' WHERE itemID = ?", (bert,))
        lib.close()
        s = run_follow(index).sources[0]
        assert (s.indexed, s.replaced) == (1, 1) and s.skipped == {"in the trash": 1}  # read as `esqbe index` reads it
        assert s.deleted == [{"id": "ABCD2345", "when": "2024-02-01 10:00:00", "how": "trashed",
                              "action": "kept (follow_deleted=keep)"}]
        assert list_sources(index)[0].state["mark"] == "2024-02-01 10:00:00"
        assert run_follow(index).sources[0].deleted == []  # the trashed item, read again at the mark: named once
        s = run_follow(index).sources[0]  # nothing changed since: the items of the mark's second only, unchanged
        assert (s.indexed, s.replaced, s.fetched - s.unchanged - sum(s.skipped.values())) == (0, 0, 0)


def test_a_folder_that_gains_files(tmp_path, ix, encoder):
    inbox = tmp_path / "inbox"
    (inbox / "sub").mkdir(parents=True)
    (inbox / "a.jsonl").write_text("".join(json.dumps({"id": f"a{i}", "title": f"A{i}", "abstract": text(10 + i)}) + "\n"
                                           for i in range(2)))
    (inbox / "notes.txt").write_text("not papers")
    (inbox / ".hidden.jsonl").write_text("{}\n")
    with open_ix(ix, encoder) as index:
        add_source(index, "inbox", f"dir:{inbox}")
        s = run_follow(index).sources[0]
        assert (s.fetched, s.indexed, s.pages) == (2, 2, 1) and "2 file(s) or folder(s) passed over" in s.notes[0]
        (inbox / "a.jsonl").write_text(json.dumps({"id": "a0", "title": "A0", "abstract": text(14)}) + "\n")
        shutil.copy(REPO / "tests" / "data" / "pdf" / "two-column.pdf", inbox / "sub" / "paper.pdf")
        (inbox / "b.ris").write_text(f"TY  - JOUR\nID  - b0\nTI  - B zero\nAB  - {text(12)}\nER  - \n")
        s = run_follow(index).sources[0]
        assert s.pages == 3 and (s.indexed, s.replaced) == (2, 1)  # a.jsonl again (changed), b.ris, the PDF
        assert s.deleted == [{"id": "a1", "when": None, "how": "no longer in a.jsonl", "action": "kept (follow_deleted=keep)"}]
        pdf = index.get(["inbox:sub/paper.pdf"])["inbox:sub/paper.pdf"]
        assert pdf.metadata["abstract_source"] == "pdf" and pdf.title.startswith("3D Face Recognition")
        (inbox / "b.ris").unlink()
        index.settings = index.settings.replace(follow_deleted="remove")
        s = run_follow(index).sources[0]
        assert s.pages == 0 and s.deleted[0]["how"] == "its file b.ris is gone" and s.deleted[0]["action"] == "removed"
        assert not index.get(["b0"]) and index.get(["a0"])


def test_a_kill_mid_harvest_resumes_with_nothing_lost_or_twice(ix, encoder):
    pages = [[rec(0), rec(1)], [rec(2), rec(3)], [rec(4), rec(5)]]
    env = {**os.environ, "ESQBE_ARXIV_INTERVAL": "0.05", "HF_HUB_OFFLINE": "1"}
    with OaiPmh(pages) as oai:
        with open_ix(ix, encoder) as index:
            add_source(index, "cl", "arxiv:cs.CL", url=oai.url + "/oai", since="2024-05-01")
            before = index.stats()["papers"]
        oai.hold = "t2"  # asked once page 2 is committed and its token kept: the harvest is killed there
        proc = subprocess.Popen([sys.executable, "-m", "cli", "follow", "run", "--path", str(ix), "--quiet"],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert oai.reached.wait(120), proc.stderr.read1().decode() if proc.poll() is not None else "no page 3"
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            oai.hold = None
            oai.release.set()
            if proc.poll() is None:
                proc.kill()
        with open_ix(ix, encoder) as index:
            (source,) = list_sources(index)
            assert source.state["run"]["token"] == "t2" and index.stats()["papers"] == before + 4
            numbers = {pid: index.backend.pnos([pid])[0] for pid in ("2405.00000", "2405.00003")}
            n = len(oai.asked())
            s = run_follow(index).sources[0]
            assert [r["params"] for r in oai.asked()[n:]] == [{"verb": "ListRecords", "resumptionToken": "t2"}]
            assert (s.fetched, s.indexed, s.replaced, s.unchanged) == (2, 2, 0, 0) and s.complete
            assert index.stats()["papers"] == before + 6  # every record once
            assert {pid: index.backend.pnos([pid])[0] for pid in numbers} == numbers  # none written again


def test_the_commands(tmp_path):
    runner = CliRunner()
    path = str(tmp_path / "ix")
    folder = tmp_path / "papers"
    folder.mkdir()
    r = runner.invoke(main, ["follow", "add", "cl", "arxiv:cs.CL", "--path", path, "--since", "2024-05-01",
                             "--source-url", "http://127.0.0.1:9/oai"])
    assert r.exit_code == 0 and "following cl: arxiv:cs.CL at http://127.0.0.1:9/oai" in r.output
    assert runner.invoke(main, ["follow", "add", "inbox", f"dir:{folder}", "--path", path]).exit_code == 0
    r = runner.invoke(main, ["follow", "list", "--path", path, "--json"])
    listed = json.loads(r.output)
    assert [(s["name"], s["spec"], s["since"], s["last"]) for s in listed] == [
        ("cl", "arxiv:cs.CL", "2024-05-01", None), ("inbox", f"dir:{folder.resolve()}", None, None)]
    for spec, why in (("arxiv:cs.XX.Y", "is not an arXiv category"), ("arxiv:bio.QM", "arXiv has no archive 'bio'"),
                      ("openalex:", "an OpenAlex filter is needed"), ("zotero:/nowhere.sqlite", "no Zotero database"),
                      ("scholar:x", "a SPEC is arxiv:CATEGORY")):
        r = runner.invoke(main, ["follow", "add", "x", spec, "--path", path])
        assert r.exit_code == 1 and why in r.output, (spec, r.output)
    r = runner.invoke(main, ["follow", "add", "cl", "arxiv:cs.LG", "--path", path])
    assert r.exit_code == 1 and "followed already" in r.output
    assert runner.invoke(main, ["follow", "remove", "inbox", "--path", path]).exit_code == 0
    r = runner.invoke(main, ["follow", "remove", "inbox", "--path", path])
    assert r.exit_code == 1 and "no followed source named inbox" in r.output
    r = runner.invoke(main, ["serve", "--follow-every", "12x", "--path", path])
    assert r.exit_code == 2 and "is not a duration" in r.output
    assert FollowSpecError.exit_status == 1 and FollowExistsError.http_status == 409
