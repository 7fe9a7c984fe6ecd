"""Integration tests: a real Elasticsearch / OpenSearch, end to end (index -> query -> rescore), with the
ranking compared against the embedded backend's on the same papers.

Where the cluster comes from, per engine:
- `ESQBE_ES_URL` / `ESQBE_OS_URL` (e.g. http://localhost:9200): an already running cluster;
- else a docker engine with `docker compose` and the image already pulled: the compose file in docker/
  is started by pytest-docker on a spare port (ESQBE_ES_PORT / ESQBE_OS_PORT, default 19200 / 19201) and
  removed afterwards (image tag: ES_VERSION / OS_VERSION, defaults as in the compose files);
- else the tests are skipped, and the skip reason says what is missing.

Each run uses a fresh index name and deletes it at the end.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "csabstruct-sample.jsonl"
N_PAPERS = 60  # papers indexed from the sample: enough for rankings to mean something, quick to encode

ENGINES = {
    "elasticsearch": {
        "url_env": "ESQBE_ES_URL",
        "compose": ROOT / "docker" / "elasticsearch-single-node.yml",
        "port_env": "ESQBE_ES_PORT",
        "port": 19200,
        "image": "docker.elastic.co/elasticsearch/elasticsearch:{}",
        "version_env": "ES_VERSION",
        "version": "9.5.1",
    },
    "opensearch": {
        "url_env": "ESQBE_OS_URL",
        "compose": ROOT / "docker" / "opensearch-single-node.yml",
        "port_env": "ESQBE_OS_PORT",
        "port": 19201,
        "image": "opensearchproject/opensearch:{}",
        "version_env": "OS_VERSION",
        "version": "3.5.0",
    },
}


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def docker_problem(image: str) -> str | None:
    """Why a docker-started cluster is not possible here, or None if it is."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    info = _run("docker", "info")
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        return f"docker engine unreachable ({lines[-1] if lines else 'docker info failed'})"
    if _run("docker", "compose", "version").returncode != 0:
        return "the `docker compose` plugin is missing"
    if _run("docker", "image", "inspect", image).returncode != 0:
        return f"image {image} is not present (docker pull {image})"
    return None


