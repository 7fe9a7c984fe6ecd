"""Followed sources on an Elasticsearch/OpenSearch index, by contract: no engine runs here. The real backend and the
real official clients make every request; only the lowest layer is tests/fakes/watching.py's engine, which keeps the
companion indexes' documents with `_seq_no`s and answers 409 as the engines do (NOT integration tests). The arXiv
stand-in answers on 127.0.0.1 (tests/fakes/services.py).

Checked: a source is one document of `<index>-esqbe-follows` (made with `op_type=create`; a second add of the name is
refused by the engine); its state is written with one conditional write after each page is committed, never before;
a run indexes into the engine index and keeps its mark; every body passes the engines' own API specifications."""
from __future__ import annotations

import pytest

pytest.importorskip("jsonschema")
pytest.importorskip("elasticsearch")
pytest.importorskip("opensearchpy")

from esqbe.backends.engines.followstore import follow_count_body, follow_index_body, follow_list_body  # noqa: E402
from esqbe.index.api import Index  # noqa: E402
from esqbe.index.follow import (  # noqa: E402
    FollowExistsError,
    FollowNotFoundError,
    add_source,
    list_sources,
    remove_source,
)
from esqbe.index.follow_run import run_follow  # noqa: E402
from esqbe.settings.config import load_settings  # noqa: E402

from .fakes.engines import INDEX, VERSIONS  # noqa: E402
from .fakes.services import OaiPmh  # noqa: E402
from .fakes.specs import assert_valid  # noqa: E402
from .fakes.watching import make_watching_backend  # noqa: E402
from .test_follow import rec  # noqa: E402

FOLLOW_INDEX = f"{INDEX}-esqbe-follows"


def _writes(canned) -> list[dict]:
    return [r for r in canned.requests if r["endpoint"] == "_doc" and r["path"].startswith(f"/{FOLLOW_INDEX}/")
            and r["method"] in ("PUT", "POST", "DELETE")]


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_a_source_is_one_document_written_after_each_committed_page(engine, encoder):
    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1])
    settings = load_settings(None).replace(backend=engine, url=backend.url, index=backend.index, arxiv_interval=0.05)
    index = Index(backend, settings, encoder=encoder)
    with OaiPmh([[rec(0), rec(1)], [rec(2)]]) as oai:
        add_source(index, "cl", "arxiv:cs.CL", url=oai.url + "/oai", since="2024-05-01")
        with pytest.raises(FollowExistsError):
            add_source(index, "cl", "arxiv:cs.LG")
        made, again = _writes(canned)  # the second add: refused by the engine (409), the first document kept
        assert made["params"] == again["params"] == {"op_type": "create", "refresh": "wait_for"}
        assert canned.follow_docs["cl"][0]["spec"] == {"kind": "arxiv", "target": "cs.CL", "url": oai.url + "/oai",
                                                       "since": "2024-05-01"}
        start = len(canned.requests)
        run = run_follow(index)
    s = run.sources[0]
    assert (s.fetched, s.indexed, s.pages) == (3, 3, 2) and s.complete and not s.error
    assert {"2405.00000", "2405.00001", "2405.00002"} <= set(canned.sources)
    assert canned.sources["2405.00002"]["metadata"]["sources"] == [{"file": "arxiv:cs.CL", "format": "arxiv"}]
    # each page's state: one write conditional on what was read, after that page's papers were written (bulk)
    order = [r for r in canned.requests[start:] if r["endpoint"] == "_bulk" or r in _writes(canned)]
    kinds = ["bulk" if r["endpoint"] == "_bulk" else "state" for r in order]
    assert kinds == ["bulk", "state", "bulk", "state", "state"]  # page 1, page 2, then the run's counts
    assert all("if_seq_no" in r["params"] and r["params"]["refresh"] == "wait_for" for r in order if r["endpoint"] == "_doc")
    first_state = next(r for r in order if r["endpoint"] == "_doc")["lines"][0]["state"]
    assert first_state["run"]["token"] == "t1" and first_state.get("mark") is None
    state = canned.follow_docs["cl"][0]["state"]
    assert state["mark"] == "2024-05-03" and "run" not in state and state["last"]["indexed"] == 3
    assert [x.name for x in list_sources(index)] == ["cl"] and list_sources(index)[0].last["complete"]
    for body in (follow_index_body(), follow_list_body(), follow_count_body()):
        assert_valid(engine, "indices_create" if "mappings" in body else "search", body)
    remove_source(index, "cl")
    assert _writes(canned)[-1]["method"] == "DELETE" and "cl" not in canned.follow_docs
    with pytest.raises(FollowNotFoundError):
        remove_source(index, "cl")
