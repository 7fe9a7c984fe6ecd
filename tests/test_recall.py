"""Recall you can trust on real vectors: CSFCube dev abstracts encoded by the real default model, indexed
with the IVF forced on (a low exact_threshold); `esqbe check recall` against an independent numpy computation over
the stored vectors, the writer's calibration against its target, and the settings that fix nprobe /
exact_threshold reaching the backend."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import esqbe_cli, shared_path

N_PAPERS = 250  # ~1,700 sentence rows: IVFs of 9-18 lists per facet; encoding stays under a minute on 2 cores
QUERIES = 40
EXACT_THRESHOLD = 100


def csfcube_index(base, encoded, n_papers: int, exact_threshold: int):
    """A real embedded index under `base` of the first `n_papers` CSFCube dev abstracts (the collection's labels),
    facets past `exact_threshold` rows behind an ANN: written from their vectors in `encoded` (the session's one
    encoding, conftest `csfcube_encoded`), so no test encodes them twice."""
    import pyarrow.parquet as pq

    import esqbe
    from tests.conftest import CSFCUBE_ENCODED

    assert n_papers <= CSFCUBE_ENCODED
    src = shared_path("data", "csfcube-dev", "abstracts-csfcube-preds.jsonl")
    with open(src) as f:
        wanted = {json.loads(line)["paper_id"] for _, line in zip(range(n_papers), f)}
    table = pq.read_table(encoded)
    subset = table.filter(pc.is_in(table["paper_id"], value_set=pa.array(sorted(wanted))))
    papers = base / "papers.parquet"
    pq.write_table(subset, papers)
    path = base / "index"
    with esqbe.open_index(str(path), config=None, exact_threshold=exact_threshold) as index:
        assert index.index_files([str(papers)]).indexed == n_papers
    return path


@pytest.fixture(scope="session")
def csfcube_ivf(tmp_path_factory, csfcube_encoded):
    """A real embedded index of the first N_PAPERS CSFCube dev abstracts, every facet behind an IVF."""
    return csfcube_index(tmp_path_factory.mktemp("csfcube-ivf"), csfcube_encoded, N_PAPERS, EXACT_THRESHOLD)


def first_stage_recalls(b, everything, ids, facet: str) -> list[float]:
    """recall@100 of the first stage's facet kNN against numpy's exact truth, per sample paper with that facet."""
    from esqbe.domain import FirstStageRequest

    recalls = []
    for pid in ids:
        query = everything[pid]
        if not query.paper.facet_indices(facet):
            continue
        truth = _numpy_truth(everything, query, facet, 100)
        q = query.vectors[query.paper.facet_indices(facet)]
        found = b.first_stage(FirstStageRequest(text="", vectors=q, facet=facet, k=100, knn_k=100, bm25_k=0,
                                                exclude=frozenset({pid}), fusion="knn", with_papers=False))
        recalls.append(len(set(truth) & {c.paper_id for c in found}) / len(truth))
    return recalls


def _run(*args, env=None):
    """The command, in this process, with none of the caller's ESQBE_ variables and `env`'s."""
    return esqbe_cli(*args, env={**dict.fromkeys(k for k in os.environ if k.startswith("ESQBE_")), **(env or {})})


def _cli(*args, env=None):
    run = _run(*args, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _numpy_truth(everything, query, facet: str, k: int) -> list[str]:
    """The first stage's kNN score model computed exactly with numpy: per query sentence the k papers whose best
    sentence of the facet is closest; a paper scores the mean over query sentences of that best cosine."""
    q = query.vectors[query.paper.facet_indices(facet)]
    ids, best = [], []
    for pid, p in everything.items():
        rows = p.paper.facet_indices(facet)
        if pid == query.paper_id or not rows:
            continue
        ids.append(pid)
        best.append((p.vectors[rows] @ q.T).max(axis=0))
    best_a = np.asarray(best)  # (papers, query sentences)
    total = np.zeros(len(ids))
    for j in range(best_a.shape[1]):
        top = np.argsort(-best_a[:, j], kind="stable")[:k]
        total[top] += best_a[top, j]
    order = np.argsort(-total, kind="stable")[:k]
    return [ids[i] for i in order if total[i] > 0]


def test_check_recall_agrees_with_numpy_over_the_stored_vectors(csfcube_ivf):
    from esqbe.backends.embedded.backend import EmbeddedBackend

    report = json.loads(_cli("check", "recall", "--path", str(csfcube_ivf), "--queries", str(QUERIES), "--json"))
    by_facet = {f["facet"]: f for f in report["facets"]}
    assert {"background", "method", "result"} <= set(by_facet)
    with EmbeddedBackend(csfcube_ivf, create=False) as b:
        everything = b.get(b.paper_ids())
        ids, _ = b.sample_papers(QUERIES, 0)  # the same seeded sample the command drew
        for facet in ("background", "method", "result"):
            assert by_facet[facet]["setting"].startswith("ivf nprobe"), by_facet[facet]  # the ANN, not exact
            recalls = first_stage_recalls(b, everything, ids, facet)
            assert by_facet[facet]["queries"] == len(recalls)
            assert abs(by_facet[facet]["recall"]["@100"]["mean"] - np.mean(recalls)) <= 0.02, (facet, np.mean(recalls))


def test_calibrated_nprobe_reaches_the_target_and_a_fixed_one_overrides_it(csfcube_ivf):
    stats = json.loads(_cli("stats", "--path", str(csfcube_ivf), "--json"))
    cal = stats["knn_calibration"]
    assert {"background", "method", "result"} <= set(cal)
    for facet, c in cal.items():
        assert c["setting"] == "calibrated" and c["target"] == 0.95
        assert c["recall"] >= 0.95, (facet, c)
    report = json.loads(_cli("check", "recall", "--path", str(csfcube_ivf), "--queries", str(QUERIES), "--json"))
    for f in report["facets"]:
        if f["facet"] in cal:
            assert f["setting"] == f"ivf nprobe {cal[f['facet']]['nprobe']} (calibrated)"
            assert f["recall"]["@100"]["mean"] >= 0.95, f  # query papers, as `esqbe query` searches
    # one list per query sentence: far below the target, so the calibration is what holds it there
    fixed = json.loads(_cli("check", "recall", "--path", str(csfcube_ivf), "--queries", str(QUERIES), "--facet",
                            "background", "--json", env={"ESQBE_NPROBE": "1"}))["facets"][0]
    assert fixed["setting"] == "ivf nprobe 1 (fixed)"
    assert fixed["recall"]["@100"]["mean"] < 0.9


def test_calibration_follows_the_target(csfcube_ivf):
    """A higher target needs more lists; the measured recall at the chosen nprobe meets each target."""
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import calibrate_nprobe

    with EmbeddedBackend(csfcube_ivf, create=False) as b:
        st = b._state()
        index = b._ann(st, _FACET_CODES["background"])
        low, high = (calibrate_nprobe(st, _FACET_CODES["background"], index, target=t, oversample=4)
                     for t in (0.6, 0.99))
    assert low["recall"] >= 0.6 and high["recall"] >= 0.99
    assert low["lower_bound"] >= 0.6  # the mean is held with 90% confidence, not just reached by the sample
    assert low["lower_bound"] <= low["mean"] and low["queries"] >= 2
    assert low["nprobe"] < high["nprobe"]


def test_exact_threshold_setting_decides_whether_an_ivf_is_built(tmp_path, sample_lines):
    """exact_threshold from the environment reaches the writer: above it an IVF (calibrated), below it exact."""
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:30]) + "\n")
    for threshold, kind in (("10", "ivf"), ("100000", "exact")):
        path = tmp_path / f"ix-{threshold}"
        _cli("index", "--path", str(path), "-q", str(src), env={"ESQBE_EXACT_THRESHOLD": threshold})
        knn = json.loads(_cli("stats", "--path", str(path), "--json"))["knn"]
        assert knn["background"].startswith("ivf-sq8" if kind == "ivf" else "exact"), knn


def test_calibration_can_bound_the_tenth_percentile(csfcube_ivf):
    """statistic="p10": the chosen nprobe holds nine in ten sample sentences at the target, which takes at least as
    many lists as holding the mean there (the mean's choice leaves its p10 below the target)."""
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import calibrate_nprobe

    with EmbeddedBackend(csfcube_ivf, create=False) as b:
        st = b._state()
        index = b._ann(st, _FACET_CODES["background"])
        mean, p10 = (calibrate_nprobe(st, _FACET_CODES["background"], index, target=0.9, oversample=4, statistic=s)
                     for s in ("mean", "p10"))
    assert mean["statistic"] == "mean" and mean["recall"] == mean["mean"] >= 0.9
    assert p10["statistic"] == "p10" and p10["recall"] == p10["p10"] >= 0.9
    assert p10["nprobe"] >= mean["nprobe"]
    if mean["p10"] < 0.9:  # the mean's choice leaves a tail below the target: the p10 bound needed more lists
        assert p10["nprobe"] > mean["nprobe"]


def test_recall_statistic_setting_reaches_the_writer(tmp_path, sample_lines):
    """ESQBE_KNN_RECALL_STATISTIC=p10 reaches the writer's calibration, and stats names what was bounded."""
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:30]) + "\n")
    path = tmp_path / "ix"
    _cli("index", "--path", str(path), "-q", str(src), env={"ESQBE_EXACT_THRESHOLD": "10", "ESQBE_KNN_RECALL_STATISTIC": "p10"})
    stats = json.loads(_cli("stats", "--path", str(path), "--json"))
    cal = stats["knn_calibration"]["background"]
    assert cal["statistic"] == "p10" and cal["recall"] == cal["p10"] >= 0.95, cal
    assert "recall@100 p10 " in stats["knn"]["background"]


