""" a Zotero library read from its own database, `esqbe index ~/Zotero/zotero.sqlite`.

The database is made with Zotero's own schema SQL (tests/data/zotero-schema/, from the zotero/zotero repository)
and filled the way Zotero fills it: item types, fields and creator types by name (ids as Zotero assigns them at
startup, here arbitrary), values in itemDataValues, creators ordered, collections, attachments, notes, the trash,
a group library. Titles and abstracts are the real ones of tests/data/library/."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from esqbe.domain import LIMITS
from esqbe.ingest import zotero
from esqbe.ingest.readers import ReadReport, read_papers

SCHEMA = Path(__file__).parent / "data" / "zotero-schema"

BERT = ("BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
        "We introduce a new language representation model called BERT. It is designed to pre-train deep "
        "bidirectional representations from unlabeled text. BERT obtains new state-of-the-art results on eleven "
        "natural language processing tasks.")
ATTENTION = ("Attention Is All You Need",
             "The dominant sequence transduction models are based on complex recurrent or convolutional neural "
             "networks. We propose a new simple network architecture, the Transformer, based solely on attention "
             "mechanisms. Experiments on two machine translation tasks show these models to be superior in quality.")
DIPHOTON = ("Calculation of prompt diphoton production cross sections at Tevatron and LHC energies",
            "A fully differential calculation in perturbative quantum chromodynamics is presented for the production "
            "of massive photon pairs at hadron colliders. All next-to-leading order perturbative contributions are "
            "included.")

TYPES = ["journalArticle", "conferencePaper", "preprint", "book", "note", "attachment", "annotation"]
FIELDS = ["title", "abstractNote", "date", "DOI", "url", "publicationTitle", "proceedingsTitle", "publisher",
          "volume", "pages", "archiveID", "extra"]
CREATOR_TYPES = ["author", "editor", "contributor"]


class Library:
    """A zotero.sqlite written through Zotero's schema, an item at a time."""

    def __init__(self, path: Path):
        self.path = path
        self.db = sqlite3.connect(path)
        self.db.execute("PRAGMA synchronous = OFF")  # a test's file: no fsync per statement of the schema
        self.db.executescript((SCHEMA / "system.sql").read_text())
        self.db.executescript((SCHEMA / "userdata.sql").read_text())
        self.db.execute("INSERT INTO libraries (libraryID, type, editable, filesEditable) VALUES (1, 'user', 1, 1)")
        # Zotero numbers these from its schema.json at startup; the reader must go by name, so these ids are shuffled
        for i, name in enumerate(TYPES):
            self.db.execute("INSERT INTO itemTypes (itemTypeID, typeName) VALUES (?, ?)", (40 - i, name))
        for i, name in enumerate(FIELDS):
            self.db.execute("INSERT INTO fields (fieldID, fieldName) VALUES (?, ?)", (100 + 3 * i, name))
        for i, name in enumerate(CREATOR_TYPES):
            self.db.execute("INSERT INTO creatorTypes (creatorTypeID, creatorType) VALUES (?, ?)", (i + 1, name))
        self.next_id = 1

    def item(self, item_type: str, key: str, fields: dict, creators=(), library: int = 1,
             parent: int | None = None) -> int:
        item_id = self.next_id
        self.next_id += 1
        type_id = 40 - TYPES.index(item_type)
        self.db.execute("INSERT INTO items (itemID, itemTypeID, libraryID, key) VALUES (?, ?, ?, ?)",
                        (item_id, type_id, library, key))
        for name, value in fields.items():
            self.db.execute("INSERT OR IGNORE INTO itemDataValues (value) VALUES (?)", (value,))
            (value_id,) = self.db.execute("SELECT valueID FROM itemDataValues WHERE value = ?", (value,)).fetchone()
            self.db.execute("INSERT INTO itemData (itemID, fieldID, valueID) VALUES (?, ?, ?)",
                            (item_id, 100 + 3 * FIELDS.index(name), value_id))
        for order, (first, last, mode, kind) in enumerate(creators):
            self.db.execute("INSERT OR IGNORE INTO creators (firstName, lastName, fieldMode) VALUES (?, ?, ?)",
                            (first, last, mode))
            (creator_id,) = self.db.execute("SELECT creatorID FROM creators WHERE firstName = ? AND lastName = ? "
                                            "AND fieldMode = ?", (first, last, mode)).fetchone()
            self.db.execute("INSERT INTO itemCreators (itemID, creatorID, creatorTypeID, orderIndex) "
                            "VALUES (?, ?, ?, ?)", (item_id, creator_id, CREATOR_TYPES.index(kind) + 1, order))
        return item_id

    def attach(self, parent: int, key: str, path: str | None, link_mode: int = 0) -> int:
        item_id = self.item("attachment", key, {})
        self.db.execute("INSERT INTO itemAttachments (itemID, parentItemID, linkMode, contentType, path) "
                        "VALUES (?, ?, ?, 'application/pdf', ?)", (item_id, parent, link_mode, path))
        return item_id

    def collection(self, name: str, key: str, items: list[int], parent: int | None = None) -> int:
        cur = self.db.execute("INSERT INTO collections (collectionName, parentCollectionID, libraryID, key) "
                              "VALUES (?, ?, 1, ?)", (name, parent, key))
        for i in items:
            self.db.execute("INSERT INTO collectionItems (collectionID, itemID) VALUES (?, ?)", (cur.lastrowid, i))
        return cur.lastrowid

    def close(self) -> Path:
        self.db.commit()
        self.db.close()
        return self.path