def responsive(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_cluster/health", timeout=5) as resp:
            return json.load(resp).get("status") in ("yellow", "green")
    except Exception:
        return False


@pytest.fixture(scope="module", params=sorted(ENGINES))
def cluster(request):
    """(engine kind, URL) of a running cluster, or a skip saying what is missing."""
    kind = request.param
    cfg = ENGINES[kind]
    url = os.environ.get(cfg["url_env"])
    if url:
        yield kind, url.rstrip("/")
        return
    version = os.environ.get(cfg["version_env"], cfg["version"])
    image = cfg["image"].format(version)
    problem = docker_problem(image)
    if problem:
        pytest.skip(f"{kind}: no cluster to test against: set {cfg['url_env']}=http://HOST:9200, "
                    f"or provide a docker engine with {image}; here: {problem}")
    from pytest_docker.plugin import get_docker_services

    port = os.environ.get(cfg["port_env"], str(cfg["port"]))
    saved = {k: os.environ.get(k) for k in (cfg["port_env"], cfg["version_env"])}
    os.environ[cfg["port_env"]], os.environ[cfg["version_env"]] = port, version
    try:
        with get_docker_services("docker compose", str(cfg["compose"]), f"esqbe-test-{kind}-{os.getpid()}",
                                 ["up -d --wait"], ["down -v"]) as services:
            url = f"http://127.0.0.1:{port}"
            services.wait_until_responsive(check=lambda: responsive(url), timeout=300, pause=2)
            yield kind, url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def indexed(cluster, tmp_path_factory):
    """The same papers indexed twice: embedded (the reference) and in the engine."""
    esqbe = pytest.importorskip("esqbe")
    if not SAMPLE.exists():
        pytest.skip(f"sample {SAMPLE} is missing")
    kind, url = cluster
    tmp = tmp_path_factory.mktemp(f"engine-{kind}")
    subset = tmp / "sample.jsonl"
    with open(SAMPLE, encoding="utf-8") as src:
        subset.write_text("".join(itertools.islice(src, N_PAPERS)), encoding="utf-8")
    name = f"esqbe-test-{uuid.uuid4().hex[:10]}"
    embedded = esqbe.open_index(str(tmp / "embedded"))
    engine = esqbe.open_index(None, backend=kind, url=url, index=name)
    try:
        first = embedded.index_files([str(subset)])
        report = engine.index_files([str(subset)])
        assert not report.errors, report.errors[:3]
        assert report.indexed == first.indexed > 0
        yield embedded, engine, subset
    finally:
        try:
            engine.backend.client.indices.delete(index=name)
            engine.backend.client.indices.delete(index=engine.backend.alias_index, ignore_unavailable=True)
        finally:
            engine.close()
            embedded.close()


def _ids() -> list[str]:
    with open(SAMPLE, encoding="utf-8") as fp:
        return [json.loads(line)["paper_id"] for line in itertools.islice(fp, N_PAPERS)]


def test_query_rescore_ranking_matches_embedded(indexed):
    embedded, engine, _ = indexed
    ids = _ids()
    stored = engine.backend.get(ids)
    compared = 0
    for pid, facet in itertools.product(ids[:8], ("background", "method", "result")):
        if not stored[pid].paper.facet_indices(facet):
            continue
        want = embedded.query(paper_id=pid, facet=facet, k=10, rescorer="summax").hits
        got = engine.query(paper_id=pid, facet=facet, k=10, rescorer="summax").hits
        assert [h.paper_id for h in got] == [h.paper_id for h in want], (pid, facet)
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
        assert [h.rank for h in got] == list(range(1, len(got) + 1))
        compared += 1
    assert compared >= 5


def test_centred_rescoring_matches_embedded(indexed):
    """vector_centering samples the engine's papers with random_score and reads their vectors back: with
    every paper in the sample (a small index) the statistics, and so the rankings, equal the embedded ones."""
    embedded, engine, _ = indexed
    ids = _ids()
    assert sorted(engine.backend.sample_papers(len(ids) + 5)[0]) == sorted(ids)
    for pid in ids[:4]:
        for facet in ("method", "result"):
            if not engine.backend.get([pid])[pid].paper.facet_indices(facet):
                continue
            want = embedded.query(paper_id=pid, facet=facet, k=10, vector_centering="top1").hits
            got = engine.query(paper_id=pid, facet=facet, k=10, vector_centering="top1").hits
            assert [h.paper_id for h in got] == [h.paper_id for h in want], (pid, facet)
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)


def test_engine_knn_scores_are_the_cosines(indexed):
    """Candidate.knn from engine scores equals the definition computed from the stored vectors."""
    from esqbe.domain import FirstStageRequest

    _, engine, _ = indexed
    backend = engine.backend
    ids = _ids()
    papers = backend.get(ids)
    query = papers[ids[0]]
    rows = query.paper.facet_indices("method") or [0]
    q = query.vectors[rows]
    request = FirstStageRequest(text="", vectors=q, facet="method", k=len(ids), knn_k=len(ids), bm25_k=0,
                                fusion="knn", exclude=frozenset({ids[0]}), with_papers=False)
    got = {c.paper_id: c.knn for c in backend.first_stage(request)}
    expected = {}
    for pid, ip in papers.items():
        idx = ip.paper.facet_indices("method")
        if pid != ids[0] and idx:
            expected[pid] = float((ip.vectors[idx] @ q.T).max(axis=0).mean())
    assert set(got) == set(expected)
    for pid, value in expected.items():
        assert got[pid] == pytest.approx(value, abs=1e-4), pid


def test_vectors_reach_the_rescorers_bit_exact(indexed):
    embedded, engine, _ = indexed
    ids = _ids()[:10]
    mine, ref = engine.backend.get(ids), embedded.backend.get(ids)
    assert set(mine) == set(ref) == set(ids)
    for pid in ids:
        assert mine[pid].paper.sentences == ref[pid].paper.sentences
        assert mine[pid].paper.facets == ref[pid].paper.facets
        np.testing.assert_array_equal(mine[pid].vectors, ref[pid].vectors)


