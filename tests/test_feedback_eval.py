"""`esqbe eval csfcube --feedback P,N` on a miniature collection in the release layout: the
marked papers, the residual runs and judgments as files, and the figures scored from those files."""
from __future__ import annotations

import json

from click.testing import CliRunner

from cli import main
from esqbe.evaluation.csfcube import load_pid2anns
from esqbe.evaluation.metrics import aggregate, evaluate_run, read_trec_run

from .test_evaluate import mini_release  # noqa: F401  (the fixture)


def test_feedback_runs_are_scored_on_the_residual_pool(tmp_path, mini_release):  # noqa: F811
    out = tmp_path / "out"
    args = ["eval", "csfcube", "--data", str(mini_release), "--index-path", str(tmp_path / "ix"), "--out", str(out)]
    r = CliRunner().invoke(main, [*args, "--feedback", "1,1", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    report = json.loads((out / "feedback.json").read_text())
    baseline, feedback = read_trec_run(out / "baseline-residual.run"), read_trec_run(out / "feedback.run")
    full = {}
    for facet in ("background", "method", "result"):
        qrels = load_pid2anns(mini_release / f"test-pid2anns-csfcube-{facet}.json", facet)[0]
        full.update(qrels)
    residual = {}
    for facet in ("background", "method", "result"):
        residual.update(load_pid2anns(out / "residual-qrels" / f"test-pid2anns-csfcube-{facet}.json", facet)[0])
    assert set(baseline) == set(feedback) == set(residual) == set(full)
    marked_any = False
    for qid, marks in report["per_query"].items():
        good, bad = marks["marked_relevant"], marks["marked_wrong"]
        assert len(good) <= 1 and len(bad) <= 1
        assert all(full[qid][p] >= 2 for p in good) and all(full[qid][p] == 0 for p in bad)
        marked = set(good) | set(bad)
        marked_any |= bool(marked)
        # the residual pool is the judged pool less the marked papers, in both runs and in the judgments
        assert set(residual[qid]) == set(full[qid]) - marked
        assert {p for p, _ in baseline[qid]} == {p for p, _ in feedback[qid]} == set(residual[qid])
        # the baseline's residual ranking is the baseline's order with the marked papers taken out
        assert [p for p, _ in baseline[qid]] == [p for p, _ in sorted(baseline[qid], key=lambda x: -x[1])]
    assert marked_any  # the miniature's first 10 hits hold a relevant and a non-relevant paper to mark
    splits = json.loads((out / "residual-qrels" / "evaluation_splits.json").read_text())
    for run, name in ((baseline, "baseline"), (feedback, "feedback")):  # the figures are the files' own
        table = aggregate(evaluate_run(run, residual), splits, "dev")
        assert table["all"]["NDCG%20"] == shown["splits"]["dev"][name]["all"]["NDCG%20"]
    dev = shown["splits"]["dev"]  # the paired difference, from the unrounded figures (so within a rounding step)
    assert abs(dev["difference"]["all"]["NDCG%20"] - (dev["feedback"]["all"]["NDCG%20"] - dev["baseline"]["all"]["NDCG%20"])) <= 0.011

    text = CliRunner().invoke(main, [*args, "--feedback", "1,1"], catch_exceptions=False).stdout
    assert "residual pool" in text and "diff" in text and "NDCG%20 per query:" in text


def test_bad_feedback_counts_are_usage_errors(tmp_path, mini_release):  # noqa: F811
    for bad in ("2", "a,b", "0,0", "11,1", "-1,1"):
        r = CliRunner().invoke(main, ["eval", "csfcube", "--data", str(mini_release), "--feedback", bad])
        assert r.exit_code == 2 and "--feedback" in r.output, (bad, r.output)
