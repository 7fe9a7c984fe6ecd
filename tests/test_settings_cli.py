"""Settings and keys as a user meets them through the real CLI: a config file's typo is named
with the setting it is nearest to; a config may set the facet `esqbe query` asks with; esqbe's internal metadata
keys (the tagger's flag, the input hash, a name's family/given parts) are in no list a user reads (`esqbe stats`,
the key list of a filter with a typo, from `esqbe query` and `esqbe list`), though they still filter when named.
(A config's query settings going to a warm server: tests/test_warm_query.py.)"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import esqbe
from cli import main

from .conftest import REPO

DATA = REPO / "tests" / "data" / "library"
INTERNAL = ("facets_predicted", "facet_probs", "input_hash", "authors.family", "authors.given", "authors.literal")


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env={"ESQBE_CONFIG": None, "ESQBE_DEFAULT_FACET": None,
                                                                 **(env or {})})


@pytest.fixture(scope="module")
def library(tmp_path_factory, encoder):
    """An index of the Zotero samples (BibTeX and CSL-JSON: names split into family/given, an organisation as a
    literal); their labels predicted by the tagger (facets_predicted, facet_probs, input_hash)."""
    root = tmp_path_factory.mktemp("settings-cli")
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(DATA / "zotero.bib"), str(DATA / "zotero-csl.json")])
        assert report.stored == 2 and report.tagged == 2, report.summary()
        stored = index.get(["vaswani2017attention"])["vaswani2017attention"].metadata
    assert {"facets_predicted", "input_hash"} <= set(stored) and "family" in stored["authors"][0]  # they are there
    return root / "ix"


def test_a_config_typo_is_named_with_the_setting_it_is_nearest_to(library, tmp_path):
    bad = tmp_path / "esqbe.yaml"
    bad.write_text("rescore: asym\nK: 5\nfinal_bm25_wieght: 0.2\nzzz: 1\n")
    for args in (["config"], ["query", "--path", library, "--paper", "ABCD2345", "--no-server"]):
        r = run(*args, "--config", bad)
        assert r.exit_code == 1, r.output
        assert (f"{bad}: unknown setting(s) K (did you mean k?), final_bm25_wieght (did you mean final_bm25_weight?), "
                "rescore (did you mean rescorer?), zzz; known: ") in r.stderr, r.stderr
        assert "Traceback" not in r.output


def test_a_default_facet_from_the_config(library, tmp_path):
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text("default_facet: method\n")
    query = ("query", "--path", library, "--paper", "vaswani2017attention", "--no-server", "--json")
    r = run(*query, "--config", cfg)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["query"]["facet"] == "method"
    # a flag wins; `--facet all` and chosen sentences ask without a facet
    assert json.loads(run(*query, "--config", cfg, "--facet", "result").stdout)["query"]["facet"] == "result"
    for extra in (("--facet", "all"), ("--sentences", "0,1")):
        r = run(*query, "--config", cfg, *extra)
        assert r.exit_code == 0 and json.loads(r.stdout)["query"]["facet"] is None, r.output
    assert json.loads(run(*query).stdout)["query"]["facet"] is None  # no default: every sentence, as before
    r = run(*query, env={"ESQBE_DEFAULT_FACET": "background"})
    assert json.loads(r.stdout)["query"]["facet"] == "background", r.output
    cfg.write_text("default_facet: methods\n")
    r = run(*query, "--config", cfg)
    assert r.exit_code == 1 and "default_facet: 'methods' is not one of background, method, result" in r.stderr


def test_internal_keys_are_in_no_list_a_user_reads(library):
    r = run("stats", "--path", library, "--json")
    assert r.exit_code == 0, r.output
    keys = json.loads(r.stdout)["metadata_keys"]
    assert keys and not set(keys) & set(INTERNAL), keys
    assert keys["authors"] == 2 and keys["url"] == 2
    text = run("stats", "--path", library).stdout
    assert "metadata_keys:" in text and not any(k in text for k in INTERNAL), text

    for args in (("list",), ("query", "--paper", "ABCD2345", "--no-server")):
        r = run(*args, "--path", library, "--filter", "yaer>=2015")
        assert r.exit_code == 1, r.output
        assert "no paper in the index has the key 'yaer'; did you mean year? The index's keys: authors.name," \
               in r.stderr, r.stderr
        assert not any(k in r.stderr for k in INTERNAL), r.stderr
        r = run(*args, "--path", library, "--filter", "facets_predictd=true")  # an internal key is not suggested
        assert r.exit_code == 1 and "did you mean" not in r.stderr and "facets_predicted" not in r.stderr, r.stderr
    # they still filter when named (a name's family part: a citation's surname)
    r = run("list", "--path", library, "--filter", "authors.family=Vaswani")
    assert r.exit_code == 0 and r.stdout.startswith("vaswani2017attention\t2017\t"), r.output
    shown = json.loads(run("show", "--path", library, "vaswani2017attention", "--json").stdout)
    assert not set(shown["metadata"]) & set(INTERNAL)


def test_the_rescore_depth_from_a_flag_the_environment_and_the_config(index_copy, tmp_path):
    """How many first-stage candidates are rescored: the flag, then ESQBE_RESCORE_DEPTH, then the config file, then the
    default (100: every other paper of this 30-paper index); the result says how many it rescored."""
    query = ("query", "--path", index_copy, "--paper", "csabstruct-train-0000", "--no-server", "--json", "-k", "3")
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text("rescore_depth: 11\n")

    def rescored(*extra, env=None):
        r = run(*query, *extra, env=env)
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert len(out["hits"]) == 3
        return out["rescoring"]["in_python"]

    assert rescored() == 29
    assert rescored("--config", cfg) == 11
    assert rescored("--config", cfg, env={"ESQBE_RESCORE_DEPTH": "9"}) == 9
    assert rescored("--config", cfg, "--rescore-depth", "7", env={"ESQBE_RESCORE_DEPTH": "9"}) == 7
    r = run(*query, "--rescore-depth", "0")
    assert r.exit_code == 2 and "--rescore-depth" in r.output and "Traceback" not in r.output