def test_a_new_target_recalibrates_the_built_ivfs_without_rebuilding_them(tmp_path, sample_lines):
    """An `esqbe index` run with another knn_recall_target re-calibrates the IVFs built for the old one (no paper
    changed, nothing rebuilt); `esqbe check recall --calibrate` does it on demand and says what it stored."""
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:30]) + "\n")
    path = tmp_path / "ix"
    env = {"ESQBE_EXACT_THRESHOLD": "10"}
    _cli("index", "--path", str(path), "-q", str(src), env=env)
    files = sorted(p.name for p in (path / "ann").iterdir())

    def calibrations():
        return json.loads(_cli("stats", "--path", str(path), "--json"))["knn_calibration"]

    first = calibrations()
    assert first and all(c["target"] == 0.95 and not c["due"] for c in first.values()), first
    # stats under another target says the calibration is not for it, and how to re-calibrate
    other = json.loads(_cli("stats", "--path", str(path), "--json", env={"ESQBE_KNN_RECALL_TARGET": "0.6"}))
    assert all(c["due"] for c in other["knn_calibration"].values())
    assert all("check recall --calibrate" in words for words in other["knn"].values() if "ivf" in words), other["knn"]
    run = _run("index", "--path", str(path), str(src), env={**env, "ESQBE_KNN_RECALL_TARGET": "0.6"})
    assert run.returncode == 0, run.stderr
    assert "calibrating the background ANN index for recall@100 (mean) >= 0.6" in run.stderr  # minutes at 1M: said
    low = calibrations()
    assert set(low) == set(first) and all(c["target"] == 0.6 and c["recall"] >= 0.6 for c in low.values()), low
    assert sorted(p.name for p in (path / "ann").iterdir()) == files  # calibrated again, not rebuilt
    out = json.loads(_cli("check", "recall", "--path", str(path), "--queries", "10", "--calibrate",
                          "--knn-recall-target", "0.99", "--json", env=env))
    assert set(out["calibrated"]) == set(first)
    high = calibrations()
    for facet, c in high.items():
        assert c["target"] == 0.99 and c["recall"] >= 0.99 and c == {**c, **out["calibrated"][facet]}, (facet, c)
        assert c["nprobe"] >= low[facet]["nprobe"]
    # the same target again: nothing due, nothing stored anew
    _cli("index", "--path", str(path), "-q", str(src), env={**env, "ESQBE_KNN_RECALL_TARGET": "0.99"})
    assert calibrations() == high
    text = _cli("check", "recall", "--path", str(path), "--queries", "5", "--calibrate", "--knn-recall-target", "0.9",
                env=env)
    assert all(f"calibrated {facet}: nprobe " in text for facet in first), text