def test_restrict_to_and_exclude(indexed):
    from esqbe.domain import FirstStageRequest

    _, engine, _ = indexed
    ids = _ids()
    pool = frozenset(ids[5:15])
    query = engine.backend.get([ids[5]])[ids[5]]
    request = FirstStageRequest(text=" ".join(query.paper.sentences), vectors=query.vectors, facet=None, k=50,
                                restrict_to=pool, exclude=frozenset({ids[5]}))
    got = {c.paper_id for c in engine.backend.first_stage(request)}
    assert got and got <= pool - {ids[5]}


def test_rerun_is_idempotent(indexed):
    _, engine, subset = indexed
    before = engine.stats()
    again = engine.index_files([str(subset)])
    assert (again.indexed, again.replaced, again.errors) == (0, 0, [])
    assert again.unchanged == before["papers"]
    assert engine.stats()["papers"] == before["papers"]


# --- what a real engine answers to the cases the contract suite models ---------------------------


def test_600_token_query_text_stays_within_the_clause_limit(indexed):
    """OpenSearch keeps max_clause_count at 1024: a 600-token query used to fail the whole first stage."""
    from esqbe.domain import FirstStageRequest

    _, engine, _ = indexed
    ids = _ids()
    papers = engine.backend.get(ids[:20])
    words = " ".join(" ".join(ip.paper.sentences) for ip in papers.values()).split()
    text = " ".join(itertools.islice(itertools.cycle(words), 600))
    query = papers[ids[0]]
    out = engine.backend.first_stage(FirstStageRequest(text=text, vectors=query.vectors, k=10, with_papers=False))
    assert out and any(c.bm25 > 0 for c in out)
    distinct = " ".join(dict.fromkeys(f"{w}{i}" for i, w in enumerate(words[:600])))  # 600 distinct tokens
    out = engine.backend.first_stage(FirstStageRequest(text=distinct, vectors=query.vectors, k=10, with_papers=False))
    assert out


def test_mget_on_a_missing_index_finds_nothing(cluster):
    import esqbe

    kind, url = cluster
    index = esqbe.open_index(None, backend=kind, url=url, index=f"esqbe-missing-{uuid.uuid4().hex[:8]}")
    try:
        assert index.backend.content_hashes(["a", "b"]) == {}
    finally:
        index.close()


def test_document_without_vectors_b64_falls_back_to_the_indexed_vectors(indexed):
    """A document written by another tool (no vectors_b64): the rescorers still get its sentence vectors."""
    _, engine, _ = indexed
    backend = engine.backend
    pid = _ids()[3]
    source = backend.client.get(index=backend.index, id=pid)
    source = dict(getattr(source, "body", source)["_source"])
    original = backend.get([pid])[pid]
    source.pop("vectors_b64")
    source["paper_id"] = foreign = f"foreign-{uuid.uuid4().hex[:6]}"
    if "vector" not in json.dumps(source):  # ES 9.2+ left the vectors out of _source: put them back
        from esqbe.backends.engines.mapping import FACET_PATHS

        for path in FACET_PATHS.values():
            for row in source.get(path) or ():
                row["vector"] = [float(x) for x in original.vectors[int(row["idx"])]]
    backend.client.index(index=backend.index, id=foreign, body=source, refresh=True)
    try:
        got = backend.get([foreign])[foreign]
        np.testing.assert_allclose(got.vectors, original.vectors, atol=1e-6)
        assert got.paper.sentences == original.paper.sentences
    finally:
        backend.client.delete(index=backend.index, id=foreign, refresh=True)


