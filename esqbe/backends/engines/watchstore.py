"""The saved queries (watches) of an Elasticsearch/OpenSearch index, behind the interface the embedded index's
SQLite tables have (esqbe.backends.embedded.watchstore; esqbe.index.watches says what the rows mean).

Where: a small companion index the esqbe index owns, `<index>-esqbe-watches` (one shard, nothing mapped but the name:
the rest is kept in `_source` only), one document per watch (id = its name) holding everything about it: the query
with its own copy of the sentences and vectors, the model identity, the mark, the feed secret, the newest matches
whole (KEPT_MATCHES) and the id of every paper it reported. Every change is one write of that one document with
`refresh=wait_for`: a new watch with `op_type=create` (a second add of the name is refused by the engine), every
later change read-modify-written with `if_seq_no`/`if_primary_term` (optimistic concurrency: a concurrent change is
read again, never overwritten). A crash leaves the old document or the new one, never half of either.

What is new: every paper document esqbe writes carries `indexed_at`, a stamp (microseconds) that only grows within a
writer (one more than the last one when the clock has not moved on); a re-indexed paper that changed gets a new one,
an unchanged one keeps its own. A watch's mark is one past the highest stamp visible when it was made or last ran;
the papers since it are a range query on the stamp, so a run's cost grows with the new papers, not with the index.
Engines have no index-wide write lock (`begin_write` takes none): a paper a writer on another machine stamps with a
clock behind the mark is not seen as new. Indexes made before this field get it added to their mapping on the next
write (`ensure`); an attached index (`esqbe attach`) keeps no watches: its documents carry no stamp.
"""
from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from typing import Any

from ...errors import BackendError
from .host import EngineHost
from .names import WATCH_INDEX_SUFFIX

log = logging.getLogger("esqbe.backends")

#: the companion index: `<index>` + this
#: the paper field stamping when esqbe wrote it (a `long`, microseconds; only grows within a writer)
STAMP_FIELD = "indexed_at"
STAMP_MAPPING = {"type": "long"}
#: hits a watch document keeps whole (the newest); the ids of all it reported are kept, so none is reported twice
KEPT_MATCHES = 1000
#: tries of a read-modify-write that another writer's change keeps interrupting (409), before giving up
CONFLICT_TRIES = 8
#: papers of one stamp read at once where a whole slice shares it (the engines' default max_result_window)
MAX_ONE_STAMP = 10_000
#: watches one listing reads (max_watches is bounded below this)
LIST_LIMIT = 10_000


def watch_index_body() -> dict:
    """`PUT /<index>-esqbe-watches`: one shard, the name mapped (sorted listing), the rest in `_source` only."""
    return {"settings": {"index": {"number_of_shards": 1, "auto_expand_replicas": "0-1"}},
            "mappings": {"dynamic": "false", "_meta": {"esqbe_watches": 1},
                         "properties": {"name": {"type": "keyword"}}}}


def watch_list_body(limit: int = LIST_LIMIT) -> dict:
    """Every watch, by name, without what it found (the listing stays small)."""
    return {"size": limit, "query": {"match_all": {}}, "sort": [{"name": {"order": "asc"}}],
            "_source": {"excludes": ["matches", "reported"]}, "track_total_hits": True}


def watch_count_body() -> dict:
    return {"size": 0, "query": {"match_all": {}}, "track_total_hits": True}


def papers_since_body(mark: int, end: int, limit: int) -> dict:
    """The first `limit` papers stamped in [mark, end), in stamp order: ids, stamps and metadata."""
    return {"size": int(limit), "track_total_hits": False,
            "_source": {"includes": ["paper_id", "metadata", STAMP_FIELD]},
            "query": {"range": {STAMP_FIELD: {"gte": int(mark), "lt": int(end)}}},
            "sort": [{STAMP_FIELD: {"order": "asc"}}]}


def last_stamp_body() -> dict:
    """The highest stamp in the index (the next mark is one past it)."""
    return {"size": 0, "track_total_hits": False, "aggs": {"last": {"max": {"field": STAMP_FIELD}}}}


def watch_document(row: dict) -> dict:
    """A new watch's document (esqbe.index.watches' row: name, spec, vectors bytes, mark, created, feed_key)."""
    return {"name": row["name"], "spec": row["spec"], "vectors_b64": base64.b64encode(row["vectors"]).decode("ascii"),
            "mark": int(row["mark"]), "created": float(row["created"]), "last_run": None, "feed_key": row["feed_key"],
            "found": 0, "matches": [], "reported": []}


