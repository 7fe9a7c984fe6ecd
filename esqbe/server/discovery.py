"""Discovery records: a running `esqbe serve` says where it answers, so that `esqbe query` on the same index can
use its warm model instead of loading one (10-13 s for a `--text` query).

A record is one small JSON file (0600), written atomically once the server listens and removed when it shuts down:

    {"version": 2, "url": "http://127.0.0.1:8000", "pid": 4242, "index_id": "...", "index": "/abs/esqbe-index",
     "settings": {"rescorer": "<digest>", ...}, "started": 1764000000.0, "secret": "<64 hex digits>"}

It lives where the index's owner controls it: inside the index directory (`servers/`) for the embedded backend,
in the user's cache directory (`$XDG_CACHE_HOME/esqbe/servers/<url+index digest>/`) for an engine index.
A record is a file another local user could have written, so a reader trusts one only when it is a regular file
of its own user that no one else may write, in a directory of the same kind, names a loopback `http` URL, a live
process and this index's `index_id`; the server's answer must then carry the same id (the `X-Esqbe-Index`
header). A record of a dead process or of a copied index directory is removed; one of another user, or that
cannot be read, is left alone and ignored.

A live pid proves nothing about who listens at the URL: once a server died (killed, its record left), any local
user may bind its port, and pids are recycled. So the server proves it wrote the record before a query is sent to
it: the record holds a random `secret` only its user can read (and the server keeps in memory); the client sends a
fresh random nonce (`GET /proof?nonce=...`) and the server answers `proof(secret, nonce, index_id)`, an HMAC-SHA256
the client checks, and the query then goes over that same connection (esqbe.server.client). A listener that
cannot prove it gets no query, and its record is removed.

`settings` holds a digest of each setting that changes a query's answer, so that a command line with other
settings (a config file, environment variables) does not get the server's answer for its own."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..settings.config import Settings
from ..settings.table import SETTINGS

RECORD_VERSION = 2  # 2: with the secret a server proves itself by (a record of version 1 is not trusted)
#: the response header that names the index a server answered from
INDEX_HEADER = "X-Esqbe-Index"
#: the endpoint a server answers a nonce at, with its proof
PROOF_PATH = "/proof"
#: a record's secret and a client's nonce: 32 random bytes, as hex
_HEX64 = re.compile(r"[0-9a-f]{64}")
NONCE_PATTERN = "^[0-9a-f]{64}$"
#: the embedded index's subdirectory of records
RECORD_DIR = "servers"
#: settings that do not change what a query answers (or say where the index is: `index_id` covers those)
_NOT_COMPARED = frozenset({"backend", "path", "url", "index", "api_key", "username", "password", "ca_certs",
                           "verify_certs", "batch_size", "commit_every", "facets", "knn_recall_target"})
#: settings a query carries over HTTP: a client sends its own values of every one of them (esqbe.server.client),
#: so a server with other values (a config's `k: 5`) answers it as a local run would; `facet_settings` only ever
#: holds those (esqbe.query.search.FACET_SETTING_KEYS) and is applied by the client, as `default_facet` is
CARRIED = frozenset({s.name for s in SETTINGS if s.http} | {"facet_settings", "default_facet"})
#: the settings a record carries digests of (everything that changes a query's answer)
COMPARED_SETTINGS = tuple(s.name for s in SETTINGS if s.name not in _NOT_COMPARED | CARRIED)


def _digest(text: str, n: int = 32) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def _engine_where(settings: Settings) -> str:
    """An engine index as `url/index`, without the credentials a URL may carry."""
    parts = urlsplit((settings.url or "").rstrip("/"))
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return f"{urlunsplit((parts.scheme, netloc, parts.path, '', ''))}/{settings.index}"


def index_where(settings: Settings) -> str:
    """Where the index lives, for people: the embedded directory (absolute) or the engine's url/index."""
    if settings.backend == "embedded":
        return str(Path(settings.path).resolve())
    return _engine_where(settings)


def index_id(settings: Settings) -> str | None:
    """The index's identity, known without opening it: the backend and where it lives, and for an embedded index
    its directory's device and inode (a copy, or a new index made where an old one was, is another index).
    None where there is no embedded index at the path."""
    if settings.backend == "embedded":
        path = Path(settings.path).resolve()
        try:
            (path / "papers.sqlite").stat()
            st = path.stat()
        except OSError:
            return None
        return _digest(f"embedded\0{path}\0{st.st_dev}\0{st.st_ino}")
    return _digest(f"{settings.backend}\0{_engine_where(settings)}")


def settings_digests(settings: Settings) -> dict[str, str]:
    """A digest of each setting that changes a query's answer (values are not written: a record holds no setting)."""
    return {name: _digest(json.dumps(getattr(settings, name), sort_keys=True, default=str), 16)
            for name in COMPARED_SETTINGS}


def record_dir(settings: Settings) -> Path:
    """Where the records of servers on this index are."""
    if settings.backend == "embedded":
        return Path(settings.path).resolve() / RECORD_DIR
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "esqbe" / "servers" / _digest(f"{settings.backend}\0{_engine_where(settings)}", 16)


