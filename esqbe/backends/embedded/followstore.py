"""The followed sources (`esqbe follow`) in the embedded index's own SQLite, beside the watches: one row per source,
its spec (what was added) and its state (the mark a run goes on from, the last run's counts and error), each change
one transaction under the write lock. A run writes a source's state only after the papers before its mark are
committed (esqbe.index.follow), so after a crash the row says where to go on."""
from __future__ import annotations

import json

from .host import EmbeddedHost


class FollowStoreMixin(EmbeddedHost):
    """Follow rows (mixed into EmbeddedBackend). Uses the backend's `_acquire_write` and `_tx`."""

    #: followed sources live in this index (esqbe.index.follow asks before using them)
    keeps_follows = True

    def _follow_table(self) -> bool:
        """Whether the index has the follows table (a writer of this esqbe adds it; an older index read-only has none)."""
        return bool(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'follows'").fetchone())

    def follow_rows(self, name: str | None = None) -> list[dict]:
        """Every followed source (or the one named), by name: {"name", "spec", "state", "created"}."""
        if not self._follow_table():
            return []
        where, args = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        rows = self._db.execute(f"SELECT name, spec, state, created FROM follows {where} ORDER BY name",  # noqa: S608
                                args).fetchall()
        return [{"name": r[0], "spec": json.loads(r[1]), "state": json.loads(r[2]), "created": float(r[3])}
                for r in rows]

    def follow_insert(self, row: dict, limit: int) -> str | None:
        """Store a new source in one transaction; None, or why not: "exists" or "full" (`limit` sources already)."""
        self._acquire_write()
        with self._tx():
            if self._db.execute("SELECT 1 FROM follows WHERE name = ?", (row["name"],)).fetchone():
                return "exists"
            if self._db.execute("SELECT COUNT(*) FROM follows").fetchone()[0] >= limit:
                return "full"
            self._db.execute("INSERT INTO follows VALUES (?, ?, ?, ?)", (
                row["name"], _dumps(row["spec"]), _dumps(row.get("state") or {}), float(row["created"])))
        return None

    def follow_delete(self, name: str) -> bool:
        """Forget a source (its papers stay in the index); False if there is none of that name."""
        self._acquire_write()
        with self._tx():
            return self._db.execute("DELETE FROM follows WHERE name = ?", (name,)).rowcount > 0

    def follow_save(self, name: str, state: dict) -> bool:
        """Replace a source's state in one transaction; False if the source was removed meanwhile."""
        self._acquire_write()
        with self._tx():
            return self._db.execute("UPDATE follows SET state = ? WHERE name = ?", (_dumps(state), name)).rowcount > 0


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
