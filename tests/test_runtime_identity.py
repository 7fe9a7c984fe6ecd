"""The encoder runtime is part of an index's model identity: an index records how its vectors were
computed (torch-fp32, onnx-int8, ...), `esqbe stats` shows it, a write in another runtime is refused with both
named and the flag to use, `auto` (the default) on an existing index keeps its runtime, and an index from before
runtimes were recorded is taken as torch-fp32. Real model, real index on disk; the CLI in-process."""
from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.domain import IndexMeta
from esqbe.encode.encoder import Encoder
from esqbe.encode.identity import backend_for, runtime_name
from esqbe.errors import ModelMismatchError
from esqbe.settings.config import Settings

from .conftest import SAMPLE


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def int8_encoder():
    return Encoder.load(backend="onnx-int8", device="cpu")


@pytest.fixture
def files(tmp_path):
    lines = SAMPLE.read_text().splitlines()
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("\n".join(lines[:6]) + "\n")
    second.write_text("\n".join(lines[6:9]) + "\n")
    return first, second


def _meta_row(path) -> dict:
    with sqlite3.connect(path / "papers.sqlite") as db:
        return json.loads(db.execute("SELECT value FROM settings WHERE key = 'meta'").fetchone()[0])


def test_runtime_names():
    assert runtime_name("torch") == "torch-fp32" and runtime_name("torch", "bf16") == "torch-bf16"
    assert runtime_name("onnx") == "onnx-fp32" and runtime_name("onnx-int8") == "onnx-int8"
    assert runtime_name("torch-int8") == "torch-int8"
    old = IndexMeta("m", 384)  # an index from before runtimes were recorded
    assert old.effective_runtime == "torch-fp32" and "runtime" not in old.to_dict()
    assert backend_for("auto", old) == "torch" and backend_for(None, IndexMeta("m", 384, runtime="onnx-int8")) == "onnx-int8"
    assert backend_for("torch-int8", IndexMeta("m", 384, runtime="onnx-int8")) == "torch-int8"  # explicit: checked later
    assert backend_for("auto", None) == "auto"
    assert Settings().encoder_backend == "auto"  # fast by default


