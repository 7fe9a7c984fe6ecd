"""Watches on an Elasticsearch/OpenSearch index ("for an engine index, a small document the index owns"),
by contract: no engine runs here. The real backend code and the real official clients (`elasticsearch`,
`opensearch-py`) make every request; only the lowest layer is replaced by tests/fakes/engines.py's WatchingEngine,
which keeps documents with `_seq_no`s and answers 409 to a stale `if_seq_no` or a second `op_type=create` as the
engines do. These are NOT integration tests (tests/test_watch_engine_integration.py runs against a live cluster).

Checked: every body the watch store sends against the engines' own API specifications (tests/specs, strict) and the
paper mapping; each change of a watch is exactly one document write (`refresh=wait_for`; a new one `op_type=create`,
later ones conditional on the `_seq_no`/`_primary_term` read), so a crash leaves the old document or the new one; a
change that loses the race is read again and never overwrites the other; papers carry a stamp that only grows, and an
index made before it gets the field; a watch runs end to end on the engine through esqbe.index.watches."""
from __future__ import annotations

import base64
import json
import logging

import numpy as np
import pytest

pytest.importorskip("jsonschema")
pytest.importorskip("elasticsearch")
pytest.importorskip("opensearchpy")

from esqbe.backends.engines.watchstore import (  # noqa: E402
    KEPT_MATCHES,
    STAMP_FIELD,
    STAMP_MAPPING,
    last_stamp_body,
    papers_since_body,
    recorded,
    watch_count_body,
    watch_index_body,
    watch_list_body,
)
from esqbe.errors import BackendError  # noqa: E402
from esqbe.index.api import Index  # noqa: E402
from esqbe.index.watches import (  # noqa: E402
    WatchesUnsupportedError,
    WatchExistsError,
    add_watch,
    get_watch,
    list_watches,
    remove_watch,
    revoke_feed_key,
    run_watches,
    watch_matches,
)
from esqbe.settings.config import load_settings  # noqa: E402

from .fakes.bodies import mapping_fields, referenced_fields  # noqa: E402
from .fakes.engines import ENGINE_VERSIONS, INDEX, META, VERSIONS, make_papers  # noqa: E402
from .fakes.specs import assert_valid  # noqa: E402
from .fakes.watching import make_watching_backend  # noqa: E402

WATCH_INDEX = f"{INDEX}-esqbe-watches"
ENGINES = ["elasticsearch", "opensearch"]


def _row(name: str = "w", mark: int = 0) -> dict:
    return {"name": name, "spec": {"query": {"paper_id": "p0"}, "model": {"dim": 8}}, "vectors": b"\x01" * 32,
            "mark": mark, "created": 1.0, "feed_key": "secret"}


def _ids_in(node, key: str, inside_must_not: bool = False, out=None):
    """Paper ids of `terms: {paper_id: [...]}` clauses in a search body: (restricting, excluding)."""
    out = out if out is not None else ([], [])
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "terms" and isinstance(v, dict) and key in v:
                out[1 if inside_must_not else 0].append(set(v[key]))
            else:
                _ids_in(v, key, inside_must_not or k == "must_not", out)
    elif isinstance(node, list):
        for x in node:
            _ids_in(x, key, inside_must_not, out)
    return out


def _answer_knn_over_every_paper(canned) -> None:
    """kNN answers: every stored paper the body's id filters allow (what an engine's filter does), one score."""
    def hits(body):
        restrict, exclude = _ids_in(body, "paper_id")
        ids = [pid for pid in canned.sources if all(pid in r for r in restrict) and not any(pid in e for e in exclude)]
        return [(pid, 0.9) for pid in sorted(ids)]
    canned.knn_hits = hits


def _refuse(canned, endpoint: str, method: str, status: int, kind: str) -> None:
    """Answer `method` requests to `endpoint` with `status` (an engine error of type `kind`) from now on (until the
    instance attribute is deleted); other methods are answered as before."""
    answer = getattr(canned, endpoint)

    def refusing(m, segs, record):
        if m == method:
            return status, {"error": {"type": kind, "reason": "canned"}, "status": status}
        return answer(m, segs, record)
    setattr(canned, endpoint, refusing)