@pytest.fixture
def library(tmp_path) -> tuple[Path, dict]:
    """A small real-shaped library: three papers with abstracts (one in a group library), one without, one in the
    trash, a note, a stand-alone attachment, and a hostile key."""
    lib = Library(tmp_path / "zotero.sqlite")
    ids = {}
    ids["bert"] = lib.item("conferencePaper", "ABCD2345", {
        "title": BERT[0], "abstractNote": BERT[1], "date": "2019-06-00 June 2019", "DOI": "10.18653/v1/N19-1423",
        "url": "https://aclanthology.org/N19-1423", "proceedingsTitle": "Proceedings of NAACL-HLT",
        "pages": "4171-4186"},
        [("Jacob", "Devlin", 0, "author"), ("Ming-Wei", "Chang", 0, "author"), ("", "Google AI Language", 1, "author"),
         ("Jill", "Burstein", 0, "editor")])
    lib.attach(ids["bert"], "PDFK2345", "storage:Devlin et al. - 2019 - BERT.pdf")
    lib.attach(ids["bert"], "LINK2345", "/home/me/papers/bert.pdf", link_mode=2)
    lib.attach(ids["bert"], "EVIL2345", "storage:../../../etc/passwd")  # a stored name that leaves its folder
    ids["attention"] = lib.item("preprint", "ATTN2345", {
        "title": ATTENTION[0], "abstractNote": ATTENTION[1], "date": "2017", "archiveID": "arXiv:1706.03762",
        "DOI": "10.48550/arXiv.1706.03762", "url": "http://arxiv.org/abs/1706.03762"},
        [("Ashish", "Vaswani", 0, "author"), ("Noam", "Shazeer", 0, "author")])
    ids["note"] = lib.item("note", "NOTE2345", {})
    lib.db.execute("INSERT INTO itemNotes (itemID, parentItemID, note, title) VALUES (?, ?, ?, ?)",
                   (ids["note"], ids["attention"], "<p>Read again</p>", "Read again"))
    ids["book"] = lib.item("book", "BOOK2345", {"title": "A Book Without an Abstract", "date": "2001"})
    ids["trashed"] = lib.item("journalArticle", "TRSH2345", {"title": DIPHOTON[0] + " (old copy)",
                                                           "abstractNote": DIPHOTON[1]})
    lib.db.execute("INSERT INTO deletedItems (itemID) VALUES (?)", (ids["trashed"],))
    ids["hostile"] = lib.item("journalArticle", "BAD\x1b[2J\x07KEY", {"title": "Bad key", "abstractNote": BERT[1]})
    lib.db.execute("INSERT INTO libraries (libraryID, type, editable, filesEditable) VALUES (2, 'group', 1, 1)")
    lib.db.execute("INSERT INTO groups (groupID, libraryID, name, description, version) VALUES (4711, 2, 'Lab', '', 1)")
    ids["group"] = lib.item("journalArticle", "GRP23456", {
        "title": DIPHOTON[0], "abstractNote": DIPHOTON[1], "date": "2007-07-00 July 2007",
        "publicationTitle": "Physical Review D", "volume": "76", "DOI": "10.1103/PhysRevD.76.013009"},
        [("C.", "Balázs", 0, "author"), ("E. L.", "Berger", 0, "author")], library=2)
    lib.db.execute("INSERT INTO libraries (libraryID, type, editable, filesEditable) VALUES (3, 'feed', 0, 0)")
    ids["feed"] = lib.item("journalArticle", "FEED2345", {"title": "From an RSS feed", "abstractNote": BERT[1]},
                           library=3)  # a feed's items are news, not the user's library
    thesis = lib.collection("Thesis", "COLL2345", [ids["bert"]])
    lib.collection("Chapter 2: Methods", "COLM2345", [ids["bert"], ids["attention"]], parent=thesis)
    return lib.close(), ids


