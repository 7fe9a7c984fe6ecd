"""A Zotero library read from its own database (`~/Zotero/zotero.sqlite`), without exporting it first.

The file is opened read-only (`mode=ro`). A running Zotero holds the database under an exclusive lock (its
`locking_mode=EXCLUSIVE`, its WAL index kept in memory), so a reader is refused. Then, where its WAL file holds
committed changes not yet written into the database, the two are copied to a temporary folder and the copy is
read (removed after); else the file is read as it stands on disk (`immutable=1`: no lock taken, nothing
written). Zotero's own file is never written either way; a transaction it has not committed is never seen.

One record per regular item (notes, attachments and annotations are not papers; feeds are not the user's
library), with its line the item's `itemID`: a record in the trash (`deletedItems`) or without an abstract is
skipped and named. The paper id is the item key (`ABCD2345`, as in Zotero's CSL-JSON ids), prefixed by the group
(`g123-ABCD2345`) in a group library. Every value is read bounded (its length first, then at most its bound),
so a hostile database costs no more than its own bounds allow.

Only tables of Zotero's own schema are read, and each only once SQLite's parsed schema (`PRAGMA table_list`) says
it is a table: a view (over an endless recursive query, say) or a virtual table under one of those names is never
selected from. The whole read runs under a wall clock (`zotero_timeout`, SQLite's progress handler; the time the
papers it gave take to index is not counted) and is read whole before any item is handed on: a database that takes
longer is an error naming the file, and nothing from it is indexed. A stored PDF of an item without an abstract is
read as a BibTeX export's is (`esqbe.ingest.pdf`, bounded per file).
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ..domain import LIMITS, Paper
from .formats import NO_ABSTRACT, _authors, _Invalid, _metadata, _Skip, _split_text_abstract
from .library import _doi, _plain, _year

SQLITE_MAGIC = b"SQLite format 3\x00"
#: what Zotero names its item types that are not papers
_NOT_PAPERS = ("note", "attachment", "annotation")
#: Zotero's item keys are 8 characters of [23456789A-Z]; anything printable and short is taken, nothing else
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: the fields read from `itemData` (a paper's venue is under the name its item type gives it)
_FIELDS = ("title", "abstractNote", "date", "DOI", "url", "publicationTitle", "proceedingsTitle", "bookTitle",
           "conferenceName", "university", "institution", "repository", "publisher", "volume", "pages", "archiveID")
_VENUE_FIELDS = ("publicationTitle", "proceedingsTitle", "bookTitle", "conferenceName", "university", "institution",
                 "repository")
#: creators, collections and attachments read per item, at most (more are not read)
_MAX_CREATORS, _MAX_COLLECTIONS, _MAX_ATTACHMENTS = 1000, 200, 100
_LIMIT = {"abstractNote": LIMITS["abstract_chars"], "title": LIMITS["title_chars"]}
_TABLES = ("items", "itemData", "itemDataValues", "fields", "itemTypes", "itemCreators", "creators", "libraries")
#: the other tables of Zotero's schema the reader uses where they are there; no other name is ever selected from
_OPTIONAL_TABLES = ("itemTypesCombined", "fieldsCombined", "creatorTypes", "groups", "deletedItems", "collections",
                    "collectionItems", "itemAttachments", "syncDeleteLog", "syncObjectTypes")
#: when an item last changed, as Zotero stamps it (UTC, `YYYY-MM-DD HH:MM:SS`: text order is time order)
CHANGED = "max(i.dateAdded, i.dateModified, i.clientDateModified)"
#: the default wall clock of one database's read (seconds of SQLite's and the reader's work, not of indexing)
READ_SECONDS = 600.0
#: characters of text one database's items may hold together: they are read whole before any is indexed
MAX_TEXT_CHARS = 500_000_000
#: SQLite virtual-machine steps between two looks at the clock
_CLOCK_STEPS = 10_000


def is_database(source) -> bool:
    """Whether `source` is a path to an SQLite file (told by its first 16 bytes, as gzip by its magic)."""
    if not isinstance(source, (str, Path)) or str(source) == "-" or not os.path.isfile(source):
        return False  # a pipe (`<(zcat x.gz)`) is not read here: what it gave could not be read again
    try:
        with open(source, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


class _Snapshot(sqlite3.Connection):
    """A connection to a copy of the database and its WAL in a temporary folder, removed when it is closed."""

    folder: str | None = None

    def close(self) -> None:
        super().close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


class Clock:
    """The seconds one database's read may take: counted while the reader works (`running`), not while the papers it
    gave are indexed; SQLite's progress handler looks at it every few thousand steps and stops a query past it."""

    def __init__(self, seconds: float = READ_SECONDS):
        self.seconds, self.spent = float(seconds), 0.0
        self._since: float | None = time.monotonic()

    def stop(self) -> None:
        if self._since is not None:
            self.spent += time.monotonic() - self._since
            self._since = None

    def start(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def over(self) -> bool:
        return self.spent + (time.monotonic() - self._since if self._since is not None else 0.0) > self.seconds

    def watch(self, conn: sqlite3.Connection) -> None:
        conn.set_progress_handler(lambda: 1 if self.over() else 0, _CLOCK_STEPS)

    def reason(self) -> str:
        return (f"reading it took over {self.seconds:g} s (zotero_timeout, --zotero-timeout): stopped, and nothing "
                "from it is indexed (a damaged or crafted database?)")


def connect(path, clock: Clock | None = None) -> tuple[sqlite3.Connection, str]:
    """(a read-only connection to the database at `path`, how it was opened: "read-only"; "snapshot" (a writer
    holds the lock and the WAL holds changes not yet in the file: the file and its WAL are copied, and the copy
    read); "as it stands" (a writer holds the lock: the file read without one)). Raises `_Invalid("file", ...)`
    when it cannot be read as a Zotero database, or not within `clock`."""
    clock = clock or Clock()
    uri = Path(path).resolve().as_uri()  # `?` and `#` in a file name are escaped, not taken as the URI's query
    conn: sqlite3.Connection | None = None
    how = "read-only"
    try:
        try:
            conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=0.5, check_same_thread=False)
            _prepare(conn, clock)
        except sqlite3.OperationalError as first:
            # Zotero running: its exclusive lock refuses every other reader ("database is locked"); a WAL or a hot
            # journal that a read-only reader may not open or roll back refuses it too
            if conn is not None:
                conn.close()
            conn = None
            wal = Path(f"{path}-wal")
            if wal.is_file() and wal.stat().st_size > 0:  # committed changes not yet in the file: read them too
                conn, how = _snapshot(Path(path), wal, clock), "snapshot"
            if conn is None:
                how = "as it stands"
                try:
                    conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, check_same_thread=False)
                    _prepare(conn, clock)
                except sqlite3.DatabaseError:
                    raise first from None
    except sqlite3.DatabaseError as e:
        if conn is not None:
            conn.close()
        if clock.over():
            raise _Invalid("file", clock.reason()) from None
        raise _Invalid("file", f"cannot read it as an SQLite database: {e}") from None
    try:
        tables = _tables(conn)
    except sqlite3.DatabaseError as e:
        conn.close()
        raise _Invalid("file", clock.reason() if clock.over() else f"cannot read its schema: {e}") from None
    except _Invalid:
        conn.close()
        raise
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        conn.close()
        raise _Invalid("file", f"not a Zotero database (no {', '.join(missing)} table)")
    return conn, how