def _writes(canned) -> list[dict]:
    return [r for r in canned.requests if r["endpoint"] == "_doc" and r["path"].startswith(f"/{WATCH_INDEX}/")
            and r["method"] in ("PUT", "POST", "DELETE")]


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_watch_store_bodies_pass_the_spec_and_the_mapping(engine, version):
    backend, canned = make_watching_backend(engine, version)
    backend.ensure(META)
    backend.upsert(make_papers(4))
    mark = backend.next_paper_number()
    assert backend.watch_insert(_row(mark=mark), 10) is None
    backend.papers_since(mark, mark + 10, 2000)
    backend.watch_rows()
    # the companion index's definition, as sent
    (create,) = [r for r in canned.requests if r["method"] == "PUT" and r["path"] == f"/{WATCH_INDEX}"]
    assert create["lines"][0] == watch_index_body()
    assert_valid(engine, "indices_create", watch_index_body())
    assert mapping_fields(watch_index_body()["mappings"])["name"]["type"] == "keyword"  # what the listing sorts by
    # the stamp field: in the shipped definition and in the spec's field mapping
    assert mapping_fields(canned.mapping)[STAMP_FIELD] == STAMP_MAPPING
    assert_valid(engine, "mapping_property", STAMP_MAPPING)
    # every search the store makes, as sent, against the spec; those on the paper index name mapped fields only
    fields = mapping_fields(canned.mapping)
    searches = [r for r in canned.requests if r["endpoint"] == "_search"]
    sent = [r["lines"][0] for r in searches]
    for body in (watch_list_body(), watch_count_body(), papers_since_body(mark, mark + 10, 2000), last_stamp_body()):
        assert body in sent, body
        assert_valid(engine, "search", body)
    for r in searches:
        assert_valid(engine, "search", r["lines"][0])
        if r["path"] == f"/{INDEX}/_search":
            named = referenced_fields(r["lines"][0]) | {next(iter(s)) for s in r["lines"][0].get("sort", [])}
            named |= {a["max"]["field"] for a in (r["lines"][0].get("aggs") or {}).values() if "max" in a}
            assert named <= set(fields), named - set(fields)
            assert all(fields[f]["type"] == "long" for f in named)
    # the bulk lines of papers carry the stamp, mapped `long`, each a larger integer than the one before
    stamps = [line[STAMP_FIELD] for r in canned.sent("_bulk") for line in r["lines"][1::2]]
    assert len(stamps) == 4 and stamps == sorted(set(stamps)) and all(isinstance(s, int) for s in stamps)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_watch_change_is_one_conditional_document_write(engine):
    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1])
    backend.ensure(META)
    assert backend.watch_rows() == [] and backend.watch_matches("w", 5) == []  # no companion index yet: none
    assert backend.watch_insert(_row(), 2) is None
    (made,) = _writes(canned)
    assert made["method"] == "PUT" and made["params"] == {"op_type": "create", "refresh": "wait_for"}
    assert made["lines"][0]["name"] == "w" and base64.b64decode(made["lines"][0]["vectors_b64"]) == b"\x01" * 32
    assert backend.watch_insert(_row(), 2) == "exists"  # the engine refuses the second create: 409
    assert backend.watch_insert(_row("v"), 2) is None
    before = len(_writes(canned))
    assert backend.watch_insert(_row("u"), 2) == "full" and len(_writes(canned)) == before  # counted, not written

    # a run's record: one write, conditional on what was read
    seq_before = canned.watch_docs["w"][1]
    assert backend.watch_record("w", 50, 2.0, [("p1", json.dumps({"paper_id": "p1", "rank": 1}))])
    (record,) = _writes(canned)[before:]
    assert record["params"] == {"if_seq_no": str(seq_before), "if_primary_term": "1", "refresh": "wait_for"}
    doc = record["lines"][0]
    assert (doc["mark"], doc["last_run"], doc["found"], doc["reported"]) == (50, 2.0, 1, ["p1"])
    assert doc["feed_key"] == "secret" and doc["spec"] == _row()["spec"]  # the rest of the watch written whole

    # another writer changes the document between this one's read and write: 409, read again, both changes kept
    canned.before_write["w"].append(lambda: backend.watch_set_key("w", "rotated"))
    assert backend.watch_record("w", 60, 3.0, [("p2", json.dumps({"paper_id": "p2", "rank": 1}))])
    stored = canned.watch_docs["w"][0]
    assert (stored["feed_key"], stored["mark"], stored["reported"]) == ("rotated", 60, ["p1", "p2"])
    statuses = [r for r in _writes(canned)[before + 1:]]
    assert len(statuses) == 3  # the losing write, the other writer's, the retried one
    assert backend.watch_matches("w", 5) == [("p2", 3.0, {"paper_id": "p2", "rank": 1}),
                                             ("p1", 2.0, {"paper_id": "p1", "rank": 1})]
    assert backend.watch_reported("w", ["p1", "p3"]) == {"p1"}

    # a watch removed meanwhile: nothing written; removing is one delete
    assert backend.watch_delete("v") is True and backend.watch_delete("v") is False
    assert _writes(canned)[-1]["method"] == "DELETE" and _writes(canned)[-1]["params"] == {"refresh": "wait_for"}
    n = len(_writes(canned))
    assert backend.watch_record("v", 1, 1.0, []) is False and backend.watch_set_key("v", "k") is False
    assert len(_writes(canned)) == n


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failed_write_leaves_the_old_document_whole(engine):
    """A process killed (or a request failing) at any point of a change: the change is one document write, so the
    stored watch is the old document or the new one; a write the engine refuses leaves the old one as it was."""
    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1])
    backend.ensure(META)
    backend.watch_insert(_row(), 5)
    old = json.loads(json.dumps(canned.watch_docs["w"][0]))
    n = len(canned.requests)
    _refuse(canned, "_doc", "PUT", 400, "mapper_parsing_exception")  # the read answers; the write is refused
    with pytest.raises(BackendError, match="writing watch w failed"):
        backend.watch_record("w", 99, 9.0, [("p1", json.dumps({"paper_id": "p1"}))])
    del canned._doc
    assert canned.watch_docs["w"][0] == old  # the old state, whole
    assert len([r for r in canned.requests[n:] if r["method"] == "PUT"]) == 1  # one write was tried, no partial ones
    assert backend.watch_record("w", 99, 9.0, [("p1", json.dumps({"paper_id": "p1"}))])  # a later run completes
    assert canned.watch_docs["w"][0]["mark"] == 99