def read_all(path, whole_file_errors: int = 0):
    report = ReadReport()
    papers = {p.paper_id: p for p in read_papers(str(path), report=report)}
    # every item counted once: yielded, skipped or wrong (a file that cannot be read at all: one error, no item)
    assert report.read == report.yielded + sum(report.skipped.values()) + len(report.errors) - whole_file_errors
    return papers, report


def test_items_with_their_metadata(library):
    path, ids = library
    before = (path.read_bytes(), sorted(path.parent.iterdir()))
    papers, report = read_all(path)
    assert (path.read_bytes(), sorted(path.parent.iterdir())) == before  # read-only: nothing written, no journal
    conn, how = zotero.connect(path)  # no other process holds it: an ordinary read-only reader
    conn.close()
    assert how == "read-only" and report.notes == []  # nothing to tell: the file itself was read
    assert sorted(papers) == ["ABCD2345", "ATTN2345", "g4711-GRP23456"]  # no note, attachment, trash, book, feed
    assert report.read == 6  # the regular items: notes, attachments and feed items are not records at all
    bert = papers["ABCD2345"]
    assert bert.title == BERT[0]
    assert " ".join(bert.sentences) == BERT[1]
    m = bert.metadata
    assert m["format"] == "zotero" and m["entry_type"] == "conferencePaper"
    assert m["year"] == 2019 and m["venue"] == "Proceedings of NAACL-HLT" and "journal" not in m
    assert m["external_ids"] == {"doi": "10.18653/v1/N19-1423"}
    assert m["url"] == "https://aclanthology.org/N19-1423" and "open_access_url" not in m
    # the authors in Zotero's order, split first/last; an organisation whole; the editor is not an author
    assert m["authors"] == [{"name": "Jacob Devlin", "family": "Devlin", "given": "Jacob"},
                            {"name": "Ming-Wei Chang", "family": "Chang", "given": "Ming-Wei"},
                            {"name": "Google AI Language", "literal": True}]
    assert m["collection"] == ["Chapter 2: Methods", "Thesis"]
    storage = path.parent / "storage"
    assert m["attachments"] == [str(storage / "PDFK2345" / "Devlin et al. - 2019 - BERT.pdf"),
                                "/home/me/papers/bert.pdf"]  # the one whose name climbs out of storage is not kept
    attention = papers["ATTN2345"].metadata
    assert attention["entry_type"] == "preprint" and attention["year"] == 2017
    assert attention["external_ids"] == {"doi": "10.48550/arXiv.1706.03762", "arxiv": "1706.03762"}
    assert attention["collection"] == ["Chapter 2: Methods"]
    group = papers["g4711-GRP23456"].metadata
    assert group["journal"] == group["venue"] == "Physical Review D" and group["volume"] == "76"
    assert group["authors"][0]["name"] == "C. Balázs"
    # skipped and named: file:itemID, key, reason; the hostile key is that item's error, the rest is read
    skipped = {(r["line"], r["id"], r["reason"]) for r in report.skipped_records}
    assert skipped == {(ids["book"], "BOOK2345", "no abstract"), (ids["trashed"], "TRSH2345", "in the trash")}
    assert all(r["file"] == str(path) for r in report.skipped_records)
    assert [str(e) for e in report.errors] == [
        f"{path}:{ids['hostile']}: key: 'BAD\\x1b[2J\\x07KEY' is not a Zotero item key (letters and digits, "
        "at most 64)"]


