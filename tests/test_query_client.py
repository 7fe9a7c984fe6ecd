"""`esqbe query --server URL` against hostile servers: real tiny servers on 127.0.0.1 (a thread
each, raw sockets, bounded in time and bytes) and the real CLI as a process. An answer past the cap is not read on,
one deadline covers the whole exchange, an answer that is not the API's response model is the server's fault
(exit 4, one line), a redirect is not followed (the token goes nowhere else), and a proxy from the environment
carries a query to a server that is not on loopback."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from esqbe.server.client import answer_cap

from .test_warm_query import cli

TOKEN = "bearer-token-0123456789abcdef"


def _valid(**hit) -> dict:
    """A query result in the API's response model (esqbe.server.models.QueryResponse)."""
    return {"version": 1, "query": {"paper_id": "p1", "facet": "method", "sentences": [
                {"index": 0, "text": "We parse.", "facet": "method", "why": "label"}]},
            "rescorer": "summax", "rescorer_params": {}, "similarity": "s", "match_weight": "cosine",
            "timings_ms": {"total": 1.0},
            "hits": [{"rank": 1, "paper_id": "h1", "title": "A hit", "similarity": 0.5, "score": 1.0,
                      "first_stage_score": 1.0, "bm25": 1.0, "knn": 0.5, "matches": [], "metadata": {}, **hit}]}


def _read_request(conn) -> bytes:
    """A request's head and body, read whole (a socket closed with bytes unread resets the connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        piece = conn.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body


class Raw:
    """A TCP server on 127.0.0.1 running `handle(conn, request)` for each connection on a thread of its own
    (`request`: the bytes of the request's head and body); `seen` lists each connection's request."""

    def __init__(self, handle):
        self.handle, self.seen = handle, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        with conn:
            conn.settimeout(30)
            try:
                request = _read_request(conn)
                self.seen.append(request)
                self.handle(conn, request)
            except OSError:
                pass

    def close(self):
        self.sock.close()


@pytest.fixture
def raw():
    servers = []

    def make(handle) -> Raw:
        servers.append(Raw(handle))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _send(conn, status: str, body: bytes, headers: str = "Content-Type: application/json\r\n") -> None:
    conn.sendall(f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                 + body)


def _query(url: str, tmp_path, *extra, env=None):
    return cli("query", "--server", url, "--paper", "p1", "--facet", "method", *extra, cwd=tmp_path, timeout=120, env=env)


def _one_line_failure(r, message: str) -> None:
    assert r.returncode == 4, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(raw, tmp_path):
    elsewhere = raw(lambda conn, request: _send(conn, "200 OK", json.dumps(_valid()).encode()))
    redirect = raw(lambda conn, request: _send(conn, "302 Found", b"",
                                               f"Location: {elsewhere.url}/query\r\n"))
    for status in ("302", "307"):
        redirect.handle = lambda conn, request, s=status: _send(conn, f"{s} Moved", b"",
                                                               f"Location: {elsewhere.url}/query\r\n")
        r = _query(redirect.url, tmp_path, env={"ESQBE_TOKEN": TOKEN})
        _one_line_failure(r, f"the server at {redirect.url} answered {status} (a redirect to {elsewhere.url}/query): "
                             "not followed")
    assert TOKEN.encode() in redirect.seen[0]  # the server named was sent the token ...
    assert elsewhere.seen == []  # ... and the origin it pointed to got nothing


def test_an_answer_past_the_cap_is_not_read_on(raw, tmp_path):
    """With -k 1 an answer may have answer_cap(1) bytes. A server streaming four times that, with no length or
    declaring 1 GiB, has sent about the cap (and what the sockets buffer) when the client hangs up."""
    cap = answer_cap(1)
    sent = {}

    def stream(conn, request, declared: bool):
        head = "Content-Length: 1073741824\r\n" if declared else ""
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{head}Connection: close\r\n\r\n".encode())
        total, chunk = 0, b" " * (1 << 20)
        try:
            while total < 4 * cap:
                conn.sendall(chunk)
                total += len(chunk)
        except OSError:
            pass
        sent[declared] = total

    for declared in (False, True):
        server = raw(lambda conn, request, d=declared: stream(conn, request, d))
        r = _query(server.url, tmp_path, "-k", "1")
        message = "announced an answer of 1073741824 bytes" if declared else "answered more than a query's answer can be"
        _one_line_failure(r, message)
        assert f"({cap >> 20} MiB)" in r.stderr
        deadline = time.time() + 30
        while declared not in sent and time.time() < deadline:
            time.sleep(0.05)
        assert sent[declared] < 4 * cap  # it stopped reading, and hung up, long before the end
    assert sent[True] < sent[False]  # a declared length past the cap: not a byte of the body read


@pytest.mark.parametrize("where", ["head", "body"])
def test_one_deadline_for_the_whole_exchange(raw, tmp_path, where):
    """A server that drips a byte every 0.5 s (for up to 60 s) outlives any per-read timeout; `--server-timeout 2`
    is the whole exchange's, so the client hangs up about 2 s after it connected."""
    seen = {}

    def drip(conn, request):
        seen["start"] = time.monotonic()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     + (b"Content-Length: 1000\r\n\r\n" if where == "body" else b"X-Slow: "))
        try:
            for _ in range(120):
                conn.sendall(b"a")
                time.sleep(0.5)
        except OSError:
            seen["closed"] = time.monotonic()

    server = raw(drip)
    r = _query(server.url, tmp_path, "--server-timeout", "2")
    _one_line_failure(r, f"the server at {server.url} did not answer within 2 s")
    deadline = time.time() + 30
    while "closed" not in seen and time.time() < deadline:
        time.sleep(0.1)
    # hung up at its deadline (not at the drip's end, 60 s on): the bound allows for a busy machine
    assert 1.5 <= seen["closed"] - seen["start"] < 2 + 4, seen


