"""Followed sources: where new papers come from by themselves (`esqbe follow add/list/remove`; the runs:
esqbe.index.follow_run).

A source is a name and a SPEC, one of
- `arxiv:CATEGORY` (`arxiv:cs.CL`): arXiv's OAI-PMH, the set that holds the category, records filtered by their
  categories (esqbe.ingest.arxiv);
- `openalex:FILTER` (`openalex:concepts.id:C41008148,type:article`): OpenAlex's works API (esqbe.ingest.openalex);
- `zotero:PATH` (`zotero:~/Zotero/zotero.sqlite`): the items of a Zotero library added or changed since the last
  run, read as `esqbe index zotero.sqlite` reads them (esqbe.ingest.zotero);
- `dir:PATH`: the files added to or changed in a folder (esqbe.ingest.folder);
with, optionally, the day its first run starts from (`since`) and another base URL for a service (a mirror).

The index keeps each source beside its watches (the embedded index's SQLite; an engine index's companion index
`<index>-esqbe-follows`): the spec, and the state a run writes only once the papers before it are committed: the mark
it goes on from, and the last run's counts and error.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from ..errors import ParameterError, UserError

#: the kinds of source, in the order the help names them
KINDS = ("arxiv", "openalex", "zotero", "dir")
#: a source's name: as a watch's (letters, digits, `_`, `-`), at most this long
MAX_NAME_CHARS = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
MAX_SPEC_CHARS = 4096


class FollowError(UserError, ValueError):
    """A followed source cannot be added or used as asked."""


class FollowNameError(ParameterError):
    """A source name outside the safe set (letters, digits, `_`, `-`; bounded length)."""


class FollowSpecError(ParameterError):
    """A source SPEC that is not `arxiv:CATEGORY`, `openalex:FILTER`, `zotero:PATH` or `dir:PATH` as each must be."""


class FollowNotFoundError(FollowError):
    """No followed source of that name in this index."""

    http_status: ClassVar[int] = 404


class FollowExistsError(FollowError):
    """A source of that name is followed already."""

    http_status: ClassVar[int] = 409


class FollowLimitError(FollowError):
    """The index follows `max_follows` sources already."""

    http_status: ClassVar[int] = 409


class FollowsUnsupportedError(FollowError):
    """This index keeps no followed sources (its backend has no place for them)."""

    http_status: ClassVar[int] = 501


def check_name(name: str) -> str:
    """`name` if it is a valid source name, else FollowNameError saying why."""
    if not isinstance(name, str) or not name:
        raise FollowNameError("a followed source needs a name")
    if len(name) > MAX_NAME_CHARS:
        raise FollowNameError(f"source name has {len(name)} characters; at most {MAX_NAME_CHARS}")
    if not _NAME.fullmatch(name):
        bad = next((c for c in name if not (c.isascii() and (c.isalnum() or c in "_-"))), name[0])
        raise FollowNameError(f"source name {ascii(name)}: {ascii(bad)} is not allowed; use letters, digits, '_' and "
                              "'-', starting with a letter or digit")
    return name


def check_day(value: str | None, what: str = "--since") -> str | None:
    """A day as YYYY-MM-DD (the day granularity OAI-PMH and OpenAlex take), or None; FollowSpecError otherwise."""
    if value is None:
        return None
    try:
        return date.fromisoformat(str(value).strip()).isoformat()
    except ValueError:
        raise FollowSpecError(f"{what}: {str(value)[:40]!r} is not a day (YYYY-MM-DD)") from None


def check_url(value: str | None) -> str | None:
    """A service's base URL (`--source-url`, a mirror's or a test's), http(s) without credentials, or None."""
    if value is None:
        return None
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc or parts.fragment \
            or any(c.isspace() or ord(c) < 32 for c in value.strip()):
        raise FollowSpecError("--source-url: http(s)://HOST[:PORT][/PATH], without credentials, spaces or a fragment")
    return value.strip()