def _snapshot(path: Path, wal: Path, clock: Clock) -> sqlite3.Connection | None:
    """The database and its WAL copied (the file first: a WAL frame names the page it replaces, so frames newer than
    the copied file are replayed on it) and the copy opened; None if that fails (no room, a torn copy)."""
    folder = tempfile.mkdtemp(prefix="esqbe-zotero-")
    try:
        shutil.copyfile(path, os.path.join(folder, "zotero.sqlite"))
        shutil.copyfile(wal, os.path.join(folder, "zotero.sqlite-wal"))
        conn = sqlite3.connect(os.path.join(folder, "zotero.sqlite"), factory=_Snapshot, check_same_thread=False)
    except (OSError, sqlite3.DatabaseError):
        shutil.rmtree(folder, ignore_errors=True)
        return None
    conn.folder = folder
    try:
        _prepare(conn, clock)  # the WAL is replayed here, on the copy
    except sqlite3.DatabaseError:
        conn.close()
        return None
    return conn


def _prepare(conn: sqlite3.Connection, clock: Clock) -> None:
    clock.watch(conn)  # from the first statement on
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA trusted_schema = OFF")  # a crafted view or trigger calls no function with side effects
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the lock is met here, not at the first item


def _tables(conn: sqlite3.Connection) -> set[str]:
    """The names of Zotero's schema that are ordinary tables in this file, as SQLite's parsed schema has them
    (`PRAGMA table_list`: `view`, `virtual` and `shadow` are not `table`; sqlite_master's own `type` column is
    what the file says). Names compare as SQLite's do, without case. `_Invalid("file", ...)` where one of those
    names is something else: Zotero's schema makes each a table, so the file is not what it says it is."""
    kinds = {name.lower(): kind for _schema, name, kind, *_ in conn.execute("PRAGMA main.table_list")
             if isinstance(name, str)}
    known = (*_TABLES, *_OPTIONAL_TABLES)
    odd = [f"{t} is a {kinds[t.lower()]}" for t in known if kinds.get(t.lower(), "table") != "table"]
    if odd:
        raise _Invalid("file", f"not Zotero's schema: {', '.join(odd)}, not a table (nothing of it is read)")
    return {t for t in known if t.lower() in kinds}


