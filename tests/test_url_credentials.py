""" a password in an engine URL (`http://elastic:S3CRET@host`) is used (the engine clients send it as
basic auth) and never shown: `esqbe config` (which says the URL carried credentials), `esqbe stats`, error messages,
the server's own start, each a real CLI process with nothing listening at the URL (an error path), and one helper
(esqbe.core.redact) that masks them everywhere."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from esqbe.core.redact import mask_url, mask_urls, redact_settings, url_has_credentials

from .conftest import REPO

SECRET = "S3CRET"
URL = f"http://elastic:{SECRET}@127.0.0.1:1"  # nothing listens on port 1
MASKED = "http://elastic:***@127.0.0.1:1"


@pytest.mark.parametrize("given, shown", [
    (URL, MASKED),
    ("https://u:p%40ss@es.example:9243/prefix", "https://u:***@es.example:9243/prefix"),
    ("http://elastic:pa@ss/w#rd@es:9200", "http://elastic:***@es:9200"),  # unescaped @ / # in the password
    ("http://TOKENONLY@es:9200", "http://***@es:9200"),
    ("elastic:S3CRET@es:9200", "elastic:***@es:9200"),  # no scheme
    ("http://es:9200/", "http://es:9200/"),
    (None, None),
])
def test_one_url_masked(given, shown):
    assert mask_url(given) == shown
    assert url_has_credentials(given) == (given != shown)


def test_every_url_in_a_message_masked_and_the_secret_settings():
    text = f"elasticsearch at {URL}, index 'x': GET https://a:b@other:9200/_cat failed ('{URL}')"
    masked = mask_urls(text)
    assert SECRET not in masked and ":b@" not in masked
    assert masked == (f"elasticsearch at {MASKED}, index 'x': GET https://a:***@other:9200/_cat failed ('{MASKED}')")
    shown = redact_settings({"url": URL, "password": SECRET, "api_key": "K3Y", "index": "x"})
    assert shown == {"url": MASKED, "password": "***", "api_key": "***", "index": "x"}


def test_the_engine_clients_still_use_the_credentials():
    from esqbe.backends.engines.elasticsearch import ElasticsearchBackend
    from esqbe.backends.engines.opensearch import OpenSearchBackend

    es = ElasticsearchBackend(URL, "x")
    assert es.url == MASKED  # what its messages, stats and logs show
    (node,) = es.client.transport.node_pool.all()
    assert node.config.headers["authorization"] == "Basic " + base64.b64encode(f"elastic:{SECRET}".encode()).decode()
    os_ = OpenSearchBackend(URL, "x")
    assert os_.url == MASKED and os_.client.transport.hosts[0]["http_auth"] == f"elastic:{SECRET}"


def _cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def test_real_cli_runs_never_print_the_password(tmp_path):
    """`esqbe config` (text, JSON, the URL from a flag or ESQBE_URL) shows the URL masked and says it carried
    credentials; `esqbe stats` on both engines, `esqbe query` and `esqbe serve` fail to connect and say where,
    masked. Run side by side: each engine run retries for seconds."""
    runs = {
        "config": _cli("config", "--backend", "elasticsearch", "--url", URL),
        "config --json": _cli("config", "--json", "--backend", "elasticsearch", "--url", URL),
        "config env": _cli("config", "--backend", "opensearch", env={"ESQBE_URL": URL}),
        "stats es": _cli("stats", "--backend", "elasticsearch", "--url", URL, "--index", "papers"),
        "stats os": _cli("stats", "--backend", "opensearch", "--url", URL, "--index", "papers", "--json"),
        "query": _cli("query", "--backend", "elasticsearch", "--url", URL, "--index", "papers", "--text", "We do it."),
        "serve": _cli("serve", "--backend", "opensearch", "--url", URL, "--index", "papers", "--port", "1",
                      "--no-warm"),
    }
    out = {name: (p.communicate(timeout=300), p.returncode) for name, p in runs.items()}
    for name, ((stdout, stderr), _) in out.items():
        assert SECRET not in stdout + stderr, (name, stdout[-1500:], stderr[-1500:])
        assert "Traceback" not in stderr, (name, stderr[-3000:])
    for name in ("config", "config env"):
        (stdout, _), rc = out[name]
        assert rc == 0 and MASKED in stdout and "note: url: the URL carries credentials" in stdout, stdout
    (stdout, _), rc = out["config --json"]
    url = next(row for row in json.loads(stdout) if row["name"] == "url")
    assert rc == 0 and url["value"] == MASKED and "carries credentials" in url["note"]
    for name in ("stats es", "stats os", "query", "serve"):
        (_, stderr), rc = out[name]
        assert rc != 0 and f"at {MASKED}" in stderr and "127.0.0.1:1" in stderr, (name, rc, stderr[-1500:])
