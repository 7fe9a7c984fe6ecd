"""The embedded index's alias table: each normalised identifier (`doi:...`, `arxiv:...`,
`pubmed:...`, esqbe.core.workids) names the paper first stored with it, and `id:<id>` names the paper a record of that
id was merged into, so that either id finds the paper. Written with the papers (in the upsert's transaction) and by
an index run's merges; an index from before the table gets its papers' identifiers (and one from before title keys,
its papers' titles) when a writer first opens it."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence

from ...core.workids import identifier_keys, title_key, work_keys
from ...domain import IndexedPaper
from .host import EmbeddedHost
from .layout import ALIASES_FILLED, TITLES_FILLED, _chunks


class AliasesMixin(EmbeddedHost):
    keeps_aliases = True

    def work_aliases(self, keys: Iterable[str]) -> dict[str, str]:
        """(An index run's look-up: an index from before the table is filled first, see `_aliases_ready`.)"""
        return self._lookup(keys) if self._aliases_ready() else {}

    def _lookup(self, keys: Iterable[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for chunk in _chunks(list(dict.fromkeys(keys)), 500):
            try:
                out.update(self._db.execute(f"SELECT key, paper_id FROM aliases WHERE key IN ({','.join('?' * len(chunk))})",
                                            chunk).fetchall())
            except sqlite3.OperationalError:  # an index from before the table, opened to read: none yet
                return {}
        return out

    def add_aliases(self, aliases: dict[str, str]) -> None:
        if not aliases:
            return
        self._acquire_write()
        with self._tx():
            self._db.executemany("INSERT OR REPLACE INTO aliases VALUES (?, ?)", list(aliases.items()))

    def _aliases_ready(self) -> bool:
        """Whether the table can answer: filled (by a writer) or the index holds no paper. An index from before it (or
        before title keys), holding papers, is filled now when this process may write it (an index run's first
        look-up); where it may not, identifiers already filled still answer."""
        try:
            filled = {k for (k,) in self._db.execute("SELECT key FROM settings WHERE key IN (?, ?)",
                                                     (ALIASES_FILLED, TITLES_FILLED))}
            if len(filled) == 2:
                return True
            if not self._db.execute("SELECT 1 FROM papers LIMIT 1").fetchone():
                return False
        except sqlite3.OperationalError:  # no index yet
            return False
        if not self.writable:
            try:
                self._acquire_write()  # fills the table (lock.py), as every writer's first opening does
            except Exception:  # noqa: BLE001  # read-only or locked: what is filled answers, the rest is not looked up
                return ALIASES_FILLED in filled
        return True

    def _remember_identifiers(self, papers: Sequence[IndexedPaper]) -> None:
        """In the upsert's transaction: each paper's identifiers name it, unless they already name another (the
        first stays: an index run merges a later record into it before it gets here)."""
        rows = [(key, ip.paper_id) for ip in papers for key in work_keys(ip.paper.metadata)]
        # a title and year names the first paper stored with it: a later run's record of the same title is reported
        # as its likely duplicate (esqbe.index.merge), never merged into it
        titles = ((title_key(ip.paper.title, (ip.paper.metadata or {}).get("year")), ip.paper_id) for ip in papers)
        rows += [(f"title:{key}", pid) for key, pid in titles if key is not None]
        if rows:
            self._db.executemany("INSERT OR IGNORE INTO aliases VALUES (?, ?)", rows)

    def _fill_aliases(self) -> None:
        """Once per index (a writer's migration): the identifiers of the papers stored before the table existed, and
        the title keys (`title:...`) of those stored before titles were kept (an index made by an older esqbe)."""
        done = {k for (k,) in self._db.execute("SELECT key FROM settings WHERE key IN (?, ?)",
                                               (ALIASES_FILLED, TITLES_FILLED))}
        if len(done) == 2:
            return
        with self._tx():
            rows: list[tuple[str, str]] = []
            for pid, title, metadata in self._db.execute("SELECT paper_id, title, metadata FROM papers ORDER BY pno"):
                try:
                    meta = json.loads(metadata, parse_constant=lambda _: None)
                except ValueError:
                    continue
                if not isinstance(meta, dict):
                    continue
                if ALIASES_FILLED not in done:
                    rows.extend((key, pid) for key in work_keys(meta))
                key = title_key(title, meta.get("year")) if TITLES_FILLED not in done else None
                if key is not None:
                    rows.append((f"title:{key}", pid))
            self._db.executemany("INSERT OR IGNORE INTO aliases VALUES (?, ?)", rows)
            self._db.executemany("INSERT OR REPLACE INTO settings VALUES (?, ?)",
                                 [(ALIASES_FILLED, json.dumps(True)), (TITLES_FILLED, json.dumps(True))])

    def resolve_ids(self, paper_ids: Sequence[str]) -> dict[str, str]:
        """Each of `paper_ids` that is an id merged into another paper, or an identifier of one (a DOI, exact but for
        case; an arXiv or PubMed id: `esqbe.core.workids.identifier_keys`) -> that paper's id."""
        asked = {pid: [f"id:{pid}", *identifier_keys(pid)] for pid in paper_ids}
        found = self._lookup(key for keys in asked.values() for key in keys)  # read-only: never the write lock
        return {pid: next(found[k] for k in keys if k in found) for pid, keys in asked.items()
                if any(k in found for k in keys)}
