"""`esqbe eval csfcube` plumbing on a miniature collection in the release layout (built from the sample)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from esqbe.evaluation.metrics import read_trec_run

from .conftest import SAMPLE


@pytest.fixture
def mini_release(tmp_path):
    """Two queries (a method and a result query) over 24 sample abstracts, in CSFCube's file layout."""
    recs = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:24]]
    root = tmp_path / "mini"
    root.mkdir()
    with open(root / "abstracts-csfcube-preds.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps({"paper_id": r["paper_id"], "title": "", "abstract": r["sentences"],
                                "pred_labels": [f"{lab}_label" for lab in r["labels"]]}) + "\n")
    pool = [r["paper_id"] for r in recs[1:]]
    grades = [3 if i % 5 == 0 else 1 if i % 3 == 0 else 0 for i in range(len(pool))]
    for facet in ("background", "method", "result"):
        anns = {recs[0]["paper_id"]: {"cands": pool, "relevance_adju": grades}}
        (root / f"test-pid2anns-csfcube-{facet}.json").write_text(json.dumps(anns))
    qid0 = recs[0]["paper_id"]
    splits = {f: {"fold1_dev": [f"{qid0}_{f}"]} for f in ("background", "method", "result")}
    (root / "evaluation_splits.json").write_text(json.dumps(splits))
    (root / "queries-release.csv").write_text("pid,facet,year,title,paper type\n" + "".join(f"{qid0},{f},2020,x,y\n" for f in ("background", "method", "result")))
    return root


def test_eval_writes_runs_and_results(tmp_path, mini_release):
    out = tmp_path / "out"
    args = ["eval", "csfcube", "--data", str(mini_release), "--out", str(out), "--index-path", str(tmp_path / "ix")]
    r = CliRunner().invoke(main, args + ["--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["name"] == "default"
    table = data["splits"]["dev"]
    assert set(table) == {"background", "method", "result", "all"}
    for facet in table:
        assert set(table[facet]) == {"RP", "P@20", "R@20", "MAP", "NDCG%20"}
        assert all(0 <= v <= 100 for v in table[facet].values())
    run = read_trec_run(out / "default.run")
    qid0 = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]
    assert set(run) == {f"{qid0}_{f}" for f in ("background", "method", "result")}
    assert all(len(v) == 23 for v in run.values())  # the whole pool is ranked

    # a second configuration reuses the index and adds its own run and results entry
    r = CliRunner().invoke(main, args + ["--rescorer", "ts"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "contextual-ts-cand-auto-bm25w0.1 — split dev" in r.stdout
    assert (out / "contextual-ts-cand-auto-bm25w0.1.run").exists()
    assert set(json.loads((out / "results.json").read_text())) == {"default", "contextual-ts-cand-auto-bm25w0.1"}


def test_eval_checks_the_collections_sample_run(tmp_path):
    """`esqbe eval csfcube` reproduces the collection script's figures for its sample run, or refuses."""
    import shutil

    from esqbe.evaluation.evaluate import check_conformance

    from .conftest import shared_path

    data = shared_path("data", "csfcube-dev")
    verdict, table = check_conformance(str(data))
    assert "exactly the 20 figures" in verdict
    assert table.splits["dev"]["all"]["NDCG%20"] == json.loads((data / "conformance" / "expected-dev-metrics.json").read_text())["metrics"]["all"]["NDCG%20"]

    copy = tmp_path / "cube"
    shutil.copytree(data, copy)
    expected = json.loads((copy / "conformance" / "expected-dev-metrics.json").read_text())
    expected["metrics"]["method"]["MAP"] += 0.01
    (copy / "conformance" / "expected-dev-metrics.json").write_text(json.dumps(expected))
    with pytest.raises(ValueError, match="method MAP"):
        check_conformance(str(copy))
    assert check_conformance(str(tmp_path)) is None  # no conformance/ folder: nothing to check


def test_eval_names_and_commands_the_encoder_runtime(tmp_path, mini_release):
    """`esqbe eval csfcube --encoder-backend torch` ranks with another runtime's vectors than a fresh `auto` run
    (onnx-int8 on CPU): its run was named `default` and its printed command left the flag out, so the two runs
    overwrote each other in results.json and the command, run as printed, ranked with the other runtime (and,
    naming ../shared/data/csfcube-dev whatever --data was, another collection). Now the run is named and commanded
    by its runtime and data, and the printed command, run again on a fresh index, gives the same name, command and
    figures."""
    import shlex

    from esqbe.evaluation.evaluate import backend_flag, resolved_backend
    from esqbe.settings.config import Settings

    if backend_flag(Settings(), "torch") is None:
        pytest.skip(f"auto picks torch here ({resolved_backend(Settings())}): nothing to name")

    def run(args, where):
        out = tmp_path / f"out-{where}"
        r = CliRunner().invoke(main, args + ["--index-path", str(tmp_path / f"ix-{where}"), "--out", str(out)],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output, json.loads((out / "results.json").read_text())

    text, results = run(["eval", "csfcube", "--data", str(mini_release), "--encoder-backend", "torch"], "first")
    (name, entry), = results.items()
    assert name == "backend-torch" and entry["config"]["encoder_backend"] == "torch"
    assert entry["command"].endswith("--encoder-backend torch"), entry["command"]
    assert f"{name} — split dev" in text
    printed = shlex.split(entry["command"])
    assert printed[:3] == ["esqbe", "eval", "csfcube"]
    _, again = run(printed[1:], "again")
    assert list(again) == [name] and again[name]["command"] == entry["command"]
    assert again[name]["splits"] == entry["splits"]


def test_clscisumm_default_index_is_the_runtimes_own():
    """`esqbe eval clscisumm`'s default index path ignored the runtime: a `--encoder-backend torch` run found the
    `auto` run's index (other vectors) at the same path. Each runtime now has its own default index."""
    from esqbe.evaluation.clscisumm import default_index_path
    from esqbe.evaluation.evaluate import backend_flag
    from esqbe.settings.config import Settings

    other = "torch" if backend_flag(Settings(), "torch") else "onnx-int8"
    assert default_index_path(Settings()) != default_index_path(Settings(encoder_backend=other))
    assert default_index_path(Settings()) == default_index_path(Settings(encoder_backend="auto"))
