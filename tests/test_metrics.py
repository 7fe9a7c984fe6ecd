"""CSFCube measures: conformance with the collection's reference figures, plus hand-made cases."""
import json
import math
import os
from pathlib import Path

import pytest

from esqbe.evaluation.metrics import (
    MEASURES,
    METRICS,
    aggregate,
    evaluate_run,
    read_trec_run,
    to_percent,
    write_trec_run,
)

DEV = Path(os.environ.get("ESQBE_CSFCUBE_DEV", Path(__file__).resolve().parents[2] / "shared/data/csfcube-dev"))
needs_dev = pytest.mark.skipif(not (DEV / "conformance").is_dir(), reason=f"CSFCube dev data not at {DEV}")


def m(name, grades):
    return MEASURES[name](grades)


# --- conformance -------------------------------------------------------------------------------

@needs_dev
def test_specter_sample_run_reproduces_reference_dev_figures():
    from esqbe.evaluation.csfcube import load_csfcube, load_pid2pool_runs

    expected = json.loads((DEV / "conformance/expected-dev-metrics.json").read_text())
    assert expected["split"] == "fold1_dev"
    cube = load_csfcube(DEV)
    run = load_pid2pool_runs(DEV / "conformance", "specter")
    per_query = evaluate_run(run, cube.qrels)
    got = aggregate(per_query, cube.splits, "dev")
    assert got == aggregate(per_query, cube.splits, "fold1_dev")
    assert set(got) == set(expected["metrics"]) == {"background", "method", "result", "all"}
    for facet, figures in expected["metrics"].items():
        assert set(figures) == set(METRICS)
        for name, value in figures.items():
            assert got[facet][name] == value, (facet, name, got[facet][name], value)


@needs_dev
def test_script_scores_only_the_candidates_a_run_ranks():
    from esqbe.evaluation.csfcube import load_csfcube, load_pid2pool_runs

    cube = load_csfcube(DEV)
    run = load_pid2pool_runs(DEV / "conformance", "specter")
    q = "8781666_result"
    assert len(run[q]) == 100 and len(cube.pools[q]) == 101
    left_out = set(cube.pools[q]) - {d for d, _ in run[q]}
    assert len(left_out) == 1
    missing = left_out.pop()
    assert cube.qrels[q][missing] == 3
    # the run's own 100 candidates are the pool: the left-out grade-3 candidate counts nowhere,
    # neither in R@20's denominator nor in the NDCG ideal
    a = evaluate_run({q: run[q]}, cube.qrels)[q]
    b = evaluate_run({q: run[q] + [(missing, 0.0)]}, cube.qrels)[q]
    n_rel = sum(cube.qrels[q][d] >= 2 for d, _ in run[q])
    assert a["R@20"] == pytest.approx(a["P@20"] * 20 / n_rel)
    assert b["R@20"] == pytest.approx(b["P@20"] * 20 / (n_rel + 1))
    assert b["NDCG%20"] < a["NDCG%20"] and b["MAP"] < a["MAP"]


# --- hand-made cases ---------------------------------------------------------------------------

# Ranked grades used below (10 candidates): relevant (grade >= 2) at ranks 1, 3, 6.
G = [3, 0, 2, 1, 0, 2, 0, 0, 1, 0]


def test_ndcg_pct20_hand_computed():
    # cut = int(0.2 * 10) = 2 -> DCG = 3 + 0/log2(2) = 3; ideal top 2 = [3, 2] -> 3 + 2/log2(2) = 5
    assert m("NDCG%20", G) == pytest.approx(3 / 5)
    # rank 1 undiscounted, rank 2 divided by log2(2) = 1: ranks 1 and 2 weigh the same
    assert m("NDCG%20", [2, 3, 0, 0, 0, 0, 0, 0, 0, 0]) == 1.0
    # 15 candidates -> cut int(3.0) = 3: DCG = 0 + 3/1 + 2/log2(3); ideal = 3 + 2/1 + 0
    assert m("NDCG%20", [0, 3, 2] + [0] * 12) == pytest.approx((3 + 2 / math.log2(3)) / 5)
    # fewer than 5 candidates: cut 0 -> 0; no gain at all -> 0
    assert m("NDCG%20", [3, 3, 3, 3]) == 0.0
    assert m("NDCG%20", [0] * 10) == 0.0
    # whole-list NDCG: rank i >= 2 divided by log2(i)
    dcg = 3 + 2 / math.log2(3) + 1 / math.log2(4) + 2 / math.log2(6) + 1 / math.log2(9)
    ideal = 3 + 2 / 1 + 2 / math.log2(3) + 1 / math.log2(4) + 1 / math.log2(5)
    assert m("NDCG", G) == pytest.approx(dcg / ideal)


def test_map_hand_computed():
    # relevant at 1, 3, 6: AP = (1/1 + 2/3 + 3/6) / 3; grade 1 is not relevant
    assert m("MAP", G) == pytest.approx((1 + 2 / 3 + 3 / 6) / 3)
    assert m("MAP", [1, 1, 0]) == 0.0
    # denominator = relevant candidates ranked, so a perfect prefix is 1 whatever follows
    assert m("MAP", [2, 3, 0, 0]) == 1.0