def test_calibrate_refuses_hostile_targets_and_repairs_a_damaged_calibration(tmp_path, sample_lines):
    """`check recall --calibrate` with a target that is not a number in 0.01..1 is refused before anything is
    written (no traceback); a damaged stored calibration (not a dict, a target that is not a number) reads as due in
    stats instead of failing, and `--calibrate` writes a good one, saying per facet on stderr what it calibrates."""
    import sqlite3

    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:30]) + "\n")
    path = tmp_path / "ix"
    env = {"ESQBE_EXACT_THRESHOLD": "10"}
    _cli("index", "--path", str(path), "-q", str(src), env=env)
    before = json.loads(_cli("stats", "--path", str(path), "--json"))["knn_calibration"]
    def cli(*args):
        return _run(*args, env=env)

    for bad in ("nan", "inf", "-inf", "2", "0", "1e309", "x"):
        run = cli("check", "recall", "--path", str(path), "--queries", "2", "--calibrate", "--knn-recall-target", bad)
        assert run.returncode != 0 and "knn-recall-target" in run.stderr.lower().replace("_", "-"), (bad, run.stderr)
        assert "Traceback" not in run.stderr + run.stdout, bad
    assert json.loads(_cli("stats", "--path", str(path), "--json"))["knn_calibration"] == before

    db = sqlite3.connect(path / "papers.sqlite")
    manifest = json.loads(db.execute("SELECT value FROM settings WHERE key = 'ann'").fetchone()[0])
    damaged = sorted(manifest)[:2]
    manifest[damaged[0]]["calibration"] = "not a calibration"
    manifest[damaged[1]]["calibration"] = {**manifest[damaged[1]]["calibration"], "target": "0.95"}
    db.execute("UPDATE settings SET value = ? WHERE key = 'ann'", (json.dumps(manifest),))
    db.commit()
    db.close()
    stats = json.loads(_cli("stats", "--path", str(path), "--json"))["knn_calibration"]
    assert all(stats[f]["due"] for f in damaged) and not any(c["due"] for f, c in stats.items() if f not in damaged)
    run = cli("check", "recall", "--path", str(path), "--queries", "2", "--calibrate")
    assert run.returncode == 0, run.stderr
    assert all(f"calibrating the {f} ANN index for recall@100 (mean) >= 0.95" in run.stderr for f in before), run.stderr
    repaired = json.loads(_cli("stats", "--path", str(path), "--json"))["knn_calibration"]
    assert all(c["target"] == 0.95 and not c["due"] for c in repaired.values()), repaired