def loopback_url(host: str, port: int) -> str | None:
    """The URL this machine reaches a server listening on `host` by, or None when it listens elsewhere only."""
    h = host.strip().strip("[]").lower()
    if h in ("0.0.0.0", "127.0.0.1", "localhost") or h.startswith("127."):
        return f"http://127.0.0.1:{port}" if h in ("0.0.0.0", "localhost") else f"http://{h}:{port}"
    if h in ("::", "::1"):
        return f"http://[::1]:{port}"
    return None


def is_loopback_url(url: str) -> bool:
    import ipaddress

    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------------------ the proof
def new_secret() -> str:
    """A server's secret for its record: 32 random bytes, as hex."""
    return secrets.token_hex(32)


def new_nonce() -> str:
    """A client's challenge: 32 random bytes, as hex (a fresh one for every server asked)."""
    return secrets.token_hex(32)


def proof(secret: str, nonce: str, ident: str) -> str:
    """What the server that holds `secret` answers to `nonce` for the index `ident`: HMAC-SHA256, as hex."""
    message = f"esqbe discovery proof\0{ident}\0{nonce}".encode()
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).hexdigest()


def proof_holds(secret: str, nonce: str, ident: str, answered: object) -> bool:
    """Whether `answered` is the proof for `nonce` (compared in constant time)."""
    return (isinstance(answered, str) and _HEX64.fullmatch(answered) is not None
            and hmac.compare_digest(proof(secret, nonce, ident), answered))


# ---------------------------------------------------------------------------------------------------- the server
def write_record(settings: Settings, url: str, secret: str) -> Path:
    """Write this process's record with the `secret` it proves itself by (atomically: a private temporary file
    renamed into place); its path."""
    ident = index_id(settings)
    if ident is None:
        raise OSError(f"no index at {index_where(settings)}")
    folder = record_dir(settings)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    parts = urlsplit(url)
    path = folder / f"{(parts.hostname or 'host').replace(':', '_')}_{parts.port}.json"
    body = {"version": RECORD_VERSION, "url": url, "pid": os.getpid(), "index_id": ident,
            "index": index_where(settings), "settings": settings_digests(settings), "started": time.time(),
            "secret": secret}
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def remove_record(path: Path) -> None:
    """Remove this process's record (only if it is still this process's), and the directory when it is empty."""
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass
    try:
        path.parent.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------- the client
@dataclass(frozen=True)
class Server:
    """A server found for an index: where it answers, its process, the index id it must answer with and the
    secret it must prove it holds."""

    url: str
    pid: int
    index_id: str
    record: Path
    secret: str = field(default="", repr=False)


def _private(st: os.stat_result, kind) -> bool:
    """A file or directory of this user that no one else may write."""
    return kind(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user: alive
        return True
    return True


def find_servers(settings: Settings) -> tuple[list[Server], list[str]]:
    """The servers whose records are trusted for this index, and why other servers on it are not used (lines for
    the user: a server with other settings). Stale records of this user are removed."""
    ident = index_id(settings)
    folder = record_dir(settings)
    if ident is None:
        return [], []
    try:
        if not _private(folder.lstat(), stat.S_ISDIR):
            return [], []
        names = sorted(os.listdir(folder))
    except OSError:
        return [], []
    found, notes = [], []
    mine = settings_digests(settings)
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = folder / name
        record = _read(path)
        if record is None:
            continue
        url, pid, secret = record.get("url"), record.get("pid"), record.get("secret")
        if not (isinstance(url, str) and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
                and is_loopback_url(url)  # (pid 0 or -1 would ask a whole process group whether it lives)
                and isinstance(secret, str) and _HEX64.fullmatch(secret)):
            continue
        if not _alive(pid) or record.get("index_id") != ident:  # a dead server, or a record copied with the index
            path.unlink(missing_ok=True)
            continue
        theirs = record.get("settings") or {}
        differ = [k for k in COMPARED_SETTINGS if theirs.get(k) != mine[k]]
        if differ:
            notes.append(f"the server at {url} runs with other settings ({', '.join(differ)}): answering here")
            continue
        found.append(Server(url=url, pid=pid, index_id=ident, record=path, secret=secret))
    return found, notes


def _read(path: Path) -> dict | None:
    """A trusted record's content: a regular file of this user, not writable by others, JSON of this version."""
    try:
        if not _private(path.lstat(), stat.S_ISREG):
            return None
        with open(path, encoding="utf-8") as f:
            record = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return record


def forget(server: Server) -> bool:
    """A record whose server did not answer at all (its port is closed), or could not prove it wrote the record:
    removed (trusted records are this user's own, in a directory of this user). Whether it is gone."""
    try:
        server.record.unlink(missing_ok=True)
    except OSError:  # a read-only index directory, say
        return False
    return True


def records(settings: Settings) -> Iterator[Path]:
    """The record files for this index, trusted or not (what a listing or a test looks at)."""
    folder = record_dir(settings)
    if folder.is_dir():
        yield from sorted(p for p in folder.glob("*.json"))
