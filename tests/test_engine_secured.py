"""Integration tests against SECURED clusters: TLS from a generated CA, a password, and on
Elasticsearch a least-privilege API key (no `monitor` privilege: GET / answers 403). index -> query -> rescore
through the CLI with `--ca-certs`, by basic auth and by API key. These need a real engine and are skipped
here with the reason (where no docker engine is).

Where the cluster comes from, per engine:
- an already running secured cluster: `ESQBE_ES_SECURED_URL` (https://HOST:9200) with `ESQBE_ES_PASSWORD`
  (user `elastic`, or `ESQBE_ES_USERNAME`), `ESQBE_ES_CA_CERTS` and optionally `ESQBE_ES_API_KEY` (encoded,
  least-privilege on `esqbe*`); OpenSearch: `ESQBE_OS_SECURED_URL`, `ESQBE_OS_PASSWORD` (user `admin`, or
  `ESQBE_OS_USERNAME`), `ESQBE_OS_CA_CERTS`;
- else a docker engine with `docker compose` and the image pulled: docker/elasticsearch-secured.yml /
  docker/opensearch-secured.yml are started on ports 19210 / 19211 (ESQBE_ES_PORT / ESQBE_OS_PORT) with a
  fresh password, the CA (and the API key) are copied out of the node, and everything is removed afterwards;
- else skipped, saying what is missing.
"""
from __future__ import annotations

import itertools
import json
import os
import secrets
import ssl
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from .test_engine_integration import SAMPLE, docker_problem

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
N_PAPERS = 30

SECURED = {
    "elasticsearch": {
        "compose": ROOT / "docker" / "elasticsearch-secured.yml",
        "url_env": "ESQBE_ES_SECURED_URL", "password_env": "ESQBE_ES_PASSWORD", "ca_env": "ESQBE_ES_CA_CERTS",
        "user_env": "ESQBE_ES_USERNAME", "user": "elastic", "api_key_env": "ESQBE_ES_API_KEY",
        "port_env": "ESQBE_ES_PORT", "port": 19210, "version_env": "ES_VERSION", "version": "9.5.1",
        "image": "docker.elastic.co/elasticsearch/elasticsearch:{}",
        "node": "es01", "done": "api-key",
        "ca_path": "/usr/share/elasticsearch/config/certs/ca/ca.crt",
        "api_key_path": "/usr/share/elasticsearch/config/certs/esqbe/api_key",
    },
    "opensearch": {
        "compose": ROOT / "docker" / "opensearch-secured.yml",
        "url_env": "ESQBE_OS_SECURED_URL", "password_env": "ESQBE_OS_PASSWORD", "ca_env": "ESQBE_OS_CA_CERTS",
        "user_env": "ESQBE_OS_USERNAME", "user": "admin", "api_key_env": None,
        "port_env": "ESQBE_OS_PORT", "port": 19211, "version_env": "OS_VERSION", "version": "3.5.0",
        "image": "opensearchproject/opensearch:{}",
        "node": "os01", "done": "ready",
        "ca_path": "/usr/share/opensearch/config/esqbe-certs/ca.crt",
        "api_key_path": None,
    },
}


