"""A server without `--show-paths` tells no client where anything lives: every endpoint of the app is asked (each GET
route, the static files, and each POST and DELETE with a small valid body) on a real server whose index, whose model
and whose papers' source file all sit under absolute paths, and no answer (body or headers) holds one of those paths
or the home directory. With `--show-paths` the operator's own server shows them where the README says it does: the
index's path and the model's directory in /stats, a paper's source file."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

import esqbe
from esqbe.encode.encoder import Encoder
from esqbe.encode.identity import resolve_model
from esqbe.index.follow import add_source
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import SAMPLE, LiveServer

RECORDS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:6]]
PID = RECORDS[0]["paper_id"]


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """(the index, the model's directory, the encoder): a copy of the default model in a directory of its own, and
    an index built with it from a file of papers, all under the test's absolute temporary directory."""
    base = tmp_path_factory.mktemp("placed")
    model = base / "models" / "my-model"
    shutil.copytree(resolve_model(None)[0], model, ignore=shutil.ignore_patterns("README.md", "1_Pooling"))
    encoder = Encoder(str(model), backend="torch", batch_size=16)
    papers = base / "papers" / "papers.jsonl"
    papers.parent.mkdir()
    papers.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[1:]))
    index = base / "indexes" / "my-index"
    with esqbe.open_index(str(index), config=None, encoder=encoder) as ix:
        assert ix.index_files([str(papers)]).indexed == len(RECORDS) - 1
        add_source(ix, "notes", f"dir:{papers.parent}")  # a followed folder: /stats lists the index's sources
    return index, model, encoder


def _routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route of `app`, the included routers' too; a mount of static files as ("GET",
    each file's path under it)."""
    out = []

    def walk(routes):
        for r in routes:
            if type(r).__name__ == "Mount":
                folder = Path(r.app.directory)
                out.extend(("GET", f"{r.path}/{f.relative_to(folder)}") for f in sorted(folder.rglob("*")) if f.is_file())
                continue
            inner = getattr(getattr(r, "original_router", None), "routes", None)
            if inner is not None:
                walk(inner)
                continue
            out.extend((m, r.path) for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD")

    walk(app.routes)
    return out


#: what each route with a parameter is asked with (a route not here fails the test: add it)
PATHS = {"/papers/{paper_id:path}": f"/papers/{PID}", "/watches/{name}.atom": "/watches/walk.atom"}
QUERIES = {"/search": {"q": "parsing"}, "/proof": {"nonce": "0" * 64}, "/watches/{name}.atom": {"limit": 5}}
BODIES = {
    "/query": {"text": "We propose a new method for parsing. It is fast.", "k": 3},
    "/graph": {"text": "We propose a new method for parsing. It is fast.", "k": 3},
    "/papers": {"records": [RECORDS[0]]},
    "/watches": {"name": "walk", "text": "We propose a new method for parsing.", "min_score": -1.0},
    "/rerank": {"query": f"paper:{PID} facet:method", "documents": [r["paper_id"] for r in RECORDS]},
}


def _walk(url: str, app) -> list[tuple[str, str, int, str]]:
    """Every endpoint of `app` asked once, writes first (a paper added, a watch saved), the paper deleted last:
    (method, path, status, headers and body as text)."""
    order = {"POST": 0, "GET": 1, "DELETE": 2}
    answers = []
    for method, path in sorted(_routes(app), key=lambda r: order[r[0]]):
        assert "{" not in path or path in PATHS, f"{method} {path}: add how the walk asks it"
        target = PATHS.get(path, path)
        r = httpx.request(method, url + target, params=QUERIES.get(path),
                          json=BODIES.get(path) if method == "POST" else None, timeout=120)
        assert r.status_code < 500, (method, target, r.status_code, r.text[:500])
        answers.append((method, target, r.status_code, f"{dict(r.headers)}\n{r.text}"))
    return answers


def test_no_answer_of_a_server_without_show_paths_holds_a_path(placed, tmp_path):
    index, model, encoder = placed
    served = tmp_path / "served-index"
    shutil.copytree(index, served)
    app = create_app(str(served), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))
    with LiveServer(app) as url:
        stats = httpx.get(url + "/stats", timeout=60).json()
        assert stats["model_source"] == model.name and stats["path"] == served.name  # names, not where they live
        assert [s["spec"] for s in stats["follow"]] == ["dir:papers"]
        answers = _walk(url, app)
    secrets = {str(served), str(model), str(index.parent.parent), str(tmp_path), os.path.expanduser("~")}
    # a path where it starts (not `</root>` in the API docs' script, for a home of /root)
    pattern = re.compile(r"(?<![\w<])(?:" + "|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True))
                         + r")(?![\w.-])")
    leaks = [(m, t, pattern.search(text).group()) for m, t, _, text in answers if pattern.search(text)]
    assert not leaks, leaks
    asked = {(m, t) for m, t, *_ in answers}
    assert {("GET", "/stats"), ("POST", "/papers"), ("DELETE", f"/papers/{PID}"), ("GET", "/static/app.js"),
            ("GET", "/openapi.json")} <= asked, asked
    assert all(status < 400 for m, t, status, _ in answers if t != "/proof"), [a[:3] for a in answers]


def test_show_paths_shows_them_where_documented(placed, tmp_path):
    index, model, encoder = placed
    served = tmp_path / "served-index"
    shutil.copytree(index, served)
    app = create_app(str(served), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", show_paths=True))
    with LiveServer(app) as url:
        stats = httpx.get(url + "/stats", timeout=60).json()
        paper = httpx.get(url + f"/papers/{RECORDS[1]['paper_id']}", timeout=60).json()
    assert stats["path"] == str(served) and stats["model_source"] == str(model)
    assert [s["spec"] for s in stats["follow"]] == [f"dir:{index.parent.parent / 'papers'}"]
    assert paper["metadata"]["sources"][0]["file"] == str(index.parent.parent / "papers" / "papers.jsonl")
