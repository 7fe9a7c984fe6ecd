"""A canned engine that also keeps esqbe's companion watch and follow indexes the way an engine keeps documents
(sequence numbers, `op_type=create`, optimistic concurrency), for the watch and follow tests."""
from __future__ import annotations

import json
from collections import defaultdict

from .engines import INDEX, CannedEngine, make_backend


class WatchingEngine(CannedEngine):
    """A CannedEngine that also keeps the companion watch index (`<index>-esqbe-watches`) the way an engine keeps
    documents: each write gets the next `_seq_no` (primary term 1); `op_type=create` on an existing id and
    `if_seq_no`/`if_primary_term` that do not match the stored document answer 409 `version_conflict_engine_exception`
    as the engines do; PUT `_mapping` adds fields; searches of the paper index by the `indexed_at` range (sorted)
    and its max aggregation are answered from the stored documents. `before_write[name]` runs a callable just before
    a watch document write is applied (another writer's change slipped in between a read and a write),
    `after_write[name]` just after it is applied and before it is answered."""

    def __init__(self, engine: str, version: str):
        super().__init__(engine, version)
        self.watch_docs: dict[str, tuple[dict, int]] = {}  # id -> (source, seq_no)
        self.watch_definition: dict | None = None
        self.follow_docs: dict[str, tuple[dict, int]] = {}  # `<index>-esqbe-follows`, kept the same way
        self.follow_definition: dict | None = None
        self.seq_no = 0
        self.before_write: dict[str, list] = defaultdict(list)
        self.after_write: dict[str, list] = defaultdict(list)

    @staticmethod
    def _is_watch(segs) -> bool:
        return bool(segs) and segs[0].endswith(("-esqbe-watches", "-esqbe-follows"))

    @staticmethod
    def _kind(segs) -> str:
        return "follow" if segs[0].endswith("-esqbe-follows") else "watch"

    def _docs(self, segs) -> dict[str, tuple[dict, int]]:
        return self.follow_docs if self._kind(segs) == "follow" else self.watch_docs

    def _definition(self, segs) -> dict | None:
        return self.follow_definition if self._kind(segs) == "follow" else self.watch_definition

    def _conflict(self, reason: str):
        return 409, {"error": {"root_cause": [{"type": "version_conflict_engine_exception", "reason": reason}],
                               "type": "version_conflict_engine_exception", "reason": reason}, "status": 409}

    def _missing(self, name: str):
        return 404, {"error": {"type": "index_not_found_exception", "reason": f"no such index [{name}]"}, "status": 404}

    def _index(self, method, segs, record):
        if not self._is_watch(segs):
            return super()._index(method, segs, record)
        if method == "PUT":
            if self._definition(segs) is not None:
                reason = f"index [{segs[0]}/canned] already exists"
                return 400, {"error": {"type": "resource_already_exists_exception", "reason": reason}, "status": 400}
            setattr(self, f"{self._kind(segs)}_definition", record["lines"][0])
            return 200, {"acknowledged": True, "shards_acknowledged": True, "index": segs[0]}
        return 405, {"error": "unexpected"}

    def _mapping(self, method, segs, record):
        if method == "PUT" and not self._is_watch(segs):
            if self.mapping is None:
                return self._missing(segs[0])
            body = record["lines"][0]
            self.mapping.setdefault("properties", {}).update(body.get("properties") or {})  # fields are added
            if "_meta" in body:  # replaced as a whole
                self.mapping["_meta"] = body["_meta"]
            return 200, {"acknowledged": True}
        return super()._mapping(method, segs, record)

    def _doc(self, method, segs, record):
        if not self._is_watch(segs):
            return super()._doc(method, segs, record)
        if self._definition(segs) is None:
            return self._missing(segs[0])
        docs = self._docs(segs)
        name, params = segs[2], record["params"]
        stored = docs.get(name)
        if method == "GET":
            if stored is None:
                return 404, {"_index": segs[0], "_id": name, "found": False}
            return 200, {"_index": segs[0], "_id": name, "_version": stored[1] + 1, "_seq_no": stored[1],
                         "_primary_term": 1, "found": True, "_source": json.loads(json.dumps(stored[0]))}
        for hook in self.before_write.pop(name, []):
            hook()
            stored = docs.get(name)
        if method == "DELETE":
            if stored is None:
                return 404, {"_index": segs[0], "_id": name, "result": "not_found"}
            del docs[name]
            return 200, {"_index": segs[0], "_id": name, "result": "deleted"}
        if params.get("op_type") == "create" and stored is not None:
            return self._conflict(f"[{name}]: version conflict, document already exists (current version [1])")
        if "if_seq_no" in params:
            if stored is None or (int(params["if_seq_no"]), int(params["if_primary_term"])) != (stored[1], 1):
                return self._conflict(f"[{name}]: version conflict, required seqNo [{params['if_seq_no']}], primary "
                                      f"term [{params['if_primary_term']}]")
        self.seq_no += 1
        docs[name] = (record["lines"][0], self.seq_no)
        for hook in self.after_write.pop(name, []):  # applied, not yet answered (a client may die meanwhile)
            hook()
        return (201 if stored is None else 200), {"_index": segs[0], "_id": name, "_seq_no": self.seq_no,
                                                  "_primary_term": 1, "result": "created" if stored is None else "updated"}

    def _search(self, method, segs, record):
        body = record["lines"][0] if record["lines"] else {}
        if self._is_watch(segs):
            if self._definition(segs) is None:
                return self._missing(segs[0])
            docs = sorted(self._docs(segs).items())
            excludes = set(((body.get("_source") or {}).get("excludes")) or [])
            hits = [{"_index": segs[0], "_id": n, "_source": {k: v for k, v in src.items() if k not in excludes}}
                    for n, (src, _) in docs]
            return 200, {"hits": {"total": {"value": len(docs), "relation": "eq"}, "hits": hits[: body.get("size", 10)]}}
        stamped = {pid: src for pid, src in self.sources.items() if "indexed_at" in src}
        if "last" in (body.get("aggs") or {}):
            value = max((src["indexed_at"] for src in stamped.values()), default=None)
            return 200, {"hits": {"hits": []}, "aggregations": {"last": {"value": value}}}
        bounds = ((body.get("query") or {}).get("range") or {}).get("indexed_at")
        if bounds is not None:
            rows = sorted((src["indexed_at"], pid) for pid, src in stamped.items()
                          if bounds["gte"] <= src["indexed_at"] < bounds["lt"])
            includes = body["_source"]["includes"]
            hits = [{"_index": INDEX, "_id": pid, "_source": {k: stamped[pid][k] for k in includes if k in stamped[pid]},
                     "sort": [stamp]} for stamp, pid in rows[: body["size"]]]
            return 200, {"hits": {"hits": hits}}
        return super()._search(method, segs, record)


def make_watching_backend(engine: str, version: str, aliases: bool = False):
    """`make_backend` over a WatchingEngine."""
    return make_backend(engine, version, aliases, canned=WatchingEngine(engine, version))
