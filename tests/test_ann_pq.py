"""The writer's 4-bit PQ fast-scan IVF on real vectors: CSFCube dev abstracts encoded by the
real default model, the ANN forced on (a low exact_threshold). Facets with enough rows get an IVF-PQ fast-scan whose
calibration tunes nprobe and the papers re-scored exactly (refine) to the recall target, `check recall` agrees with
an independent numpy computation, `stats` names the structure and its knobs; a facet entry as the writer stored it
before (IVF-SQ8, no structure or refine in the manifest) still queries as it did."""
from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pytest

from tests.test_recall import _cli, csfcube_index, first_stage_recalls

N_PAPERS = 700  # ~4,800 rows: background and method past the PQ's minimum (1,000 rows), result and other below it
QUERIES = 30


@pytest.fixture(scope="module")
def csfcube_pq(tmp_path_factory, csfcube_encoded):
    return csfcube_index(tmp_path_factory.mktemp("csfcube-pq"), csfcube_encoded, N_PAPERS, exact_threshold=100)


def test_writer_builds_pq_fastscan_calibrated_for_nprobe_and_refine(csfcube_pq):
    from esqbe.backends.embedded.recall import REFINE_LADDER

    stats = json.loads(_cli("stats", "--path", str(csfcube_pq), "--json"))
    cal, knn = stats["knn_calibration"], stats["knn"]
    for facet in ("background", "method"):
        c = cal[facet]
        assert c["structure"] == "ivf-pq4fs" and knn[facet].startswith("ivf-pq4fs"), (facet, knn[facet])
        assert c["setting"] == "calibrated" and c["recall"] >= 0.95 and c["refine"] in REFINE_LADDER, c
        assert f"nprobe {c['nprobe']} refine {c['refine']} (calibrated" in knn[facet]
    # a facet below the PQ's minimum keeps the IVF-SQ8 and its 2k re-scored papers
    assert cal["result"]["structure"] == "ivf-sq8" and cal["result"]["refine"] == 2
    assert knn["result"].startswith("ivf-sq8") and "refine" not in knn["result"]


def test_check_recall_on_pq_agrees_with_numpy_and_meets_the_target(csfcube_pq):
    from esqbe.backends.embedded.backend import EmbeddedBackend

    cal = json.loads(_cli("stats", "--path", str(csfcube_pq), "--json"))["knn_calibration"]
    report = json.loads(_cli("check", "recall", "--path", str(csfcube_pq), "--queries", str(QUERIES), "--json"))
    by_facet = {f["facet"]: f for f in report["facets"]}
    with EmbeddedBackend(csfcube_pq, create=False) as b:
        everything = b.get(b.paper_ids())
        ids, _ = b.sample_papers(QUERIES, 0)
        for facet in ("background", "method"):
            c = cal[facet]
            assert by_facet[facet]["setting"] == f"ivf nprobe {c['nprobe']} refine {c['refine']} (calibrated)"
            recalls = first_stage_recalls(b, everything, ids, facet)
            mean = by_facet[facet]["recall"]["@100"]["mean"]
            assert abs(mean - np.mean(recalls)) <= 0.02, (facet, mean, np.mean(recalls))
            assert mean >= 0.95, by_facet[facet]


def test_refine_is_what_holds_recall_on_pq(csfcube_pq):
    """The writer stored what calibration chooses, and a refine above 2 is chosen only where it reaches the target
    scanning fewer lists than re-scoring 2k papers needs."""
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import calibrate_nprobe

    with EmbeddedBackend(csfcube_pq, create=False) as b:
        st = b._state()
        code = _FACET_CODES["background"]
        index = b._ann(st, code)
        pq = calibrate_nprobe(st, code, index, target=0.95, oversample=4, refines=(2, 3, 4, 6, 8))
        two = calibrate_nprobe(st, code, index, target=0.95, oversample=4, refines=(2,))
    entry = st.manifest["background"]
    assert (pq["nprobe"], pq["refine"]) == (entry["nprobe"], entry["refine"])  # what the writer stored
    assert two["refine"] == 2
    assert pq["recall"] >= 0.95 and two["recall"] >= 0.95
    if pq["refine"] > 2:  # more papers re-scored only where that reaches the target with fewer lists
        assert two["nprobe"] > pq["nprobe"]


