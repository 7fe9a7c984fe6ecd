"""A filter's value list is bounded (count and bytes: the schema, the settings filter_max_values / filter_max_bytes,
the CLI's --filter) before any work, and a list of values no paper has costs what a few cost: the near-value search
runs once per filter, for its first few values. A real index small in papers and rich in author names, a real
server on 127.0.0.1."""
from __future__ import annotations

import json
import random
import string
import threading
import time

import httpx
import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.core.filters import FilterError
from esqbe.core.limits import MAX_FILTER_BYTES, MAX_FILTER_VALUES

from .conftest import LiveServer

#: papers, and author names per paper: ~9,000 distinct names, as in an index of many co-authored papers
PAPERS, AUTHORS = 30, 300


def _name(rng: random.Random) -> str:
    return " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9))).title()
                    for _ in range(2))


@pytest.fixture(scope="module")
def names_index(tmp_path_factory, encoder, sample_lines):
    rng = random.Random(62)
    path = tmp_path_factory.mktemp("names") / "ix"
    src = path.parent / "papers.jsonl"
    with open(src, "w") as f:
        for i, line in enumerate(sample_lines[:PAPERS]):
            rec = json.loads(line)
            f.write(json.dumps({"id": f"p{i}", "title": f"Paper {i}", "abstract": rec["sentences"],
                                "facets": rec["labels"],
                                "metadata": {"authors": [_name(rng) for _ in range(AUTHORS)]}}) + "\n")
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == PAPERS
        names = index.backend._metadata_columns().kw["authors.name"][1]
        assert len(set(names.tolist())) > 0.99 * PAPERS * AUTHORS
    return path


@pytest.fixture(scope="module")
def server(names_index, encoder):
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    with LiveServer(create_app(str(names_index), config=None, options=ServeOptions(host="127.0.0.1"),
                               encoder=encoder)) as url:
        yield url


def _unknown(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [_name(rng) + " Zq" for _ in range(n)]  # no stored name ends so


def _query(url: str, values: list, timeout: float = 120) -> httpx.Response:
    body = {"paper_id": "p0", "k": 3, "filters": [{"key": "authors.name", "op": "in", "value": values}]}
    return httpx.post(url + "/query", json=body, timeout=timeout)


def test_a_list_past_the_bounds_is_refused_by_the_schema(server):
    r = _query(server, _unknown(MAX_FILTER_VALUES + 1))
    assert r.status_code == 422, r.text
    assert f"at most {MAX_FILTER_VALUES} items" in r.text
    big = ["x" * 4000] * (MAX_FILTER_BYTES // 4000 + 1)  # few values, many bytes
    r = _query(server, big)
    assert r.status_code == 422, r.text
    assert f"bytes of values; at most {MAX_FILTER_BYTES} (filter_max_bytes)" in r.text


def test_the_longest_list_of_unknown_names_costs_what_one_costs_and_health_answers_meanwhile(server):
    """The maximum count of names no paper has: refused (no paper has any of them) within a small multiple of one
    name's time, with near values looked up for the first few only (and said so); /health answers all along."""
    def timed(values) -> tuple[float, httpx.Response]:
        t0 = time.perf_counter()
        r = _query(server, values)
        return time.perf_counter() - t0, r

    one = min(timed(_unknown(1, seed=s))[0] for s in (1, 2, 3))  # the index's names are folded once, then kept
    done: list = []
    worker = threading.Thread(target=lambda: done.append(timed(_unknown(MAX_FILTER_VALUES, seed=4))))
    worker.start()
    health = []
    while worker.is_alive():
        t0 = time.perf_counter()
        assert httpx.get(server + "/health", timeout=30).status_code == 200
        health.append(time.perf_counter() - t0)
        time.sleep(0.02)
    worker.join()
    [(many, r)] = done
    assert r.status_code == 400, r.text
    detail = r.json()["error"]["message"]
    assert "no paper has any of these values for authors.name" in detail
    assert f"... {MAX_FILTER_VALUES - 5} more)" in detail  # the message names a few of them, not all
    assert f"near values were looked up for its first 3 values (of {MAX_FILTER_VALUES})" in detail
    assert many < 4 * one + 1.0, (many, one)
    assert health and max(health) < 2.0, health


def test_the_settings_lower_the_bounds_and_the_cli_says_them(names_index, tmp_path):
    index = esqbe.open_index(str(names_index), filter_max_values=5, filter_max_bytes=64)
    with pytest.raises(FilterError, match=r"^filter authors.name in: 6 values; at most 5 \(filter_max_values\)$"):
        index.query("p0", k=3, filters=[{"key": "authors.name", "op": "in", "value": _unknown(6)}])
    with pytest.raises(FilterError, match=r"bytes of values; at most 64 \(filter_max_bytes\)$"):
        index.query("p0", k=3, filters=["author in (" + ", ".join(_unknown(4)) + ")"])
    values = ", ".join(f"n{i}" for i in range(MAX_FILTER_VALUES + 1))
    r = CliRunner().invoke(main, ["query", "--path", str(names_index), "--no-server", "--paper", "p0",
                                  "--filter", f"author in ({values})"])
    assert r.exit_code == 2, r.output
    assert f"{MAX_FILTER_VALUES + 1} values; at most {MAX_FILTER_VALUES} (filter_max_values)" in r.output
