"""The CLI's manners: usage errors exit 2, `| head` ends quietly, help says true things,
JSON hits carry no internals and name their facets."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli import main

from .conftest import REPO, SAMPLE

LINES = SAMPLE.read_text().splitlines()
QID = json.loads(LINES[0])["paper_id"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def predicted_ix(tmp_path_factory, encoder):
    """8 papers whose labels esqbe's tagger predicted (their metadata holds its internals)."""
    import esqbe

    root = tmp_path_factory.mktemp("manners")
    src = root / "p.jsonl"
    src.write_text("".join(json.dumps({"id": json.loads(x)["paper_id"], "abstract": " ".join(json.loads(x)["sentences"]),
                                       "year": 2020}) + "\n" for x in LINES[:8]))
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None, facets="predict") as index:
        assert index.index_files([str(src)]).indexed == 8
    return root / "ix"


def test_usage_errors_exit_2(predicted_ix):
    r = run("query", "--path", predicted_ix, "--paper", QID, "--rescorer", "summx")
    assert r.exit_code == 2 and "Invalid value for --rescorer" in r.output and "summax" in r.output
    r = run("query", "--path", predicted_ix)
    assert r.exit_code == 2 and "give --paper ID" in r.output
    r = run("query", "--path", predicted_ix, "--paper", QID, "--paper", QID)  # (--paper with --text: two examples)
    assert r.exit_code == 2 and "given twice" in r.output
    assert run("query", "--path", predicted_ix, "--paper", QID, "--facet", "methods").exit_code == 2


def test_json_hits_carry_no_internals_and_name_the_facets(predicted_ix):
    r = run("query", "--path", predicted_ix, "--paper", QID, "--json")
    hits = json.loads(r.stdout)["hits"]
    assert hits
    for h in hits:
        assert not {"input_hash", "facets_predicted", "facet_probs"} & set(h["metadata"]), h["metadata"]
        assert h["metadata"]["year"] == 2020
    import httpx

    from esqbe.server.app import create_app  # the same shape over HTTP, with the sentences
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    app = create_app(str(predicted_ix), config=None, options=ServeOptions(host="127.0.0.1"))
    with LiveServer(app) as url:
        body = httpx.post(url + "/query", json={"paper_id": QID, "with_sentences": True}, timeout=60).json()
    for h in body["hits"]:
        assert "facet_probs" not in h["metadata"] and "input_hash" not in h["metadata"]
        for s in h["sentences"]:
            assert set(s["probabilities"]) == {"background", "method", "result", "other"}


