"""The alias table on Elasticsearch/OpenSearch, by contract: no engine runs here. The real
backend code and the real official clients make every request; only the lowest layer is replaced by
tests/fakes/engines.py's canned engine, which keeps the companion `<index>-esqbe-aliases` documents (a second
`create` of an id answers 409, a `_delete_by_query` sees only what a refresh made searchable). These are NOT
integration tests (tests/test_engine_integration.py::test_alias_index_on_a_live_engine runs against a live cluster).

Checked (through the clients, and once over a loopback socket): the bodies against the engines' strict
specifications and the 512-byte `_id` limit; an index run's look-ups batched by its read-ahead; a later run's record
sharing a DOI merges into the paper an earlier run stored; `get` (show, query --paper, --not) by DOI and by a
merged-away id; a likely duplicate across runs is reported with both ids and a watch does not report it; deleting a
paper removes its keys; an index made before the companion index is filled on the next write; hostile answers."""
from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest

pytest.importorskip("jsonschema")
pytest.importorskip("elasticsearch")
pytest.importorskip("opensearchpy")

from esqbe.backends.engines.aliasstore import (  # noqa: E402
    FILLED_ID,
    MAX_ID_BYTES,
    alias_id,
    alias_index_body,
    fill_body,
    forget_body,
)
from esqbe.domain import IndexedPaper, Paper  # noqa: E402
from esqbe.errors import BackendError  # noqa: E402
from esqbe.index.api import Index  # noqa: E402
from esqbe.index.merge import Merger  # noqa: E402
from esqbe.index.reports import IndexReport  # noqa: E402
from esqbe.ingest.readers import ReadReport  # noqa: E402
from esqbe.settings.config import load_settings  # noqa: E402

from .fakes.bodies import mapping_fields, referenced_fields  # noqa: E402
from .fakes.engines import DIM, ENGINE_VERSIONS, INDEX, META, VERSIONS, make_backend  # noqa: E402
from .fakes.specs import assert_valid  # noqa: E402
from .fakes.watching import make_watching_backend  # noqa: E402

ALIASES = f"{INDEX}-esqbe-aliases"
ENGINES = ["elasticsearch", "opensearch"]
DOI = "10.5555/LIB.0"


def _vectors(pid: str, n: int) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha256(pid.encode()).hexdigest()[:8], 16))
    v = rng.normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _record(pid: str, title: str, **meta) -> Paper:
    sentences = [f"{title} is studied in sentence {j}." for j in range(3)]
    return Paper(pid, title, sentences, ["background", "method", "result"], dict(meta))


def _run(backend, records: list[Paper], source: str = "run.jsonl") -> IndexReport:
    """What an index run does with a backend (esqbe.index.ingest): records merged (esqbe.index.merge), then stored."""
    report, read = IndexReport(), ReadReport()
    read.source = source
    papers = list(Merger(lambda: backend, report).papers(records, read))
    backend.upsert([IndexedPaper(p, _vectors(p.paper_id, len(p.sentences))) for p in papers])
    return report


def _index(backend) -> Index:
    return Index(backend, load_settings(None).replace(backend=backend.engine, url=backend.url, index=backend.index))


def _alias_requests(canned) -> list[dict]:
    return [r for r in canned.requests if r["path"].startswith(f"/{ALIASES}")
            or (r["endpoint"] == "_bulk" and any(a.get("_index") == ALIASES for line in r["lines"][0::2]
                                                 for a in line.values() if isinstance(a, dict)))]