def test_index_records_its_runtime_and_refuses_another(tmp_path, files, int8_encoder, encoder):
    first, second = files
    path = tmp_path / "ix"
    with esqbe.open_index(str(path), encoder=int8_encoder, config=None) as index:
        assert index.index_files([str(first)]).indexed == 6
    assert int8_encoder.runtime == "onnx-int8" and encoder.runtime == "torch-fp32"
    assert _meta_row(path)["runtime"] == "onnx-int8"

    result = _cli("stats", "--path", path, "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["encoder_runtime"] == "onnx-int8" and stats["encoder_runtime_recorded"] is True
    assert "encoder_runtime: onnx-int8" in _cli("stats", "--path", path).output

    # another runtime on this index: refused, nothing written, both runtimes and the flag named
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        with pytest.raises(ModelMismatchError) as e:
            index.index_files([str(second)])
        assert index.stats()["papers"] == 6
    message = str(e.value)
    assert "onnx-int8" in message and "torch-fp32" in message and "--encoder-backend onnx-int8" in message
    result = _cli("index", second, "--path", path, "--encoder-backend", "torch")
    assert result.exit_code != 0 and "--encoder-backend onnx-int8" in result.output and "Traceback" not in result.output

    # the default (auto) on an existing index keeps its runtime, whatever this machine would pick for a new one
    result = _cli("index", second, "--path", path, "--encoder-backend", "auto")
    assert result.exit_code == 0, result.output
    assert json.loads(_cli("stats", "--path", path, "--json").output)["papers"] == 9

    # a query with another runtime is allowed (its vectors are not stored)
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.query(text="We propose a method.", k=3).hits


def test_an_index_from_before_runtimes_is_taken_as_torch_fp32(tmp_path, files, encoder, int8_encoder):
    first, second = files
    path = tmp_path / "old"
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        index.index_files([str(first)])
    meta = _meta_row(path)
    assert meta.pop("runtime") == "torch-fp32"
    with sqlite3.connect(path / "papers.sqlite") as db:  # as an index written before this change stores it
        db.execute("UPDATE settings SET value = ? WHERE key = 'meta'", (json.dumps(meta),))

    stats = json.loads(_cli("stats", "--path", path, "--json").output)
    assert stats["encoder_runtime"] == "torch-fp32" and stats["encoder_runtime_recorded"] is False
    with esqbe.open_index(str(path), encoder=int8_encoder, config=None) as index:
        with pytest.raises(ModelMismatchError, match="assumed: the index predates recorded runtimes"):
            index.index_files([str(second)])
    # the default settings add to it with its own runtime (torch fp32), and it keeps working
    with esqbe.open_index(str(path), config=None) as index:
        assert index.index_files([str(second)]).indexed == 3
        assert index.encoder.runtime == "torch-fp32"


def test_encoded_parquet_carries_the_runtime(tmp_path, files, int8_encoder, encoder):
    first, _ = files
    with esqbe.open_index(str(tmp_path / "unused"), encoder=int8_encoder, config=None) as index:
        index.encode_files([str(first)], str(tmp_path / "shards"))
    (shard,) = (tmp_path / "shards").glob("*.parquet")
    from esqbe.ingest.encoded import read_meta

    assert read_meta(shard).runtime == "onnx-int8"
    with esqbe.open_index(str(tmp_path / "fp32"), encoder=encoder, config=None) as index:
        index.index_files([str(first)])
        with pytest.raises(ModelMismatchError, match="onnx-int8"):
            index.index_files([str(shard)])
    with esqbe.open_index(str(tmp_path / "int8"), config=None) as index:  # a new index takes the file's runtime
        assert index.index_files([str(shard)]).indexed == 6
        assert index.stats()["encoder_runtime"] == "onnx-int8"


def test_onnx_export_is_keyed_by_the_model_identity(int8_encoder):
    from esqbe.encode.onnx import _weights_digest

    model = int8_encoder.model
    a, b = _weights_digest(model.config, "sha256:aa"), _weights_digest(model.config, "sha256:bb")
    assert a != b and a == _weights_digest(model.config, "sha256:aa")
    assert int8_encoder._runner.path.parent.name == _weights_digest(model.config, int8_encoder.fingerprint)
    assert int8_encoder._runner.path.name.endswith("int8-matmul-per-channel.onnx")


def test_onnx_runtime_does_not_spin_between_runs(int8_encoder):
    # spinning intra-op threads took the 2 cores from tokenising and pooling between two runs
    opts = int8_encoder._runner.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_pooling_matches_the_mean_of_each_sentences_tokens():
    from esqbe.encode.encoder import _pool_row

    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(12, 4)).astype(np.float32)
    # [CLS] title title [SEP] s0 s0 s1 s1 s1 [SEP] pad pad ; a third sentence cut off by truncation
    in_body = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0], bool)
    token_starts = np.array([0, 0, 3, 0, 0, 4, 10, 13, 16, 0, 0, 0])
    out = np.zeros((5, 4), np.float32)
    spans = _pool_row(hidden, in_body, token_starts, np.array([0, 10, 30]), out, [1, 2, 4])
    assert spans == [(4, 6), (6, 9), (0, 0)]
    for row, (a, b) in zip([1, 2], spans[:2]):
        want = hidden[a:b].mean(0)
        assert np.allclose(out[row], want / np.linalg.norm(want), atol=1e-6)
    assert not out[[0, 3, 4]].any()


def test_onnx_rows_run_side_by_side_with_the_serial_loops_vectors_and_order(int8_encoder):
    # indexing runs the int8 encoder's one-row batches `workers` at a time on one-thread sessions: the
    # vectors, the hidden states handed to listeners and their order must be the serial loop's
    papers = _sample_papers(12)
    runner = int8_encoder._runner
    seen: dict[str, list] = {"parallel": [], "serial": []}
    assert runner.workers >= 1
    runner.workers = 2
    try:
        parallel = int8_encoder.contextual_sentence_vectors(papers, on_batch=seen["parallel"].append)
        assert 1 in runner._sessions  # the one-thread session ran the rows
        runner.workers = 1
        serial = int8_encoder.contextual_sentence_vectors(papers, on_batch=seen["serial"].append)
    finally:
        runner.workers = runner._threads
    assert len(parallel) == len(serial) == 12
    for a, b in zip(parallel, serial):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert [b.rows for b in seen["parallel"]] == [b.rows for b in seen["serial"]]
    assert [b.spans for b in seen["parallel"]] == [b.spans for b in seen["serial"]]
    for a, b in zip(seen["parallel"], seen["serial"]):
        np.testing.assert_allclose(a.hidden_states[4].numpy(), b.hidden_states[4].numpy(), atol=1e-5)


