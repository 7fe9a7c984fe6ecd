"""`esqbe query` answered by a running `esqbe serve` (a warm model for CLI queries): a real `esqbe serve` process
on 127.0.0.1 over a real index, and the real CLI as a process (the local runs its output is compared with run in this
process). The server's answer prints exactly what a local run prints; records that must not be trusted (stale, another
index, writable by others, other settings) are not used; `--server URL` names one; a server that fails leaves the
query to the CLI."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from esqbe.server import discovery
from esqbe.settings.config import load_settings

from .conftest import REPO, SAMPLE, Ran, esqbe_cli

QID = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]
TEXT = ("We propose a neural parser trained with back-translation. We train a transformer on parallel data. "
        "It improves accuracy on three treebanks.")
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
for _var in ("ESQBE_TOKEN", "ESQBE_CONFIG", "ESQBE_INDEX_PATH", "ESQBE_BACKEND"):
    ENV.pop(_var, None)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args, cwd, timeout=300, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=cwd, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _here(*args, cwd) -> Ran:
    """The same command run in this process (the reference a server's answer is compared with, or a query answered
    locally): a real process would load the model again for every text query."""
    return esqbe_cli(*args, cwd=cwd, env=dict.fromkeys(set(os.environ) - set(ENV)))


class Served:
    """`esqbe serve --path PATH --port P` as a process; its output collected line by line."""

    def __init__(self, path: Path, cwd: Path):
        import httpx

        self.path, self.port = path, _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--path", str(path), "--port", str(self.port)],
                                     cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")), daemon=True).start()
        deadline = time.time() + 240
        while not (self.ready(httpx) and list(discovery.records(self.settings))):
            assert self.proc.poll() is None and time.time() < deadline, "".join(self.lines)
            time.sleep(0.2)

    @property
    def settings(self):
        return load_settings(None).replace(path=str(self.path))

    def ready(self, httpx) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def queries_answered(self) -> int:
        return sum("POST /query" in line for line in self.lines)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory, index_dir_30):
    root = tmp_path_factory.mktemp("warm")
    path = root / "index"
    shutil.copytree(index_dir_30, path)
    server = Served(path, root)
    yield server
    server.stop()
    out = "".join(server.lines)
    assert server.proc.returncode == 0 and "Traceback" not in out, out
    # a clean shutdown takes its record away (and the empty records directory)
    assert not (path / discovery.RECORD_DIR).exists()


def _answered_by(stderr: str, url: str) -> bool:
    return f"answered by the server at {url}" in stderr


@pytest.mark.parametrize("extra", [(), ("--json",), ("--format", "bibtex"), ("--format", "csv"), ("--format", "ris"),
                                   ("--format", "csl-json", "--with-scores")])
def test_a_running_server_answers_paper_queries_with_the_same_output(served, extra):
    args = ("query", "--path", served.path, "--paper", QID, "--facet", "method", "-k", "5", *extra)
    before = served.queries_answered()
    warm = cli(*args, cwd=served.path.parent)
    assert warm.returncode == 0, warm.stderr
    assert _answered_by(warm.stderr, served.url) and len(warm.stderr.strip().splitlines()) == 1, warm.stderr
    time.sleep(0.5)  # the access log line
    assert served.queries_answered() == before + 1  # the server's log: it answered this query
    here = _here(*args, "--no-server", cwd=served.path.parent)
    assert here.returncode == 0 and "server" not in here.stderr, here.stderr
    assert served.queries_answered() == before + 1  # --no-server: not asked
    if extra == ("--json",):  # field for field; only the times differ
        warm_json, here_json = json.loads(warm.stdout), json.loads(here.stdout)
        warm_json.pop("timings_ms"), here_json.pop("timings_ms")
        assert warm_json == here_json
    else:
        assert warm.stdout == here.stdout  # byte for byte


def test_a_warm_server_keeps_its_startup_objects_out_of_the_garbage_collectors_walks(served):
    """`esqbe serve` freezes what warming allocated (ServeOptions.freeze_gc), after warming and before it says ready:
    a full collection in the server then walks only what requests allocate."""
    said = [line for line in served.lines if "kept out of the garbage collector's walks" in line]
    assert len(said) == 1, "".join(served.lines)
    assert int(said[0].split("warm; ")[1].split(" objects")[0].replace(",", "")) > 10_000  # the libraries, the model


def test_a_running_server_answers_text_queries(served):
    """A --text query is encoded by the server's warm model: the same hits and sentences as encoding it here."""
    args = ("query", "--path", served.path, "--text", TEXT, "--facet", "method", "-k", "5", "--json")
    warm = cli(*args, cwd=served.path.parent)
    assert warm.returncode == 0 and _answered_by(warm.stderr, served.url), warm.stderr
    here = _here(*args, "--no-server", cwd=served.path.parent)
    assert here.returncode == 0, here.stderr
    a, b = json.loads(warm.stdout), json.loads(here.stdout)
    assert a["query"] == b["query"]
    assert [h["paper_id"] for h in a["hits"]] == [h["paper_id"] for h in b["hits"]]
    for x, y in zip(a["hits"], b["hits"]):
        assert x["similarity"] == pytest.approx(y["similarity"], abs=1e-5)
        assert [(m["query_index"], m["candidate_index"]) for m in x["matches"]] == \
               [(m["query_index"], m["candidate_index"]) for m in y["matches"]]
    quiet = cli("query", "--path", served.path, "--text", TEXT, "--facet", "method", "-k", "2", "-q",
                cwd=served.path.parent)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr  # -q: not said
    assert "query text, facet method" in quiet.stdout


