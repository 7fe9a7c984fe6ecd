"""How the server runs and who may reach it: `ServeOptions`, the exposure rules checked at start
(`check_exposure`), the startup banner (`exposure_notes`) and the options from flags and the environment."""
from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.limits import MAX_QUERY_SENTENCES, MAX_REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S
from ..settings.config import ConfigError

#: a name for word vectors the operator configured (`esqbe serve --words NAME=DIR`): no path separators
WORDS_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class ServeOptions(BaseModel):
    """How the server runs (not what it searches: that is `Settings`)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8000
    #: bearer token for the write endpoints; required whenever `host` is not a loopback address
    token: str | None = None
    #: reader threads, each with its own index handle and encoder (default: 1 embedded, 4 engines)
    readers: int | None = Field(None, ge=1, le=64)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    #: sentences of a request's free texts together, each text counted whole (esqbe.query.search.query_texts): the
    #: library's bound or lower, never higher (the schema publishes the library's)
    max_query_sentences: int = Field(MAX_QUERY_SENTENCES, ge=1, le=MAX_QUERY_SENTENCES)
    max_batch_records: int = Field(1000, ge=1)
    max_queued_writes: int = Field(8, ge=1)
    #: origins allowed to call the API from a browser page of their own (CORS); none = CORS off
    cors_origins: list[str] = Field(default_factory=list)
    #: load the model and the kNN structures before answering (health says "warming" until then)
    warm: bool = True
    #: Host header names answered (besides loopback names on loopback connections); empty: any when exposed
    allowed_hosts: list[str] = Field(default_factory=list)
    #: reads need the token too (a private library), not only writes
    private: bool = False
    #: a request carrying the token may send any engine_filter (raw query DSL); otherwise only SAFE_CLAUSES
    allow_raw_engine_filter: bool = False
    #: seconds a write waits for another writer's lock on the embedded index before answering 503
    write_lock_timeout: float = Field(30.0, gt=0, le=3600)
    #: show the index path and engine URL in /stats and error messages (only for an operator's own use)
    show_paths: bool = False
    #: word vectors a query may use by name (`rescorer_params: {"words": NAME}` for asym_token): NAME -> the
    #: directory from `esqbe train-words`. Only these: a client never names a directory (a pickle is loaded from it)
    words: dict[Annotated[str, Field(pattern=WORDS_NAME)], str] = Field(default_factory=dict)
    #: seconds a query may take, its wait for a reader included, before it is abandoned with 504
    request_timeout: float = Field(REQUEST_TIMEOUT_S, gt=0, le=MAX_REQUEST_TIMEOUT_S)
    #: once warm, keep everything allocated so far (the model, the index's structures, the libraries) out of the garbage
    #: collector's walks (gc.freeze): a full collection then walks only what requests allocated since. At hard 1M
    #: a full walk of a warm server's ~270K objects took 120-131 ms, 3 times in 1,000 queries, holding every
    #: thread (docs/performance.md). Process-wide, so `esqbe serve` sets it for its own process; an app
    #: mounted in another one leaves that process's collector alone unless asked
    freeze_gc: bool = False
    #: where readers reach the server (its page), e.g. https://papers.example.org/esqbe/ behind a proxy: a feed entry
    #: of a paper with no DOI or URL links to the paper on this page. None: http://HOST:PORT/ on loopback
    public_url: str | None = Field(None, max_length=2000)
    #: run `esqbe follow run` (every followed source, then every watch) every this many seconds, on the writer's thread
    #: (esqbe.server.schedule); None: never (`esqbe follow run` from cron or a timer does it)
    follow_every: float | None = Field(None, ge=1, le=30 * 86_400)

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
                or any(c.isspace() or ord(c) < 32 for c in value.strip()):
            raise ValueError("the public URL is http(s)://HOST[:PORT][/PATH], with no query, fragment or spaces")
        return value.strip().rstrip("/") + "/"

    def base_url(self) -> str:
        """The server's public base URL, ending in /: `public_url`, else this server on loopback."""
        if self.public_url:
            return self.public_url
        host = self.host if is_loopback(self.host) else "127.0.0.1"
        host = f"[{host.strip('[]')}]" if ":" in host else host
        return f"http://{host}:{self.port}/"


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MIN_TOKEN_LENGTH = 16


def check_exposure(options: ServeOptions, writes: Sequence[str] = ("the writes",)) -> None:
    """Refuse to expose the write endpoints beyond this machine without a token, weak tokens, and options
    that need a token without one. `writes`: the write endpoints, named in the refusal (the app passes the route
    table's: esqbe.server.routes.write_endpoints)."""
    if not is_loopback(options.host) and not options.token:
        raise ConfigError(
            f"refusing to listen on {options.host}: the write endpoints ({', '.join(writes)}) "
            "need a bearer token when the host is not loopback; set ESQBE_TOKEN or pass --token-file"
        )
    if options.token is not None and len(options.token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"the token has {len(options.token)} characters; use at least {MIN_TOKEN_LENGTH} "
                          "(e.g. `openssl rand -hex 16`)")
    for flag, wanted in (("--private", options.private), ("--allow-raw-engine-filter", options.allow_raw_engine_filter)):
        if wanted and not options.token:
            raise ConfigError(f"{flag} needs a token (ESQBE_TOKEN or --token-file)")


def exposure_notes(options: ServeOptions) -> list[str]:
    """What the startup banner says about who can do what (warnings for what an operator may not mean)."""
    where = f"{options.host}:{options.port}"
    if is_loopback(options.host):
        notes = [f"listening on {where}: only this machine can connect; loopback host names only"
                 + (f" and {', '.join(options.allowed_hosts)}" if options.allowed_hosts else "")]
    else:
        notes = [f"listening on {where}: reachable from other machines; writes need the token"]
        if not options.allowed_hosts:
            notes.append("warning: any Host name is answered; --allowed-host NAME (repeatable) answers only the "
                         "names clients use (a DNS-rebinding page cannot then reach it)")
    notes.append("reads need the token too (--private)" if options.private else
                 "reads (queries, papers, search, stats) are open to anyone who can connect; --private needs the token for them")
    if options.allow_raw_engine_filter:
        notes.append("raw engine_filter query DSL is allowed for requests with the token")
    return notes


def options_from_env(*, token_file: str | None = None, **given) -> ServeOptions:
    """ServeOptions from flags, the token from --token, --token-file or ESQBE_TOKEN (in that order).
    A token on the command line is visible to other users of the machine (ps): a warning says so."""
    clean = {k: v for k, v in given.items() if v is not None}
    if clean.get("token") and token_file:
        raise ConfigError("give the token once: --token or --token-file")
    if clean.get("token"):
        print("esqbe: warning: --token is visible to other users of this machine (ps); prefer ESQBE_TOKEN or "
              "--token-file", file=sys.stderr, flush=True)
    elif token_file:
        try:
            clean["token"] = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the token file {token_file}: {getattr(e, 'strerror', None) or e}") from None
        if not clean["token"]:
            raise ConfigError(f"the token file {token_file} is empty")
    elif os.environ.get("ESQBE_TOKEN"):
        clean["token"] = os.environ["ESQBE_TOKEN"]
    from pydantic import ValidationError

    try:
        return ServeOptions(**clean)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(map(str, first.get("loc") or ())).replace("_", "-")
        raise ConfigError(f"--{field}: {first.get('msg', 'invalid')}".replace("Value error, ", "")) from None
