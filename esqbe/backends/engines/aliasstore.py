"""The alias table of an Elasticsearch/OpenSearch index, with the embedded table's meaning
(esqbe.backends.embedded.aliases): each normalised identifier (`doi:...`, `arxiv:...`, `pubmed:...`,
esqbe.core.workids) and title key (`title:<folded title (year)>`) names the paper first stored with it, and
`id:<id>` names the paper a record of that id was merged into (esqbe.index.merge), so that either id, and a paper's
DOI, arXiv or PubMed id, finds the paper, and a later run's record of a stored work is merged into it (or, by title,
reported as its likely duplicate).

Where: a companion index the esqbe index owns, `<index>-esqbe-aliases` (one shard, only `paper_id` mapped, as a
keyword: a deleted paper's keys are found by it), one document per key: `_id` is the key itself, or, where its UTF-8
is over the engines' 512-byte `_id` limit (a long title, an identifier of many non-ASCII characters),
`sha256:<hex of the key>`; `_source` is {paper_id}. Identifiers and titles are written with the papers (bulk
`create`: the first paper stored with a key keeps it, the engine's 409 for a later one is no error); a merge's `id:`
key is written with bulk `index` (replaced); look-ups are `_mget`s (real time: no refresh needed); deleting papers
deletes every key naming them (`_delete_by_query` on `paper_id`, after a refresh of the companion index). When esqbe
makes the paper index, a companion index left by an earlier index of that name is emptied (its keys name papers
that are gone).

An index made before the companion index is filled by the next write (an index run's first look-up, or an upsert):
the writer reads every paper's id, title and metadata once (sorted by `paper_id`, `search_after`; where two papers
of that time share a key, the smaller id keeps it), writes their keys, then a marker document (`FILLED_ID`). Until
the marker is there, a reader (`show`, `query --paper`) finds what is written. Where the credentials cannot create
the companion index, a warning says so and the backend keeps no aliases for the rest of the process (records merge
within a run only, as before). An attached index (`esqbe attach`) keeps none (esqbe.backends.engines.attach).
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from ...core.workids import identifier_keys, title_key, work_keys
from ...domain import IndexedPaper
from ...errors import BackendError
from .client import _describe, _error_type, _reason
from .host import EngineHost
from .names import ALIAS_INDEX_SUFFIX

log = logging.getLogger("esqbe.backends")

#: the companion index: `<index>` + this
#: the engines' limit on a document `_id` (UTF-8 bytes): a longer key is stored under its SHA-256
MAX_ID_BYTES = 512
#: the marker document written once every paper stored before the companion index has its keys (no key has no `:`)
FILLED_ID = "esqbe-aliases-filled"
#: papers read per page while filling, and keys per `_mget` / ids per `_delete_by_query`
FILL_PAGE = 1000
LOOKUP_BATCH = 1000


def alias_id(key: str) -> str:
    """The document `_id` of a key: the key, or `sha256:<hex>` where its UTF-8 is over MAX_ID_BYTES."""
    raw = key.encode("utf-8")
    return key if len(raw) <= MAX_ID_BYTES else "sha256:" + hashlib.sha256(raw).hexdigest()


def paper_keys(title: Any, metadata: Any) -> list[str]:
    """The keys naming a paper as stored: its identifiers (DOI first), then its title key where it has one."""
    meta = metadata if isinstance(metadata, dict) else {}
    keys = work_keys(meta)
    key = title_key(title if isinstance(title, str) else "", meta.get("year"))
    if key is not None:
        keys.append(f"title:{key}")
    return keys


def alias_index_body() -> dict:
    """`PUT /<index>-esqbe-aliases`: one shard, `paper_id` mapped (the keys of a deleted paper), nothing else."""
    return {"settings": {"index": {"number_of_shards": 1, "auto_expand_replicas": "0-1"}},
            "mappings": {"dynamic": "false", "_meta": {"esqbe_aliases": 1},
                         "properties": {"paper_id": {"type": "keyword"}}}}


def fill_body(after: str | None, size: int = FILL_PAGE) -> dict:
    """One page of the papers' ids, titles and metadata, by id (the fill of an index made before the table)."""
    body: dict = {"size": int(size), "track_total_hits": False,
                  "_source": {"includes": ["paper_id", "title", "metadata"]},
                  "query": {"match_all": {}}, "sort": [{"paper_id": {"order": "asc"}}]}
    if after is not None:
        body["search_after"] = [after]
    return body


def forget_body(paper_ids: Sequence[str]) -> dict:
    """`_delete_by_query` on the companion index: every key naming one of these papers."""
    return {"query": {"terms": {"paper_id": list(paper_ids)}}}




