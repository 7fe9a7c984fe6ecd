"""`esqbe serve`: the Python API (esqbe.index.api) as a JSON HTTP service and a page, on any backend.

A thin layer: request and response models, limits, auth and error statuses live here; every
answer comes from `esqbe.index.api.Index`. The model and the index are opened once and kept warm.

Concurrency: each `Index` lives in one thread of its own (the embedded backend's SQLite handle
must stay on the thread that opened it), so the server keeps

- one *writer* (`POST /papers`, `DELETE /papers/{id}`): one thread, and a lock, so there is a
  single writer at a time; further writes wait in a short queue (503 with Retry-After past it);
- one or more *readers* (queries, papers, search, stats), each with its own thread, index handle
  and encoder, which never wait for the writer: a write becomes visible to them when it commits.

Embed it with the app factory, saying who can reach it (the app cannot see where its host listens):

    from esqbe.server import ServeOptions, create_app
    app = create_app(path="esqbe-index", options=ServeOptions(host="127.0.0.1"))   # only this machine reaches it
    app = create_app(path="esqbe-index", options=ServeOptions(host="0.0.0.0", token=TOKEN))  # others do
    parent_app.mount("/esqbe", app)                  # inside an existing FastAPI / Starlette app

`create_app` refuses options that name neither a host nor a token: a parent app listening on all
interfaces would otherwise serve the write endpoints without a token.

The package, one job a module: options.py (ServeOptions, the exposure rules), models.py (request and
response models), errors.py (errors as JSON), middleware.py (the perimeter, the body limit), service.py
(the writer and readers), work.py (what the handlers do on a reader's thread), routes.py (`make_router`),
connections.py (what one client connection may hold: the header timeout, the connection limit, the open-file
limit), and this module (`create_app`, `serve`). The logger is "esqbe.server".

The perimeter (`_Perimeter`, before any body byte is read): the Host header (loopback names only on a
loopback connection, `allowed_hosts` otherwise), the Origin of writes (own origin or a CORS origin), the
bearer token (writes; reads too when `private`), and JSON / JSON Lines bodies only for writes.
Clients get error messages without filesystem paths or engine URLs; the log has them, by request id.
"""
from __future__ import annotations

import asyncio
import sys

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from ..settings.config import ConfigError, Settings, load_settings
from .connections import ConnectionGuard, connection_limit, guarded_protocol, open_file_limit
from .discovery import loopback_url, new_secret, remove_record, write_record
from .errors import install_error_handlers
from .feeds import redact_access_log
from .middleware import _BodyLimit, _Perimeter
from .options import (
    ServeOptions,
    check_exposure,
    exposure_notes,
    is_loopback,
    options_from_env,
)
from .routes import STATIC_DIR, make_router, write_endpoints
from .schedule import FollowSchedule
from .service import Service


def create_app(path: str | None = None, *, settings: Settings | None = None, config: str | None = None,
               options: ServeOptions | None = None, encoder=None, **overrides) -> FastAPI:
    """The esqbe HTTP app (FastAPI), ready to run with uvicorn or to mount inside another ASGI app.

    `path`, `config`, `settings` and `overrides` choose the index as `esqbe.open_index` does;
    `options` set host (for the token rule), token, limits, CORS and readers. `encoder` shares one
    already loaded encoder across all threads (tests; otherwise each thread loads its own).
    The index is opened when the app starts (or on its first request when mounted without lifespan).

    `options` must say who can reach the app: `ServeOptions(host="127.0.0.1")` (only this machine: writes
    need no token) or a token. The app cannot see where the server that runs it listens, so it does not guess.
    """
    if options is None or not (options.token or "host" in options.model_fields_set):
        raise ConfigError(
            "create_app needs to know who can reach the app: options=ServeOptions(host=\"127.0.0.1\") when only "
            "this machine can (writes need no token), or ServeOptions(host=..., token=...) when others can "
            "(mounted in another app, the host is where that app listens)")
    check_exposure(options, write_endpoints())
    settings = (settings or load_settings(config)).replace(path=path, **overrides)
    service = Service(settings, options, encoder=encoder)

    from contextlib import asynccontextmanager

    schedule = FollowSchedule(service, options.follow_every) if options.follow_every else None

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.get_running_loop().run_in_executor(None, service.start)
        if schedule is not None:
            schedule.start()
        try:
            yield
        finally:
            if schedule is not None:
                await asyncio.get_running_loop().run_in_executor(None, schedule.stop)
            await asyncio.get_running_loop().run_in_executor(None, service.close)

    # the API docs (/docs: Swagger UI, /redoc: ReDoc) from the assets the fastapi-offline package ships, served
    # here under /static/docs: they work with no network (FastAPI's own load them from a CDN)
    from fastapi_offline import FastAPIOffline

    app = FastAPIOffline(
        static_url="/static/docs",
        favicon_url="static/favicon.svg",  # relative to /docs: right where the app is mounted
        swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from the validator's site
        title="esqbe",
        summary="Faceted query-by-example search for scientific papers",
        description="Pick a paper and an aspect of it (background, method, result, or chosen sentences) and get "
                    "the papers most similar in that aspect, with the sentences that matched. Write endpoints need "
                    "`Authorization: Bearer <token>` when the server has a token.",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.follow_schedule = schedule
    redact_access_log()  # a feed's secret URL is never written to the access log

    install_error_handlers(app)
    app.include_router(make_router(service, options, schedule))
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    # outermost last: CORS (its headers on every answer, refusals too), the perimeter, then the body limit
    app.add_middleware(_BodyLimit, limit=options.max_body_bytes, stall=settings.header_timeout)
    app.add_middleware(_Perimeter, options=options)
    if options.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])
    return app


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("esqbe")
    except Exception:
        return "0"