def test_a_configs_query_settings_go_to_the_server_with_the_query(served, tmp_path):
    """ a config's `k: 5` (any setting the HTTP API carries, a facet's own, the default facet) is
    sent with the query, so the warm server answers it, as a local run would, instead of the model loading here."""
    config = tmp_path / "esqbe.yaml"
    config.write_text("k: 3\nfinal_bm25_weight: 0.3\nfusion: linear\ndefault_facet: method\n"
                      "facet_settings: {method: {abstract_weight: 0.2}}\n")
    for query in (("--paper", QID), ("--text", TEXT)):
        args = ("query", "--path", served.path, *query, "--config", config, "--json")
        before = served.queries_answered()
        warm = cli(*args, cwd=served.path.parent)
        assert warm.returncode == 0 and _answered_by(warm.stderr, served.url), warm.stderr
        time.sleep(0.5)  # the access log line
        assert served.queries_answered() == before + 1
        here = _here(*args, "--no-server", cwd=served.path.parent)
        assert here.returncode == 0, here.stderr
        a, b = json.loads(warm.stdout), json.loads(here.stdout)
        assert a["query"]["facet"] == "method" and len(a["hits"]) == 3
        assert [h["paper_id"] for h in a["hits"]] == [h["paper_id"] for h in b["hits"]]
        assert [h["score"] for h in a["hits"]] == pytest.approx([h["score"] for h in b["hits"]], abs=1e-5)


def test_settings_that_differ_are_not_answered_by_the_server(served, tmp_path):
    config = tmp_path / "other.yaml"
    config.write_text("prf_docs: 2\n")  # a setting the HTTP API does not carry
    r = cli("query", "--path", served.path, "--paper", QID, "--facet", "method", "--config", config,
            cwd=served.path.parent)
    assert r.returncode == 0 and not _answered_by(r.stderr, served.url)
    assert "runs with other settings (prf_docs)" in r.stderr
    # a flag the HTTP API does not take: answered here, said why
    r = cli("query", "--path", served.path, "--paper", QID, "--facet", "method", "--prf-docs", "2",
            cwd=served.path.parent)
    assert r.returncode == 0 and not _answered_by(r.stderr, served.url)
    assert "--prf-docs is not a setting a server takes over HTTP" in r.stderr
    # a flag it does take goes with the query
    r = cli("query", "--path", served.path, "--paper", QID, "--facet", "method", "--bm25-weight", "0.4", "-k", "2",
            "--json", cwd=served.path.parent)
    assert r.returncode == 0 and _answered_by(r.stderr, served.url) and len(json.loads(r.stdout)["hits"]) == 2


