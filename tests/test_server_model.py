"""The server loads its model the way the Python API does (`Index.encoder`): the index's stored model
directory (`model_source`), the `encoder_backend` setting, the fingerprint check; one encoder per thread."""
from __future__ import annotations

import json
import shutil
import time

import pytest
from fastapi.testclient import TestClient

import esqbe
from esqbe.server import ServeOptions, create_app

from .conftest import SAMPLE, model_copy

QID = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]


def _started(app) -> TestClient:
    client = TestClient(app, raise_server_exceptions=False)
    client.__enter__()
    deadline = time.time() + 120
    while client.get("/health").status_code != 200:
        assert time.time() < deadline, client.get("/health").text
        time.sleep(0.1)
    return client


def _encoders(app) -> list:
    service = app.state.service
    return [slot.index.encoder for slot in [service.writer, *service.readers]]


def test_the_server_runs_the_encoder_backend_it_is_given(index_dir_30, tmp_path):
    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    app = create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1", readers=2),
                     encoder_backend="torch-int8")
    client = _started(app)
    try:
        encoders = _encoders(app)
        assert [e.backend for e in encoders] == ["torch-int8"] * 3
        assert len({id(e) for e in encoders}) == 3  # a tokenizer of its own for each thread
        r = client.post("/query", json={"text": "We propose a parser. It is evaluated on treebanks.", "k": 3})
        assert r.status_code == 200, r.text
        assert len(r.json()["hits"]) == 3
    finally:
        client.__exit__(None, None, None)


def test_an_index_built_from_a_model_directory_is_served_without_naming_the_model(tmp_path, sample_lines):
    """The index stores the directory it was built with (model_source); the server finds it there, as
    `esqbe query` does, rather than looking for a package named like the directory."""
    model_dir = model_copy(tmp_path / "my-minilm")  # a plain directory, not an installed package
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:6]) + "\n")
    path = tmp_path / "index"
    with esqbe.open_index(str(path), model=str(model_dir), config=None) as index:
        assert index.index_files([str(src)]).indexed == 6
        meta = index.backend.meta()
    assert meta.model == "my-minilm" and meta.model_source == str(model_dir.resolve())

    app = create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"))
    client = _started(app)
    try:
        assert all(e.location == str(model_dir.resolve()) for e in _encoders(app))
        r = client.post("/query", json={"text": "We propose a parser. It is evaluated on treebanks.", "k": 2})
        assert r.status_code == 200, r.text
        assert client.post("/query", json={"paper_id": QID, "k": 2}).status_code == 200
    finally:
        client.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch):
    for var in ("ESQBE_MODEL", "ESQBE_ENCODER_BACKEND", "ESQBE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