class EngineAliasStoreMixin(EngineHost):
    """The alias table in the companion index (mixed into EngineBackend)."""

    keeps_aliases = True
    #: set once the marker is seen (or written) by this backend: the table answers for every paper
    _aliases_filled: bool = False
    #: `id:` keys of merges made before the paper index existed (a new index's first run): written with its first papers
    _pending_aliases: dict[str, str] | None = None

    @property
    def alias_index(self) -> str:
        return f"{self.index}{ALIAS_INDEX_SUFFIX}"

    # --- the Backend interface ------------------------------------------------------------------

    def work_aliases(self, keys: Iterable[str]) -> dict[str, str]:
        """(An index run's look-up: an index from before the table is filled first, see `_aliases_ready`.)"""
        keys = list(keys)
        if not keys or not self._aliases_ready():
            return {}
        return self._lookup(keys)

    def add_aliases(self, aliases: dict[str, str]) -> None:
        """A merge's `id:` keys, replacing what they named (kept for the first papers of a new index)."""
        if not aliases or not self.keeps_aliases:
            return
        if self._aliases_ready():
            self._write_keys(aliases, create=False)
        elif self.keeps_aliases:  # no paper index yet: written with its first papers
            self._pending_aliases = {**(self._pending_aliases or {}), **aliases}

    def resolve_ids(self, paper_ids: Sequence[str]) -> dict[str, str]:
        """Each of `paper_ids` that is an id merged into another paper, or an identifier of one (a DOI, exact but for
        case; an arXiv or PubMed id: `esqbe.core.workids.identifier_keys`) -> that paper's id. Read only: never fills."""
        if not paper_ids or not self.keeps_aliases:
            return {}
        asked = {pid: [f"id:{pid}", *identifier_keys(pid)] for pid in paper_ids}
        found = self._lookup([key for keys in asked.values() for key in keys])
        return {pid: next(found[k] for k in keys if k in found) for pid, keys in asked.items()
                if any(k in found for k in keys)}

    # --- with the papers (EngineBackend.upsert / delete) -----------------------------------------

    def _remember_keys(self, papers: Sequence[IndexedPaper]) -> None:
        """After `papers` are stored: each one's identifiers and title name it, unless they already name another."""
        if not self.keeps_aliases or not self._aliases_ready():
            return
        if self._pending_aliases:
            self._write_keys(self._pending_aliases, create=False)
            self._pending_aliases = None
        pairs: dict[str, str] = {}
        for ip in papers:
            for key in paper_keys(ip.paper.title, ip.paper.metadata):
                pairs.setdefault(key, ip.paper_id)  # two of one upsert: the first keeps it, as a run would
        self._write_keys(pairs, create=True)

    def _forget_keys(self, paper_ids: Sequence[str]) -> None:
        """After `paper_ids` are deleted: the keys naming them name no paper now (a later record is a new paper)."""
        if not paper_ids or not self.keeps_aliases:
            return
        ids = list(dict.fromkeys(paper_ids))
        try:
            self._call(self.client.indices.refresh, index=self.alias_index)  # the keys written since are found
            for start in range(0, len(ids), LOOKUP_BATCH):
                resp = self._body(self._call(self.client.delete_by_query, index=self.alias_index,
                                             body=forget_body(ids[start:start + LOOKUP_BATCH]), refresh=True,
                                             conflicts="proceed"))
                failures = resp.get("failures") if isinstance(resp, dict) else None
                if failures:
                    first = failures[0] if isinstance(failures, list) else failures
                    raise BackendError(f"{self.name}: removing the deleted papers' keys from {self.alias_index!r} "
                                       f"failed: {_reason(first.get('cause', first) if isinstance(first, dict) else first)}")
        except BackendError:
            raise
        except Exception as exc:
            if self._status(exc) == 404:  # no companion index: no key names them
                return
            raise self._error(f"removing the deleted papers' keys from {self.alias_index!r}", exc) from exc

    def _clear_aliases(self) -> None:
        """The paper index was made just now: a companion index left by an index of that name deleted before holds
        the keys of papers that are gone (and its marker): every document of it is deleted, so the new index's first
        write fills it afresh."""
        if not self.keeps_aliases:
            return
        self._aliases_filled = False
        try:
            self._call(self.client.indices.refresh, index=self.alias_index)
            self._call(self.client.delete_by_query, index=self.alias_index, body={"query": {"match_all": {}}},
                       refresh=True, conflicts="proceed")
        except Exception as exc:
            if self._status(exc) == 404:  # none left: the usual case
                return
            raise self._error(f"clearing the alias index {self.alias_index!r} left by an earlier index", exc) from exc

    # --- the table ------------------------------------------------------------------------------

    def _lookup(self, keys: Iterable[str]) -> dict[str, str]:
        """key -> paper id for the keys stored; every document of the answer checked (a malformed one names none)."""
        wanted = {alias_id(key): key for key in dict.fromkeys(keys)}
        ids = list(wanted)
        out: dict[str, str] = {}
        for start in range(0, len(ids), LOOKUP_BATCH):
            try:
                resp = self._body(self._call(self.client.mget, index=self.alias_index,
                                             body={"ids": ids[start:start + LOOKUP_BATCH]}))
            except Exception as exc:
                if self._status(exc) == 404:  # no companion index yet
                    return {}
                raise self._error(f"reading the alias index {self.alias_index!r}", exc) from exc
            docs = resp.get("docs") if isinstance(resp, dict) else None
            if not isinstance(docs, list):
                raise BackendError(f"{self.name}: the alias index {self.alias_index!r} answered an _mget without "
                                   f"`docs`: {str(resp)[:200]}")
            for doc in docs:
                if not isinstance(doc, dict):
                    continue
                if doc.get("found") is True:
                    src = doc.get("_source")
                    pid = src.get("paper_id") if isinstance(src, dict) else None
                    key = wanted.get(str(doc.get("_id")))
                    if isinstance(pid, str) and pid and key is not None:
                        out[key] = pid
                elif "error" in doc:
                    # a missing index is not a 404 here: 200 with one index_not_found_exception per id
                    if _error_type(doc["error"]) == "index_not_found_exception":
                        return {}
                    raise BackendError(f"{self.name}: reading key {doc.get('_id')} from {self.alias_index!r}: "
                                       f"{_reason(doc['error'])}")
        return out

    def _write_keys(self, pairs: dict[str, str], *, create: bool) -> None:
        """key -> paper id in one bulk: `create` keeps a key that names a paper already (409, no error)."""
        if not pairs:
            return
        op = "create" if create else "index"
        actions = [{"_op_type": op, "_index": self.alias_index, "_id": alias_id(key), "_source": {"paper_id": pid}}
                   for key, pid in pairs.items()]
        failed = [f"{aid}: {_describe(info)}" for aid, (ok, info) in self._bulk(actions).items()
                  if not ok and not (create and isinstance(info, dict) and info.get("status") == 409)]
        if failed:
            raise BackendError(f"{self.name}: writing {len(failed)} keys to {self.alias_index!r} failed: "
                               + "; ".join(failed[:5]))

    def _aliases_ready(self) -> bool:
        """Whether the table answers for every paper: the marker is there, or this writer fills the table now. False
        where the paper index does not exist yet (no key names a paper) or the companion index cannot be made (said
        once; no aliases are kept by this backend from then on)."""
        if self._aliases_filled:
            return True
        if not self.keeps_aliases or (self._mapping is None and self._get_mapping() is None):
            return False
        if self._marker():
            self._aliases_filled = True
            return True
        try:
            self._call(self.client.indices.create, index=self.alias_index, body=alias_index_body())
        except Exception as exc:
            if self._status(exc) != 400:  # 400 resource_already_exists_exception: made before (or concurrently)
                log.warning("%s: cannot create the alias index %r (%s): records of one work are merged within a run "
                            "only, and a DOI or a merged-away id does not find a paper", self.name, self.alias_index, exc)
                self.keeps_aliases = False
                return False
        self._fill()
        self._aliases_filled = True
        return True

    def _marker(self) -> bool:
        try:
            resp = self._body(self._call(self.client.get, index=self.alias_index, id=FILLED_ID))
        except Exception as exc:
            if self._status(exc) == 404:  # no marker, or no companion index yet
                return False
            raise self._error(f"reading the alias index {self.alias_index!r}", exc) from exc
        return isinstance(resp, dict) and resp.get("found") is True

    def _fill(self) -> None:
        """Every stored paper's keys (an index made before the table), page by page, then the marker."""
        after: str | None = None
        while True:
            try:
                resp = self._body(self._call(self.client.search, index=self.index, body=fill_body(after, FILL_PAGE)))
            except Exception as exc:
                raise self._error("reading the papers' identifiers (filling the alias index)", exc) from exc
            hits = (resp.get("hits") or {}).get("hits") if isinstance(resp, dict) else None
            if not isinstance(hits, list):
                raise BackendError(f"{self.name}: filling {self.alias_index!r}: a search of {self.index!r} answered "
                                   f"without hits: {str(resp)[:200]}")
            pairs: dict[str, str] = {}
            last = None
            for hit in hits:
                src = hit.get("_source") if isinstance(hit, dict) else None
                if not isinstance(src, dict):
                    continue
                pid = src.get("paper_id")
                if not isinstance(pid, str) or not pid:
                    continue
                last = pid
                for key in paper_keys(src.get("title"), src.get("metadata")):
                    pairs.setdefault(key, pid)
            self._write_keys(pairs, create=True)
            if len(hits) < FILL_PAGE:
                break
            if last is None or last == after:  # a full page that names no later paper: it would never end
                raise BackendError(f"{self.name}: filling {self.alias_index!r}: the papers of {self.index!r} cannot "
                                   "be paged by paper_id")
            after = last
        try:
            self._call(self.client.index, index=self.alias_index, id=FILLED_ID, body={"filled": True})
        except Exception as exc:
            raise self._error(f"marking {self.alias_index!r} filled", exc) from exc