@pytest.mark.parametrize("engine", ENGINES)
def test_papers_of_one_stamp_are_not_skipped_between_slices(engine):
    """Two writers may stamp papers alike: a slice never ends inside a stamp, so every new paper is read once."""
    from esqbe.index.watches import _new_slices

    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1])
    backend.ensure(META)
    backend.upsert(make_papers(7))
    for pid, stamp in zip(sorted(canned.sources), (10, 11, 11, 11, 12, 12, 13)):
        canned.sources[pid][STAMP_FIELD] = stamp
    seen = [pid for rows in _new_slices(backend, 10, 14) for _, pid, _ in rows]
    assert sorted(seen) == sorted(canned.sources) and len(seen) == len(set(seen))
    import esqbe.index.watches as watches_module

    old = watches_module.NEW_PAPERS_PER_PASS
    watches_module.NEW_PAPERS_PER_PASS = 2  # slices of 2: each boundary falls inside a stamp
    try:
        seen = [pid for rows in _new_slices(backend, 10, 14) for _, pid, _ in rows]
    finally:
        watches_module.NEW_PAPERS_PER_PASS = old
    assert sorted(seen) == sorted(canned.sources) and len(seen) == len(set(seen))


def test_recorded_keeps_the_newest_matches_and_every_reported_id():
    doc = {"mark": 5, "found": 0, "matches": [], "reported": []}
    for run in range(3):
        doc = recorded(doc, 10 + run, float(run), [(f"p{run}-{i}", {"i": i}) for i in range(KEPT_MATCHES // 2 + 1)])
    assert len(doc["matches"]) == KEPT_MATCHES and doc["matches"][-1]["paper_id"] == f"p2-{KEPT_MATCHES // 2}"
    assert len(doc["reported"]) == doc["found"] == 3 * (KEPT_MATCHES // 2 + 1)
    again = recorded(doc, 3, 9.0, [("p0-0", {}), ("new", {})])  # one reported before: not again; a mark never goes back
    assert again["reported"][-1] == "new" and again["found"] == doc["found"] + 1 and again["mark"] == 12


@pytest.mark.parametrize("engine", ENGINES)
def test_papers_carry_a_stamp_that_only_grows_and_an_older_index_gets_the_field(engine, caplog):
    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1])
    backend.ensure(META)
    papers = make_papers(3)
    backend.upsert(papers)
    first = {pid: src[STAMP_FIELD] for pid, src in canned.sources.items()}
    assert backend.upsert(papers).unchanged == 3  # unchanged papers are not written: they keep their stamps
    from esqbe.domain import IndexedPaper, Paper

    changed = IndexedPaper(Paper("p1", "A new title", papers[1].paper.sentences, papers[1].paper.facets), papers[1].vectors)
    backend.upsert([changed])
    assert canned.sources["p1"][STAMP_FIELD] > max(first.values())  # re-indexed: new to every watch
    assert {p: canned.sources[p][STAMP_FIELD] for p in ("p0", "p2")} == {p: first[p] for p in ("p0", "p2")}

    # an index made before the field: `ensure` adds it to the mapping (allowed on a strict mapping)
    old, canned2 = make_watching_backend(engine, VERSIONS[engine][0])
    old.ensure(META)
    del canned2.mapping["properties"][STAMP_FIELD]
    reopened = type(old)(old.url, old.index, client=old.client)
    assert reopened.watches_unsupported() and "no indexed_at field" in reopened.watches_unsupported()
    reopened._mapping = None
    reopened.ensure(META)
    (put,) = [r for r in canned2.requests if r["method"] == "PUT" and r["path"] == f"/{INDEX}/_mapping"]
    assert put["lines"][0] == {"properties": {STAMP_FIELD: STAMP_MAPPING}}
    assert reopened.watches_unsupported() is None
    # credentials that may not change the mapping: papers are still written (without the stamp), watches refused
    third, canned3 = make_watching_backend(engine, VERSIONS[engine][-1])
    third.ensure(META)
    del canned3.mapping["properties"][STAMP_FIELD]
    limited = type(third)(third.url, third.index, client=third.client)
    _refuse(canned3, "_mapping", "PUT", 403, "security_exception")
    with caplog.at_level(logging.WARNING, logger="esqbe.backends"):
        limited.ensure(META)
    assert "cannot add the indexed_at field" in caplog.text
    assert limited.upsert(make_papers(2)).added == 2 and STAMP_FIELD not in canned3.sources["p0"]
    assert "no indexed_at field" in limited.watches_unsupported()


def _index(backend) -> Index:
    return Index(backend, load_settings(None).replace(backend=backend.engine, url=backend.url, index=backend.index))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_watch_runs_end_to_end_on_an_engine_index(engine):
    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1])
    backend.ensure(META)
    papers = make_papers(12)
    backend.upsert(papers[:6])
    _answer_knn_over_every_paper(canned)
    index = _index(backend)
    watch, now = add_watch(index, "w", paper_id="p0", min_sim=-1.0, k=100, now=1.0)
    assert np.array_equal(watch.vectors, papers[0].vectors) and [w.name for w in list_watches(index)] == ["w"]
    with pytest.raises(WatchExistsError):
        add_watch(index, "w", paper_id="p1", min_sim=0.0)
    # a second watch of two examples and a paper to avoid: kept whole in its document too
    two, _ = add_watch(index, "two", examples=["p1", "p2"], avoid=["p3"], min_sim=-1.0, k=100)
    assert two.vectors.shape[0] == sum(len(papers[i].paper.sentences) for i in (1, 2, 3))
    assert [r.matches for r in run_watches(index)] == [[], []]  # nothing written since

    backend.upsert(papers[6:])
    dry = run_watches(index, ["w"], dry_run=True)[0]
    assert dry.new_papers == 6 and not dry.advanced
    runs = {r.name: r for r in run_watches(index, now=5.0)}
    new = {f"p{i}" for i in range(6, 12)}
    assert {m["paper_id"] for m in runs["w"].matches} == new and runs["w"].advanced
    assert {m["paper_id"] for m in runs["two"].matches} == new
    assert all(len(m["example_similarities"]) == 2 and m["avoided"][0]["paper_id"] == "p3"
               for m in runs["two"].matches)
    direct = index.query("p0", k=100)  # the same ranking as `esqbe query` over the engine now
    assert [m["paper_id"] for m in runs["w"].matches] == [h.paper_id for h in direct.hits if h.paper_id in new]
    assert run_watches(index)[0].matches == []  # the mark moved on
    assert [pid for pid, *_ in backend.watch_matches("w", 100)] == [m["paper_id"] for m in runs["w"].matches]
    assert [m["paper_id"] for m in watch_matches(index, "w", 3)] == [m["paper_id"] for m in runs["w"].matches][:3]

    # re-indexed: a new stamp, the same id: not reported twice
    changed = papers[7].paper
    from esqbe.domain import IndexedPaper, Paper

    backend.upsert([IndexedPaper(Paper(changed.paper_id, "Changed", changed.sentences, changed.facets), papers[7].vectors)])
    again = run_watches(index)[0]
    assert again.new_papers == 1 and again.matches == []
    old_key = get_watch(index, "w").feed_key
    new_key = revoke_feed_key(index, "w")
    assert new_key != old_key and canned.watch_docs["w"][0]["feed_key"] == get_watch(index, "w").feed_key == new_key
    remove_watch(index, "w")
    assert [w.name for w in list_watches(index)] == ["two"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_attached_index_refuses_watches_with_the_reason(engine):
    from esqbe.backends.engines.attach import AttachedElasticsearchBackend, AttachedOpenSearchBackend

    backend, _ = make_watching_backend(engine, VERSIONS[engine][-1])
    cls = AttachedElasticsearchBackend if engine == "elasticsearch" else AttachedOpenSearchBackend
    attached = cls(backend.url, backend.index, client=backend.client)
    with pytest.raises(WatchesUnsupportedError, match="is attached .* no esqbe indexed_at stamp"):
        add_watch(_index(attached), "w", paper_id="p0", min_sim=0.5)


@pytest.mark.parametrize("engine,version", [("opensearch", "3.5.0")])  # one engine: it loads the model (~10 s)
def test_the_watch_commands_end_to_end_over_http(tmp_path, engine, version):
    """`esqbe index`, `esqbe watch add/run/list/show/remove` through the CLI against the fake engine served on a
    loopback socket (the clients' own transports): the commands take --backend/--url/--index like `esqbe query`."""
    from tests.test_engine_secured import _cli

    from .conftest import SAMPLE
    from .fakes.watching import WatchingEngine
    from .fakes.wire import EngineHTTPServer

    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    first, more = tmp_path / "first.jsonl", tmp_path / "more.jsonl"
    first.write_text("\n".join(lines[:8]) + "\n", encoding="utf-8")
    more.write_text("\n".join(lines[8:12]) + "\n", encoding="utf-8")
    ids = [json.loads(line)["paper_id"] for line in lines[:12]]
    server = EngineHTTPServer(WatchingEngine(engine, version))
    try:
        _answer_knn_over_every_paper(server.canned)
        where = ["--backend", engine, "--url", server.url, "--index", INDEX]
        assert _cli("index", *where, str(first)).exit_code == 0
        add = _cli("watch", "add", "w", *where, "--paper", ids[0], "--paper", f"{ids[1]}:method", "--not", ids[2],
                   "--min-sim", "-1", "-k", "50", "--json")
        assert add.exit_code == 0, add.output
        made = json.loads(add.output[add.output.index("{"):])
        assert [e["paper_id"] for e in made["examples"]] == ids[:2] and made["feed"].startswith("/watches/w.atom?key=")
        assert set(server.canned.watch_docs) == {"w"}
        assert _cli("index", *where, str(more)).exit_code == 0
        run = _cli("watch", "run", *where, "--json")
        assert run.exit_code == 0, run.output
        (got,) = json.loads(run.output[run.output.index("["):])
        assert got["new_papers"] == 4 and {m["paper_id"] for m in got["matches"]} == set(ids[8:12]) and got["advanced"]
        assert server.canned.watch_docs["w"][0]["reported"] == [m["paper_id"] for m in got["matches"]]
        listed = _cli("watch", "list", *where)
        assert f"w: paper {ids[0]}, all sentences; paper {ids[1]}, facet method; not paper {ids[2]}" in listed.output
        shown = _cli("watch", "show", "w", *where)
        assert shown.exit_code == 0 and "found 4" in shown.output, shown.output
        assert _cli("watch", "remove", "w", *where).exit_code == 0 and server.canned.watch_docs == {}
    finally:
        server.close()


def test_kill_9_during_watch_run_on_an_engine_leaves_the_old_or_the_new_document(tmp_path):
    """Real `esqbe watch run` processes against the fake engine on a loopback socket, SIGKILLed at several points
    after they first read the watch's document (a run's only write comes after): the stored document is then the
    old one or the new one, whole; a later run completes. (The fake applies a write when it receives it, as an
    engine does; the kill can land before the request, or while its answer is held back: `delays`.)"""
    import os
    import subprocess
    import sys
    import time

    from tests.test_engine_secured import _cli

    from .conftest import REPO, SAMPLE
    from .fakes.watching import WatchingEngine
    from .fakes.wire import EngineHTTPServer

    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    first, more = tmp_path / "first.jsonl", tmp_path / "more.jsonl"
    first.write_text("\n".join(lines[:8]) + "\n", encoding="utf-8")
    more.write_text("\n".join(lines[8:14]) + "\n", encoding="utf-8")
    ids = [json.loads(line)["paper_id"] for line in lines[:14]]
    server = EngineHTTPServer(WatchingEngine("elasticsearch", "9.2.0"))
    canned = server.canned
    where = ["--backend", "elasticsearch", "--url", server.url, "--index", INDEX]

    def run_process() -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        return subprocess.Popen([sys.executable, "-m", "cli", "watch", "run", *where], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def reads_of_the_watch() -> int:
        return sum(1 for r in canned.requests if r["method"] == "GET" and r["path"] == f"/{INDEX}-esqbe-watches/_doc/w")

    try:
        _answer_knn_over_every_paper(canned)
        assert _cli("index", *where, str(first)).exit_code == 0
        assert _cli("watch", "add", "w", *where, "--paper", ids[0], "--facet", "method", "--min-sim", "-1", "-k", "50",
                    ).exit_code == 0
        assert _cli("index", *where, str(more)).exit_code == 0
        dry = _cli("watch", "run", *where, "--dry-run", "--json")
        want = sorted(m["paper_id"] for m in json.loads(dry.output[dry.output.index("["):])[0]["matches"])
        assert want == sorted(ids[8:14])
        before = json.loads(json.dumps(canned.watch_docs["w"][0]))

        def writes_of_the_watch() -> int:
            return sum(1 for r in canned.requests if r["method"] == "PUT" and r["path"] == f"/{INDEX}-esqbe-watches/_doc/w")

        # killed 0 and 0.05 s after its first read of the watch (its write comes later): the old document, or the new
        # one whole; killed while its write is in flight (received and applied, the answer held back 2 s): the new one
        outcomes = []
        for after, delay, in_flight in ((reads_of_the_watch, 0.0, False), (reads_of_the_watch, 0.05, False),
                                        (writes_of_the_watch, 0.0, True)):
            if in_flight:
                canned.after_write["w"].append(lambda: time.sleep(2.0))
            seen, proc = after(), run_process()
            deadline = time.monotonic() + 120
            while proc.poll() is None and after() == seen and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(delay)
            assert proc.poll() is None, "the run ended before it was killed"
            proc.kill()
            proc.communicate(timeout=60)
            stored = canned.watch_docs["w"][0]
            if stored == before:
                outcomes.append("old")
            else:  # the new document, whole: the mark moved and every match recorded, together
                assert sorted(stored["reported"]) == want and stored["mark"] > before["mark"], stored
                assert sorted(m["paper_id"] for m in stored["matches"]) == want and stored["found"] == len(want)
                outcomes.append("new")
            canned.seq_no += 1
            canned.watch_docs["w"] = (json.loads(json.dumps(before)), canned.seq_no)  # the next kill starts over
        assert outcomes[-1] == "new" and "old" in outcomes, outcomes
        done = _cli("watch", "run", *where, "--json")  # a later run completes (or finds nothing new if one did)
        assert done.exit_code == 0, done.output
        assert sorted(canned.watch_docs["w"][0]["reported"]) == want
    finally:
        server.close()
