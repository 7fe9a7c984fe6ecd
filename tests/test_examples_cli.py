"""`esqbe query` with several examples and papers to avoid: the forms, the output, the usage errors
(exit 2) and a missing paper (exit 1), on a real index through the real command."""
from __future__ import annotations

import json

from click.testing import CliRunner

from cli import main

A, B, C, NO_RESULT = "csabstruct-train-0000", "csabstruct-train-0001", "csabstruct-train-0002", "csabstruct-train-0005"


def run(ix, *args):
    return CliRunner().invoke(main, ["query", "--path", str(ix), "--no-server", *args])


def test_several_papers_with_facets_sentences_a_text_and_one_to_avoid(index_dir_30):
    r = run(index_dir_30, "--paper", f"{A}:method", "--paper", f"{B}:sentences=0,2", "--text",
            "We train a neural parser. It is evaluated on treebanks.", "--not", f"{C}:method", "--json", "-k", "30")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    examples = data["query"]["examples"]
    assert [(e["paper_id"], e["facet"]) for e in examples] == [(A, "method"), (B, None), (None, None)]
    assert [s["index"] for s in examples[1]["sentences"]] == [0, 2]
    assert [(a["paper_id"], a["facet"]) for a in data["query"]["avoid"]] == [(C, "method")]
    ids = [h["paper_id"] for h in data["hits"]]
    assert len(ids) == 27 and not {A, B, C} & set(ids)
    assert all(len(h["example_similarities"]) == 3 and h["avoided"][0]["paper_id"] == C for h in data["hits"])

    # --facet is every example's and every avoided paper's without its own; the output for people names them, and
    # what the avoided paper took off (Rocchio's rule: every hit loses something)
    r = run(index_dir_30, "--paper", A, "--paper", B, "--facet", "method", "--not", C, "--avoid-rule", "rocchio")
    assert r.exit_code == 0, r.output
    assert f"examples: 1. {A} (method: sentences" in r.stdout and f"2. {B} (method" in r.stdout
    assert f"not like: {C} (method" in r.stdout and "pulled down" in r.stdout and f"by {C} [" in r.stdout
    assert "example 2 query [" in r.stdout


def test_one_paper_with_its_facet_is_the_plain_query(index_dir_30):
    plain = json.loads(run(index_dir_30, "--paper", A, "--facet", "method", "--json").stdout)
    suffixed = json.loads(run(index_dir_30, "--paper", f"{A}:method", "--json").stdout)
    assert [(h["paper_id"], h["score"]) for h in plain["hits"]] == [(h["paper_id"], h["score"]) for h in suffixed["hits"]]


def test_bad_examples_are_usage_errors_and_a_missing_paper_exit_1(index_dir_30):
    for args, message in [
        (["--paper", A, "--paper", A], "given twice"),
        (["--paper", A, "--paper", B, "--not", B], "both an example and to avoid"),
        (["--not", C], "at least one example"),
        (["--paper", A, "--paper", B, "--sentences", "0"], "--paper ID:sentences=1,3"),
        (["--paper", f"{A}:sentences=x"], "ID:sentences=I,J"),
        (["--paper", A, "--not", f"{C}:sentences=1"], "takes a facet"),
        ([arg for i in range(17) for arg in ("--paper", f"csabstruct-train-{i:04d}")], "at most 16"),
    ]:
        r = run(index_dir_30, *args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output, (args, r.output)
    r = run(index_dir_30, "--paper", A, "--paper", "no-such-paper", "--not", "nor-this")
    assert r.exit_code == 1 and "no-such-paper, nor-this are not in the index" in r.output
    r = run(index_dir_30, "--paper", A, "--not", NO_RESULT, "--facet", "result")
    assert r.exit_code == 1 and f"{NO_RESULT} has no sentence labelled 'result'" in r.output
