"""Finding and inspecting papers from the CLI (item 3: search, show, list) and `esqbe config`
(item 6): real indexes on disk, the real model and tagger."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main

from .conftest import SAMPLE

LINES = SAMPLE.read_text().splitlines()


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, env=env)


@pytest.fixture(scope="module")
def predicted(tmp_path_factory, encoder):
    """Six papers with metadata whose labels esqbe's tagger predicts (so they have probabilities)."""
    import esqbe

    root = tmp_path_factory.mktemp("info")
    src = root / "p.jsonl"
    recs = []
    for i, line in enumerate(LINES[:6]):
        r = json.loads(line)
        recs.append({"id": r["paper_id"], "title": f"Title {i}", "abstract": " ".join(r["sentences"]),
                     "year": 2015 + i, "venue": "ArXiv" if i % 2 else "ACL",
                     "authors": [{"name": "Ashish Vaswani", "family": "Vaswani", "given": "Ashish"},
                                 {"name": "Google AI Language", "literal": True}, "Noam Shazeer"]})
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None, facets="predict") as index:
        assert index.index_files([str(src)]).indexed == 6
    return root / "ix", recs


def test_show_numbers_sentences_with_facet_and_probability(predicted):
    ix, recs = predicted
    pid = recs[0]["id"]
    data = json.loads(run("show", "--path", ix, pid, "--json").stdout)
    assert data["paper_id"] == pid and data["facets_predicted"] is True
    assert [s["index"] for s in data["sentences"]] == list(range(len(data["sentences"])))
    for s in data["sentences"]:
        assert set(s["probabilities"]) == {"background", "method", "result", "other"}
        assert s["probability"] == s["probabilities"].get(s["facet"])
        assert abs(sum(s["probabilities"].values()) - 1) < 0.01
    assert "facet_probs" not in data["metadata"] and data["metadata"]["year"] == 2015
    text = run("show", "--path", ix, pid).stdout
    first = data["sentences"][0]
    assert f"[0] {first['facet']} {first['probability']:.2f}: {first['text']}" in text
    assert "year: 2015" in text
    # authors read as names, not as the stored dicts (an organisation kept whole)
    assert "authors: Ashish Vaswani; Google AI Language; Noam Shazeer" in text and '{"name"' not in text


def test_show_unknown_paper_is_an_error(predicted):
    r = run("show", "--path", predicted[0], "nope")
    assert r.exit_code != 0 and "paper 'nope' is not in the index" in r.output and "Traceback" not in r.output


def test_search_by_words_and_by_id(predicted):
    ix, recs = predicted
    words = " ".join(json.loads(LINES[3])["sentences"][0].split()[:8])
    data = json.loads(run("search", "--path", ix, *words.split(), "--json").stdout)
    assert data["hits"][0]["paper_id"] == recs[3]["id"] and data["hits"][0]["match"] == "words"
    data = json.loads(run("search", "--path", ix, recs[2]["id"], "--json").stdout)
    assert data["hits"][0] == {**data["hits"][0], "paper_id": recs[2]["id"], "match": "id"}
    assert recs[3]["id"] in run("search", "--path", ix, *words.split()).stdout


def test_list_with_filter_and_limit(predicted):
    ix, recs = predicted
    data = json.loads(run("list", "--path", ix, "--json").stdout)
    assert data["total"] == 6 and [p["paper_id"] for p in data["papers"]] == sorted(r["id"] for r in recs)
    data = json.loads(run("list", "--path", ix, "--filter", "year>=2018", "--json").stdout)
    assert sorted(p["paper_id"] for p in data["papers"]) == sorted(r["id"] for r in recs if r["year"] >= 2018)
    r = run("list", "--path", ix, "--filter", "venue=ACL", "--limit", "2")
    assert r.exit_code == 0
    assert len(r.stdout.strip().splitlines()) == 2 and "2 of 3 paper(s) matching the filters" in r.output


def test_config_says_where_each_setting_came_from(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("k: 7\nrescorer: ot\n")
    r = run("config", "--config", cfg, "--rescorer", "ts", "--json", env={"ESQBE_DEVICE": "cpu"})
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["k"] == {"name": "k", "value": 7, "source": "file", "from": str(cfg)}
    assert rows["rescorer"]["value"] == "ts" and rows["rescorer"]["source"] == "flag"
    assert rows["rescorer"]["from"] == "--rescorer"
    assert rows["device"] == {"name": "device", "value": "cpu", "source": "env", "from": "ESQBE_DEVICE"}
    assert rows["fusion"]["source"] == "default" and rows["fusion"]["value"] == "rrf"
    text = run("config", "--config", cfg).stdout
    assert any(line.startswith("k ") and line.rstrip().endswith(f"file {cfg}") for line in text.splitlines())
    bad = run("config", "--config", cfg, env={"ESQBE_ENCODER_BACKEND": "gpu-magic"})
    assert bad.exit_code != 0 and "ESQBE_ENCODER_BACKEND" in bad.output