def test_a_huge_abstract_is_that_items_error(tmp_path):
    lib = Library(tmp_path / "zotero.sqlite")
    big = lib.item("journalArticle", "HUGE2345", {"title": "Huge", "abstractNote": "word " * 40_000})
    lib.item("journalArticle", "GOOD2345", {"title": ATTENTION[0], "abstractNote": ATTENTION[1]})
    papers, report = read_all(lib.close())
    assert list(papers) == ["GOOD2345"]
    assert [str(e) for e in report.errors] == [f"{tmp_path / 'zotero.sqlite'}:{big}: abstractNote: 200000 "
                                               "characters; at most 100000"]


#: a value past each LIMITS bound ten times over that a Zotero item can carry (its metadata has a fixed shape: no
#: depth), the field it is refused in and a fragment of the reason
PAST = {
    "id_chars": ({"key": "K" * 10 * LIMITS["id_chars"]}, "key", "is not a Zotero item key"),
    "title_chars": ({"title": "word " * 1_600_000}, "title", f"at most {LIMITS['title_chars']}"),
    "sentences": ({"abstractNote": "We parse it. " * (LIMITS["sentences"] + 1)}, "sentences",
                  f"at most {LIMITS['sentences']}"),
    "abstract_chars": ({"abstractNote": "word " * 1_600_000}, "abstractNote",
                       f"at most {LIMITS['abstract_chars']}"),
    "metadata_bytes": ({"publicationTitle": "v" * (8 * LIMITS["metadata_bytes"])}, "publicationTitle", "at most"),
}