def serve(settings: Settings, options: ServeOptions, *, log_level: str = "info") -> None:
    """Run the app with uvicorn until interrupted (what `esqbe serve` does)."""
    import uvicorn

    from ..core.threads import limit_for_query

    check_exposure(options, write_endpoints())
    limit_for_query()  # this process answers queries: small matrices, one BLAS thread (esqbe.core.threads)
    app = create_app(settings=settings, options=options)
    secret = app.state.record_secret = new_secret()  # what GET /proof proves this process wrote its record with
    for line in exposure_notes(options):
        print(f"esqbe: {line}", file=sys.stderr, flush=True)
    app.state.service.start()  # open the index and load the model now: a failure is one clear error, not a traceback
    files, _ = open_file_limit()  # the soft limit raised to the hard one: held connections must not exhaust it
    guard = ConnectionGuard(settings.header_timeout, connection_limit(settings.max_connections, files), files)
    print(f"esqbe: at most {guard.limit} connections at once (max_connections {settings.max_connections}, open-file "
          f"limit {files}); each sends its request headers within {guard.header_timeout:g} s (header_timeout)",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level=log_level, proxy_headers=False,
                            server_header=False, timeout_graceful_shutdown=10, http=guarded_protocol(guard))
    server = _recorded_server(config, lambda: _record(settings, options, secret), guard)
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: the signal that stopped a clean shutdown
        pass
    finally:
        if server.record is not None:
            remove_record(server.record)
    if not server.started:
        sys.exit(3)  # uvicorn's STARTUP_FAILURE: the port is taken, say


def _recorded_server(config, make_record, guard: ConnectionGuard | None = None):
    """uvicorn's Server that, once it listens, leaves a discovery record (esqbe.server.discovery) for `esqbe query`
    (`make_record()`: its path or None) and removes it as its shutdown begins (before a SIGTERM is passed on); with a
    `guard`, a failed accept is one of its rate-limited notes, and what it counted is logged at shutdown."""
    import uvicorn

    class Recorded(uvicorn.Server):
        record = None

        async def startup(self, sockets=None):
            if guard is not None:
                asyncio.get_running_loop().set_exception_handler(guard.accept_failed)
            await super().startup(sockets)
            if self.started and not self.should_exit:
                self.record = make_record()

        async def shutdown(self, sockets=None):
            if self.record is not None:
                remove_record(self.record)
            await super().shutdown(sockets)
            if guard is not None:
                guard.flush()

    return Recorded(config)


def _record(settings: Settings, options: ServeOptions, secret: str):
    """Write the discovery record of a server this machine reaches by loopback and any local user may query
    (not a private one), with the `secret` it proves itself by (GET /proof); say so on stderr. Its path, or None."""
    url = loopback_url(options.host, options.port)
    if url is None or options.private:
        return None
    try:
        path = write_record(settings, url, secret)
    except OSError as e:
        print(f"esqbe: no discovery record ({e}): `esqbe query` uses this server only with --server {url}",
              file=sys.stderr, flush=True)
        return None
    print(f"esqbe: `esqbe query` on this index uses this server (its record: {path})", file=sys.stderr, flush=True)
    return path


__all__ = ["create_app", "serve", "ServeOptions", "Service", "check_exposure", "exposure_notes", "is_loopback",
           "options_from_env"]