def _knn_over_every_paper(canned) -> None:
    def hits(body):
        text = str(body)
        return [(pid, 0.9) for pid in sorted(canned.sources) if f"'{pid}'" not in text]  # less the ids it excludes
    canned.knn_hits = hits


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_alias_bodies_pass_the_spec_and_keys_keep_to_the_id_limit(engine, version):
    backend, canned = make_backend(engine, version, aliases=True)
    backend.ensure(META)
    long_title = "A study of " + " ".join(f"wörd{i}" for i in range(120))
    _run(backend, [_record("p0", "Graphs of Papers Zero", external_ids={"doi": DOI}, year=2020),
                   _record("p1", long_title, year=2021),
                   _record("p2", "Graphs of papers zero", year=2020)])
    (create,) = [r for r in canned.requests if r["method"] == "PUT" and r["path"] == f"/{ALIASES}"]
    assert create["lines"][0] == alias_index_body() == canned.alias_definition
    assert_valid(engine, "indices_create", alias_index_body())
    assert set(mapping_fields(alias_index_body()["mappings"])) == {"paper_id"}
    # every key write: a valid bulk action, `create` with the papers, an `_id` within the limit, `_source` {paper_id}
    bulks = [r for r in _alias_requests(canned) if r["endpoint"] == "_bulk"]
    assert bulks
    for r in bulks:
        for action, source in zip(r["lines"][0::2], r["lines"][1::2]):
            assert_valid(engine, "bulk_action", action)
            (op, meta), = action.items()
            assert op == "create" and meta["_index"] == ALIASES and set(source) == {"paper_id"}
            assert len(meta["_id"].encode()) <= MAX_ID_BYTES
    hashed = [i for i in canned.alias_docs if i.startswith("sha256:")]
    assert len(hashed) == 1 and canned.alias_docs[hashed[0]] == {"paper_id": "p1"}
    assert len(alias_id("title:" + "é" * 300).encode()) <= MAX_ID_BYTES and alias_id("doi:10.1/x") == "doi:10.1/x"
    assert backend.work_aliases([f"doi:{DOI.lower()}"]) == {f"doi:{DOI.lower()}": "p0"}
    # the fill of a new index read one page (nothing yet) and marked the table filled
    for body in (fill_body(None), fill_body("p9"), forget_body(["p0"])):
        assert_valid(engine, "search", body)
        assert referenced_fields(body) | {next(iter(s)) for s in body.get("sort", [])} <= {"paper_id"}
    assert FILLED_ID in canned.alias_docs
    backend.delete(["p1"])
    (forget,) = [r for r in canned.requests if r["endpoint"] == "_delete_by_query"]
    assert forget["path"] == f"/{ALIASES}/_delete_by_query" and forget["lines"][0] == forget_body(["p1"])
    assert hashed[0] not in canned.alias_docs