@pytest.mark.parametrize("bound", list(PAST))
def test_every_limit_holds_before_the_value_is_read_whole(tmp_path, bound):
    """Each LIMITS bound a Zotero item can break is that item's error, found before the value is read into Python
    whole (SQLite counts its length; at most the bound is read); the next item is read."""
    change, field, reason = PAST[bound]
    lib = Library(tmp_path / "zotero.sqlite")
    fields = {"title": "A title", "abstractNote": ATTENTION[1], **{k: v for k, v in change.items() if k != "key"}}
    bad = lib.item("journalArticle", change.get("key", "BAD23456"), fields)
    lib.item("journalArticle", "GOOD2345", {"title": ATTENTION[0], "abstractNote": ATTENTION[1]})
    path = lib.close()
    tracemalloc.start()
    try:
        papers, report = read_all(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert list(papers) == ["GOOD2345"]
    [error] = report.errors
    assert (error.line, error.field) == (bad, field) and reason in error.reason, error
    largest = max(len(v) for v in change.values())
    # SQLite's own memory is not Python's: what is traced is what was copied out of it
    assert peak < LIMITS["metadata_bytes"] + 2_000_000 < largest // 2 or largest < 1_000_000, \
        f"{peak / 1e6:.1f} MB to refuse a value of {largest / 1e6:.1f} MB"


def test_not_a_zotero_database(tmp_path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    papers, report = read_all(other, whole_file_errors=1)
    assert not papers
    assert [str(e) for e in report.errors] == [f"{other}: file: not a Zotero database (no items, itemData, "
                                               "itemDataValues, fields, itemTypes, itemCreators, creators, libraries "
                                               "table)"]


_HOLD = textwrap.dedent("""
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("PRAGMA main.locking_mode=EXCLUSIVE")  # as Zotero's db.js opens its database
    if sys.argv[2] == "wal":
        db.execute("PRAGMA journal_mode=WAL")  # as current Zotero runs it
        db.execute("PRAGMA wal_autocheckpoint=0")  # what it commits stays in the WAL, as between checkpoints
    def add(key, title, abstract):  # a paper added in Zotero: committed, or (below) still being written
        db.execute("INSERT INTO items (itemTypeID, libraryID, key) SELECT itemTypeID, 1, ? FROM itemTypes "
                   "WHERE typeName = 'journalArticle'", (key,))
        item = db.execute("SELECT itemID FROM items WHERE key = ?", (key,)).fetchone()[0]
        for name, value in (("title", title), ("abstractNote", abstract)):
            db.execute("INSERT OR IGNORE INTO itemDataValues (value) VALUES (?)", (value,))
            db.execute("INSERT INTO itemData (itemID, fieldID, valueID) SELECT ?, fieldID, valueID FROM fields, "
                       "itemDataValues WHERE fieldName = ? AND value = ?", (item, name, value))
    db.execute("BEGIN EXCLUSIVE")
    add("NEWW2345", sys.argv[3], sys.argv[4])
    db.execute("COMMIT")
    db.execute("BEGIN EXCLUSIVE")
    add("HALF2345", "Half written", sys.argv[4])
    db.execute("UPDATE items SET version = version + 1")
    print("holding", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    db.execute("ROLLBACK")
""")


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_indexed_through_the_cli_while_another_process_holds_the_write_lock(library, tmp_path, encoder, journal):
    """Zotero running: a real second process holds the database under an exclusive lock in a write transaction
    (rollback journal, and WAL as current Zotero uses it); `esqbe index zotero.sqlite` still reads every item, and
    the papers are found by their collection."""
    path, ids = library
    copies_before = set(Path(tempfile.gettempdir()).glob("esqbe-zotero-*"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), journal, *DIPHOTON], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # the lock is real: a plain reader is refused
            sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=0.1).execute(
                "SELECT count(*) FROM items").fetchone()
        conn, how = zotero.connect(path)  # refused read-only: the WAL's commits copied with the file, or the file
        conn.close()
        assert how == {"wal": "snapshot", "delete": "as it stands"}[journal]
        ix = tmp_path / "ix"
        r = CliRunner().invoke(main, ["index", "--path", str(ix), str(path), "--json"], catch_exceptions=False)
        text = CliRunner().invoke(main, ["index", "--path", str(tmp_path / "ix2"), str(path), "--quiet"],
                                  catch_exceptions=False)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    out = json.loads(r.stdout)
    assert r.exit_code == 0, r.output
    assert out["indexed"] == 4  # the paper committed while Zotero holds the lock is in; the one half written is not
    # the summary says that Zotero was running and what was read instead of the locked file
    read = {"wal": "a temporary copy of it and its WAL (removed after)",
            "delete": "the file as it stands, without a lock"}[journal]
    note = (f"{path}: Zotero holds it locked (it is running), so esqbe read {read}; what Zotero had not committed "
            "then is not in")
    assert out["notes"] == [note]
    assert text.exit_code == 0 and f"\n  {note}\n" in text.stdout, text.output
    assert set(Path(tempfile.gettempdir()).glob("esqbe-zotero-*")) == copies_before  # no copy left behind
    assert out["skipped"] == {"in the trash": 1, "no abstract": 1}
    assert len(out["errors"]) == 1 and f"{path}:{ids['hostile']}: key:" in out["errors"][0]
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", "g4711-GRP23456", "--facet", "method",
                                  "--filter", "collection=Chapter 2: Methods", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    found = {h["paper_id"] for h in json.loads(r.stdout)["hits"]}
    assert found == {"ABCD2345", "ATTN2345"}
    # and back out: the Zotero item types become CSL's (Zotero's own import), an RIS CONF for the conference paper
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", "g4711-GRP23456", "--facet", "method",
                                  "--filter", "collection=Chapter 2: Methods", "--format", "csl-json"],
                           catch_exceptions=False)
    types = {item["id"]: item["type"] for item in json.loads(r.stdout)}
    assert types == {"ABCD2345": "paper-conference", "ATTN2345": "article"}
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", "ATTN2345", "--facet", "method",
                                  "--format", "ris"], catch_exceptions=False)
    assert "TY  - CONF\nID  - ABCD2345" in r.stdout and "TY  - JOUR\nID  - g4711-GRP23456" in r.stdout


def test_format_zotero_on_a_file_that_is_not_a_database(tmp_path):
    text = tmp_path / "zotero.sqlite"
    text.write_text("not a database\n")
    report = ReadReport()
    assert list(read_papers(str(text), "zotero", report=report)) == []
    assert [str(e) for e in report.errors] == [f"{text}: file: not an SQLite database (--format zotero reads "
                                               "zotero.sqlite)"]


