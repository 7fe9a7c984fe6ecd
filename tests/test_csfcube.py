"""Loading the CSFCube release layout: the real dev data, and clear errors for bad files."""
import json
import os
import shutil
from pathlib import Path

import pytest

from esqbe.evaluation.csfcube import (
    FACETS,
    CSFCubeDataError,
    CSFCubeMissingFile,
    load_csfcube,
    load_pid2anns,
    load_pid2pool_run,
    load_pid2pool_runs,
    load_splits,
    read_abstracts,
    split_qid,
)

DEV = Path(os.environ.get("ESQBE_CSFCUBE_DEV", Path(__file__).resolve().parents[2] / "shared/data/csfcube-dev"))
needs_dev = pytest.mark.skipif(not (DEV / "evaluation_splits.json").is_file(), reason=f"CSFCube dev data not at {DEV}")


@pytest.fixture(scope="module")
def cube():
    return load_csfcube(DEV)


@needs_dev
def test_dev_release_loads(cube):
    assert len(cube.qrels) == 24
    dev = cube.query_ids("dev")
    assert len(dev) == 24 and set(dev) == set(cube.qrels)
    for facet in FACETS:
        qids = cube.query_ids("dev", facet)
        assert len(qids) == 8 and all(q.endswith("_" + facet) for q in qids)
    assert cube.query_ids("fold1_dev", "method") == cube.splits["method"]["fold1_dev"]
    assert cube.complete_splits() == ["fold1_dev"]
    assert cube.scorable_splits() == ["dev"]
    with pytest.raises(KeyError, match="fold1_test"):
        cube.query_ids("test")


@needs_dev
def test_dev_judgements_and_pools(cube):
    for q, judged in cube.qrels.items():
        assert list(judged) == cube.pools[q]
        assert set(judged.values()) <= {0, 1, 2, 3}
        assert len(judged) >= 88
    assert len(cube.pools["11310392_method"]) == 251
    assert set(cube.queries) == set(cube.qrels)
    assert cube.queries["11310392_method"]["year"] == "2017"


@needs_dev
def test_dev_abstracts(cube):
    abstracts = cube.abstracts()
    assert len(abstracts) == 4205
    rec = abstracts["388"]
    assert rec["title"].startswith("A Sentimental Education")
    assert len(rec["abstract"]) == len(rec["pred_labels"])
    # every query paper and every pooled candidate has an abstract
    assert all(split_qid(q)[0] in abstracts for q in cube.qrels)
    assert all(c in abstracts for pool in cube.pools.values() for c in pool)
    paper = next(iter(cube.papers()))
    assert paper.paper_id == next(cube.iter_abstracts())["paper_id"]


@needs_dev
def test_sample_run_loads(cube):
    run = load_pid2pool_runs(DEV / "conformance", "specter")
    assert set(run) == set(cube.qrels)
    first = run["3264891_background"][0]
    assert first[0] == "17157304" and isinstance(first[1], float)
    assert all(set(d for d, _ in r) <= set(cube.qrels[q]) for q, r in run.items())


def test_split_qid():
    assert split_qid("1791179_method") == ("1791179", "method")
    with pytest.raises(ValueError):
        split_qid("1791179_other")


# --- errors -------------------------------------------------------------------------------------

def _copy_release(tmp_path):
    dst = tmp_path / "cube"
    shutil.copytree(DEV, dst, ignore=shutil.ignore_patterns("conformance"))
    for p in dst.iterdir():
        p.chmod(0o644)
    dst.chmod(0o755)
    return dst


@needs_dev
@pytest.mark.parametrize("name", ["test-pid2anns-csfcube-method.json", "evaluation_splits.json",
                                  "abstracts-csfcube-preds.jsonl"])
def test_missing_file_names_path(tmp_path, name):
    root = _copy_release(tmp_path)
    (root / name).unlink()
    with pytest.raises(CSFCubeMissingFile, match=f"{name}: missing") as err:
        load_csfcube(root)
    assert err.value.path == root / name
    assert isinstance(err.value, FileNotFoundError)


def test_missing_directory(tmp_path):
    with pytest.raises(CSFCubeMissingFile, match="not found"):
        load_csfcube(tmp_path / "nowhere")


def test_malformed_pid2anns(tmp_path):
    path = tmp_path / "anns.json"
    cases = {
        "{not json": "not valid JSON",
        "[]": "expected an object",
        json.dumps({"1": {"cands": ["a"]}}): "expected keys",
        json.dumps({"1": {"cands": ["a", "b"], "relevance_adju": [1]}}): "2 cands but 1 grades",
        json.dumps({"1": {"cands": ["a"], "relevance_adju": [4]}}): "grade 4 of a",
        json.dumps({"1": {"cands": ["a", "a"], "relevance_adju": [1, 2]}}): "appears twice",
    }
    for text, reason in cases.items():
        path.write_text(text)
        with pytest.raises(CSFCubeDataError, match=f"anns.json: .*{reason}"):
            load_pid2anns(path, "method")
    path.write_text(json.dumps({"7": {"cands": ["a", "b"], "relevance_adju": [3, 0], "relevance_min": [2, 0]}}))
    assert load_pid2anns(path, "result") == ({"7_result": {"a": 3, "b": 0}}, {"7_result": ["a", "b"]})


def test_malformed_splits_and_runs(tmp_path):
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"method": {"fold1_dev": ["1_result"]}}))
    with pytest.raises(CSFCubeDataError, match="another facet"):
        load_splits(path)
    path.write_text(json.dumps({"method": {"fold1_dev": ["1_method"]}, "result": {"fold1_dev": ["2_result"]}}))
    assert load_splits(path)["all"] == {"fold1_dev": ["1_method", "2_result"]}

    run = tmp_path / "ranked.json"
    run.write_text(json.dumps({"1": [["a", 0.5], ["b"]]}))
    with pytest.raises(CSFCubeDataError, match="query 1, rank 2"):
        load_pid2pool_run(run, "method")
    with pytest.raises(CSFCubeMissingFile, match="nope.json: missing"):
        load_pid2pool_run(tmp_path / "nope.json", "method")


def test_malformed_abstract_line(tmp_path):
    path = tmp_path / "abstracts.jsonl"
    path.write_text('{"paper_id": "1", "abstract": ["a."], "pred_labels": ["method_label"]}\n{"paper_id": 2}\n')
    with pytest.raises(CSFCubeDataError, match="abstracts.jsonl: line 2"):
        list(read_abstracts(path))