def test_an_ivf_sq8_entry_written_before_pq_still_queries(csfcube_pq, tmp_path):
    """The manifest entry the writer stored before PQ fast-scan (IVF-SQ8 file, no "structure", no "refine"): read as an
    IVF-SQ8 re-scoring 2k papers, named as before by `check recall`, and its recall holds."""
    from esqbe.backends.embedded.backend import EmbeddedBackend

    path = tmp_path / "old"
    shutil.copytree(csfcube_pq, path)
    db = sqlite3.connect(path / "papers.sqlite")
    manifest = json.loads(db.execute("SELECT value FROM settings WHERE key = 'ann'").fetchone()[0])
    old = {k: v for k, v in manifest["result"].items() if k not in ("structure", "refine")}
    old["calibration"] = {k: v for k, v in old["calibration"].items() if k != "refine"}
    manifest["result"] = old
    db.execute("UPDATE settings SET value = ? WHERE key = 'ann'", (json.dumps(manifest),))
    db.commit()
    db.close()
    stats = json.loads(_cli("stats", "--path", str(path), "--json"))
    assert stats["knn"]["result"].startswith("ivf-sq8") and "refine" not in stats["knn"]["result"]
    assert stats["knn_calibration"]["result"]["refine"] == 2
    report = json.loads(_cli("check", "recall", "--path", str(path), "--queries", str(QUERIES), "--facet", "result",
                             "--json"))["facets"][0]
    assert report["setting"] == f"ivf nprobe {old['nprobe']} (calibrated)"
    assert report["recall"]["@100"]["mean"] >= 0.95, report
    with EmbeddedBackend(path, create=False) as b:
        assert b.refine_for("result") == 2 and b.refine_for("background") == manifest["background"]["refine"]


def test_exact_cap_bounds_the_papers_a_many_sentence_query_rescores(csfcube_pq, tmp_path):
    """`exact_cap`: a query of many sentences re-scores at most max(exact_cap, refine * k) of the
    ANN's papers, each sentence's best candidates first; 0 re-scores the union of every sentence's
    refine * k, as without a cap. The default (1,000) is past any union of this small index (700 papers)."""
    from esqbe.backends.embedded.backend import EmbeddedBackend

    path = tmp_path / "capped"
    shutil.copytree(csfcube_pq, path)
    with EmbeddedBackend(path, create=False) as b:
        everything = b.get(b.paper_ids())
        queries = sorted(everything, key=lambda p: (-len(everything[p].paper.facet_indices("background")), p))[:4]
        refine = b.refine_for("background")
        rescored: list[int] = []
        orig = b._exact_best

        def counting(st, pnos, *a, **kw):
            rescored.append(len(np.unique(pnos)))
            return orig(st, pnos, *a, **kw)

        b._exact_best = counting
        got = {}
        for cap in (0, 1, 10_000):  # 1 is raised to refine * k; 10,000 is past any union here
            b.configure(exact_cap=cap)
            rescored.clear()
            got[cap] = []
            for pid in queries:
                q = everything[pid].vectors[everything[pid].paper.facet_indices("background")]
                got[cap].append(b.knn(q, 100, facet="background", exclude=frozenset({pid})))
            counts = list(rescored)
            if cap == 0:
                union = counts
                assert min(counts) > refine * 100, counts  # these queries' unions are past one sentence's papers
            elif cap == 1:
                assert counts == [refine * 100] * len(queries), counts  # the query paper itself takes no place
            else:
                assert counts == union and got[cap] == got[0]  # a cap past the union changes nothing
        # the capped queries keep most of the uncapped top 10 (the papers best on many sentences)
        kept = [len(set(_top10(a)) & set(_top10(c))) / 10 for a, c in zip(got[0], got[1])]
        assert np.mean(kept) >= 0.8, kept
    assert json.loads(_cli("stats", "--path", str(path), "--json"))["knn_params"]["exact_cap"] == 10_000


def _top10(scores: dict[str, float]) -> list[str]:
    return sorted(scores, key=lambda p: (-scores[p], p))[:10]