def test_a_pipe_is_not_sniffed_away(tmp_path):
    """Telling a database by its first bytes must not eat them from a pipe (`esqbe index <(zcat papers.jsonl.gz)`)."""
    line = json.dumps({"id": "p1", "title": ATTENTION[0], "abstract": ATTENTION[1]})
    writer = subprocess.Popen(["bash", "-c", 'cat "$0" <<< "$1"', "-", line], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        papers, _ = read_all(f"/dev/fd/{writer.stdout.fileno()}")
    finally:
        writer.wait(timeout=30)
    assert list(papers) == ["p1"]


# ---------------------------------------------------------------- a hostile database

PDFS = Path(__file__).parent / "data" / "pdf"
ENDLESS = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
           "SELECT n AS creatorTypeID, 'author' AS creatorType FROM r")


def endless_view(path: Path) -> Path:
    """A Zotero database whose `creatorTypes` is a view over a recursive query that never ends."""
    lib = Library(path)
    bert = lib.item("conferencePaper", "VIEW2345", {"title": BERT[0], "abstractNote": BERT[1]},
                    [("Jacob", "Devlin", 0, "author")])
    assert bert
    lib.db.execute("DROP TABLE creatorTypes")
    lib.db.execute(f"CREATE VIEW creatorTypes AS {ENDLESS}")
    return lib.close()


def quadratic(path: Path, items: int = 5000, junk: int = 100_000) -> tuple[Path, list[str]]:
    """A database of tables only (no view) that Zotero's schema reads in milliseconds, made slow: its itemData has no
    key, so each item's values are a scan of every row (`items` x `junk` row visits, minutes); each item is a paper
    with a title and an abstract, so a reader that streamed would have indexed the first ones."""
    lib = Library(path)
    lib.db.execute("CREATE TABLE itemData2 (itemID INT, fieldID INT, valueID INT)")  # no key, no index
    lib.db.execute("DROP TABLE itemData")
    lib.db.execute("ALTER TABLE itemData2 RENAME TO itemData")
    values = []
    for text in (ATTENTION[0], ATTENTION[1]):
        values.append(lib.db.execute("INSERT INTO itemDataValues (value) VALUES (?)", (text,)).lastrowid)
    keys = [f"Q{i:07d}" for i in range(items)]
    journal = 40 - TYPES.index("journalArticle")
    lib.db.executemany("INSERT INTO items (itemID, itemTypeID, libraryID, key) VALUES (?, ?, 1, ?)",
                       [(i + 1, journal, k) for i, k in enumerate(keys)])
    fields = (100 + 3 * FIELDS.index("title"), 100 + 3 * FIELDS.index("abstractNote"))
    lib.db.executemany("INSERT INTO itemData VALUES (?, ?, ?)",
                       [(i + 1, f, v) for i in range(items) for f, v in zip(fields, values)])
    lib.db.executemany("INSERT INTO itemData VALUES (?, 999, 1)", [(10_000_000 + j,) for j in range(junk)])
    return lib.close(), keys


def with_pdfs(path: Path) -> tuple[Path, dict]:
    """Zotero's own layout: items without an abstract whose PDF is stored under storage/KEY/ next to the database,
    one whose stored PDF is gone, one linked under Zotero's base directory (a path relative to a folder esqbe does
    not know), and one with its own abstract."""
    lib = Library(path)
    ids = {"own": lib.item("preprint", "ATTN2345", {"title": ATTENTION[0], "abstractNote": ATTENTION[1]})}
    ids["stored"] = lib.item("journalArticle", "PDFA2345", {"title": "A Paper Read From Its PDF", "date": "2020"})
    lib.attach(ids["stored"], "ATTK2345", "storage:Quiz - 2020.pdf")
    (path.parent / "storage" / "ATTK2345").mkdir(parents=True)
    shutil.copy(PDFS / "one-column.pdf", path.parent / "storage" / "ATTK2345" / "Quiz - 2020.pdf")
    ids["untitled"] = lib.item("journalArticle", "NOTI2345", {"date": "2021"})  # no title either: the PDF's
    lib.attach(ids["untitled"], "ATTM2345", "storage:two.pdf")
    (path.parent / "storage" / "ATTM2345").mkdir(parents=True)
    shutil.copy(PDFS / "two-column.pdf", path.parent / "storage" / "ATTM2345" / "two.pdf")
    ids["gone"] = lib.item("journalArticle", "GONE2345", {"title": "Its PDF Was Moved"})
    lib.attach(ids["gone"], "ATTG2345", "storage:gone.pdf")
    ids["linked"] = lib.item("journalArticle", "LINK2345", {"title": "Linked Under the Base Directory"})
    lib.attach(ids["linked"], "ATTL2345", "attachments:Papers/linked.pdf", link_mode=2)
    return lib.close(), ids


