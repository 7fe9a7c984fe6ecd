"""One JSON shape for a query result: `esqbe query --json` (the real command, run in this process with the CLI's own
model loader) and HTTP `POST /query` answer the same JSON for the same query, whatever the rescorer (timings
apart)."""
from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from esqbe.query.results import RESULT_JSON_VERSION
from esqbe.server import ServeOptions, create_app

from .conftest import SAMPLE, esqbe_cli

QID = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]
TEXT = "We propose a parser for scientific abstracts. It is evaluated on two treebanks and beats the baselines."
ENV = dict.fromkeys(("ESQBE_CONFIG", "ESQBE_MODEL", "ESQBE_ENCODER_BACKEND", "ESQBE_BACKEND"))  # unset for the command


@pytest.fixture(scope="module")
def index_path(index_dir_30, tmp_path_factory):
    path = tmp_path_factory.mktemp("json-shape") / "index"
    shutil.copytree(index_dir_30, path)
    return path


@pytest.fixture(scope="module")
def client(index_path, encoder):
    app = create_app(str(index_path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1", warm=False))
    with TestClient(app) as c:
        yield c


def _cli_json(*args) -> dict:
    done = esqbe_cli("query", *args, "--json", env=ENV)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _http_json(client, body: dict) -> dict:
    r = client.post("/query", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _without_timings(d: dict) -> dict:
    assert isinstance(d.pop("timings_ms"), dict)
    return d


def _close(a, b, where="") -> None:
    """Equal JSON, but for the last bits of numbers an encoder computed now (its batches and threads differ
    between the two encoders): the same keys, strings, ids and order."""
    assert type(a) is type(b) or {type(a), type(b)} == {int, float}, (where, a, b)
    if isinstance(a, dict):
        assert list(a) == list(b) or set(a) == set(b), (where, set(a) ^ set(b))
        for key in a:
            _close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("rescorer", ["summax", "ts", "ot", "asym", "asym_token", "none"])
def test_cli_json_and_http_query_are_the_same_json(client, index_path, rescorer):
    cli = _cli_json("--path", index_path, "--paper", QID, "--facet", "method", "--rescorer", rescorer, "-k", "5")
    http = _http_json(client, {"paper_id": QID, "facet": "method", "rescorer": rescorer, "k": 5})
    if rescorer == "asym_token":  # token vectors encoded now, by each side's own encoder
        _close(_without_timings(cli), _without_timings(http))
    else:  # every number from the stored vectors: the very same JSON
        assert _without_timings(cli) == _without_timings(http)
    assert cli["version"] == RESULT_JSON_VERSION and cli["rescorer"] == rescorer and len(cli["hits"]) == 5
    assert all(s["facet"] == "method" for s in cli["query"]["sentences"])


def test_cli_json_and_http_query_agree_for_a_text_with_parameters_and_a_filter(client, index_path):
    cli = _cli_json("--path", index_path, "--text", TEXT, "--title", "A parser", "--rescorer", "ot", "--param", "tau=0.5",
                    "--filter", "year not exists", "-k", "3")
    http = _http_json(client, {"text": TEXT, "title": "A parser", "rescorer": "ot", "rescorer_params": {"tau": 0.5},
                               "filters": ["year not exists"], "k": 3})
    _close(_without_timings(cli), _without_timings(http))  # the text is encoded by each side
    assert cli["query"]["title"] == "A parser" and cli["rescorer_params"] == {"tau": 0.5}
    assert cli["query"]["filters"][0]["op"] == "not exists" and len(cli["hits"]) == 3