def recorded(doc: dict, mark: int, when: float, matches: list[tuple[str, Any]]) -> dict:
    """`doc` after a run that found `matches` ((paper id, hit) each, at `when`) and moved the mark to `mark`: a paper
    it reported already is not added again; the newest KEPT_MATCHES hits are kept whole."""
    reported = list(doc.get("reported") or [])
    seen = set(reported)
    fresh = [(pid, hit) for pid, hit in matches if pid not in seen and not seen.add(pid)]  # type: ignore[func-returns-value]
    kept = list(doc.get("matches") or []) + [{"paper_id": pid, "found": float(when), "hit": hit} for pid, hit in fresh]
    return {**doc, "mark": max(int(mark), int(doc.get("mark") or 0)), "last_run": float(when),
            "found": int(doc.get("found") or 0) + len(fresh), "matches": kept[-KEPT_MATCHES:],
            "reported": reported + [pid for pid, _ in fresh]}




class EngineWatchStoreMixin(EngineHost):
    """Watch documents in the companion index (mixed into EngineBackend, which supplies `client`, `index`, `_call`,
    `_body`, `_status`, `_error` and `_index_mapping`)."""

    keeps_watches = True
    _last_stamp: int = 0

    @property
    def watch_index(self) -> str:
        return f"{self.index}{WATCH_INDEX_SUFFIX}"

    # --- the stamp on paper documents -------------------------------------------------------------

    def _stamps(self) -> bool:
        """Whether the paper index maps the stamp (documents may carry it)."""
        return STAMP_FIELD in (self._index_mapping().get("properties") or {})

    def _next_stamp(self) -> int:
        """A stamp past every one this writer gave: the clock in microseconds, or one more than the last."""
        self._last_stamp = max(time.time_ns() // 1000, self._last_stamp + 1)
        return self._last_stamp

    def _add_stamp_field(self) -> None:
        """Map the stamp on an index made before it (adding a field is allowed on a strict mapping); where the
        credentials cannot, say so and go on: papers are written without it, and watches are refused."""
        if self._stamps():
            return
        try:
            self._call(self.client.indices.put_mapping, index=self.index, body={"properties": {STAMP_FIELD: STAMP_MAPPING}})
        except Exception as exc:  # a key without `manage` on the index: writes go on without the stamp
            log.warning("%s: cannot add the %s field to index %r (%s): watches will not see its new papers",
                        self.name, STAMP_FIELD, self.index, exc)
            return
        if self._mapping is not None:
            self._mapping.setdefault("properties", {})[STAMP_FIELD] = dict(STAMP_MAPPING)

    def watches_unsupported(self) -> str | None:
        """Why this index cannot keep watches now, or None."""
        if self._stamps():
            return None
        return (f"index {self.index!r} has no {STAMP_FIELD} field (made by an older esqbe, or the credentials could not "
                "add it): the next `esqbe index` into it adds it, then watches see the papers indexed after it")

    # --- reading ---------------------------------------------------------------------------------

    def _watch_doc(self, name: str) -> tuple[dict, int, int] | None:
        """A watch's document with its `_seq_no` and `_primary_term`, or None."""
        try:
            resp = self._body(self._call(self.client.get, index=self.watch_index, id=name))
        except Exception as exc:
            if self._status(exc) == 404:  # no such watch, or no companion index yet
                return None
            raise self._error(f"reading watch {name}", exc) from exc
        if not resp.get("found"):
            return None
        return resp.get("_source") or {}, int(resp["_seq_no"]), int(resp["_primary_term"])

    def _search_watches(self, body: dict) -> dict | None:
        try:
            return self._body(self._call(self.client.search, index=self.watch_index, body=body))
        except Exception as exc:
            if self._status(exc) == 404:
                return None
            raise self._error("listing watches", exc) from exc

    @staticmethod
    def _row(src: dict) -> dict:
        return {"name": src["name"], "spec": src["spec"], "vectors": base64.b64decode(src.get("vectors_b64") or ""),
                "mark": int(src["mark"]), "created": src["created"], "last_run": src.get("last_run"),
                "feed_key": src["feed_key"], "found": int(src.get("found") or 0)}

    def watch_rows(self, name: str | None = None) -> list[dict]:
        """Every watch (or the one named), by name: its stored fields and how many papers it has found."""
        if name is not None:
            found = self._watch_doc(name)
            return [self._row(found[0])] if found else []
        body = self._search_watches(watch_list_body())
        hits = ((body or {}).get("hits") or {}).get("hits") or []
        return [self._row(h["_source"]) for h in hits]

    def watch_matches(self, name: str, limit: int) -> list[tuple[str, float, dict]]:
        """What a watch found, newest first (one run's in rank order), at most `limit`."""
        found = self._watch_doc(name)
        kept = list(enumerate((found[0].get("matches") or []) if found else []))
        kept.sort(key=lambda x: (-float(x[1]["found"]), x[0]))
        return [(m["paper_id"], float(m["found"]), m["hit"]) for _, m in kept[: int(limit)]]

    def watch_reported(self, name: str, paper_ids: list[str]) -> set[str]:
        found = self._watch_doc(name)
        return set(paper_ids) & set((found[0].get("reported") or []) if found else [])

    def next_paper_number(self) -> int:
        """One past the highest stamp visible now: a mark that every paper written later is at or past."""
        try:
            body = self._body(self._call(self.client.search, index=self.index, body=last_stamp_body()))
        except Exception as exc:
            raise self._error("reading the last stamp", exc) from exc
        value = (((body or {}).get("aggregations") or {}).get("last") or {}).get("value")
        return int(value) + 1 if value is not None else 0

    def papers_since(self, mark: int, end: int, limit: int) -> list[tuple[int, str, dict]]:
        """The first `limit` papers stamped in [mark, end), in stamp order: (stamp, id, metadata). Two writers may
        give one stamp: a slice never ends inside one (the last stamp's papers wait for the next slice, which starts
        at it; a slice of one stamp only holds all of its papers, up to MAX_ONE_STAMP), so none is skipped."""
        out = self._stamped(mark, end, limit)
        if len(out) == int(limit) and out[0][0] != out[-1][0]:
            out = [row for row in out if row[0] != out[-1][0]]
        elif len(out) == int(limit):
            out = self._stamped(out[0][0], out[0][0] + 1, max(int(limit), MAX_ONE_STAMP))
        return out

    def _stamped(self, mark: int, end: int, limit: int) -> list[tuple[int, str, dict]]:
        try:
            body = self._body(self._call(self.client.search, index=self.index, body=papers_since_body(mark, end, limit)))
        except Exception as exc:
            raise self._error("reading the papers indexed since a watch's mark", exc) from exc
        out = []
        for h in (body.get("hits") or {}).get("hits") or []:
            src = h.get("_source") or {}
            out.append((int(src[STAMP_FIELD]), str(src.get("paper_id") or h["_id"]), dict(src.get("metadata") or {})))
        return out

    # --- writing: one document write each ----------------------------------------------------------

    def begin_write(self, timeout: float | None = None) -> None:
        """Engines have no index-wide write lock: each watch document is changed with optimistic concurrency."""

    def _ensure_watch_index(self) -> None:
        try:
            self._call(self.client.indices.create, index=self.watch_index, body=watch_index_body())
        except Exception as exc:
            if self._status(exc) != 400:  # 400 resource_already_exists_exception: made before (or concurrently)
                raise self._error("creating the watch index", exc) from exc

    def watch_insert(self, row: dict, limit: int) -> str | None:
        """Store a new watch in one document write; None, or why not: "exists" or "full" (`limit` watches)."""
        self._ensure_watch_index()
        body = self._search_watches(watch_count_body()) or {}
        total = (body.get("hits") or {}).get("total") or {}
        if int(total.get("value", 0) if isinstance(total, dict) else total) >= int(limit):
            return "full"
        try:
            self._call(self.client.index, index=self.watch_index, id=row["name"], body=watch_document(row),
                       op_type="create", refresh="wait_for")
        except Exception as exc:
            if self._status(exc) == 409:
                return "exists"
            raise self._error(f"storing watch {row['name']}", exc) from exc
        return None

    def _change(self, name: str, change: Callable[[dict], dict]) -> bool:
        """Read watch `name`, write `change(document)` only if nobody wrote it meanwhile (read again and retried
        if someone did); False if there is no such watch."""
        for _ in range(CONFLICT_TRIES):
            found = self._watch_doc(name)
            if found is None:
                return False
            doc, seq_no, term = found
            try:
                self._call(self.client.index, index=self.watch_index, id=name, body=change(doc), if_seq_no=seq_no,
                           if_primary_term=term, refresh="wait_for")
                return True
            except Exception as exc:
                if self._status(exc) != 409:  # version conflict: changed meanwhile; read it again
                    raise self._error(f"writing watch {name}", exc) from exc
        raise BackendError(f"watch {name} in {self.watch_index!r} kept changing under {CONFLICT_TRIES} tries; run again")

    def watch_delete(self, name: str) -> bool:
        """Remove a watch and what it found (one document); False if there is none of that name."""
        try:
            self._call(self.client.delete, index=self.watch_index, id=name, refresh="wait_for")
        except Exception as exc:
            if self._status(exc) == 404:
                return False
            raise self._error(f"removing watch {name}", exc) from exc
        return True

    def watch_set_key(self, name: str, key: str) -> bool:
        return self._change(name, lambda doc: {**doc, "feed_key": key})

    def watch_record(self, name: str, mark: int, when: float, matches: list[tuple[str, str]]) -> bool:
        """What one run found ((paper id, hit JSON) each) and the new mark, in one document write: after a crash
        the watch has both or neither. False if the watch was removed meanwhile."""
        import json

        parsed = [(pid, json.loads(hit)) for pid, hit in matches]
        return self._change(name, lambda doc: recorded(doc, mark, when, parsed))