def test_zotero_pdfs_are_read_as_bibtex_ones_and_a_missing_one_is_named(tmp_path):
    """ an item without an abstract takes it from its PDF in storage/ next to the database (as the
    BibTeX export of the same library does), marked and counted; a missing or unresolvable attachment skips its item
    with the reason and the path."""
    from esqbe.ingest import pdf

    path, ids = with_pdfs(tmp_path / "zotero.sqlite")
    papers, report = read_all(path)
    expected = json.loads((PDFS / "abstracts.json").read_text())
    assert sorted(papers) == ["ATTN2345", "NOTI2345", "PDFA2345"]
    stored = papers["PDFA2345"]
    assert " ".join(stored.sentences) == expected["one-column"] and stored.title == "A Paper Read From Its PDF"
    assert stored.metadata["abstract_source"] == "pdf" and stored.metadata["year"] == 2020
    assert papers["NOTI2345"].title == ("3D Face Recognition with a Deep Convolutional Neural Network and Expression "
                                        "Augmentation")  # the item has none: the PDF's
    assert "abstract_source" not in papers["ATTN2345"].metadata
    assert report.abstracts_from_pdf == 2
    gone = tmp_path / "storage" / "ATTG2345" / "gone.pdf"
    reasons = {r["id"]: (r["line"], r["reason"]) for r in report.skipped_records}
    assert reasons == {
        "GONE2345": (ids["gone"], f"{pdf.MISSING}: {gone}"),
        "LINK2345": (ids["linked"], f"{pdf.MISSING}: attachments:Papers/linked.pdf (a relative path, and no folder "
                                    "to take it from: stdin, or Zotero's base directory)")}
    assert report.skipped == {pdf.MISSING: 2} and report.errors == []


def test_a_database_that_never_finishes_is_stopped_and_the_run_goes_on(tmp_path):
    """Through `esqbe index`: a zotero.sqlite whose creatorTypes is a view over an endless recursive
    query is refused before any select from it (Zotero's schema makes it a table); one of tables only that takes
    minutes is stopped at --zotero-timeout with nothing of it indexed; the other files of the run are indexed."""
    import faulthandler

    (tmp_path / "view").mkdir()
    view = endless_view(tmp_path / "view" / "zotero.sqlite")
    probe = sqlite3.connect(f"{view.as_uri()}?mode=ro", uri=True)  # the hazard is real: the view does not end
    started = time.monotonic()
    probe.set_progress_handler(lambda: int(time.monotonic() - started > 0.3), 1000)
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        probe.execute("SELECT count(*) FROM creatorTypes").fetchone()
    probe.close()
    (tmp_path / "slow").mkdir()
    slow, slow_keys = quadratic(tmp_path / "slow" / "zotero.sqlite")
    (tmp_path / "good").mkdir()
    good, _ = with_pdfs(tmp_path / "good" / "zotero.sqlite")
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(json.dumps({"id": "p1", "title": DIPHOTON[0], "abstract": DIPHOTON[1]}) + "\n")
    ix = tmp_path / "ix"
    faulthandler.dump_traceback_later(600, exit=True)  # a bound that fails must fail the run, not hang it
    try:
        started = time.monotonic()
        r = CliRunner().invoke(main, ["index", "--path", str(ix), "--zotero-timeout", "1.5", "--json", str(view),
                                      str(slow), str(good), str(jsonl)], catch_exceptions=False)
        seconds = time.monotonic() - started
    finally:
        faulthandler.cancel_dump_traceback_later()
    out = json.loads(r.stdout)
    assert out["errors"] == [
        f"{view}: file: not Zotero's schema: creatorTypes is a view, not a table (nothing of it is read)",
        f"{slow}: file: reading it took over 1.5 s (zotero_timeout, --zotero-timeout): stopped, and nothing from it "
        "is indexed (a damaged or crafted database?)"]
    assert out["indexed"] == 4 and out["abstracts_from_pdf"] == 2, out  # good's three papers and the JSON Lines one
    assert seconds < 120, f"{seconds:.0f} s (contended)"
    r = CliRunner().invoke(main, ["list", "--path", str(ix), "--json"], catch_exceptions=False)
    listed = {p["paper_id"] for p in json.loads(r.stdout)["papers"]}
    assert listed == {"ATTN2345", "PDFA2345", "NOTI2345", "p1"} and not listed & set(slow_keys)