def _compose(cfg, project, *args, env=None, timeout=900):
    return subprocess.run(["docker", "compose", "-p", project, "-f", str(cfg["compose"]), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _healthy(url: str, ca: str, user: str, password: str) -> bool:
    request = urllib.request.Request(f"{url}/_cluster/health")
    request.add_header("Authorization", "Basic " + __import__("base64").b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=ca)) as resp:
            return json.load(resp).get("status") in ("yellow", "green")
    except Exception:
        return False


@pytest.fixture(scope="module", params=sorted(SECURED))
def secured(request, tmp_path_factory):
    """A secured cluster: dict(kind, url, username, password, ca_certs, api_key), or a skip with the reason."""
    kind = request.param
    cfg = SECURED[kind]
    url = os.environ.get(cfg["url_env"])
    if url:
        missing = [e for e in (cfg["password_env"], cfg["ca_env"]) if not os.environ.get(e)]
        if missing:
            pytest.skip(f"{kind}: {cfg['url_env']} is set but {', '.join(missing)} is not")
        yield {"kind": kind, "url": url.rstrip("/"), "username": os.environ.get(cfg["user_env"], cfg["user"]),
               "password": os.environ[cfg["password_env"]], "ca_certs": os.environ[cfg["ca_env"]],
               "api_key": os.environ.get(cfg["api_key_env"]) if cfg["api_key_env"] else None}
        return
    version = os.environ.get(cfg["version_env"], cfg["version"])
    image = cfg["image"].format(version)
    problem = docker_problem(image)
    if problem:
        pytest.skip(f"{kind} (secured): no cluster to test against: set {cfg['url_env']}=https://HOST:9200 with "
                    f"{cfg['password_env']} and {cfg['ca_env']}, or provide a docker engine with {image}; here: {problem}")
    tmp = tmp_path_factory.mktemp(f"secured-{kind}")
    port = os.environ.get(cfg["port_env"], str(cfg["port"]))
    password = "Esqbe-" + secrets.token_hex(12)
    env = {**os.environ, cfg["port_env"]: port, cfg["version_env"]: version, cfg["password_env"]: password}
    project = f"esqbe-secured-{kind}-{os.getpid()}"
    try:
        up = _compose(cfg, project, "up", "-d", env=env)
        assert up.returncode == 0, up.stderr[-2000:]
        done = _compose(cfg, project, "wait", cfg["done"], env=env)
        assert done.returncode == 0 and done.stdout.strip().endswith("0"), (done.stdout, done.stderr[-2000:])
        ca = tmp / "ca.crt"
        cp = _compose(cfg, project, "cp", f"{cfg['node']}:{cfg['ca_path']}", str(ca), env=env)
        assert cp.returncode == 0, cp.stderr
        api_key = None
        if cfg["api_key_path"]:
            key_file = tmp / "api_key"
            cp = _compose(cfg, project, "cp", f"{cfg['node']}:{cfg['api_key_path']}", str(key_file), env=env)
            assert cp.returncode == 0, cp.stderr
            api_key = key_file.read_text().strip()
        url = f"https://localhost:{port}"  # the node certificate names localhost and 127.0.0.1
        assert _healthy(url, str(ca), cfg["user"], password), f"{kind}: the secured node is not healthy at {url}"
        yield {"kind": kind, "url": url, "username": cfg["user"], "password": password, "ca_certs": str(ca), "api_key": api_key}
    finally:
        _compose(cfg, project, "down", "-v", env=env)


@pytest.fixture(scope="module")
def subset(tmp_path_factory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("secured-sample") / "sample.jsonl"
    with open(SAMPLE, encoding="utf-8") as src:
        lines = list(itertools.islice(src, N_PAPERS))
    path.write_text("".join(lines), encoding="utf-8")
    return path, [json.loads(line)["paper_id"] for line in lines]


def _cli(*args):
    from click.testing import CliRunner

    from cli import main

    return CliRunner().invoke(main, list(args))


def _drop(secured, index, **auth):
    from esqbe.backends.engines.elasticsearch import ElasticsearchBackend
    from esqbe.backends.engines.opensearch import OpenSearchBackend

    cls = ElasticsearchBackend if secured["kind"] == "elasticsearch" else OpenSearchBackend
    backend = cls(secured["url"], index, ca_certs=secured["ca_certs"], username=secured["username"], password=secured["password"])
    try:
        backend.client.indices.delete(index=index)
    except Exception:
        pass
    finally:
        backend.close()


def index_query_rescore(kind: str, url: str, auth: list[str], sample: Path, ids: list[str], *, ca_certs: str | None = None,
                        index: str | None = None, query_args: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """esqbe index (twice: the second run reads the stored content hashes back) -> query with summax rescoring
    -> stats, through the CLI; returns (query result, stats). Also run by the contract suite against a local
    engine-like HTTP server (tests/test_engine_http.py), so this path is exercised here too."""
    index = index or f"esqbe-it-{uuid.uuid4().hex[:10]}"  # inside the API key's esqbe* scope
    where = ["--backend", kind, "--url", url, "--index", index, *(["--ca-certs", ca_certs] if ca_certs else []), *auth]
    done = _cli("index", *where, "--json", str(sample))
    assert done.exit_code == 0, done.output
    report = json.loads(done.output[done.output.index("{"):])
    assert report["indexed"] == len(ids) and not report["errors"], report
    again = _cli("index", *where, "--json", str(sample))
    assert again.exit_code == 0, again.output
    assert json.loads(again.output[again.output.index("{"):])["unchanged"] == len(ids)
    hits = _cli("query", *where, "--paper", ids[0], "--facet", "method", "--rescorer", "summax", "-k", "5", "--json", *query_args)
    assert hits.exit_code == 0, hits.output
    result = json.loads(hits.output[hits.output.index("{"):])
    assert result["hits"] and ids[0] not in {h["paper_id"] for h in result["hits"]}
    assert all(h["matches"] for h in result["hits"])  # rescored with aligned sentences: the vectors came back
    stats = _cli("stats", *where, "--json")
    assert stats.exit_code == 0, stats.output
    return result, json.loads(stats.output[stats.output.index("{"):])


def _run(secured, subset, auth: list[str]) -> dict:
    path, ids = subset
    index = f"esqbe-it-{uuid.uuid4().hex[:10]}"
    try:
        return index_query_rescore(secured["kind"], secured["url"], auth, path, ids, ca_certs=secured["ca_certs"], index=index)[1]
    finally:
        _drop(secured, index)


def test_basic_auth_over_tls_index_query_rescore(secured, subset):
    stats = _run(secured, subset, ["--username", secured["username"], "--password", secured["password"]])
    assert stats["papers"] == N_PAPERS
    assert "version unknown" not in stats["engine"]  # the superuser may read GET /


def test_least_privilege_api_key_over_tls_index_query_rescore(secured, subset):
    if secured["kind"] != "elasticsearch":
        pytest.skip("OpenSearch API keys need the security plugin of 3.7+; the secured compose file uses basic auth")
    if not secured["api_key"]:
        pytest.skip("no API key given (ESQBE_ES_API_KEY)")
    stats = _run(secured, subset, ["--api-key", secured["api_key"]])
    assert stats["papers"] == N_PAPERS
    assert "version unknown" in stats["engine"]  # no `monitor` privilege: GET / answered 403 and esqbe went on


def test_wrong_password_is_one_clear_error(secured):
    out = _cli("stats", "--backend", secured["kind"], "--url", secured["url"], "--index", "esqbe-none",
               "--ca-certs", secured["ca_certs"], "--username", secured["username"], "--password", "wrong-" + secrets.token_hex(4))
    assert out.exit_code == 1
    assert "authentication failed (401)" in out.output and "Traceback" not in out.output


def test_without_the_ca_the_tls_failure_is_one_clear_error(secured):
    out = _cli("stats", "--backend", secured["kind"], "--url", secured["url"], "--index", "esqbe-none",
               "--username", secured["username"], "--password", secured["password"])
    assert out.exit_code == 1
    assert out.output.startswith("error:") and "Traceback" not in out.output