def _names(conn: sqlite3.Connection, tables: set[str], table: str, id_col: str, name_col: str) -> dict[int, str]:
    """Zotero fills `X` from its schema and `XCombined` (with custom types) at startup: both, by id."""
    names: dict[int, str] = {}
    for t in (table, f"{table}Combined"):
        if t in tables:
            names.update((i, n) for i, n in conn.execute(f"SELECT {id_col}, {name_col} FROM {t}")  # noqa: S608
                         if isinstance(n, str))
    return names


def read_all(conn: sqlite3.Connection, path, clock: Clock,
             since: str | None = None) -> list[tuple[int, dict | _Invalid]]:
    """Every item (`entries`; with `since`, those added or changed at or after it) read whole under `clock`, before
    any is handed on; `_Invalid("file", ...)` when the read outlasts the clock (nothing of the file is then indexed) or
    its text outgrows MAX_TEXT_CHARS."""
    clock.start()
    items: list[tuple[int, dict | _Invalid]] = []
    chars = 0
    try:
        for item_id, record in entries(conn, path, since):
            if isinstance(record, dict):
                chars += sum(_chars(v) for v in record.values())
                if chars > MAX_TEXT_CHARS:
                    raise _Invalid("file", f"its items hold over {MAX_TEXT_CHARS:,} characters of text together; "
                                           "a library is read whole before it is indexed")
            items.append((item_id, record))
    except sqlite3.DatabaseError as e:
        if clock.over():
            raise _Invalid("file", clock.reason()) from None
        raise _Invalid("file", f"cannot read further (after {len(items)} items, none of them indexed): {e}") from None
    finally:
        clock.stop()
    return items


def _chars(value) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