# ---------------------------------------------------------------- a locked database

def test_a_server_answers_attachment_file_names_not_paths(library, tmp_path, encoder):
    """Attachment paths are the indexing user's own (`esqbe show` has them); a real `esqbe serve` answers GET
    /papers/ID and POST /query hits with their file names only, and refuses a filter on them (which papers match
    `attachments^=/home/` would tell the paths), unless --show-paths (an operator's own server)."""
    import httpx

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    path, _ = library
    ix = tmp_path / "ix"
    r = CliRunner().invoke(main, ["index", "--path", str(ix), "--encoder-backend", "torch", str(path), "-q"],
                           catch_exceptions=False)  # the runtime of the test encoder the server is handed
    assert r.exit_code == 0, r.output
    full = [str(path.parent / "storage" / "PDFK2345" / "Devlin et al. - 2019 - BERT.pdf"), "/home/me/papers/bert.pdf"]
    r = CliRunner().invoke(main, ["show", "--path", str(ix), "ABCD2345", "--json"], catch_exceptions=False)
    assert json.loads(r.stdout)["metadata"]["attachments"] == full  # kept in the index, for its own user
    query = {"paper_id": "ATTN2345", "facet": "method", "k": 5}
    for show_paths in (False, True):
        app = create_app(str(ix), config=None, encoder=encoder,
                         options=ServeOptions(host="127.0.0.1", warm=False, show_paths=show_paths))
        with LiveServer(app) as url:
            paper = httpx.get(url + "/papers/ABCD2345", timeout=60)
            hits = httpx.post(url + "/query", json=query, timeout=120)
            by_path = httpx.post(url + "/query", json={**query, "filters": ["attachments^=/home/"]}, timeout=120)
            structured = httpx.post(url + "/query", json={**query, "filters": [
                {"key": "attachments", "op": "exists"}]}, timeout=120)
        assert paper.status_code == hits.status_code == 200, (paper.text, hits.text)
        [hit] = [h for h in hits.json()["hits"] if h["paper_id"] == "ABCD2345"]
        if show_paths:
            assert paper.json()["metadata"]["attachments"] == hit["metadata"]["attachments"] == full
            assert by_path.status_code == structured.status_code == 200, by_path.text
            assert [h["paper_id"] for h in by_path.json()["hits"]] == ["ABCD2345"]
            continue
        names = ["Devlin et al. - 2019 - BERT.pdf", "bert.pdf"]
        assert paper.json()["metadata"]["attachments"] == hit["metadata"]["attachments"] == names
        for answer in (paper, hits):
            assert str(tmp_path) not in answer.text and "/home/me" not in answer.text and "storage" not in answer.text
        for refused in (by_path, structured):
            assert refused.status_code == 400, refused.text
            assert "attachments holds file paths" in refused.json()["error"]["message"]
            assert "/home/me" not in refused.text


def test_file_names_only_takes_every_directory_away():
    from esqbe.query.results import file_names_only

    meta = {"title": "T", "attachments": ["/home/me/Zotero/storage/ABCD2345/a b.pdf", "C:\\Users\\me\\x.pdf",
                                          "attachments:Papers/y.pdf", "file:///tmp/z.pdf", "w.pdf", 7]}
    assert file_names_only(meta) == {"title": "T", "attachments": ["a b.pdf", "x.pdf", "y.pdf", "z.pdf", "w.pdf"]}
    assert file_names_only({"attachments": ["/home/me/dir/"]}) == {}
    assert meta["attachments"][0].startswith("/home")  # the paper's own metadata is not changed
    sources = {"sources": [{"file": "/home/me/lib/a.bib", "format": "bibtex"}, {"file": "C:\\me\\z.sqlite"}]}
    assert file_names_only(sources) == {"sources": [{"file": "a.bib", "format": "bibtex"}, {"file": "z.sqlite"}]}