BAD_ANSWERS = {
    "a wrong type": (json.dumps(_valid(rank="first")), "not a query result: hits.0.rank"),
    "a missing field": (json.dumps({k: v for k, v in _valid().items() if k != "query"}), "not a query result: query"),
    "not an object": (json.dumps([_valid()]), "not a query result"),
    "not JSON": ("<html>hello</html>", "not JSON"),
    "NaN": (json.dumps(_valid()).replace('"similarity": 0.5', '"similarity": NaN'), "not JSON: NaN is not a finite"),
    "nested too deep for the parser": ("[" * 100_000 + "]" * 100_000, "not JSON"),
    "metadata nested deep": (json.dumps(_valid(metadata={"a": json.loads("[" * 500 + "]" * 500)})),
                             "not a query result: nested deeper than 32 levels"),
}


@pytest.mark.parametrize("name", list(BAD_ANSWERS))
def test_an_answer_that_is_not_a_query_result_is_the_servers_fault(raw, tmp_path, name):
    body, message = BAD_ANSWERS[name]
    server = raw(lambda conn, request: _send(conn, "200 OK", body.encode()))
    for extra in ((), ("--json",)):
        r = _query(server.url, tmp_path, *extra)
        _one_line_failure(r, f"the server at {server.url} answered something that is {message}")


def test_an_odd_but_valid_answer_prints(raw, tmp_path):
    """Metadata is free-form in the response model: odd shapes print as a local index's would, without a crash."""
    answer = _valid(metadata={"external_ids": "doi:x", "authors": {"a": 1}, "venue": ["V"], "year": "MMXX"})
    server = raw(lambda conn, request: _send(conn, "200 OK", json.dumps(answer).encode()))
    for extra in ((), ("--json",), ("--format", "csv")):
        r = _query(server.url, tmp_path, *extra)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "h1" in r.stdout


def test_a_proxy_from_the_environment_carries_a_query_to_another_host(raw, tmp_path):
    """Loopback URLs are asked directly; another host through `http_proxy` (as urllib would), in absolute form."""
    proxy = raw(lambda conn, request: _send(conn, "200 OK", json.dumps(_valid()).encode()))
    env = {"http_proxy": proxy.url, "HTTP_PROXY": proxy.url, "no_proxy": "", "NO_PROXY": ""}
    r = _query("http://esqbe.example:8000", tmp_path, "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["hits"][0]["paper_id"] == "h1", r.stderr
    assert proxy.seen[0].startswith(b"POST http://esqbe.example:8000/query HTTP/1.1\r\n")


def test_https(tmp_path):
    """An https:// server: its certificate is checked (here one the test makes and trusts by SSL_CERT_FILE), and the
    one deadline also ends a drip over TLS."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"https://127.0.0.1:{listener.getsockname()[1]}"
    mode = {"drip": False}

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    _read_request(tls)
                    if mode["drip"]:
                        tls.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                        for _ in range(120):
                            tls.sendall(b"a")
                            time.sleep(0.5)
                    else:
                        _send(tls, "200 OK", json.dumps(_valid()).encode())
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        trusted = {"SSL_CERT_FILE": str(cert)}
        r = _query(url, tmp_path, "--json", env=trusted)
        assert r.returncode == 0 and json.loads(r.stdout)["hits"][0]["paper_id"] == "h1", r.stderr
        r = _query(url, tmp_path, "--json", env={"SSL_CERT_FILE": str(tmp_path / "none.pem")})
        _one_line_failure(r, f"the server at {url} cannot be reached: [SSL: CERTIFICATE_VERIFY_FAILED]")
        mode["drip"] = True
        r = _query(url, tmp_path, "--server-timeout", "2", env=trusted)
        _one_line_failure(r, f"the server at {url} did not answer within 2 s")
    finally:
        listener.close()