def test_head_ends_quietly(predicted_ix):
    """`esqbe ... | head`: the reader goes away; esqbe exits 0 without 'Broken pipe' (it printed it and exited 3)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "list", "--path", str(predicted_ix), "--json"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before anything is written: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Broken pipe" not in err and "Errno 32" not in err and "Traceback" not in err


def test_index_help_lists_every_format_with_what_it_is():
    """ `index --help` named 5 of the formats it detects; it lists each `--format` choice, from
    the code's own list, each with a description."""
    from esqbe.cli.index_cmds import FORMAT_HELP
    from esqbe.settings.table import INDEX_FORMATS

    out = run("index", "--help").output
    block = out.split("Formats, detected per file", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [line.split()[0] for line in block] == list(INDEX_FORMATS)
    assert set(FORMAT_HELP) == set(INDEX_FORMATS)
    for line, name in zip(block, INDEX_FORMATS):
        assert " ".join(line.split()[1:]) == " ".join(FORMAT_HELP[name].split())


def test_help_tells_true_things():
    speed = " ".join((REPO / "docs" / "speed.md").read_text().split())
    r = run("index", "--help")
    assert "CSFCube dev NDCG%20 +0.15" in " ".join(r.output.split())
    assert "62.01 against 61.86 (+0.15)" in speed
    tag_help = " ".join(run("tag", "--help").output.split())
    assert "the index's own model" not in tag_help and "for commands that open one" in tag_help



def test_the_score_column_is_called_a_score_and_the_position_is_said_to_be_one(predicted_ix):
    """Item 8: "the `rank` column is a score, not a position (call it so)": each hit line reads `N. sim X  score Y`,
    and the header says what the number before a hit is."""
    import re

    r = run("query", "--path", predicted_ix, "--paper", QID, "-k", "3", "--no-server")
    assert r.exit_code == 0, r.output
    assert "the query and the paper alone decide it" in r.output and "the number before each hit is its position" in r.output
    # the score leads each hit (what orders them), its parts (sim, bm25) on the line below
    rows = re.findall(r"^\s+(\d+)\. score (\S+)\s", r.output, flags=re.M)
    assert [int(n) for n, _ in rows] == [1, 2, 3] and " rank " not in r.output
    scores = [float(x) for _, x in rows]
    assert scores == sorted(scores, reverse=True)
    assert len(re.findall(r"^\s+\(sim \S+, bm25 \S+\)$", r.output, flags=re.M)) == 3


@pytest.mark.parametrize("args", [["train-tagger", "--token-stride", "100000"], ["train-tagger", "--token-stride", "0"],
                                  ["train-encoder", "--group", "100000"], ["train-encoder", "--group", "0"]])
def test_training_sizes_are_bounded_before_any_work(args):
    # --token-stride and --group are bounded integers: a usage error (exit 2), nothing loaded or trained
    from click.testing import CliRunner

    from cli import main

    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "is not in the range" in r.output and "Traceback" not in r.output


def _commands(group, prefix=()):
    import click

    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


def test_help_shows_each_range_once():
    import re

    for path, _cmd in _commands(main):
        text = run(*path, "--help").output
        for line in re.findall(r"\([^()]*\d\.\.\d[^()]*\)[^\n]*\[[^\]]*<=x", text):
            raise AssertionError(f"{' '.join(path)}: a range twice: {line}")
    text = run("query", "--help").output
    assert "[1<=x<=4096]" in " ".join(text.split()) or "<=x<=" in text  # click's own range, once
    assert "1..4096" not in text


def test_every_choice_valued_option_says_did_you_mean():
    import click

    checked = 0
    for path, cmd in _commands(main):
        for param in cmd.params:
            if not isinstance(param.type, click.Choice) or not param.opts[0].startswith("--"):
                continue
            choice = next((c for c in param.type.choices if len(str(c)) >= 4), None)
            if choice is None:
                continue
            typo = str(choice)[:2] + str(choice)[3:]  # one letter dropped
            r = run(*path, param.opts[0], typo)
            assert r.exit_code == 2 and f"did you mean {choice!r}" in r.output, (path, param.opts, r.output)
            checked += 1
    assert checked >= 10  # --facet, --format, --log-level, the settings' choices, ...
    r = run("query", "--paper", "x", "--rescorer", "sumax")  # free text, checked against the registry
    assert r.exit_code != 0 and "did you mean 'summax'" in r.output, r.output


def test_the_tokens_help_lists_every_write_endpoint_of_the_route_table():
    from esqbe.server.middleware import is_write
    from esqbe.server.options import ServeOptions
    from esqbe.server.routes import make_router

    router = make_router(None, ServeOptions(host="127.0.0.1"))
    writes = {(m, r.path.replace(":path}", "}")) for r in router.routes for m in getattr(r, "methods", ())
              if is_write(m, r.path)}
    assert {("POST", "/papers"), ("DELETE", "/papers/{paper_id}"), ("POST", "/watches"), ("POST", "/rerank")} <= writes
    text = " ".join(run("serve", "--help").output.split())
    for method, path in writes:
        assert f"{method} {path}" in text.replace("/ ", "/"), (method, path)
    refused = run("serve", "--host", "0.0.0.0")
    assert refused.exit_code != 0 and all(f"{m} {p}" in refused.output for m, p in writes)
