"""The lowest layer of the official clients, replaced: `RecordingNode` (an elastic-transport node) and
`RecordingConnection` (an opensearch-py connection) hand the bytes a client would put on the wire to a canned engine
(tests/fakes/engines.py) and return its answer; `EngineHTTPServer` serves a canned engine on a real loopback socket,
so the clients' own transports are exercised too."""
from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest

os_client = pytest.importorskip("opensearchpy")
pytest.importorskip("elasticsearch")

from elastic_transport import ApiResponseMeta, BaseNode, HttpHeaders  # noqa: E402
from elastic_transport import ConnectionError as ESConnectionError  # noqa: E402
from elastic_transport._node import NodeApiResponse  # noqa: E402
from opensearchpy.connection import Connection  # noqa: E402

if TYPE_CHECKING:
    from .engines import CannedEngine

class RecordingNode(BaseNode):
    """elastic-transport node: hands the request bytes to a CannedEngine instead of a socket."""

    canned: CannedEngine

    def perform_request(self, method, target, body=None, headers=None, request_timeout=None):
        sent = dict(self.headers)
        sent.update(headers or {})
        status, payload = self.canned.handle(method, target, sent, body)
        if status == "connection":
            raise ESConnectionError("canned: connection refused")
        meta = ApiResponseMeta(
            status=status,
            http_version="1.1",
            headers=HttpHeaders({"content-type": "application/json", "x-elastic-product": "Elasticsearch"}),
            duration=0.0,
            node=self.config,
        )
        return NodeApiResponse(meta, json.dumps(payload).encode("utf-8"))

    def close(self):
        pass


class RecordingConnection(Connection):
    """opensearch-py connection: hands the request bytes to a CannedEngine instead of a socket."""

    canned: CannedEngine

    def perform_request(self, method, url, params=None, body=None, timeout=None, ignore=(), headers=None):
        target = url
        if params:
            from urllib.parse import urlencode

            target = f"{url}?{urlencode(params)}"
        sent = dict(self.headers)
        sent.update(headers or {})
        status, payload = self.canned.handle(method, target, sent, body)
        if status == "connection":
            raise os_client.ConnectionError("N/A", "canned: connection refused", None)
        raw = json.dumps(payload)
        if not (200 <= status < 300) and status not in ignore:
            self._raise_error(status, raw, "application/json")
        return status, {"content-type": "application/json"}, raw

    def close(self):
        pass


class EngineHTTPServer:
    """A real HTTP server on 127.0.0.1 that answers like the engine (a CannedEngine behind it): the clients'
    own transports (urllib3 nodes / connections) put the request on a socket, so what is checked is what
    goes over the wire. `delays[endpoint]` queues seconds to wait before answering (request timeouts)."""

    def __init__(self, canned: CannedEngine):
        import http.server
        import threading
        import time

        self.canned = canned
        self.delays: dict[str, list[float]] = defaultdict(list)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # one write per response (flushed by the handler): no Nagle/delayed-ACK stalls
            disable_nagle_algorithm = True

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                n = len(canned.requests)
                status, payload = canned.handle(self.command, self.path, dict(self.headers.items()), body)
                endpoint = canned.requests[n]["endpoint"] if len(canned.requests) > n else ""
                if server.delays[endpoint]:
                    time.sleep(server.delays[endpoint].pop(0))
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                if canned.engine == "elasticsearch":
                    self.send_header("x-elastic-product", "Elasticsearch")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