def entries(conn: sqlite3.Connection, path, since: str | None = None) -> Iterator[tuple[int, dict | _Invalid]]:
    """(itemID, the item as a dict or why it cannot be read) for each item that is not a note, attachment or
    annotation (with `since`: added or changed at or after it, Zotero's UTC stamp), in itemID order. Only tables of
    Zotero's schema that are tables (`_tables`) are read."""
    tables = _tables(conn)
    types = _names(conn, tables, "itemTypes", "itemTypeID", "typeName")
    fields = {n: i for i, n in _names(conn, tables, "fields", "fieldID", "fieldName").items() if n in _FIELDS}
    skip_types = [i for i, n in types.items() if n in _NOT_PAPERS]
    groups = dict(conn.execute("SELECT libraryID, groupID FROM groups")) if "groups" in tables else {}
    feeds = {r[0] for r in conn.execute("SELECT libraryID FROM libraries WHERE type = 'feed'")}
    collections = _collection_names(conn) if "collectionItems" in tables and "collections" in tables else {}
    storage = Path(path).resolve().parent / "storage"
    marks = ",".join("?" * len(skip_types)) or "NULL"
    changed = f" AND {CHANGED} >= ?" if since is not None else ""
    rows = conn.execute("SELECT itemID, itemTypeID, libraryID, "  # noqa: S608 (only ? marks)
                        "CASE WHEN typeof(key) = 'text' THEN substr(key, 1, 65) END FROM items i "
                        f"WHERE itemTypeID NOT IN ({marks}){changed} ORDER BY itemID",
                        [*skip_types, *([since] if since is not None else [])]).fetchall()
    for item_id, type_id, library_id, key in rows:
        if library_id in feeds:
            continue
        try:
            yield item_id, _item(conn, item_id, types.get(type_id), groups.get(library_id), key, fields, tables,
                                 collections, storage)
        except _Invalid as e:
            yield item_id, e


def _item(conn, item_id: int, type_name, group, key, fields: dict[str, int], tables: set[str], collections: dict,
          storage: Path) -> dict:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        shown = repr(key)[:80]
        raise _Invalid("key", f"{shown} is not a Zotero item key (letters and digits, at most 64)")
    record: dict = {"id": _paper_id(key, group), "key": key, "itemType": type_name}
    for name, value in _values(conn, item_id, fields):
        record[name] = value
    deleted = "deletedItems" in tables
    if deleted and conn.execute("SELECT 1 FROM deletedItems WHERE itemID = ?", (item_id,)).fetchone():
        record["deleted"] = True
    kind = "ct.creatorType" if "creatorTypes" in tables else "NULL"
    join = "LEFT JOIN creatorTypes ct ON ct.creatorTypeID = ic.creatorTypeID " if "creatorTypes" in tables else ""
    record["creators"] = conn.execute(
        f"SELECT substr(c.firstName, 1, 1000), substr(c.lastName, 1, 1000), c.fieldMode, {kind} "  # noqa: S608
        f"FROM itemCreators ic JOIN creators c ON c.creatorID = ic.creatorID {join}"
        "WHERE ic.itemID = ? ORDER BY ic.orderIndex LIMIT ?", (item_id, _MAX_CREATORS)).fetchall()
    record["collections"] = sorted({collections[c] for (c,) in conn.execute(
        "SELECT collectionID FROM collectionItems WHERE itemID = ? LIMIT ?", (item_id, _MAX_COLLECTIONS))
        if c in collections}) if collections else []
    record["attachments"], record["pdfs"] = (_attachments(conn, item_id, storage, deleted)
                                             if "itemAttachments" in tables else ([], []))
    return record


