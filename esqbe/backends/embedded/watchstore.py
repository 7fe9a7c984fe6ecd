"""The saved queries (watches) in the embedded index's own SQLite: their rows, what each found, and the papers
indexed since a mark (paper numbers only grow: a paper added or re-indexed after the mark has a number at or past
it). Every change is one transaction under the write lock; esqbe.index.watches says what the rows mean."""
from __future__ import annotations

import json
import sqlite3

from .host import EmbeddedHost
from .layout import _load_metadata


class WatchStoreMixin(EmbeddedHost):
    """Watch rows (mixed into EmbeddedBackend). Uses the backend's `_setting`, `_acquire_write` and `_tx`."""

    #: saved queries live in this index (esqbe.index.watches asks before using them)
    keeps_watches = True

    def _watch_tables(self) -> bool:
        """Whether the index has the watch tables (a writer of this esqbe adds them; an older index read-only has none)."""
        return bool(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'watch_matches'").fetchone())

    def watch_rows(self, name: str | None = None) -> list[dict]:
        """Every watch (or the one named), by name: its stored fields and how many papers it has found."""
        if not self._watch_tables():
            return []
        where, args = ("WHERE w.name = ?", (name,)) if name is not None else ("", ())
        rows = self._db.execute(
            "SELECT w.name, w.spec, w.vectors, w.mark, w.created, w.last_run, w.feed_key, "
            f"(SELECT COUNT(*) FROM watch_matches m WHERE m.name = w.name) FROM watches w {where} ORDER BY w.name",
            args).fetchall()
        return [{"name": r[0], "spec": json.loads(r[1]), "vectors": bytes(r[2]), "mark": int(r[3]), "created": r[4],
                 "last_run": r[5], "feed_key": r[6], "found": int(r[7])} for r in rows]

    def watch_insert(self, row: dict, limit: int) -> str | None:
        """Store a new watch in one transaction; None, or why not: "exists" or "full" (`limit` watches already)."""
        self._acquire_write()
        with self._tx():
            if self._db.execute("SELECT 1 FROM watches WHERE name = ?", (row["name"],)).fetchone():
                return "exists"
            if self._db.execute("SELECT COUNT(*) FROM watches").fetchone()[0] >= limit:
                return "full"
            self._db.execute("INSERT INTO watches VALUES (?, ?, ?, ?, ?, NULL, ?)",
                             (row["name"], json.dumps(row["spec"], ensure_ascii=False, allow_nan=False),
                              sqlite3.Binary(row["vectors"]), int(row["mark"]), float(row["created"]), row["feed_key"]))
        return None

    def watch_delete(self, name: str) -> bool:
        """Remove a watch and what it found (one transaction); False if there is none of that name."""
        self._acquire_write()
        with self._tx():
            found = self._db.execute("DELETE FROM watches WHERE name = ?", (name,)).rowcount > 0
            self._db.execute("DELETE FROM watch_matches WHERE name = ?", (name,))
        return found

    def watch_set_key(self, name: str, key: str) -> bool:
        """Replace a watch's feed key; False if there is no such watch."""
        self._acquire_write()
        with self._tx():
            return self._db.execute("UPDATE watches SET feed_key = ? WHERE name = ?", (key, name)).rowcount > 0

    def watch_record(self, name: str, mark: int, when: float, matches: list[tuple[str, str]]) -> bool:
        """What one run of a watch found ((paper id, hit JSON) each, found at `when`) and its new mark, in one
        transaction: after a crash the watch has either both or neither. False if the watch was removed meanwhile."""
        self._acquire_write()
        with self._tx():
            if not self._db.execute("UPDATE watches SET mark = ?, last_run = ? WHERE name = ?",
                                    (int(mark), float(when), name)).rowcount:
                return False
            self._db.executemany("INSERT OR IGNORE INTO watch_matches VALUES (?, ?, ?, ?)",
                                 [(name, pid, float(when), hit) for pid, hit in matches])
        return True

    def watch_matches(self, name: str, limit: int) -> list[tuple[str, float, dict]]:
        """What a watch found, newest first (one run's in rank order), at most `limit`: (paper id, when found, the
        hit as it was then)."""
        if not self._watch_tables():
            return []
        rows = self._db.execute("SELECT paper_id, found, hit FROM watch_matches WHERE name = ? "
                                "ORDER BY found DESC, rowid LIMIT ?", (name, int(limit))).fetchall()
        return [(r[0], float(r[1]), json.loads(r[2])) for r in rows]

    def watch_reported(self, name: str, paper_ids: list[str]) -> set[str]:
        """Which of `paper_ids` the watch has already reported (a re-indexed paper is not reported twice)."""
        out: set[str] = set()
        for i in range(0, len(paper_ids), 900):
            chunk = paper_ids[i : i + 900]
            q = f"SELECT paper_id FROM watch_matches WHERE name = ? AND paper_id IN ({','.join('?' * len(chunk))})"
            out.update(r[0] for r in self._db.execute(q, (name, *chunk)))
        return out

    def next_paper_number(self) -> int:
        """The number the next paper indexed will get: a mark that every later paper is at or past."""
        return int(self._setting("next_pno", 0))

    def papers_since(self, mark: int, end: int, limit: int) -> list[tuple[int, str, dict]]:
        """The first `limit` live papers numbered in [mark, end) (indexed since `mark`), in number order: (number, id,
        metadata). A range scan of the paper-number index: its cost grows with the new papers, not with the index."""
        rows = self._db.execute("SELECT pno, paper_id, metadata FROM papers WHERE pno >= ? AND pno < ? ORDER BY pno "
                                "LIMIT ?", (int(mark), int(end), int(limit))).fetchall()
        return [(int(r[0]), r[1], _load_metadata(r[2])) for r in rows]