def test_rp_is_precision_at_last_relevant_rank():
    # last relevant at rank 6, 3 relevant among the first 6 -> 0.5 (true R-precision, P@3, is 2/3)
    assert m("RP", G) == 0.5
    assert m("RP", [0, 0, 2]) == pytest.approx(1 / 3)
    assert m("RP", [2, 0, 0]) == 1.0
    assert m("RP", [0, 1, 0]) == 0.0


def test_precision_and_recall_at_20():
    grades = [2] * 5 + [0] * 15 + [3] * 5 + [0] * 5  # 10 relevant, 5 in the top 20
    assert m("P@20", grades) == 0.25
    assert m("R@20", grades) == 0.5
    assert m("R@20", [0] * 30) == 0.0
    assert m("F1@20", grades) == pytest.approx(2 * 0.25 * 0.5 / 0.75)
    with pytest.raises(ValueError, match="at least 20"):
        m("P@20", [2] * 19)


def test_evaluate_run_fractions_and_errors():
    qrels = {"1_method": {"a": 3, "b": 0, "c": 2, "d": 1}}
    run = {"1_method": [("c", 0.1), ("a", 0.5), ("d", 0.7), ("b", 0.9)]}  # order is the ranking
    out = evaluate_run(run, qrels, measures=["RP", "MAP", "NDCG"])
    assert out == {"1_method": {"RP": 1.0, "MAP": 1.0, "NDCG": pytest.approx((2 + 3 + 1 / math.log2(3)) / (3 + 2 + 1 / math.log2(3)))}}
    with pytest.raises(ValueError, match="not in its judged pool"):
        evaluate_run({"1_method": [("z", 1.0)]}, qrels, measures=["MAP"])
    with pytest.raises(ValueError, match="ranked twice"):
        evaluate_run({"1_method": [("a", 1.0), ("a", 0.5)]}, qrels, measures=["MAP"])
    with pytest.raises(ValueError, match="no judgements"):
        evaluate_run({"2_method": [("a", 1.0)]}, qrels, measures=["MAP"])
    with pytest.raises(ValueError, match="1_method.*at least 20"):
        evaluate_run(run, qrels, measures=["P@20"])
    with pytest.raises(ValueError, match="unknown measure"):
        evaluate_run(run, qrels, measures=["nDCG@10"])


def test_aggregate_folds_and_all_like_the_script():
    per_query = {q: {"MAP": v} for q, v in {
        "1_background": 0.1, "2_background": 0.3,  # fold1
        "3_background": 0.5,                       # fold2
        "1_method": 0.2,                           # fold1
        "4_method": 0.6, "5_method": 0.8,          # fold2
    }.items()}
    splits = {
        "background": {"fold1_dev": ["3_background"], "fold1_test": ["3_background"],
                       "fold2_test": ["1_background", "2_background"]},
        "method": {"fold1_dev": ["4_method", "5_method"], "fold1_test": ["4_method", "5_method"],
                   "fold2_test": ["1_method"]},
    }  # no "all": derived by concatenating the facets per fold
    test = aggregate(per_query, splits, "test")
    assert test["background"]["MAP"] == 35.0  # mean(0.5, mean(0.1, 0.3))
    assert test["method"]["MAP"] == 45.0  # mean(mean(0.6, 0.8), 0.2)
    # all: each fold pools its queries (fold1 (0.5+0.6+0.8)/3, fold2 (0.1+0.3+0.2)/3), then the
    # folds are averaged; not the mean of the facet means (40.0)
    assert test["all"]["MAP"] == pytest.approx(to_percent(((1.9 / 3) + (0.6 / 3)) / 2))
    assert test["all"]["MAP"] == 41.67
    assert aggregate(per_query, splits, "dev")["all"]["MAP"] == pytest.approx(to_percent(1.9 / 3))
    assert aggregate(per_query, splits, "dev", facets=["method"]) == {"method": {"MAP": 70.0}}
    with pytest.raises(ValueError, match="not scored"):
        aggregate({"3_background": {"MAP": 1.0}}, splits, "test", facets=["background"])
    with pytest.raises(ValueError, match="no queries"):
        aggregate(per_query, splits, "fold2_dev")


def test_percent_rounding_matches_reference_figures():
    assert to_percent(0.23125) == 23.12  # exact tie in binary -> even (the script's {:.4f} says 0.2313)
    assert to_percent(0.14375000000000002) == 14.38
    assert to_percent(0.2762810708525659) == 27.63
    assert to_percent(0.325) == 32.5


def test_trec_run_round_trip(tmp_path):
    run = {"1_method": [("a", -0.5), ("b", -1.25)], "2_result": [("c", 3.0)]}
    path = tmp_path / "run.trec"
    write_trec_run(path, run, tag="test")
    assert path.read_text().splitlines()[1] == "1_method Q0 b 2 -1.25 test"
    assert read_trec_run(path) == run
    path.write_text("1_method Q0 b 2 9.0 t\n1_method Q0 a 1 0.0 t\n")
    assert read_trec_run(path) == {"1_method": [("a", 0.0), ("b", 9.0)]}  # rank column, not score
    path.write_text("1_method Q0 a one 0.0 t\n")
    with pytest.raises(ValueError, match=r"run.trec:1"):
        read_trec_run(path)
    with pytest.raises(FileNotFoundError, match="nope.trec"):
        read_trec_run(tmp_path / "nope.trec")
    with pytest.raises(ValueError):
        write_trec_run(path, run, tag="two words")