def _values(conn, item_id: int, fields: dict[str, int]) -> Iterator[tuple[str, str]]:
    """The item's fields that esqbe reads, each refused past its bound before more than the bound is read."""
    if not fields:
        return
    by_id = {i: n for n, i in fields.items()}
    limits = {i: _LIMIT.get(n, LIMITS["metadata_bytes"]) for i, n in by_id.items()}
    marks = ",".join("?" * len(by_id))
    cases = " ".join("WHEN ? THEN ?" for _ in limits)  # each field read to one past its own bound, no further
    bounds = [x for i, limit in limits.items() for x in (i, limit + 1)]
    for field_id, length, value in conn.execute(
            f"SELECT d.fieldID, length(v.value), substr(CAST(v.value AS TEXT), 1, CASE d.fieldID {cases} END) "  # noqa: S608
            f"FROM itemData d JOIN itemDataValues v ON v.valueID = d.valueID "
            f"WHERE d.itemID = ? AND d.fieldID IN ({marks})", (*bounds, item_id, *by_id)):
        name, limit = by_id[field_id], limits[field_id]
        if isinstance(length, int) and length > limit:
            raise _Invalid(name, f"{length} characters; at most {limit}")
        if isinstance(value, str):
            yield name, value


def changes(path, since: str | None, clock: Clock | None = None) -> tuple[str | None, list[dict]]:
    """(the newest change stamp of the library's items, where a run that reads from it on misses nothing; the items
    removed at or after `since`: `{"id", "when", "how"}`, `how` "trashed" (in Zotero's trash) or "deleted" (gone,
    Zotero's syncDeleteLog)), read as `connect` reads. `_Invalid` as `connect` raises it."""
    conn, _how = connect(path, clock)
    try:
        tables = _tables(conn)
        groups = dict(conn.execute("SELECT libraryID, groupID FROM groups")) if "groups" in tables else {}
        feeds = {r[0] for r in conn.execute("SELECT libraryID FROM libraries WHERE type = 'feed'")}
        (latest,) = conn.execute(f"SELECT max({CHANGED}) FROM items i").fetchone()  # noqa: S608
        removed: list[dict] = []
        if since is not None and "deletedItems" in tables:
            for key, library, when in conn.execute(
                    "SELECT substr(i.key, 1, 65), i.libraryID, substr(d.dateDeleted, 1, 40) FROM deletedItems d "
                    "JOIN items i ON i.itemID = d.itemID WHERE d.dateDeleted >= ? LIMIT ?", (since, MAX_REMOVED)):
                if isinstance(key, str) and _KEY.fullmatch(key) and library not in feeds:
                    removed.append({"id": _paper_id(key, groups.get(library)), "when": str(when), "how": "trashed"})
        if since is not None and {"syncDeleteLog", "syncObjectTypes"} <= tables:
            for key, library, when in conn.execute(
                    "SELECT substr(l.key, 1, 65), l.libraryID, substr(l.dateDeleted, 1, 40) FROM syncDeleteLog l "
                    "JOIN syncObjectTypes t ON t.syncObjectTypeID = l.syncObjectTypeID WHERE t.name = 'item' "
                    "AND l.dateDeleted >= ? LIMIT ?", (since, MAX_REMOVED)):
                if isinstance(key, str) and _KEY.fullmatch(key) and library not in feeds:
                    removed.append({"id": _paper_id(key, groups.get(library)), "when": str(when), "how": "deleted"})
    except sqlite3.DatabaseError as e:
        raise _Invalid("file", f"cannot read what changed: {e}") from None
    finally:
        conn.close()
    return (latest if isinstance(latest, str) else None), removed


#: items removed since a run that one look at the library names, at most
MAX_REMOVED = 100_000


def _paper_id(key: str, group) -> str:
    """The paper id of an item: its key, prefixed by its group in a group library (`g123-ABCD2345`)."""
    return f"g{group}-{key}" if group is not None else key


def _collection_names(conn) -> dict[int, str]:
    """Each collection's name by id (bounded: a name is a label, not a text)."""
    return {i: " ".join(n.split()) for i, n in conn.execute(
        "SELECT collectionID, substr(collectionName, 1, 500) FROM collections") if isinstance(n, str) and n.strip()}


