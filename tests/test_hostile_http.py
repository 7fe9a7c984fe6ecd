"""`esqbe serve` attacked over real HTTP on 127.0.0.1, the way an attacker would (bounded: a few requests each):
a page on another site writing, a DNS-rebinding Host, engine DSL from anyone, a weak token, reads of a
private library, a body sent without the token, a writer lock held elsewhere, internal paths in answers,
and an app factory that trusted a host it cannot see."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket

import httpx
import pytest
from click.testing import CliRunner

import esqbe
from esqbe.core.filters import FilterError
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions, options_from_env
from esqbe.settings.config import ConfigError

from .conftest import SAMPLE, LiveServer

QID = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]
TOKEN = "hostile-test-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EVIL = "https://evil.example"


def _record(pid: str) -> dict:
    return {"id": pid, "title": "An attack", "abstract": f"This paper {pid} was sent by another site. It must not be indexed."}


def _copy(index_dir_30, tmp_path_factory, name: str):
    path = tmp_path_factory.mktemp(name) / "index"
    shutil.copytree(index_dir_30, path)
    return path


def _serve(path, encoder, **options):
    options.setdefault("host", "127.0.0.1")
    return LiveServer(create_app(str(path), config=None, encoder=encoder, options=ServeOptions(**options)))


def _refused(r: httpx.Response, status: int, match: str = "") -> str:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert match.lower() in message.lower(), message
    return message


@pytest.fixture(scope="module")
def open_server(index_dir_30, encoder, tmp_path_factory):
    """The default: loopback, no token, no CORS."""
    path = _copy(index_dir_30, tmp_path_factory, "hostile-open")
    with _serve(path, encoder) as url:
        yield url, path


# --- 3. a page on another site -----------------------------------------------------------------------


def test_a_page_on_another_site_cannot_write_or_delete(open_server):
    url, _ = open_server
    line = json.dumps(_record("xsite-1"))
    # what a cross-site form or fetch may send without a preflight: text/plain (or no type), a foreign Origin
    r = httpx.post(url + "/papers", content=line, headers={"Content-Type": "text/plain", "Origin": EVIL})
    _refused(r, 403, "evil.example")
    _refused(httpx.delete(url + f"/papers/{QID}", headers={"Origin": EVIL}), 403)
    _refused(httpx.post(url + "/papers", json={"records": [_record("xsite-2")]}, headers={"Origin": "null"}), 403)
    # the types a browser sends cross-site without asking are never bodies of writes, whatever the origin
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": ctype} if ctype else {}
        _refused(httpx.post(url + "/papers", content=line, headers=headers), 415, "application/json")
    assert httpx.get(url + "/papers/xsite-1").status_code == 404
    assert httpx.get(url + "/papers/xsite-2").status_code == 404
    assert httpx.get(url + f"/papers/{QID}").status_code == 200
    # the server's own page (same origin), scripts (no Origin) and JSON Lines still write
    own = url  # the origin of the page the server itself serves
    r = httpx.post(url + "/papers", json={"records": [_record("own-1")]}, headers={"Origin": own})
    assert r.status_code == 200 and r.json()["indexed"] == 1
    r = httpx.post(url + "/papers", content=json.dumps(_record("own-2")) + "\n",
                   headers={"Content-Type": "application/x-ndjson; charset=utf-8"})
    assert r.status_code == 200 and r.json()["indexed"] == 1
    assert httpx.delete(url + "/papers/own-1", headers={"Origin": own}).status_code == 200
    assert httpx.delete(url + "/papers/own-2").status_code == 200
    # a query is a read: any origin may send one (it cannot read the answer without CORS)
    assert httpx.post(url + "/query", json={"paper_id": QID, "facet": "method", "k": 1},
                      headers={"Origin": EVIL}).status_code == 200


def test_a_cors_origin_may_write(index_dir_30, encoder, tmp_path_factory):
    path = _copy(index_dir_30, tmp_path_factory, "hostile-cors")
    with _serve(path, encoder, cors_origins=["https://library.example"], warm=False) as url:
        r = httpx.post(url + "/papers", json={"records": [_record("cors-1")]}, headers={"Origin": "https://library.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://library.example"
        _refused(httpx.post(url + "/papers", json={"records": [_record("cors-2")]}, headers={"Origin": EVIL}), 403)


def test_a_rebound_dns_name_gets_nothing_from_a_loopback_server(open_server):
    url, _ = open_server
    port = url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        _refused(httpx.get(url + "/stats", headers={"Host": host}), 400, "host name")
        _refused(httpx.post(url + "/query", json={"paper_id": QID, "k": 1}, headers={"Host": host}), 400)
        _refused(httpx.post(url + "/papers", json={"records": [_record("rebound-1")]}, headers={"Host": host}), 400)
        _refused(httpx.delete(url + f"/papers/{QID}", headers={"Host": host}), 400)
    assert httpx.get(url + f"/papers/{QID}").status_code == 200
    assert httpx.get(url + "/papers/rebound-1").status_code == 404
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
        assert httpx.get(url + "/stats", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_name_the_hosts_a_server_answers_to(index_dir_30, encoder, tmp_path_factory):
    path = _copy(index_dir_30, tmp_path_factory, "hostile-hosts")
    with _serve(path, encoder, allowed_hosts=["papers.example.org"], warm=False) as url:
        assert httpx.get(url + "/health", headers={"Host": "papers.example.org"}).status_code == 200
        assert httpx.get(url + "/health", headers={"Host": "localhost"}).status_code == 200  # on loopback: yes
        _refused(httpx.get(url + "/health", headers={"Host": "other.example.org"}), 400)


# --- 4. raw engine DSL --------------------------------------------------------------------------------

ATTACKS = {
    "script": {"script": {"script": {"source": "Runtime.getRuntime()", "lang": "painless"}}},
    "wrapper": {"wrapper": {"query": "eyJtYXRjaF9hbGwiOnt9fQ=="}},
    "terms lookup": {"terms": {"lang": {"index": "secrets", "id": "1", "path": "password"}}},
    "query_string": {"query_string": {"query": "*"}},
    "nested script": {"bool": {"filter": [{"term": {"lang": "en"}}, {"script": {"script": "1"}}]}},
    "_index field": {"term": {"_index": "other-index"}},
    "wildcard field": {"exists": {"field": "meta_*"}},
    "has_child": {"has_child": {"type": "x", "query": {"match_all": {}}}},
    "range without bounds object": {"range": {"year": 2019}},
    "object value": {"term": {"lang": {"value": {"script": 1}}}},
}


def test_untrusted_engine_filters_are_limited_to_safe_clauses():
    from esqbe.backends.engines.filters import (
        SAFE_MAX_CLAUSES,
        SAFE_MAX_DEPTH,
        check_safe_clause,
    )

    safe = [{"term": {"meta_kw.lang": "en"}}, {"terms": {"meta_kw.venue": ["ACL", "EMNLP"]}},
            {"range": {"meta_num.year": {"gte": 2019, "lt": 2024}}}, {"exists": {"field": "meta_kw.doi"}},
            {"match": {"title": {"query": "parser", "operator": "and"}}}, {"prefix": {"meta_kw.venue": "AC"}},
            {"bool": {"must": [{"term": {"a": 1}}], "should": {"match": {"title": "x"}}, "minimum_should_match": 1,
                      "must_not": [{"exists": {"field": "b"}}], "filter": [{"term": {"c": True}}]}}]
    for clause in safe:
        check_safe_clause(clause)
    for _name, clause in ATTACKS.items():
        with pytest.raises(FilterError):
            check_safe_clause(clause)
    deep = {"term": {"a": 1}}
    for _ in range(SAFE_MAX_DEPTH):
        deep = {"bool": {"must": [deep]}}
    with pytest.raises(FilterError, match="deeper"):
        check_safe_clause(deep)
    with pytest.raises(FilterError, match="clauses"):
        check_safe_clause({"bool": {"should": [{"term": {"a": i}} for i in range(SAFE_MAX_CLAUSES)]}})


def test_engine_dsl_from_anyone_is_refused_over_http(open_server, index_dir_30, encoder, tmp_path_factory):
    url, _ = open_server
    ask = {"paper_id": QID, "facet": "method", "k": 2}
    for name, clause in ATTACKS.items():
        message = _refused(httpx.post(url + "/query", json={**ask, "engine_filter": clause}), 400, "engine_filter")
        assert "elasticsearch" not in message.lower(), name  # refused for what it is, before the backend is asked
    # a safe clause on the embedded backend: the request's fault (400), not an unavailable backend (503)
    _refused(httpx.post(url + "/query", json={**ask, "engine_filter": {"term": {"lang": "en"}}}), 400, "elasticsearch")
    path = _copy(index_dir_30, tmp_path_factory, "hostile-raw")
    with _serve(path, encoder, token=TOKEN, allow_raw_engine_filter=True, warm=False) as raw:
        wrapper = {**ask, "engine_filter": ATTACKS["wrapper"]}
        _refused(httpx.post(raw + "/query", json=wrapper), 400, "needs the bearer token")
        # with the token the raw clause passes the check (and this embedded index then says what it cannot do)
        _refused(httpx.post(raw + "/query", json=wrapper, headers=AUTH, timeout=60), 400, "elasticsearch")


# --- 8. tokens, private reads, auth before the body ------------------------------------------------


def test_weak_tokens_are_refused_at_start_and_the_token_can_come_from_a_file(index_dir_30, tmp_path, monkeypatch, capsys):
    for weak in ("s3cret", "x" * 15):
        with pytest.raises(ConfigError, match="at least 16"):
            create_app(str(index_dir_30), config=None, options=ServeOptions(host="0.0.0.0", token=weak))
    from cli import main

    monkeypatch.setenv("ESQBE_TOKEN", "short")
    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--path", str(index_dir_30)])
    assert r.exit_code == 1 and "at least 16" in r.output and "Traceback" not in r.output
    monkeypatch.delenv("ESQBE_TOKEN")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert options_from_env(token_file=str(token_file), host="0.0.0.0").token == TOKEN
    assert "visible" not in capsys.readouterr().err
    assert options_from_env(token=TOKEN).token == TOKEN
    assert "visible to other users" in capsys.readouterr().err  # --token shows in ps
    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--path", str(index_dir_30), "--token-file", str(tmp_path / "none")])
    assert r.exit_code == 1 and "cannot read the token file" in r.output and "Traceback" not in r.output
    for flag in ("--private", "--allow-raw-engine-filter"):
        r = CliRunner().invoke(main, ["serve", flag, "--path", str(index_dir_30)])
        assert r.exit_code == 1 and "needs a token" in r.output


def test_a_private_library_needs_the_token_for_reads(index_dir_30, encoder, tmp_path_factory):
    path = _copy(index_dir_30, tmp_path_factory, "hostile-private")
    with _serve(path, encoder, token=TOKEN, private=True, warm=False) as url:
        reads = [("GET", "/stats", None), ("GET", f"/papers/{QID}", None), ("GET", "/search?q=parser", None),
                 ("POST", "/query", {"paper_id": QID, "facet": "method", "k": 1})]
        for method, route, body in reads:
            r = httpx.request(method, url + route, json=body, timeout=60)
            _refused(r, 401, "bearer")
            assert r.headers["www-authenticate"].startswith("Bearer")
            _refused(httpx.request(method, url + route, json=body, headers={"Authorization": "Bearer wrong"}), 401, "wrong")
            assert httpx.request(method, url + route, json=body, headers=AUTH, timeout=60).status_code == 200, route
        # the page (which asks for the token), its assets, health and the API docs stay open
        for route in ("/", "/static/app.js", "/health", "/openapi.json"):
            assert httpx.get(url + route).status_code == 200, route
        assert "sessionStorage" in httpx.get(url + "/static/app.js").text


def test_a_body_sent_without_the_token_is_not_read(index_dir_30, encoder, tmp_path_factory):
    """A write route without the token answers 401 at once: it does not wait for (and buffer) a body the
    client announced. The client here sends 1 KiB of the 8 MB it announced, then waits for the answer."""
    path = _copy(index_dir_30, tmp_path_factory, "hostile-body")
    with _serve(path, encoder, token=TOKEN, warm=False) as url:
        port = int(url.rsplit(":", 1)[1])
        for method, route in (("POST", "/papers"), ("DELETE", f"/papers/{QID}")):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(f"{method} {route} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: 8000000\r\n\r\n".encode() + b"[" * 1024)
                try:
                    head = s.recv(4096).decode("latin-1")
                except TimeoutError:
                    head = "no answer while the body was unsent"
            assert head.startswith("HTTP/1.1 401"), head
        assert httpx.get(url + f"/papers/{QID}").status_code == 200


# --- 8. the write lock, internal paths, the app factory --------------------------------------------


def test_a_write_lock_held_elsewhere_answers_503_naming_the_holder(index_dir_30, encoder, tmp_path_factory):
    path = _copy(index_dir_30, tmp_path_factory, "hostile-lock")
    with _serve(path, encoder, write_lock_timeout=1, warm=False) as url:
        with esqbe.open_index(str(path), encoder=encoder, config=None, create=False) as other:
            other.backend.begin_write()  # another handle (here in this process) holds the write lock
            r = httpx.post(url + "/papers", json={"records": [_record("locked-1")]}, timeout=60)
            message = _refused(r, 503, f"pid {os.getpid()}")
            assert "write lock" in message and int(r.headers["retry-after"]) >= 1
            assert str(path) not in r.text
            _refused(httpx.delete(url + f"/papers/{QID}", timeout=60), 503, "write lock")
        r = httpx.post(url + "/papers", json={"records": [_record("locked-1")]}, timeout=60)  # the lock is free again
        assert r.status_code == 200 and r.json()["indexed"] == 1


def test_stats_and_errors_carry_no_internal_paths(index_dir_30, encoder, tmp_path_factory, caplog):
    path = _copy(index_dir_30, tmp_path_factory, "hostile-paths")
    with _serve(path, encoder, warm=False) as url:
        stats = httpx.get(url + "/stats")
        assert stats.status_code == 200 and stats.json()["path"] == path.name
        assert str(path.parent) not in stats.text
        # an error whose message names the index directory: the write lock file replaced by a directory
        (path / "write.lock").unlink(missing_ok=True)
        (path / "write.lock").mkdir()
        with caplog.at_level(logging.WARNING, logger="esqbe.server"):
            r = httpx.post(url + "/papers", json={"records": [_record("paths-1")]}, timeout=60)
        message = _refused(r, 503, "cannot write to the index")
        assert str(path.parent) not in r.text and "/tmp" not in r.text and "request " in message
        request_id = message.split("request ", 1)[1].split(":", 1)[0]
        assert any(request_id in rec.getMessage() and str(path) in rec.getMessage() for rec in caplog.records)
    path2 = _copy(index_dir_30, tmp_path_factory, "hostile-paths-shown")
    with _serve(path2, encoder, show_paths=True, warm=False) as url:
        assert httpx.get(url + "/stats").json()["path"] == str(path2)


def test_the_app_factory_needs_an_explicit_exposure(index_dir_30, encoder):
    for options in (None, ServeOptions(), ServeOptions(port=9000, token=None)):
        with pytest.raises(ConfigError, match="who can reach"):
            create_app(str(index_dir_30), config=None, encoder=encoder, options=options)
    create_app(str(index_dir_30), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))
    create_app(str(index_dir_30), config=None, encoder=encoder, options=ServeOptions(token=TOKEN))
    with pytest.raises(ConfigError, match="token"):
        create_app(str(index_dir_30), config=None, encoder=encoder, options=ServeOptions(host="0.0.0.0"))