SECRET = "5e" * 32


def _record(folder: Path, url: str, pid: int, ident: str, settings, mode=0o600, name="127.0.0.1_1.json",
            secret=SECRET) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"version": discovery.RECORD_VERSION, "url": url, "pid": pid, "index_id": ident,
                                "index": "x", "settings": discovery.settings_digests(settings), "started": 0,
                                "secret": secret}))
    path.chmod(mode)
    return path


def test_stale_records_are_ignored_and_removed(index_dir_30, tmp_path):
    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    settings = load_settings(None).replace(path=str(path))
    ident = discovery.index_id(settings)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = path / discovery.RECORD_DIR
    gone = _record(folder, f"http://127.0.0.1:{_port()}", dead.pid, ident, settings, name="dead.json")
    closed = _record(folder, f"http://127.0.0.1:{_port()}", os.getpid(), ident, settings, name="closed.json")
    r = cli("query", "--path", path, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
    assert r.returncode == 0 and "server" not in r.stderr, r.stderr
    assert "paper " + QID in r.stdout
    assert not gone.exists()  # the process is dead
    assert not closed.exists()  # nothing listens where it said


def test_records_of_another_index_or_writable_by_others_are_not_used(served, tmp_path):
    # the served index copied, its record with it: the copy is another index
    copy = tmp_path / "copy"
    shutil.copytree(served.path, copy)
    copied = list((copy / discovery.RECORD_DIR).glob("*.json"))
    assert copied
    r = cli("query", "--path", copy, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
    assert r.returncode == 0 and "server" not in r.stderr, r.stderr
    assert not any(p.exists() for p in copied)  # a record of another index: removed
    settings = load_settings(None).replace(path=str(copy))
    ident = discovery.index_id(settings)
    # a record others may write is not trusted, even naming a live server
    open_to_all = _record(copy / discovery.RECORD_DIR, served.url, served.proc.pid, ident, settings, mode=0o666)
    before = served.queries_answered()
    r = cli("query", "--path", copy, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
    assert r.returncode == 0 and "server" not in r.stderr, r.stderr
    assert served.queries_answered() == before
    # a record of this user naming a live esqbe server of another index, which cannot prove it wrote this record
    # (its secret and index differ): not asked, the record removed
    open_to_all.chmod(0o600)
    r = cli("query", "--path", copy, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
    assert r.returncode == 0 and "paper " + QID in r.stdout, r.stderr
    assert "did not prove it is the esqbe serve that wrote the discovery record" in r.stderr, r.stderr
    assert "its answer to the challenge is not the record's proof" in r.stderr, r.stderr
    assert served.queries_answered() == before and not open_to_all.exists()
    # a record naming a server that is not on loopback is not used
    remote = _record(copy / discovery.RECORD_DIR, "http://192.0.2.1:8000", served.proc.pid, ident, settings,
                     name="remote.json")
    r = cli("query", "--path", copy, "--paper", QID, "--facet", "method", "-k", "2", "--server-timeout", "2",
            cwd=tmp_path)
    assert r.returncode == 0 and "server" not in r.stderr, r.stderr
    assert remote.exists()


class _Broken(http.server.BaseHTTPRequestHandler):
    """A server that fails every query (500), or never answers (`slow`); it holds the record's secret (`index_id`:
    the index it proves it serves), as a genuine server that then fails would."""

    slow = False
    close_after_proof = False
    posts = 0
    index_id = ""
    protocol_version = "HTTP/1.1"  # keep-alive: the query follows the proof on one connection

    def do_GET(self):  # noqa: N802
        from urllib.parse import parse_qs, urlsplit

        nonce = parse_qs(urlsplit(self.path).query).get("nonce", [""])[0]
        body = json.dumps({"proof": discovery.proof(SECRET, nonce, self.index_id)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_after_proof:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        type(self).posts += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.slow:
            time.sleep(5)
        body = json.dumps({"error": {"status": 500, "message": "something broke"}}).encode()
        try:
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (the `slow` case): what the test wants, not an error to print

    def log_message(self, *args):
        pass


@pytest.fixture
def broken():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    _Broken.slow = _Broken.close_after_proof = False
    _Broken.posts = 0


def test_a_found_server_that_fails_leaves_the_query_here(index_dir_30, tmp_path, broken):
    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    settings = load_settings(None).replace(path=str(path))
    _Broken.index_id = discovery.index_id(settings)
    _record(path / discovery.RECORD_DIR, broken, os.getpid(), discovery.index_id(settings), settings)
    r = cli("query", "--path", path, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and "failed (500): something broke; answering here" in warnings[0], r.stderr
    assert "paper " + QID in r.stdout


def test_the_query_goes_over_the_connection_the_proof_came_on(index_dir_30, tmp_path, broken):
    """A listener that proves itself and then closes the connection gets no query: the client does not open another
    (which whoever holds the port then could answer)."""
    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    settings = load_settings(None).replace(path=str(path))
    _Broken.index_id, _Broken.close_after_proof = discovery.index_id(settings), True
    _record(path / discovery.RECORD_DIR, broken, os.getpid(), discovery.index_id(settings), settings)
    r = cli("query", "--path", path, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
    assert r.returncode == 0 and "paper " + QID in r.stdout, r.stderr
    assert f"the server at {broken} closed the connection it proved itself on; answering here" in r.stderr, r.stderr
    assert _Broken.posts == 0


def test_server_flag(served, tmp_path, broken):
    # any server the user names; the command line's --path does not matter
    r = cli("query", "--server", served.url, "--paper", QID, "--facet", "method", "-k", "3", "--json", cwd=tmp_path)
    assert r.returncode == 0 and _answered_by(r.stderr, served.url), r.stderr
    assert len(json.loads(r.stdout)["hits"]) == 3
    # the query's own fault: the server's message, exit 1 as here
    r = cli("query", "--server", served.url, "--paper", "no-such-paper", "--facet", "method", cwd=tmp_path)
    assert r.returncode == 1 and "paper no-such-paper is not in the index" in r.stderr, r.stderr
    # a server that fails, none that listens, one that is too slow: exit 4, one line, no traceback
    for url, extra, message in ((broken, (), "failed (500): something broke"),
                                (f"http://127.0.0.1:{_port()}", (), "cannot be reached"),
                                (broken, ("--server-timeout", "1"), "did not answer within 1 s")):
        _Broken.slow = "--server-timeout" in extra
        r = cli("query", "--server", url, "--paper", QID, "--facet", "method", *extra, cwd=tmp_path)
        assert r.returncode == 4 and message in r.stderr, (url, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # what HTTP does not carry is a usage error with --server
    r = cli("query", "--server", served.url, "--paper", QID, "--facet", "method", "--prf-docs", "2", cwd=tmp_path)
    assert r.returncode == 2 and "--prf-docs" in r.stderr
    r = cli("query", "--server", served.url, "--no-server", "--paper", QID, cwd=tmp_path)
    assert r.returncode == 2


def test_a_record_only_for_a_server_this_machine_may_query_by_loopback(index_dir_30, tmp_path):
    """No record for a private server (reads need the token) or one that listens on another address only; a server
    on all addresses is recorded at its loopback address."""
    from esqbe.server.app import _record
    from esqbe.server.options import ServeOptions

    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    settings = load_settings(None).replace(path=str(path))
    token = "t" * 32
    assert _record(settings, ServeOptions(host="127.0.0.1", port=9, private=True, token=token), SECRET) is None
    assert _record(settings, ServeOptions(host="192.0.2.1", port=9, token=token), SECRET) is None
    assert not (path / discovery.RECORD_DIR).exists()
    written = _record(settings, ServeOptions(host="0.0.0.0", port=9, token=token), SECRET)
    record = json.loads(written.read_text())
    assert record["url"] == "http://127.0.0.1:9" and record["pid"] == os.getpid() and record["secret"] == SECRET
    assert record["index_id"] == discovery.index_id(settings) and "index" in record
    assert written.stat().st_mode & 0o777 == 0o600 and written.parent.stat().st_mode & 0o777 == 0o700
    assert not any(v in written.read_text() for v in ("summax", "rrf"))  # digests, not the settings' values
    discovery.remove_record(written)
    assert not (path / discovery.RECORD_DIR).exists()


def test_an_engine_index_keeps_its_records_in_the_users_cache_keyed_by_url_and_index(monkeypatch, tmp_path):
    """An engine index has no directory of its own here: its records go to the user's cache directory, one folder per
    engine URL and index name; credentials in the URL are no part of the identity (nor written anywhere)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    base = load_settings(None).replace(backend="elasticsearch", url="http://localhost:9200", index="papers")
    with_creds = base.replace(url="http://elastic:s3cret@localhost:9200/")
    other = base.replace(index="other")
    folder = discovery.record_dir(base)
    assert folder.parent == tmp_path / "cache" / "esqbe" / "servers"
    assert discovery.record_dir(with_creds) == folder != discovery.record_dir(other)
    assert discovery.index_id(with_creds) == discovery.index_id(base) != discovery.index_id(other)
    written = discovery.write_record(with_creds, "http://127.0.0.1:9", SECRET)
    assert written.parent == folder and "s3cret" not in written.read_text()
    assert json.loads(written.read_text())["index"] == "http://localhost:9200/papers"
    found, _ = discovery.find_servers(base)
    assert [s.url for s in found] == ["http://127.0.0.1:9"]  # this process is alive; the URL is only read here
    discovery.remove_record(written)


def test_server_flag_sends_the_token_to_a_private_server(index_dir_30, encoder, tmp_path):
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    token = "private-library-token-0123456789"
    app = create_app(str(index_dir_30), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", private=True, token=token))
    with LiveServer(app) as url:
        r = cli("query", "--server", url, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
        assert r.returncode == 1 and "refused the query (401)" in r.stderr, r.stderr
        r = cli("query", "--server", url, "--paper", QID, "--facet", "method", "-k", "2", "--json", cwd=tmp_path,
                env={"ESQBE_TOKEN": token})
        assert r.returncode == 0 and _answered_by(r.stderr, url) and len(json.loads(r.stdout)["hits"]) == 2, r.stderr


#: a process of another user that binds a dead server's port: answers everything with a fake result (a proof that is
#: not one, the index's id, which anyone who can stat the index directory can compute) and logs what it receives
IMPOSTOR = r'''
import http.server, json, sys
port, log, ident = int(sys.argv[1]), sys.argv[2], sys.argv[3]
FAKE = {"version": 1, "query": {"paper_id": None, "facet": "method", "sentences": []}, "rescorer": "summax",
        "rescorer_params": {}, "similarity": "s", "match_weight": "w", "timings_ms": {}, "proof": "0" * 64,
        "hits": [{"rank": 1, "paper_id": "IMPOSTOR-1", "title": "IMPOSTOR HIT", "similarity": 1.0, "score": 1.0,
                  "first_stage_score": 1.0, "bm25": 1.0, "knn": 1.0, "matches": []}]}

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(log, "ab") as f:
            f.write(self.requestline.encode() + b"\n" + bytes(self.headers) + data + b"\n")
        out = json.dumps(FAKE).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Esqbe-Index", ident)
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = answer

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def test_a_process_that_took_a_dead_servers_port_gets_no_query(index_dir_30, tmp_path):
    """ a real `esqbe serve` answers, is killed (SIGKILL: its record stays), and another process
    binds its port, its pid being the record's (pids are recycled: the test writes the impostor's pid into the
    record instead of forking ~20 s until the pid comes round). The query's text never reaches it, its answer is
    not printed, the record is removed and the query is answered here, saying why on stderr."""
    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    server = Served(path, tmp_path)
    try:
        (record,) = discovery.records(server.settings)
        held = json.loads(record.read_text())
        assert record.stat().st_mode & 0o777 == 0o600 and len(held["secret"]) == 64
        # the genuine server proves itself and answers
        r = cli("query", "--path", path, "--paper", QID, "--facet", "method", "-k", "2", cwd=tmp_path)
        assert r.returncode == 0 and _answered_by(r.stderr, server.url), r.stderr
    finally:
        server.proc.kill()
        server.proc.wait(timeout=30)
    assert record.exists()  # SIGKILL: no clean shutdown took it away
    log = tmp_path / "impostor.log"
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(server.port), str(log), held["index_id"]])
    try:
        deadline = time.time() + 30
        while True:  # until it listens on the port
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                break
            except OSError:
                assert impostor.poll() is None and time.time() < deadline
                time.sleep(0.1)
        log.unlink(missing_ok=True)  # (the probe above)
        record.write_text(json.dumps({**held, "pid": impostor.pid}))  # the recycled pid
        secret_text = "CONFIDENTIAL merger plan. " + TEXT
        r = _here("query", "--path", path, "--text", secret_text, "--facet", "method", "-k", "2", cwd=tmp_path)
        received = log.read_bytes() if log.exists() else b""
    finally:
        impostor.kill()
        impostor.wait(timeout=30)
    assert b"GET /proof?nonce=" in received  # it was challenged ...
    assert b"CONFIDENTIAL" not in received and b"POST" not in received, received  # ... and sent nothing else
    assert r.returncode == 0, r.stderr
    assert "IMPOSTOR" not in r.stdout and "query text, facet method" in r.stdout, r.stdout  # answered here
    assert not _answered_by(r.stderr, server.url)
    assert (f"the process listening at {server.url} did not prove it is the esqbe serve that wrote the discovery "
            "record (its answer to the challenge is not the record's proof): the query was not sent to it, its "
            "record is removed; answering here") in r.stderr, r.stderr
    assert not record.exists()


def test_proof_endpoint(index_dir_30, encoder):
    """GET /proof answers a well-formed nonce with the HMAC a client checks, only on a server that left a record
    (its secret); an app without one (mounted, embedded) says 404, a malformed nonce 422."""
    import httpx

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    app = create_app(str(index_dir_30), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))
    ident = discovery.index_id(load_settings(None).replace(path=str(index_dir_30)))
    nonce = discovery.new_nonce()
    with LiveServer(app) as url:
        assert httpx.get(f"{url}/proof", params={"nonce": nonce}).status_code == 404
        app.state.record_secret = SECRET  # what serve() sets when it writes a record
        r = httpx.get(f"{url}/proof", params={"nonce": nonce})
        assert r.status_code == 200 and r.headers[discovery.INDEX_HEADER] == ident
        assert discovery.proof_holds(SECRET, nonce, ident, r.json()["proof"])
        assert not discovery.proof_holds("00" * 32, nonce, ident, r.json()["proof"])  # another secret's proof
        assert not discovery.proof_holds(SECRET, discovery.new_nonce(), ident, r.json()["proof"])  # another nonce's
        for bad in ("", "xyz", nonce.upper(), nonce + "0"):
            assert httpx.get(f"{url}/proof", params={"nonce": bad}).status_code == 422
