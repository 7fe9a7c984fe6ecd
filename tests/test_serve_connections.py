"""Held connections do not make `esqbe serve` unreachable: a connection that sends half its headers is closed after
header_timeout; at max_connections the oldest connection still waiting for its headers makes room for a new one, and
a new one is refused only when every open one has a request in hand; each kind is a line or two in the log, not a
traceback per connection; the soft open-file limit is raised at start. Real sockets on 127.0.0.1 only, each closed
at the end; the real `esqbe serve` started with a soft open-file limit of 1,024, the default on many systems."""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from esqbe.server.connections import ConnectionGuard, guarded_protocol
from esqbe.server.middleware import _BodyLimit

from .conftest import REPO

HELD = 1100
HALF = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: "  # a request line and half its headers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _closed_by_server(s: socket.socket, wait: float) -> bool:
    """Whether the server closed `s` (EOF or a reset) within `wait` seconds."""
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


@contextmanager
def _files(n: int):
    """This process may hold `n` more sockets (its soft open-file limit raised for the test, then put back)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 512
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-file limit here is {hard}; holding {n} sockets needs {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _answer(s: socket.socket) -> bytes:
    """One whole answer of the test app (its body is `ok`)."""
    got = b""
    while not got.endswith(b"ok"):
        chunk = s.recv(1000)
        if not chunk:
            break
        got += chunk
    return got


def _hold(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
        s.sendall(HALF)
    return socks


def test_serve_stays_reachable_while_1100_half_open_connections_are_held(index_copy, tmp_path):
    """A slow-headers attack on the real `esqbe serve` (soft open-file limit 1,024): a fresh GET /health answers while
    1,100 connections hold half their headers; every one of them is closed by the server (the oldest to make room
    at max_connections, the rest after header_timeout); the log says so in a few lines."""
    port = _free_port()
    log = tmp_path / "serve.log"
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    with _files(HELD), open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--path", str(index_copy), "--port", str(port),
                                   "--no-warm", "--header-timeout", "3"], cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT,
                                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard)))
        socks: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 240
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            socks = _hold(port, HELD)
            t0 = time.monotonic()
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)  # a fresh connection
            assert r.status_code == 200 and time.monotonic() - t0 < 5, r.text
            closed = sum(_closed_by_server(s, 8) for s in socks)  # header_timeout 3 s, then closed
            assert closed == HELD
        finally:
            for s in socks:
                s.close()
            server.terminate()
            server.wait(timeout=60)
    text = log.read_text()
    assert "Traceback" not in text and "Too many open files" not in text, text[-3000:]
    assert "each sends its request headers within 3 s (header_timeout)" in text
    about = [line for line in text.splitlines() if "connection(s)" in line]
    assert 1 <= len(about) <= 4, about  # each kind: its first line, then one line of the rest at shutdown
    assert any("within 3 s (header_timeout)" in line for line in about), about


@contextmanager
def _guarded_server(guard: ConnectionGuard):
    """A real uvicorn server on a loopback port speaking `guarded_protocol(guard)`, over an app that reads the
    whole body of a request before answering (through esqbe's body limit, its stall timeout the header timeout): a
    request whose body has not come is a request in hand."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = _free_port()
    app = _BodyLimit(app, limit=1 << 20, stall=guard.header_timeout)  # as `esqbe serve`'s app reads a body
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           http=guarded_protocol(guard), timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_at_the_limit_the_oldest_waiting_connection_makes_room_and_busy_ones_refuse(caplog):
    guard = ConnectionGuard(header_timeout=30, limit=3, files=1024)
    caplog.set_level(logging.WARNING, logger="esqbe.server")
    with _guarded_server(guard) as port:
        waiting = _hold(port, 3)
        time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text == "ok"  # made room: the oldest closed
        assert _closed_by_server(waiting[0], 5) and not any(_closed_by_server(s, 0.3) for s in waiting[1:])
        for s in waiting:
            s.close()
        # three requests in hand (their bodies not sent): a fourth connection is refused, nothing is evicted
        busy = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        for s in busy:
            s.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n")
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert _closed_by_server(extra, 5)
        extra.close()
        for s in busy:  # each gets its answer once its body comes
            s.sendall(b"0123456789")
            assert _answer(s).endswith(b"ok")
            s.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "esqbe.server"]
    assert any(line.startswith("esqbe: closed 1 connection(s) still waiting for their request headers to make "
                               "room: 3 connections were open (max_connections)") for line in lines), lines
    assert any(line.startswith("esqbe: refused 1 connection(s): 3 connections were open, each with a request in hand")
               for line in lines), lines


def test_a_kept_alive_connection_that_stalls_in_its_next_headers_is_closed(caplog):
    """The header timer runs for every request of a connection: after a first answer, half of a second request's
    headers and then nothing is closed too (uvicorn's keep-alive timer stops at the first byte)."""
    guard = ConnectionGuard(header_timeout=0.5, limit=100, files=1024)
    caplog.set_level(logging.WARNING, logger="esqbe.server")
    with _guarded_server(guard) as port:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _answer(s).endswith(b"ok")
        s.sendall(HALF)
        t0 = time.monotonic()
        assert _closed_by_server(s, 5)
        assert 0.4 < time.monotonic() - t0 < 4
        s.close()
    assert any("within 0.5 s (header_timeout)" in r.getMessage() for r in caplog.records)


def test_a_request_body_that_stalls_is_answered_408_and_closed():
    guard = ConnectionGuard(header_timeout=0.5, limit=100, files=1024)
    with _guarded_server(guard) as port:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n01234")
        t0 = time.monotonic()
        s.settimeout(5)
        answer = b""
        while chunk := s.recv(1000):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ") and b"no bytes for 0.5 s (header_timeout)" in answer, answer
        assert 0.4 < time.monotonic() - t0 < 4
        s.close()


def test_notes_are_one_line_then_counted():
    """A kind of refusal: its first line at once, the next ones counted and logged together (at shutdown here)."""
    now = [0.0]
    guard = ConnectionGuard(header_timeout=10, limit=5, files=1024, clock=lambda: now[0])
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("esqbe.server")
    logger.addHandler(handler)
    try:
        for _ in range(500):
            guard.note("header_timeout")
        now[0] = 5.0
        guard.note("accept", error="[Errno 24] Too many open files")
        asyncio.run(asyncio.sleep(0))  # no loop was running for the notes: nothing was scheduled
        guard.flush()
    finally:
        logger.removeHandler(handler)
    assert records == [
        "esqbe: closed 1 connection(s) that sent no complete request line and headers within 10 s (header_timeout); "
        "more are counted and logged at most once a minute",
        "esqbe: could not accept 1 connection(s): [Errno 24] Too many open files (open-file limit 1024); more are "
        "counted and logged at most once a minute",
        "esqbe: closed 499 connection(s) that sent no complete request line and headers within 10 s (header_timeout) "
        "since the last line about them"]