def test_listeners_run_on_their_own_thread_beside_the_rows_and_their_errors_reach_the_caller(int8_encoder):
    # the tagger's copied layers (the listener) held the thread that tokenises and pools for the encoder's rows, so
    # the rows waited: tagging cost +4% CPU but +17% wall. They run on a thread of their own, in order.
    import threading

    papers = _sample_papers(12)
    runner = int8_encoder._runner
    names: list[str] = []
    runner.workers = 2
    try:
        int8_encoder.contextual_sentence_vectors(papers, on_batch=lambda b: names.append(threading.current_thread().name))
        assert len(names) > 1 and all(n.startswith("esqbe-listener") for n in names)

        def fail(batch):
            raise ValueError("the listener failed")

        with pytest.raises(ValueError, match="the listener failed"):
            int8_encoder.contextual_sentence_vectors(papers, on_batch=fail)
    finally:
        runner.workers = runner._threads


def test_an_onnx_encoder_with_a_cached_export_starts_without_the_pytorch_weights(int8_encoder):
    # loading the PyTorch model (and transformers' modeling code) cost each `esqbe index` process a few seconds
    # that an ONNX runtime does not use once its export is cached
    again = Encoder.load(backend="onnx-int8", device="cpu")  # int8_encoder made (or found) the export
    assert again._model is None and again._runner.path == int8_encoder._runner.path
    vectors = again.contextual_sentence_vectors(_sample_papers(3))
    assert again._model is None  # encoding did not need it
    for a, b in zip(vectors, int8_encoder.contextual_sentence_vectors(_sample_papers(3))):
        np.testing.assert_array_equal(a, b)
    assert again.model is not None and again._model is again.model  # loaded on first use, once
    assert again.model.config.to_json_string() == again.config.to_json_string()  # so the export's key is the same


def _sample_papers(n):
    from esqbe.ingest.readers import read_papers

    return list(read_papers(str(SAMPLE)))[:n]


def test_an_onnx_encoder_tags_without_the_pytorch_weights_once_its_tagger_is_rebuilt(int8_encoder):
    # the shipped tagger stores its layers as differences from the encoder's own, which needed the PyTorch model
    # in every tagging process; the rebuilt weights are kept beside the ONNX export instead
    import torch

    from esqbe.tagger.runtime import FacetTagger

    papers = _sample_papers(4)
    first = FacetTagger.load(encoder=int8_encoder)  # rebuilt from the PyTorch layers (or found rebuilt)
    fresh = Encoder.load(backend="onnx-int8", device="cpu")
    again = FacetTagger.load(encoder=fresh)
    assert fresh._model is None
    mine = again.net.state_dict()
    assert all(torch.equal(v, mine[k]) for k, v in first.net.state_dict().items())
    assert again.tag(papers) == first.tag(papers)
    assert fresh._model is None  # tagging did not need it either


def test_token_counts_reuse_the_contextual_calls_tokens_and_match_a_fresh_tokenisation(int8_encoder):
    # indexing asks for each paper's wordpiece counts right after encoding it: the encoder's own tokens are reused,
    # and must give what tokenising the paper again gives; a paper changed since is tokenised again
    papers = _sample_papers(5)
    int8_encoder.contextual_sentence_vectors(papers)
    assert all(int8_encoder._recent[id(p)][0] is p for p in papers)
    fresh = [int8_encoder.token_counts(p) for p in papers]
    int8_encoder._recent = {}
    assert fresh == [int8_encoder.token_counts(p) for p in papers]
    int8_encoder.contextual_sentence_vectors(papers)
    papers[0].sentences = papers[0].sentences[:1]  # remembered with its old sentences
    changed = int8_encoder.token_counts(papers[0])
    assert changed != fresh[0]
    int8_encoder._recent = {}
    assert changed == int8_encoder.token_counts(papers[0])


