""" one sentence count and one bound for every free text, before any tagging or encoding, whatever
sentences the request chooses: POST /query (a text, each example's), POST /watches, POST /rerank's query, the Python
API and `esqbe query` / `esqbe watch add` `--text`/`--file`, on a real server (uvicorn on 127.0.0.1) over a real
embedded index with the real model. Every write and watch route under the request deadline; the bounds in the
OpenAPI schema. Timings here are taken on a contended machine: the bounds asserted are far from what tagging the
refused texts costs (the issue measured 7 s for 8,000 sentences, 39 s for 20,000)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import esqbe
from esqbe.core.limits import MAX_QUERY_CHARS, MAX_QUERY_SENTENCES
from esqbe.ingest.sentences import split_sentences
from esqbe.query.results import QueryTooLargeError

from .conftest import REPO, LiveServer

A, B = "csabstruct-train-0000", "csabstruct-train-0001"
#: seconds a refusal may take: splitting 100,000 characters and answering, nowhere near tagging what it refuses
FAST_S = 2.0


def _text(n: int) -> str:
    """A text of `n` short sentences (5 characters each)."""
    text = "A b. " * n
    assert len(split_sentences(text)) == n
    return text.strip()


HUGE = _text(8_000)  # the issue's: 8,000 sentences, 40 KB
RERANK_HUGE = _text(3_990)  # within POST /rerank's 20,000 characters
WRITER_HUGE = _text(MAX_QUERY_CHARS // 5)  # the 20,000 sentences that stalled the writer for 39 s


@pytest.fixture(scope="module")
def server(index_copy, encoder):
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    with LiveServer(create_app(str(index_copy), config=None, encoder=encoder,
                               options=ServeOptions(host="127.0.0.1"))) as url:
        yield url


def _post(url: str, body: dict) -> tuple[httpx.Response, float]:
    t = time.perf_counter()
    r = httpx.post(url, json=body, timeout=120)
    return r, time.perf_counter() - t


def _refused(r: httpx.Response, elapsed: float, match: str) -> None:
    assert r.status_code == 413, r.text
    assert match in r.json()["error"]["message"], r.text
    assert elapsed < FAST_S, f"refused after {elapsed:.2f} s"


def test_every_route_refuses_an_over_count_text_whatever_it_chooses(server):
    """The same count (the whole text's sentences) and the same bound on every route and field, before any work:
    choosing 5 sentences of 8,000 does not make them 5."""
    five = [0, 1, 2, 3, 4]
    over = f"{8_000} sentences; at most {MAX_QUERY_SENTENCES}"
    cases = [
        ("/query", {"text": HUGE}, over),
        ("/query", {"text": HUGE, "sentences": five}, over),
        ("/query", {"examples": [{"paper_id": A}, {"text": HUGE, "sentences": five}]}, over),
        ("/query", {"examples": [{"text": _text(40)}, {"text": _text(40), "sentences": [0]}]},
         f"80 sentences; at most {MAX_QUERY_SENTENCES}"),  # all of a request's texts together
        ("/watches", {"name": "huge", "min_sim": 0.5, "text": HUGE, "sentences": five}, over),
        ("/watches", {"name": "huge", "min_sim": 0.5, "examples": [{"text": HUGE, "sentences": five}]}, over),
        ("/rerank", {"query": RERANK_HUGE, "documents": [A, B]}, f"3990 sentences; at most {MAX_QUERY_SENTENCES}"),
        ("/rerank", {"query": "facet:method " + RERANK_HUGE, "documents": [A]}, "3990 sentences"),
    ]
    for path, body, match in cases:
        r, elapsed = _post(server + path, body)
        _refused(r, elapsed, match)
    assert httpx.get(server + "/watches", timeout=60).json() == []  # nothing reached the writer
    # the bound is the bound: a text of exactly MAX_QUERY_SENTENCES sentences is answered, one more is not
    ok, took = _post(server + "/query", {"text": _text(MAX_QUERY_SENTENCES), "k": 1})
    assert ok.status_code == 200, ok.text[:500]
    assert len(ok.json()["query"]["sentences"]) == MAX_QUERY_SENTENCES
    r, elapsed = _post(server + "/query", {"text": _text(MAX_QUERY_SENTENCES + 1), "k": 1})
    _refused(r, elapsed, f"{MAX_QUERY_SENTENCES + 1} sentences")
    print(f"\n{MAX_QUERY_SENTENCES} sentences answered in {took:.2f} s; one more refused in {elapsed:.3f} s (contended)")


def test_the_bounds_are_in_the_schema(server):
    schemas = httpx.get(server + "/openapi.json", timeout=60).json()["components"]["schemas"]
    for model in ("QueryRequest", "WatchRequest", "ExampleRequest"):
        as_string, as_list = schemas[model]["properties"]["text"]["anyOf"]
        assert as_string["maxLength"] == MAX_QUERY_CHARS and as_string["x-maxSentences"] == MAX_QUERY_SENTENCES
        assert as_list["maxItems"] == MAX_QUERY_SENTENCES and as_list["items"]["maxLength"] == 5_000
    for model in ("QueryRequest", "WatchRequest"):
        assert schemas[model]["properties"]["sentences"]["maxItems"] == MAX_QUERY_SENTENCES
    query = schemas["RerankRequest"]["properties"]["query"]
    assert query["maxLength"] == 20_000 and query["x-maxSentences"] == MAX_QUERY_SENTENCES
    # past the schema's own bounds: 422 before the route runs
    r = httpx.post(server + "/query", json={"text": ["A b."] * (MAX_QUERY_SENTENCES + 1)}, timeout=60)
    assert r.status_code == 422 and f"at most {MAX_QUERY_SENTENCES} items" in r.text


def test_a_refused_watch_never_stalls_a_concurrent_write(server):
    """The issue's attack: three POST /watches with an example of 20,000 sentences each, beside a POST /papers. The
    watches are refused before the writer's thread sees them; the papers are written as fast as alone."""
    record = lambda i: {"id": f"concurrent-{i}", "title": "Spectral graph partitioning",  # noqa: E731
                        "abstract": "We study balanced graph partitioning. We propose a spectral method. It cuts "
                                    "fewer edges than METIS."}
    r, alone = _post(server + "/papers", {"records": [record(0)]})
    assert r.status_code == 200 and r.json()["indexed"] == 1, r.text
    with ThreadPoolExecutor(4) as pool:
        watches = [pool.submit(_post, server + "/watches",
                               {"name": f"stall-{i}", "min_sim": 0.5, "examples": [{"text": WRITER_HUGE}]})
                   for i in range(3)]
        papers = pool.submit(_post, server + "/papers", {"records": [record(1)]})
        for w in watches:
            _refused(*w.result(), f"{MAX_QUERY_CHARS // 5} sentences")
        r, beside = papers.result()
    assert r.status_code == 200 and r.json()["indexed"] == 1, r.text
    assert beside < alone + 5, f"POST /papers took {beside:.2f} s beside the watches, {alone:.2f} s alone"
    assert not [w for w in httpx.get(server + "/watches", timeout=60).json() if w["name"].startswith("stall-")]
    assert httpx.get(server + "/stats", timeout=60).json()["server"]["writes_queued"] == 0


def test_writes_run_under_the_request_deadline(tmp_path, index_dir_30, encoder, sample_lines):
    """POST /papers past the server's request timeout: 504 at the deadline, the writer stops before its next batch
    is encoded (not all the papers are written) and is free again for the next write (DELETE, under its own)."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    records = [json.loads(line) for line in sample_lines[100:300]]
    with LiveServer(create_app(str(path), config=None, encoder=encoder,
                               options=ServeOptions(host="127.0.0.1", request_timeout=1.0))) as url:
        r, elapsed = _post(url + "/papers", {"records": records, "facets": "predict"})
        assert r.status_code == 504 and "request timeout" in r.json()["error"]["message"], r.text
        assert elapsed < 1.0 + FAST_S, elapsed
        deadline = time.time() + 60
        while httpx.get(url + "/stats", timeout=60).json()["server"]["writes_queued"]:
            assert time.time() < deadline, "the writer did not stop"
            time.sleep(0.2)
        assert httpx.get(url + "/stats", timeout=60).json()["papers"] < 30 + len(records)
        r = httpx.delete(url + f"/papers/{A}", timeout=60)
        assert r.status_code == 200 and r.json() == {"deleted": A}, r.text


def test_the_python_api_counts_and_bounds_the_same(index_copy, encoder):
    with esqbe.open_index(str(index_copy), encoder=encoder, config=None, create=False) as index:
        for call in (lambda: index.query(text=HUGE, sentences=[0, 1]),
                     lambda: index.query(examples=[{"text": _text(40)}, {"text": _text(40), "facet": "method"}]),
                     lambda: index.rerank("facet:method " + RERANK_HUGE, [A])):
            t = time.perf_counter()
            with pytest.raises(QueryTooLargeError, match=f"at most {MAX_QUERY_SENTENCES}"):
                call()
            assert time.perf_counter() - t < FAST_S


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    return r, time.perf_counter() - t


def test_the_cli_refuses_before_opening_the_index(index_copy):
    """`--text` and `--file` counted as the server counts, before the index is opened or the model loaded; a file
    is read no further than the character cap (`/dev/zero` ends at once)."""
    runs = [
        (_cli("query", "--path", str(index_copy), "--text", HUGE, "--sentences", "0,1"), "8000 sentences; at most 64"),
        (_cli("query", "--path", str(index_copy), "--file", "/dev/zero"), f"more than {MAX_QUERY_CHARS} characters"),
        (_cli("watch", "add", "huge", "--min-sim", "0.5", "--path", str(index_copy), "--text", HUGE, "--sentences", "0"),
         "8000 sentences; at most 64"),
    ]
    for (r, _), message in runs:
        assert r.returncode == 1 and message in r.stderr, (r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