def test_calibration_counts_what_the_first_stage_returns(csfcube_pq):
    """Calibration's simulation of a query (recall.first_stage_top, over the ANN's candidates at a rung) returns the
    very papers `knn()` returns at that rung, for query papers of several sentences, at the stored setting and at a
    cheaper one with a tight exact_cap: what calibration counts is what queries and `check recall` get."""
    import faiss

    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import ann_candidate_scores, ann_hits, first_stage_top

    with EmbeddedBackend(csfcube_pq, create=False) as b:
        everything = b.get(b.paper_ids())
        st = b._state()
        code = _FACET_CODES["background"]
        index = b._ann(st, code)
        entry = st.manifest["background"]
        ids, _ = b.sample_papers(12, 3)
        pno_of = {pid: int(b.pnos([pid])[0]) for pid in ids}
        compared = 0
        for nprobe, refine, cap in ((entry["nprobe"], entry["refine"], 2_000), (2, 2, 250)):
            b._overrides.update(nprobe=nprobe, exact_cap=cap)
            b.refine_for = lambda facet, st=None, r=refine: r
            for pid in ids:
                rows = everything[pid].paper.facet_indices("background")
                if not rows:
                    continue
                q = np.ascontiguousarray(everything[pid].vectors[rows], dtype=np.float32)
                got = b.knn(q, 100, facet="background", exclude=frozenset({pid}))
                sp = faiss.SearchParametersIVF(nprobe=nprobe)
                sims, hits = index.search(q, ann_hits(100, int(b.knn_params()["oversample"]), refine), params=sp)
                top = first_stage_top(st, code, ann_candidate_scores(hits, sims, 100, refine), q, pno_of[pid], 100,
                                      max(cap, refine * 100))
                names = b._ids_of(top[top >= 0])
                want = [pid for pid, _ in sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))[:100]]
                assert set(names.values()) == set(want), (pid, nprobe, refine, cap)
                compared += len(rows) > 1
        assert compared >= 4  # queries of several sentences were among them


def test_a_many_sentence_query_searches_the_ann_in_parts_with_the_same_hits(csfcube_pq, monkeypatch):
    """A query of more than `ANN_SPLIT_SENTENCES` sentences has its ANN search split over the ANN threads (a
    many-sentence query left the other core idle); each query sentence is searched on its own, so the kNN is the same as
    one search of all the sentences gives. Real vectors: the papers' own sentences, stacked into long queries."""
    from esqbe.backends.embedded import ann as ann_mod
    from esqbe.backends.embedded.backend import EmbeddedBackend

    with EmbeddedBackend(csfcube_pq, create=False) as b:
        everything = b.get(b.paper_ids())
        ids = sorted(everything)
        parts: list[int] = []
        pool = ann_mod._ann_pool()
        real_submit = pool.submit

        def counting(fn, q, *a, **kw):
            parts.append(len(q))
            return real_submit(fn, q, *a, **kw)

        monkeypatch.setattr(pool, "submit", counting)
        for i, m in enumerate((ann_mod.ANN_SPLIT_SENTENCES + 1, 9, 13)):
            rows = [everything[p].vectors[j] for p in ids[i * 40:(i + 1) * 40]
                    for j in everything[p].paper.facet_indices("background")]
            q = np.stack(rows[:m])
            parts.clear()
            split = b.knn(q, 100, facet="background")
            assert len(parts) == min(ann_mod._ann_threads(), -(-m // ann_mod.ANN_SPLIT_SENTENCES)) > 1, parts
            assert sum(parts) == m and max(parts) - min(parts) <= 1, parts  # parts of nearly equal size
            parts.clear()
            with monkeypatch.context() as never_split:
                never_split.setattr(ann_mod, "ANN_SPLIT_SENTENCES", 10**6)
                whole = b.knn(q, 100, facet="background")
            assert parts == [m]
            assert split == whole and len(whole) >= 100  # each sentence's 100 best papers


def test_ann_effort_scales_the_calibrated_nprobe(csfcube_pq):
    """A query of several examples searches each sentence with `examples_ann_effort` x the calibrated nprobe (issue
    36): the kNN at effort e is the kNN with nprobe fixed at round(e x calibrated), at least one list."""
    from esqbe.backends.embedded.backend import EmbeddedBackend

    with EmbeddedBackend(csfcube_pq, create=False) as b:
        everything = b.get(b.paper_ids())
        st = b._state()
        calibrated = b.nprobe_for("background", st)
        assert calibrated >= 4  # a low effort can be told from the calibrated one
        ids, _ = b.sample_papers(6, 5)
        checked = 0
        for pid in ids:
            rows = everything[pid].paper.facet_indices("background")
            if not rows:
                continue
            q = np.ascontiguousarray(everything[pid].vectors[rows], dtype=np.float32)
            for effort, fixed in ((0.5, round(calibrated * 0.5)), (1e-6, 1)):
                got = b.knn(q, 100, facet="background", exclude=frozenset({pid}), effort=effort)
                b._overrides["nprobe"] = fixed
                want = b.knn(q, 100, facet="background", exclude=frozenset({pid}))
                del b._overrides["nprobe"]
                assert got == want, (pid, effort)
            checked += 1
        assert checked >= 3
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="ANN effort"):
                b.knn(q, 10, facet="background", effort=bad)