def _attachments(conn, item_id: int, storage: Path, deleted: bool) -> tuple[list[str], list[str]]:
    """(the paths of the item's file attachments, those of them that are PDFs): a stored file (`storage:NAME`)
    under `storage/KEY/`, a linked file as Zotero holds it (absolute, or `attachments:...` under the base directory
    set in Zotero's settings). A stored name that would leave its folder is not kept; links to web pages have no
    path. A PDF is one Zotero typed `application/pdf`, or named `.pdf`."""
    trash = " AND a.itemID NOT IN (SELECT itemID FROM deletedItems)" if deleted else ""
    paths: list[str] = []
    pdfs: list[str] = []
    for key, path, ctype in conn.execute(
            "SELECT CASE WHEN typeof(i.key) = 'text' THEN substr(i.key, 1, 65) END, substr(a.path, 1, 4096), "
            "substr(a.contentType, 1, 100) FROM itemAttachments a JOIN items i ON i.itemID = a.itemID "
            f"WHERE a.parentItemID = ?{trash} ORDER BY a.itemID LIMIT ?", (item_id, _MAX_ATTACHMENTS)):
        if not isinstance(path, str) or not path.strip() or any(ord(c) < 32 for c in path):
            continue
        if path.startswith("storage:"):
            name = path[len("storage:"):]
            if not isinstance(key, str) or not _KEY.fullmatch(key) or not name or Path(name).name != name \
                    or name in (".", ".."):
                continue
            path = str(storage / key / name)
        paths.append(path)
        if ctype == "application/pdf" or path.lower().endswith(".pdf"):
            pdfs.append(path)
    return paths, pdfs


def parse(record: dict, pdf=None) -> Paper:
    """One Zotero item as a Paper, its metadata under esqbe's keys (`entry_type` the Zotero item type,
    `collection` the names of the collections it is in, `attachments` its files' paths). An item without an
    abstract takes it (and its title if it has none) from its first PDF attachment that has one, as a BibTeX
    export's record does (esqbe.ingest.pdf, read by `pdf`, a TextReader, or a new one), marked
    `abstract_source: pdf`; else it is skipped with the first PDF's reason and path."""
    if record.get("deleted"):
        raise _Skip("in the trash")
    from_pdf = None
    try:
        sentences = _split_text_abstract(record.get("abstractNote"), "abstractNote")
    except _Skip as skip:
        if skip.reason != NO_ABSTRACT or not record.get("pdfs"):
            raise
        from .pdf import read_pdf_abstract

        from_pdf = read_pdf_abstract(record["pdfs"], None, pdf)
        sentences = _split_text_abstract(from_pdf.abstract, "abstractNote")
    title = _plain(record.get("title")) or (from_pdf.title if from_pdf is not None else "")
    authors: list[dict] = []
    others: list[dict] = []
    for first, last, mode, kind in record.get("creators") or []:
        first, last = _plain(first), _plain(last)
        if mode == 1 or not first:  # a single-field name (an organisation, or one name): kept whole
            entry = {"name": last or first, "literal": True} if (last or first) else None
        else:
            entry = {"name": f"{first} {last}".strip(), "family": last, "given": first}
        if entry:
            (authors if kind in (None, "author") else others).append(entry)
    archive = _plain(record.get("archiveID"))
    arxiv = archive[len("arxiv:"):].strip() if archive.lower().startswith("arxiv:") else None
    meta = _metadata(
        "zotero", _year(record.get("date")),
        venue=next((_plain(record[k]) for k in _VENUE_FIELDS if _plain(record.get(k))), None),
        journal=_plain(record.get("publicationTitle")) if record.get("itemType") == "journalArticle" else None,
        authors=_authors(authors or others), publisher=_plain(record.get("publisher")),
        external_ids={"doi": _doi(record.get("DOI")), "arxiv": arxiv}, url=_plain(record.get("url")),
        entry_type=record.get("itemType"), volume=_plain(record.get("volume")), pages=_plain(record.get("pages")),
        collection=record.get("collections"), attachments=record.get("attachments"),
    )
    if from_pdf is not None:
        meta["abstract_source"] = "pdf"
    return Paper(str(record["id"]), title, sentences, metadata=meta)
