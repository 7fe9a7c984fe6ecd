"""The followed sources (`esqbe follow`) of an Elasticsearch/OpenSearch index, kept as its watches are
(esqbe.backends.engines.watchstore): a small companion index the esqbe index owns, `<index>-esqbe-follows` (one
shard, nothing mapped but the name), one document per source (id = its name) holding its spec and its state. Every
change is one write of that one document with `refresh=wait_for`: a new source with `op_type=create` (a second add
of the name is refused by the engine), a state read-modify-written with `if_seq_no`/`if_primary_term` (a concurrent
change is read again, never overwritten). A run writes a source's state only after the papers before its mark are
committed (esqbe.index.follow), so a crash leaves the old state or the new one, never half of either."""
from __future__ import annotations

from ...errors import BackendError
from .host import EngineHost
from .names import FOLLOW_INDEX_SUFFIX

#: tries of a state write that another writer's change keeps interrupting (409), before giving up
CONFLICT_TRIES = 8
#: sources one listing reads (max_follows is bounded below this)
LIST_LIMIT = 1000


def follow_index_body() -> dict:
    """`PUT /<index>-esqbe-follows`: one shard, the name mapped (sorted listing), the rest in `_source` only."""
    return {"settings": {"index": {"number_of_shards": 1, "auto_expand_replicas": "0-1"}},
            "mappings": {"dynamic": "false", "_meta": {"esqbe_follows": 1},
                         "properties": {"name": {"type": "keyword"}}}}


def follow_list_body(limit: int = LIST_LIMIT) -> dict:
    """Every source, by name."""
    return {"size": limit, "query": {"match_all": {}}, "sort": [{"name": {"order": "asc"}}], "track_total_hits": True}


def follow_count_body() -> dict:
    return {"size": 0, "query": {"match_all": {}}, "track_total_hits": True}


class EngineFollowStoreMixin(EngineHost):
    """Source documents in the companion index (mixed into EngineBackend, which supplies `client`, `index`, `_call`,
    `_body`, `_status` and `_error`)."""

    keeps_follows = True

    @property
    def follow_index(self) -> str:
        return f"{self.index}{FOLLOW_INDEX_SUFFIX}"

    def _follow_doc(self, name: str) -> tuple[dict, int, int] | None:
        try:
            resp = self._body(self._call(self.client.get, index=self.follow_index, id=name))
        except Exception as exc:
            if self._status(exc) == 404:  # no such source, or no companion index yet
                return None
            raise self._error(f"reading followed source {name}", exc) from exc
        if not resp.get("found"):
            return None
        return resp.get("_source") or {}, int(resp["_seq_no"]), int(resp["_primary_term"])

    def _search_follows(self, body: dict) -> dict | None:
        try:
            return self._body(self._call(self.client.search, index=self.follow_index, body=body))
        except Exception as exc:
            if self._status(exc) == 404:
                return None
            raise self._error("listing followed sources", exc) from exc

    @staticmethod
    def _follow_row(src: dict) -> dict:
        return {"name": src["name"], "spec": src["spec"], "state": src.get("state") or {},
                "created": float(src.get("created") or 0.0)}

    def follow_rows(self, name: str | None = None) -> list[dict]:
        """Every followed source (or the one named), by name: {"name", "spec", "state", "created"}."""
        if name is not None:
            found = self._follow_doc(name)
            return [self._follow_row(found[0])] if found else []
        body = self._search_follows(follow_list_body())
        return [self._follow_row(h["_source"]) for h in ((body or {}).get("hits") or {}).get("hits") or []]

    def follow_insert(self, row: dict, limit: int) -> str | None:
        """Store a new source in one document write; None, or why not: "exists" or "full" (`limit` sources)."""
        try:
            self._call(self.client.indices.create, index=self.follow_index, body=follow_index_body())
        except Exception as exc:
            if self._status(exc) != 400:  # 400 resource_already_exists_exception: made before (or concurrently)
                raise self._error("creating the follow index", exc) from exc
        body = self._search_follows(follow_count_body()) or {}
        total = (body.get("hits") or {}).get("total") or {}
        if int(total.get("value", 0) if isinstance(total, dict) else total) >= int(limit):
            return "full"
        doc = {"name": row["name"], "spec": row["spec"], "state": row.get("state") or {}, "created": float(row["created"])}
        try:
            self._call(self.client.index, index=self.follow_index, id=row["name"], body=doc, op_type="create",
                       refresh="wait_for")
        except Exception as exc:
            if self._status(exc) == 409:
                return "exists"
            raise self._error(f"storing followed source {row['name']}", exc) from exc
        return None

    def follow_delete(self, name: str) -> bool:
        """Forget a source (its papers stay in the index); False if there is none of that name."""
        try:
            self._call(self.client.delete, index=self.follow_index, id=name, refresh="wait_for")
        except Exception as exc:
            if self._status(exc) == 404:
                return False
            raise self._error(f"removing followed source {name}", exc) from exc
        return True

    def follow_save(self, name: str, state: dict) -> bool:
        """Replace a source's state in one conditional document write (read again if another writer changed it
        meanwhile); False if the source was removed meanwhile."""
        for _ in range(CONFLICT_TRIES):
            found = self._follow_doc(name)
            if found is None:
                return False
            doc, seq_no, term = found
            try:
                self._call(self.client.index, index=self.follow_index, id=name, body={**doc, "state": state},
                           if_seq_no=seq_no, if_primary_term=term, refresh="wait_for")
                return True
            except Exception as exc:
                if self._status(exc) != 409:
                    raise self._error(f"writing followed source {name}", exc) from exc
        raise BackendError(f"followed source {name} in {self.follow_index!r} kept changing under {CONFLICT_TRIES} "
                           "tries; run again")