def test_a_listener_runs_the_tagger_head_once_for_labels_and_soft_labels(int8_encoder):
    from esqbe.tagger.runtime import FACET_CLASSES, FacetTagger

    papers = _sample_papers(4)
    tagger = FacetTagger.load(encoder=int8_encoder)
    listener = tagger.listener()
    int8_encoder.contextual_sentence_vectors(papers, on_batch=listener)
    labels = listener.collect(papers)
    first = listener._memo[1]
    probs = listener.facet_probabilities(papers)
    assert listener._memo[1] is first  # the BiLSTM ran once
    for lab, prob in zip(labels, probs):  # and the soft labels are those the labels came from
        assert lab == [FACET_CLASSES[max(range(4), key=row.__getitem__)] for row in prob]


def test_torch_runs_one_thread_beside_the_onnx_rows_and_gets_its_threads_back(int8_encoder):
    # torch's small ops beside the encoder's rows (the tagger's BiLSTM: 4-10x slower on two threads) run on one
    # thread while the rows keep the cores busy; the thread count comes back after, also when blocks nest
    import torch

    from esqbe.encode.encoder import torch_threads

    suite_threads = torch.get_num_threads()  # one under `-n 2` (tests/conftest.py): two here, so that 1 is a change
    torch.set_num_threads(2)
    try:
        before = torch.get_num_threads()
        seen: list[int] = []
        int8_encoder._runner.workers = 2
        try:
            int8_encoder.contextual_sentence_vectors(_sample_papers(3),
                                                     on_batch=lambda b: seen.append(torch.get_num_threads()))
        finally:
            int8_encoder._runner.workers = int8_encoder._runner._threads
        assert before == 2 and seen and set(seen) == {1}
        assert torch.get_num_threads() == before
        with torch_threads(1):
            with torch_threads(1):
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(suite_threads)


def test_a_fresh_export_says_so_and_nothing_of_the_quantisers_chatter(tmp_path):
    """The first `esqbe index` on a machine exports the model (and the tagger's layers) to ONNX and quantises them:
    announced once, and none of onnxruntime's quantiser warnings ("Please consider to run pre-processing before
    quantization", logged through the root logger, so the filters on its named loggers missed it) reach stderr."""
    import os
    import subprocess
    import sys

    from .conftest import REPO

    src = tmp_path / "plain.jsonl"
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:2]]
    src.write_text("".join(json.dumps({"id": r["paper_id"], "title": r.get("title", ""),
                                       "abstract": " ".join(r["sentences"])}) + "\n" for r in rows))
    done = subprocess.run([sys.executable, "-m", "cli", "index", "--path", str(tmp_path / "ix"), str(src)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "ESQBE_CACHE_DIR": str(tmp_path / "cache"),
                               "ESQBE_PROGRESS_SECONDS": "0"},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "exporting the model to ONNX" in done.stderr  # a fresh export did run
    assert list((tmp_path / "cache" / "onnx").glob("tagger-*/layers-int8-*.onnx"))  # and the tagger's layers' too
    assert "pre-processing" not in done.stderr and "WARNING" not in done.stderr, done.stderr
    with esqbe.open_index(str(tmp_path / "ix"), config=None) as index:  # the papers were tagged (by those layers)
        stored = index.backend.get([r["paper_id"] for r in rows])
    assert all(stored[r["paper_id"]].paper.metadata.get("facets_predicted") for r in rows)


def test_quiet_block_drops_the_exporters_root_warnings_only_and_leaves_logging_as_it_was():
    # onnxruntime's quantiser warns through the root logger (`logging.warning`); inside the block that is dropped,
    # the host's own root warnings are not, and a host without root handlers is not given one (basicConfig)
    import logging

    from esqbe.encode.onnx import _quiet

    root = logging.getLogger()
    saved = root.handlers[:]
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    theirs = compile("import logging\nlogging.warning('Please consider to run pre-processing')",
                     "/x/site-packages/onnxruntime/quantization/quantize.py", "exec")
    try:
        root.handlers[:] = []
        with _quiet():
            exec(theirs, {})
        assert root.handlers == [] and root.filters == []  # no basicConfig, the filter came off
        root.addHandler(Keep())
        with _quiet():
            exec(theirs, {})
            logging.getLogger().warning("the host's own warning")
        exec(theirs, {})  # outside the block the host's logging is untouched
        assert seen == ["the host's own warning", "Please consider to run pre-processing"]
    finally:
        root.handlers[:] = saved