@pytest.mark.parametrize("engine", ENGINES)
def test_a_later_run_merges_into_the_paper_an_earlier_run_stored_and_every_id_finds_it(engine):
    from esqbe.index.browse import search_papers, show_paper

    backend, canned = make_backend(engine, VERSIONS[engine][-1], aliases=True)
    backend.ensure(META)
    first = _run(backend, [_record("lib0", "Library Paper Zero", external_ids={"doi": DOI, "arxiv": "2101.00042"},
                                   year=2020),
                           _record("lib1", "Library Paper One", year=2020)], "lib.bib")
    assert first.aliases_kept is True and not first.merged
    # the second run in another process: a backend that remembers nothing of the first
    later = type(backend).from_connection(backend)
    second = _run(later, [_record("s2-0", "library paper zero (dump)", external_ids={"doi": f"https://doi.org/{DOI.lower()}"},
                                  year=2020, venue="Dump Venue"),
                          _record("s2-9", "Another paper", year=2021)], "dump.jsonl")
    assert [(m["id"], m["into"], m["by"]) for m in second.merged] == [("s2-0", "lib0", f"doi {DOI.lower()}")]
    assert sorted(canned.sources) == ["lib0", "lib1", "s2-9"]  # one paper: the dump's record updated lib0
    assert canned.sources["lib0"]["metadata"]["venue"] == "Dump Venue"
    assert canned.alias_docs["id:s2-0"] == {"paper_id": "lib0"}

    reader = _index(type(backend).from_connection(backend))
    for name in ("s2-0", DOI, "https://doi.org/10.5555/lib.0", "arXiv:2101.00042v3", "lib0"):
        assert reader.get([name])[name].paper_id == "lib0", name
        assert show_paper(reader, name)["paper_id"] == "lib0"
    assert reader.get(["10.5555/lib.1"]) == {}  # a DOI no paper has is no paper
    _knn_over_every_paper(canned)
    for name in ("s2-0", DOI):  # query --paper by the merged-away id and by the DOI: the paper itself is no hit
        hits = [h.paper_id for h in reader.query(name, k=10).hits]
        assert hits and "lib0" not in hits, (name, hits)
    avoided = [h.paper_id for h in reader.query(examples=["lib1"], avoid=[DOI], k=10).hits]  # --not by DOI
    assert "lib0" not in avoided and avoided
    found = search_papers(reader, DOI)  # search lists it once, found by its identifier
    assert [(r["paper_id"], r["match"]) for r in found if r["paper_id"] == "lib0"] == [("lib0", "identifier")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_likely_duplicate_across_runs_is_reported_with_both_ids_and_a_watch_does_not_report_it(engine):
    from esqbe.index.watches import add_watch, run_watches

    backend, canned = make_watching_backend(engine, VERSIONS[engine][-1], aliases=True)
    backend.ensure(META)
    _run(backend, [_record("twin2019", "Facets of Scientific Papers", year=2019,
                           authors=[{"name": "John Smith"}, {"name": "Jane Doe"}])], "lib.bib")
    _knn_over_every_paper(canned)
    add_watch(_index(backend), "mine", paper_id="twin2019", min_sim=-1.0, k=100)
    later = type(backend).from_connection(backend)
    second = _run(later, [_record("s2-twin", "Facets of scientific papers.", year=2019, authors=[{"name": "J. Smith"}]),
                          _record("s2-namesake", "Facets of Scientific Papers", year=2019, authors=[{"name": "Ada Jones"}]),
                          _record("s2-other", "Another view of the same facets", year=2020)], "dump.jsonl")
    assert [(d["id"], d["like"]) for d in second.likely_duplicates] == [("s2-twin", "twin2019")]
    assert not second.merged and sorted(canned.sources) == ["s2-namesake", "s2-other", "s2-twin", "twin2019"]
    assert any(line.endswith("s2-twin, already in the index as twin2019") for line in second.merge_lines())
    [run] = run_watches(_index(later))
    assert sorted(m["paper_id"] for m in run.matches) == ["s2-namesake", "s2-other"]


@pytest.mark.parametrize("engine", ENGINES)
def test_deleting_a_paper_removes_every_key_naming_it(engine):
    backend, canned = make_backend(engine, VERSIONS[engine][-1], aliases=True)
    backend.ensure(META)
    _run(backend, [_record("lib0", "Library Paper Zero", external_ids={"doi": DOI}, year=2020),
                   _record("lib1", "Library Paper One", external_ids={"doi": "10.5555/lib.1"}, year=2020)])
    _run(type(backend).from_connection(backend), [_record("s2-0", "Dump zero", external_ids={"doi": DOI})])
    named = {i for i, doc in canned.alias_docs.items() if doc.get("paper_id") == "lib0"}
    assert named == {f"doi:{DOI.lower()}", "title:library paper zero (2020)", "id:s2-0"}
    index = _index(type(backend).from_connection(backend))
    assert index.delete(["s2-0"]) == 1  # the merged-away id deletes the paper it names, which goes with its keys
    assert sorted(canned.sources) == ["lib1"]
    assert not any(doc.get("paper_id") == "lib0" for doc in canned.alias_docs.values())
    assert canned.alias_docs["doi:10.5555/lib.1"] == {"paper_id": "lib1"}  # another paper's keys stay
    assert index.get([DOI]) == {} and index.get(["s2-0"]) == {}
    third = _run(type(backend).from_connection(backend), [_record("s2-0", "Dump zero", external_ids={"doi": DOI})])
    assert not third.merged and sorted(canned.sources) == ["lib1", "s2-0"]  # a new paper under its own id
    assert index.get([DOI])[DOI].paper_id == "s2-0"


@pytest.mark.parametrize("engine", ENGINES)
def test_an_index_made_before_the_alias_index_is_filled_on_the_next_write(engine):
    old, canned = make_backend(engine, VERSIONS[engine][-1])  # as an esqbe before the alias index wrote it
    old.ensure(META)
    assert old.keeps_aliases is False
    _run(old, [_record("old", "Facets of Scientific Papers", external_ids={"doi": DOI}, year=2019),
               *[_record(f"o{i}", f"Old paper {i}", year=2000 + i) for i in range(5)]])
    assert canned.alias_definition is None and not canned.alias_docs
    reader = _index(type(old).from_connection(old))
    assert reader.backend.keeps_aliases and reader.get([DOI]) == {}  # a reader does not fill; nothing there yet
    assert canned.alias_definition is None
    import esqbe.backends.engines.aliasstore as store

    page, store.FILL_PAGE = store.FILL_PAGE, 2  # pages of two papers: the fill pages on by id
    try:
        report = _run(type(old).from_connection(old),
                      [_record("new", "FACETS of scientific papers", year=2019),
                       _record("dup", "Dump of the old one", external_ids={"doi": f"doi:{DOI}"})])
    finally:
        store.FILL_PAGE = page
    assert [(d["id"], d["like"]) for d in report.likely_duplicates] == [("new", "old")]
    assert [(m["id"], m["into"]) for m in report.merged] == [("dup", "old")]
    fills = [r["lines"][0] for r in canned.requests if r["endpoint"] == "_search" and "sort" in r["lines"][0]]
    assert [b.get("search_after") for b in fills] == [None, ["o1"], ["o3"], ["old"]]
    assert {f"title:old paper {i} ({2000 + i})" for i in range(5)} <= set(canned.alias_docs)
    assert canned.alias_docs[FILLED_ID] == {"filled": True}
    assert reader.get([DOI])[DOI].paper_id == "old"
    # once filled, a later writer reads the marker and fills nothing again
    n = len(fills)
    _run(type(old).from_connection(old), [_record("x", "Something else", year=2022)])
    assert len([r for r in canned.requests if r["endpoint"] == "_search" and "sort" in r["lines"][0]]) == n


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_alias_answers_are_checked(engine, caplog):
    backend, canned = make_backend(engine, VERSIONS[engine][-1], aliases=True)
    backend.ensure(META)
    _run(backend, [_record("p0", "Graphs of Papers Zero", external_ids={"doi": DOI}, year=2020)])
    key = f"doi:{DOI.lower()}"
    answer = canned._mget

    def malformed(method, segs, record):
        if not canned._is_alias(segs):
            return answer(method, segs, record)
        return 200, {"docs": [None, {"_id": key, "found": True, "_source": {"paper_id": 7}},
                              {"_id": key, "found": True, "_source": "x"}, {"_id": "other", "found": True,
                                                                            "_source": {"paper_id": "p0"}}]}
    canned._mget = malformed
    assert backend.work_aliases([key]) == {} and backend.resolve_ids([DOI]) == {}
    canned._mget = lambda method, segs, record: (200, {"nodocs": 1}) if canned._is_alias(segs) else answer(method, segs, record)
    with pytest.raises(BackendError, match="without `docs`"):
        backend.work_aliases([key])
    del canned._mget
    # a 403 creating the companion index: said, and the run goes on without aliases (within a run only)
    fresh, canned2 = make_backend(engine, VERSIONS[engine][-1], aliases=True)
    fresh.ensure(META)
    canned2.failures["index"] = [403]
    with caplog.at_level(logging.WARNING, logger="esqbe.backends"):
        report = _run(fresh, [_record("a", "Paper A", external_ids={"doi": DOI}),
                              _record("b", "Paper B", external_ids={"doi": DOI})])
    assert "cannot create the alias index" in caplog.text and fresh.keeps_aliases is False
    assert report.aliases_kept is False and any("keeps no alias table" in line for line in report.merge_lines())
    assert [(m["id"], m["into"]) for m in report.merged] == [("b", "a")] and list(canned2.sources) == ["a"]
    # a key write the engine refuses (not a 409) is an error, not a silent gap
    canned.bulk_item_status["title:another paper of graphs (2020)"] = [400]
    with pytest.raises(BackendError, match="writing 1 keys"):
        backend.upsert([IndexedPaper(_record("p5", "Another paper of graphs", year=2020), _vectors("p5", 3))])


def test_an_attached_index_keeps_no_aliases():
    from esqbe.backends.engines.attach import AttachedElasticsearchBackend, AttachedOpenSearchBackend

    assert AttachedElasticsearchBackend.keeps_aliases is False and AttachedOpenSearchBackend.keeps_aliases is False


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_looks_up_its_records_a_read_ahead_at_a_time(engine):
    """One `_mget` of the alias index per LOOKAHEAD records (their identifiers and titles together), not one a record."""
    from esqbe.index.merge import LOOKAHEAD

    backend, canned = make_backend(engine, VERSIONS[engine][-1], aliases=True)
    backend.ensure(META)
    _run(backend, [_record("lib0", "Library Paper Zero", external_ids={"doi": DOI}, year=2020)])
    before = len([r for r in canned.requests if r["endpoint"] == "_mget" and r["path"].startswith(f"/{ALIASES}")])
    n = 2 * LOOKAHEAD + 10
    records = [_record(f"r{i}", f"Record number {i} of many", external_ids={"doi": f"10.5555/r.{i}"}, year=2021)
               for i in range(n - 1)] + [_record("dup", "The library copy", external_ids={"doi": DOI})]
    report = _run(type(backend).from_connection(backend), records)
    lookups = [r for r in canned.requests if r["endpoint"] == "_mget" and r["path"].startswith(f"/{ALIASES}")][before:]
    assert len(lookups) == 3 and sum(len(r["lines"][0]["ids"]) for r in lookups) == 2 * n  # an identifier and a title each
    assert [(m["id"], m["into"]) for m in report.merged] == [("dup", "lib0")]


def test_a_reading_error_comes_after_the_records_read_before_it():
    """The read-ahead holds records back: a reading error mid-way is raised once those before it have gone through."""
    def source():
        yield _record("a", "First")
        yield _record("b", "Second")
        raise OSError("disk gone")

    seen = []
    merger = Merger(lambda: pytest.fail("records with no key to look up open no index"), IndexReport())
    with pytest.raises(OSError, match="disk gone"):
        for p in merger.papers(source(), ReadReport()):
            seen.append(p.paper_id)
    assert seen == ["a", "b"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_alias_index_over_a_loopback_socket(engine):
    """The same over the clients' own HTTP transports (tests/fakes/engines.py's EngineHTTPServer): what goes on the
    wire for the companion index (its `_mget`, the marker's GET, `_delete_by_query?refresh=true&conflicts=proceed`)."""
    from esqbe.index.open import open_backend

    from .fakes.engines import CannedEngine
    from .fakes.wire import EngineHTTPServer

    server = EngineHTTPServer(CannedEngine(engine, VERSIONS[engine][-1]))
    try:
        settings = load_settings(None).replace(backend=engine, url=server.url, index=INDEX)
        first = open_backend(settings, create=True)
        first.ensure(META)
        _run(first, [_record("lib0", "Library Paper Zero", external_ids={"doi": DOI}, year=2020)])
        first.close()
        second = open_backend(settings)
        report = _run(second, [_record("s2-0", "Dump zero", external_ids={"doi": DOI.lower()})])
        assert [(m["id"], m["into"]) for m in report.merged] == [("s2-0", "lib0")]
        assert second.get([DOI])[DOI].paper_id == second.get(["s2-0"])["s2-0"].paper_id == "lib0"
        assert second.delete(["lib0"]) == 1 and second.get([DOI]) == {}
        (forget,) = server.canned.sent("_delete_by_query")
        assert forget["params"] == {"refresh": "true", "conflicts": "proceed"}
        assert not any(doc.get("paper_id") == "lib0" for doc in server.canned.alias_docs.values())
        second.close()
    finally:
        server.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_an_index_made_again_under_its_name_starts_with_an_empty_alias_table(engine):
    """The paper index deleted (by hand) and made again by esqbe: the companion index it left names papers that are
    gone, so esqbe empties it when it makes the index; a record of the same DOI is then a new paper under its own id."""
    backend, canned = make_backend(engine, VERSIONS[engine][-1], aliases=True)
    backend.ensure(META)
    _run(backend, [_record("lib0", "Library Paper Zero", external_ids={"doi": DOI}, year=2020)])
    assert canned.alias_docs and canned.alias_definition is not None
    backend.client.indices.delete(index=INDEX)  # the paper index only, as a user might
    again = type(backend).from_connection(backend)
    again.ensure(META)
    assert canned.alias_docs == {}
    report = _run(again, [_record("s2-0", "Dump zero", external_ids={"doi": DOI}, year=2020)])
    assert not report.merged and list(canned.sources) == ["s2-0"]
    assert again.get([DOI])[DOI].paper_id == "s2-0" and FILLED_ID in canned.alias_docs