def test_identical_queries_give_identical_scores(indexed):
    """Every search of one query carries the same `preference`: the same copy answers (three-node clusters)."""
    from esqbe.domain import FirstStageRequest

    _, engine, _ = indexed
    ids = _ids()
    query = engine.backend.get([ids[1]])[ids[1]]
    request = FirstStageRequest(text=" ".join(query.paper.sentences), vectors=query.vectors, k=20, with_papers=False)
    first = [(c.paper_id, c.score, c.bm25, c.knn) for c in engine.backend.first_stage(request)]
    assert first == [(c.paper_id, c.score, c.bm25, c.knn) for c in engine.backend.first_stage(request)]


def test_engine_calibrates_num_candidates_for_the_recall_target(indexed):
    """`esqbe index` on a live engine calibrated num_candidates per facet against exact script_score search and
    stored it in the mapping's _meta; `check recall` then measures at least the target on average."""
    from esqbe.index.recall import check_recall

    _, engine, _ = indexed
    stats = engine.backend.stats()
    cal = stats["knn_calibration"]
    assert cal, stats
    for facet, c in cal.items():
        assert c["recall"] >= c["target"] == 0.95, (facet, c)
        assert stats["knn"][facet].endswith("(calibrated)")
    report = check_recall(engine.backend, queries=20)
    for f in report.facets:
        assert f.recall["@100"]["mean"] >= 0.9, f  # other query papers than the calibration's sample


def test_alias_index_on_a_live_engine(cluster, tmp_path):
    """On a live engine: a later run's record sharing a DOI merges into the paper an earlier
    run stored, a record of the same title, year and first author is reported as its likely duplicate, the DOI and
    the merged-away id find the paper, and deleting it removes every key naming it (tests/test_engine_aliases.py
    checks the same by contract)."""
    esqbe = pytest.importorskip("esqbe")
    from esqbe.index.browse import show_paper

    kind, url = cluster
    with open(SAMPLE, encoding="utf-8") as fp:
        record = json.loads(next(fp))
    abstract = " ".join(record["sentences"]) if "sentences" in record else record["abstract"]
    lib = {"paper_id": "lib0", "title": "Facets of Scientific Papers", "abstract": abstract, "year": 2019,
           "doi": "10.5555/LIB.0", "authors": [{"first": "John", "last": "Smith"}]}
    dump = [{"paper_id": "s2-0", "title": "Library dump zero", "abstract": abstract, "doi": "https://doi.org/10.5555/lib.0"},
            {"paper_id": "s2-twin", "title": "Facets of scientific papers.", "abstract": abstract, "year": 2019,
             "authors": [{"first": "J.", "last": "Smith"}]}]
    (tmp_path / "lib.jsonl").write_text(json.dumps(lib) + "\n")
    (tmp_path / "dump.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dump))
    name = f"esqbe-test-{uuid.uuid4().hex[:10]}"
    index = esqbe.open_index(None, backend=kind, url=url, index=name)
    try:
        assert index.index_files([str(tmp_path / "lib.jsonl")]).indexed == 1
        second = esqbe.open_index(None, backend=kind, url=url, index=name)  # another process's run
        try:
            report = second.index_files([str(tmp_path / "dump.jsonl")])
        finally:
            second.close()
        assert [(m["id"], m["into"]) for m in report.merged] == [("s2-0", "lib0")], report.summary()
        assert [(d["id"], d["like"]) for d in report.likely_duplicates] == [("s2-twin", "lib0")]
        for asked in ("s2-0", "10.5555/lib.0", "https://doi.org/10.5555/LIB.0"):
            assert show_paper(index, asked)["paper_id"] == "lib0"
        assert index.delete(["s2-0"]) == 1
        client = index.backend.client
        client.indices.refresh(index=index.backend.alias_index)
        left = client.search(index=index.backend.alias_index, body={"query": {"term": {"paper_id": "lib0"}}})
        assert getattr(left, "body", left)["hits"]["hits"] == []
        assert index.get(["10.5555/lib.0"]) == {}
    finally:
        try:
            index.backend.client.indices.delete(index=name)
            index.backend.client.indices.delete(index=index.backend.alias_index, ignore_unavailable=True)
        finally:
            index.close()
