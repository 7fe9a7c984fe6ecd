"""Bad input and faults (issue 9): nothing lost, nothing mixed, no traceback.

Each test drives the real CLI (click's runner, `catch_exceptions=False`, so a traceback fails the
test) or the API against a real index on disk and the real default model.
"""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.config import ConfigError

from .conftest import SAMPLE


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args, input=None, env=None):
        return runner.invoke(main, [str(a) for a in args], input=input, env=env, catch_exceptions=False)

    return invoke


@pytest.fixture
def sample(tmp_path):
    """The first n sample abstracts (given labels) as a JSONL file."""

    def make(n: int, name: str = "papers.jsonl", start: int = 0):
        path = tmp_path / name
        path.write_text("\n".join(SAMPLE.read_text().splitlines()[start : start + n]) + "\n")
        return path

    return make


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A small real index built once through the CLI (read-only use by the tests below)."""
    root = tmp_path_factory.mktemp("built")
    src = root / "papers.jsonl"
    src.write_text("\n".join(SAMPLE.read_text().splitlines()[:12]) + "\n")
    r = CliRunner().invoke(main, ["index", "--path", str(root / "ix"), "--quiet", str(src)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return root / "ix"


FIRST_ID = "csabstruct-train-0000"


# ---------------------------------------------------------------- 3: settings validated before anything is written


def test_config_typo_never_reaches_a_new_index_and_is_refused_on_an_existing_one(run, tmp_path, sample, built):
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text("encoder_mode: independant\n")
    ix = tmp_path / "new-ix"
    r = run("index", "--config", cfg, "--path", ix, sample(3))
    assert r.exit_code == 1
    assert f"error: {cfg}: encoder_mode: 'independant' is not one of contextual, independent" in r.output
    assert not ix.exists()  # nothing was written: a later run with the typo fixed starts clean
    cfg.write_text("encoder_mode: independent\n")
    r = run("index", "--config", cfg, "--path", ix, sample(3))
    assert r.exit_code == 0, r.output
    assert esqbe.open_index(str(ix), create=False).backend.meta().encoder_mode == "independent"

    # an existing index: a query with a misspelt setting is refused, not silently answered
    for bad in ("encoder_mode: independant\n", "fusion: rff\n", "rescorer: summmax\n", "candidate_facet: any\n"):
        cfg.write_text(bad)
        r = run("query", "--config", cfg, "--path", built, "--paper", FIRST_ID, "--facet", "method")
        assert r.exit_code == 1, (bad, r.output)
        assert r.output.startswith(f"error: {cfg}: {bad.split(':')[0]}:"), r.output
    r = run("query", "--path", built, "--paper", FIRST_ID, "--facet", "method", "--rescorer", "summmax")
    assert r.exit_code == 1 and "rescorer: 'summmax' is not one of" in r.output
    # and through the environment, the variable is named
    r = run("stats", "--path", built, env={"ESQBE_DEVICE": "gpu"})
    assert r.exit_code == 1 and "ESQBE_DEVICE: device: 'gpu' is not a torch device" in r.output


# ---------------------------------------------------------------- 4: every number checked (CLI, config, API)


@pytest.mark.parametrize("args", [
    ("-k", "-1"), ("-k", "0"), ("-k", "100001"), ("--bm25-weight", "5"), ("--bm25-weight", "-1"),
    ("--batch-size", "0"),
])
def test_numeric_options_out_of_range_are_usage_errors(run, built, args):
    r = run("query", "--path", built, "--paper", FIRST_ID, "--facet", "method", *args)
    assert r.exit_code == 2, r.output
    assert args[0] in r.output and "range" in r.output


def test_numeric_settings_out_of_range_in_config_and_api(run, tmp_path, built, sample):
    cfg = tmp_path / "esqbe.yaml"
    for bad, key in (("k: -2", "k"), ("k: 0", "k"), ("final_bm25_weight: 5", "final_bm25_weight"),
                     ("fusion_bm25_weight: -0.5", "fusion_bm25_weight"), ("batch_size: 0", "batch_size"),
                     ("commit_every: 0", "commit_every"), ("rescore_depth: -1", "rescore_depth"),
                     ("knn_k: 0", "knn_k"), ("bm25_k: 0", "bm25_k"), ("k: 2.5", "k"), ("k: true", "k")):
        cfg.write_text(bad + "\n")
        r = run("query", "--config", cfg, "--path", built, "--paper", FIRST_ID, "--facet", "method")
        assert r.exit_code == 1, (bad, r.output)
        assert r.output.startswith(f"error: {cfg}: {key}:"), r.output
    r = run("index", "--path", tmp_path / "ix", sample(2), env={"ESQBE_CONFIG": str(cfg)})
    assert r.exit_code == 1 and not (tmp_path / "ix").exists()
    index = esqbe.open_index(str(built), create=False)
    for bad in ({"k": -1}, {"k": 0}, {"final_bm25_weight": 1.5}, {"knn_k": 0}, {"fusion_bm25_weight": -1},
                {"final_bm25_weight": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            index.query(FIRST_ID, facet="method", **bad)
    with pytest.raises(ConfigError, match="batch_size"):
        esqbe.open_index(str(built), create=False, batch_size=0)
    hits = index.query(FIRST_ID, facet="method", k=3).hits
    assert len(hits) == 3