def parse_spec(spec: str) -> tuple[str, str]:
    """(kind, target) of a SPEC, checked as far as can be without asking a service: the category, the filter's
    syntax; a Zotero database or a folder that exists (its path made absolute)."""
    if not isinstance(spec, str) or not spec.strip():
        raise FollowSpecError("a SPEC is needed: arxiv:CATEGORY, openalex:FILTER, zotero:PATH or dir:PATH")
    if len(spec) > MAX_SPEC_CHARS:
        raise FollowSpecError(f"the SPEC has {len(spec)} characters; at most {MAX_SPEC_CHARS}")
    kind, sep, target = spec.strip().partition(":")
    if not sep or kind not in KINDS:
        raise FollowSpecError(f"{spec[:80]!r}: a SPEC is arxiv:CATEGORY, openalex:FILTER, zotero:PATH or dir:PATH")
    try:
        if kind == "arxiv":
            from ..ingest.arxiv import set_spec

            set_spec(target)
            return kind, target
        if kind == "openalex":
            from ..ingest.openalex import check_filter

            return kind, check_filter(target)
    except ValueError as e:
        raise FollowSpecError(f"{spec[:80]!r}: {e}") from None
    path = Path(target).expanduser()
    if kind == "zotero":
        from ..ingest.zotero import is_database

        if not is_database(path):
            raise FollowSpecError(f"{spec[:200]!r}: no Zotero database there (an SQLite file, e.g. "
                                  "~/Zotero/zotero.sqlite)")
    elif not path.is_dir():
        raise FollowSpecError(f"{spec[:200]!r}: no folder there")
    return kind, str(path.resolve())


@dataclass
class Source:
    """A followed source as the index keeps it."""

    name: str
    kind: str
    target: str
    #: another base URL for the service (a mirror's), or None: the service's own
    url: str | None
    #: the day its first run starts from, or None (follow_first_days back; a library or folder whole)
    since: str | None
    created: float
    #: where a run goes on (`mark`, a harvest's `run`, a folder's `files`) and the last run's outcome (`last`)
    state: dict = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.target}"

    @property
    def last(self) -> dict | None:
        return self.state.get("last")

    def to_dict(self) -> dict:
        """As `esqbe follow list --json` and GET /stats show it: no folder's file list (its counts only)."""
        state = {k: v for k, v in self.state.items() if k != "files"}
        if "files" in self.state:
            state["files"] = len(self.state["files"])
        return {"name": self.name, "spec": self.spec, "kind": self.kind, "target": self.target, "url": self.url,
                "since": self.since, "created": self.created, "mark": self.state.get("mark"),
                "running": bool(self.state.get("run")), "last": self.last, "state": state}


def _store(index):
    """The backend's store of followed sources, or FollowsUnsupportedError."""
    backend = index.backend
    if not getattr(backend, "keeps_follows", False):
        raise FollowsUnsupportedError(f"followed sources are not kept on the {index.settings.backend} backend")
    return backend


def _source(row: dict) -> Source:
    spec = row["spec"]
    return Source(row["name"], spec["kind"], spec["target"], spec.get("url"), spec.get("since"), row["created"],
                  dict(row.get("state") or {}))


def list_sources(index) -> list[Source]:
    """The index's followed sources, by name."""
    return [_source(r) for r in _store(index).follow_rows()]


def get_source(index, name: str) -> Source:
    rows = _store(index).follow_rows(check_name(name))
    if not rows:
        raise FollowNotFoundError(f"no followed source named {name} in this index (`esqbe follow list` lists them)")
    return _source(rows[0])


def add_source(index, name: str, spec: str, *, url: str | None = None, since: str | None = None,
               now: float | None = None) -> Source:
    """Follow `spec` as source `name` (checked: esqbe.index.follow.parse_spec), from `since` (a day) at its first run,
    at `url` instead of the service's own address. Written in one transaction; refused past `max_follows`."""
    check_name(name)
    kind, target = parse_spec(spec)
    url = check_url(url)
    if url is not None and kind in ("zotero", "dir"):
        raise FollowSpecError(f"--source-url is a service's address; a {kind} source reads its file or folder")
    row = {"name": name, "spec": {"kind": kind, "target": target, "url": url, "since": check_day(since)},
           "state": {}, "created": time.time() if now is None else float(now)}
    reason = _store(index).follow_insert(row, int(index.settings.max_follows))
    if reason == "exists":
        raise FollowExistsError(f"a source named {name} is followed already (`esqbe follow remove {name}` first)")
    if reason == "full":
        raise FollowLimitError(f"the index follows {index.settings.max_follows} sources, its limit (the max_follows "
                               "setting, ESQBE_MAX_FOLLOWS); remove one first")
    return get_source(index, name)


def remove_source(index, name: str) -> None:
    """Stop following `name` (the papers it brought stay in the index)."""
    if not _store(index).follow_delete(check_name(name)):
        raise FollowNotFoundError(f"no followed source named {name} in this index (`esqbe follow list` lists them)")
