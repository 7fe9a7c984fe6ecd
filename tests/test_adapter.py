"""Encoder adapters: `esqbe train-encoder` on a miniature citation pack (seeded: the same weights twice),
the adapter merged at load with plain torch (vectors move, the model's identity carries it), an index built with
one refuses the bare model, and the `adapter` setting never loads from a URL."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main
from esqbe.domain import Paper

PAPERS = {
    "P1": ("Statistical machine translation with phrases", [
        "We present a phrase-based translation model.", "Phrases are extracted from word alignments.",
        "The model improves BLEU over word-based systems."]),
    "P2": ("A maximum entropy tagger", [
        "We describe a part-of-speech tagger.", "It uses maximum entropy features of the context.",
        "Accuracy reaches 96 percent on the Penn Treebank."]),
    "P3": ("Unsupervised word sense disambiguation", [
        "Word senses are induced from co-occurrence graphs.", "No annotated data is needed.",
        "The method rivals supervised systems on Senseval."]),
    "P4": ("Parsing with probabilistic grammars", [
        "We train a lexicalised probabilistic context-free grammar.", "Head words condition the rule probabilities.",
        "The parser reaches 88 percent labelled F-measure."]),
}
CITING = {
    "P1": ["phrase-based models extract phrases from alignments (Koehn, 2003)", "translation quality in BLEU improved"],
    "P2": ["a maximum entropy tagger with context features (Ratnaparkhi, 1996)", "taggers reach 96 percent accuracy"],
    "P3": ["senses induced from co-occurrence graphs without annotated data", "unsupervised disambiguation of senses"],
    "P4": ["lexicalised PCFG parsing with head words (Collins, 1997)", "parsers conditioned on head words"],
}


def _pack(tmp: Path) -> Path:
    """The two packs of the real layout: <paper>/Reference_XML/<paper>.xml and <paper>/citing_sentences.json +
    <paper>/annotation/<paper>.ann.txt; one sentence co-cites P2 and P4."""
    def add(tar, name, text):
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    ref, cit = tmp / "pack.Reference_XML.tar.gz", tmp / "pack.citances.tar.gz"
    with tarfile.open(ref, "w:gz") as tar:
        for pid, (title, sents) in PAPERS.items():
            body = "".join(f'<S sid="{i + 1}" ssid="{i + 1}">{s}</S>' for i, s in enumerate(sents))
            add(tar, f"From-ScisummNet-2019/{pid}/Reference_XML/{pid}.xml",
                f'<PAPER><S sid="0">{title}</S><ABSTRACT>{body}</ABSTRACT></PAPER>')
    with tarfile.open(cit, "w:gz") as tar:
        for pid, texts in CITING.items():
            rows = [{"citance_No": i + 1, "citing_paper_id": f"X{i}", "clean_text": t} for i, t in enumerate(texts)]
            if pid in ("P2", "P4"):
                rows.append({"citance_No": 9, "citing_paper_id": "Z1", "clean_text": "taggers and parsers (R, 1996; C, 1997)"})
            add(tar, f"From-ScisummNet-2019/{pid}/citing_sentences.json", json.dumps(rows))
            add(tar, f"From-ScisummNet-2019/{pid}/annotation/{pid}.ann.txt",
                "Citance Number: 1 | Reference Article: x | Reference Offset: ['2'] | Annotator: Automatic\n")
    return cit


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapter")
    pack = _pack(tmp)
    outs = []
    for name in ("a", "b"):
        r = CliRunner().invoke(main, ["train-encoder", "--citances", str(pack), "--out", str(tmp / name), "--sample", "8",
                                      "--batch", "4", "--threads", "1"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        outs.append(tmp / name)
    return outs


def test_train_encoder_is_seeded_and_small(trained):
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "adapter_model.safetensors")) for d in trained)
    assert a.keys() == b.keys() and len(a) > 0
    assert all(bool((a[k] == b[k]).all()) for k in a)  # same seed, same threads: the same weights
    assert any(float(a[k].abs().sum()) > 0 for k in a if "lora_B" in k)  # it learned something
    assert (trained[0] / "adapter_model.safetensors").stat().st_size < 1_000_000
    meta = json.loads((trained[0] / "esqbe-adapter.json").read_text())
    assert meta["co_cited_pairs"] == 1 and meta["cited_papers"] == 4
    # LoRA only above the tagger's input layer: the lower layers (and the tagger's inputs) stay the model's
    layers = {int(k.split("layer.")[1].split(".")[0]) for k in a}
    assert layers == {4, 5}


def test_adapter_moves_vectors_and_joins_the_model_identity(trained, encoder):
    from esqbe.encode.encoder import Encoder
    from esqbe.encode.identity import model_info

    adapted = Encoder.load(batch_size=16, adapter=str(trained[0]))
    paper = Paper("q", "A maximum entropy tagger", ["We describe a part-of-speech tagger.", "Accuracy is high."],
                  ["background", "result"], {})
    base_v = encoder.contextual_sentence_vectors([paper])[0]
    ad_v, = adapted.contextual_sentence_vectors([paper])
    assert not np.allclose(base_v, ad_v, atol=1e-4)
    assert adapted.name == f"{encoder.name}+a" and adapted.fingerprint != encoder.fingerprint
    info = model_info(None, str(trained[0]))  # known without loading: what an index checks against
    assert (info.name, info.fingerprint) == (adapted.name, adapted.fingerprint)
    assert model_info(None, "none").fingerprint == encoder.fingerprint
    # the facet tagger reads hidden state 4 (the shipped tagger's input layer): the adapter leaves it bit for bit
    import torch

    enc = encoder.tokenizer(["We describe a part-of-speech tagger."], return_tensors="pt")
    with torch.no_grad():
        h_base = encoder.model(**enc, output_hidden_states=True).hidden_states
        h_ad = adapted.model(**enc, output_hidden_states=True).hidden_states
    assert torch.equal(h_base[4], h_ad[4]) and not torch.equal(h_base[6], h_ad[6])


def test_index_built_with_an_adapter_refuses_the_bare_model(trained, tmp_path):
    import esqbe
    from esqbe.settings.config import Settings

    path = str(tmp_path / "index")
    src = tmp_path / "papers.jsonl"
    src.write_text(json.dumps({"paper_id": "p1", "title": "T", "abstract": ["One sentence.", "Another one."]}) + "\n")
    with esqbe.open_index(path, settings=Settings(path=path, adapter=str(trained[0]))) as index:
        index.index_files([str(src)])
    r = CliRunner().invoke(main, ["query", "--path", path, "--text", "One sentence. Another one."])
    assert r.exit_code != 0 and "+a" in r.output, r.output  # the index names the adapted model it was built with
    r = CliRunner().invoke(main, ["query", "--path", path, "--text", "One sentence. Another one.", "--adapter", str(trained[0])])
    assert r.exit_code == 0, r.output


def test_adapter_setting_is_checked(tmp_path):
    from esqbe.encode.adapter import AdapterError, resolve_adapter

    with pytest.raises(AdapterError, match="never a URL"):
        resolve_adapter("https://example.org/adapter")
    with pytest.raises(AdapterError, match="neither a shipped adapter"):
        resolve_adapter(str(tmp_path / "nope"))
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterError, match="missing adapter_model.safetensors"):
        resolve_adapter(str(tmp_path / "half"))
    assert resolve_adapter("none") is None and resolve_adapter(None) is None


def test_onnx_runtime_exports_the_merged_weights(trained, tmp_path):
    """The ONNX cache is keyed by the merged weights and exported from them: ONNX vectors with an adapter are the
    torch ones with it (not the base model's, which a fresh load of the model's files would give)."""
    pytest.importorskip("onnxruntime")
    from esqbe.encode.encoder import Encoder

    paper = Paper("q", "A maximum entropy tagger", ["We describe a part-of-speech tagger.", "Accuracy is high."],
                  ["background", "result"], {})
    torch_v, = Encoder.load(batch_size=4, adapter=str(trained[0])).contextual_sentence_vectors([paper])
    onnx_v, = Encoder.load(batch_size=4, adapter=str(trained[0]), backend="onnx",
                           cache_dir=str(tmp_path)).contextual_sentence_vectors([paper])
    base_v, = Encoder.load(batch_size=4, backend="onnx", cache_dir=str(tmp_path)).contextual_sentence_vectors([paper])
    assert np.allclose(torch_v, onnx_v, atol=1e-4)
    assert not np.allclose(base_v, onnx_v, atol=1e-4)
    assert len(list((tmp_path / "onnx").iterdir())) == 2  # two cache entries: the adapter changed the key


def test_cached_lower_layers_train_the_same_adapter(tmp_path):
    """ with the frozen layers' output cached once per text, training runs only the top layers and must
    give the same losses and the same adapter as running the whole model every step (a cache of the wrong layer's
    output, or one fed to the wrong layer, changes both). Two epochs, so the second pass reads the cache again."""
    from safetensors.torch import load_file

    from esqbe.encode.identity import model_info
    from esqbe.encode.train import TrainConfig, train_encoder

    pack = _pack(tmp_path)
    info = model_info(None)
    runs = {}
    for cache in (True, False):
        out = tmp_path / f"cache-{cache}"
        runs[cache] = train_encoder(str(pack), str(out), encoder_source=info.source, base_name=info.name,
                                    base_fingerprint=info.fingerprint, log=lambda m: None,
                                    cfg=TrainConfig(citances=0, epochs=2, batch=4, threads=1, cache=cache, lr=1e-3))
        runs[cache]["weights"] = load_file(str(out / "adapter_model.safetensors"))
    cached, full = runs[True], runs[False]
    assert cached["config"]["cache"] and not full["config"]["cache"]
    assert cached["steps"] == full["steps"] >= 4 and len(cached["losses"]["guide"]) >= 4
    for kind in ("guide", "cocite"):
        assert np.allclose(cached["losses"][kind], full["losses"][kind], atol=1e-4), kind
    assert cached["losses"]["guide"][0] != cached["losses"]["guide"][-1]  # it trained
    a, b = cached["weights"], full["weights"]
    assert a.keys() == b.keys()
    assert all(np.allclose(a[k].numpy(), b[k].numpy(), atol=1e-5) for k in a)
    assert any(float(a[k].abs().sum()) > 0 for k in a if "lora_B" in k)


def test_index_records_the_adapter_by_name_and_refuses_another_on_write(trained, tmp_path):
    """ the index's model identity names its adapter (IndexMeta.adapter, `esqbe stats`), and a write with
    another adapter (or none) is refused as a different model would be, naming the index's adapter."""
    import shutil

    path = str(tmp_path / "index")
    src = tmp_path / "papers.jsonl"
    src.write_text(json.dumps({"paper_id": "p1", "title": "T", "abstract": ["One sentence.", "Another one."]}) + "\n")
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"paper_id": "p2", "title": "U", "abstract": ["A third one.", "And a fourth."]}) + "\n")
    r = CliRunner().invoke(main, ["index", str(src), "--path", path, "--adapter", str(trained[0])])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["stats", "--path", path, "--json"])
    assert json.loads(r.output)["encoder_adapter"] == "a", r.output
    assert "encoder_adapter: a" in CliRunner().invoke(main, ["stats", "--path", path]).output
    other = tmp_path / "b"  # another adapter: same files but one weight changed
    shutil.copytree(trained[1], other)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(other / "adapter_model.safetensors"))
    key = next(k for k in weights if "lora_B" in k)
    weights[key] = weights[key] + 0.01
    save_file(weights, str(other / "adapter_model.safetensors"))
    for flag in ([], ["--adapter", str(other)]):
        r = CliRunner().invoke(main, ["index", str(more), "--path", path, *flag])
        assert r.exit_code != 0 and "adapter a" in r.output and "--adapter a" in r.output, r.output
    r = CliRunner().invoke(main, ["index", str(more), "--path", path, "--adapter", str(trained[0])])
    assert r.exit_code == 0, r.output


def test_eval_clscisumm_names_the_adapter_in_its_command_and_run(trained, tmp_path):
    """ `esqbe eval clscisumm --adapter DIR` ranks with another encoder: its printed command, run name and
    default index path say so (they left the adapter out, so two runs looked like one)."""
    from esqbe.evaluation.clscisumm import default_index_path
    from esqbe.settings.config import Settings

    derived = tmp_path / "data" / "derived"
    derived.mkdir(parents=True)
    with open(derived / "mine-reference-sentences.jsonl", "w") as f:
        for i, s in enumerate(["A maximum entropy tagger", *PAPERS["P2"][1]]):
            f.write(json.dumps({"reference": "R", "sid": str(i), "ssid": str(i), "section": "", "text": s}) + "\n")
    with open(derived / "mine-citances.jsonl", "w") as f:
        f.write(json.dumps({"reference": "R", "citance": "1", "citing_article": "X", "citation_marker": "",
                            "text": CITING["P2"][0]}) + "\n")
    base = ["eval", "clscisumm", "--data", str(tmp_path / "data"), "--param", "method=bm25"]
    runs = {}
    for adapter in ("none", str(trained[0])):
        out = tmp_path / f"out-{Path(adapter).name}"
        r = CliRunner().invoke(main, base + ["--index-path", str(tmp_path / f"index-{Path(adapter).name}"),
                                             "--out", str(out), "--adapter", adapter], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        runs[adapter] = (r.output, json.loads((out / "results.json").read_text()))
    text, results = runs[str(trained[0])]
    (name, entry), = results.items()
    assert name == "method-bm25_adapter-a" and entry["command"].endswith(f"--adapter {trained[0]} --param method=bm25")
    assert f"{name} (" in text and f"--adapter {trained[0]}" in text, text
    text, results = runs["none"]
    assert list(results) == ["method-bm25"] and "--adapter" not in text
    paths = {default_index_path(Settings(adapter=a)) for a in ("none", str(trained[0]))}
    assert len(paths) == 2 and any(p.endswith("-adapter-a") for p in paths)


def test_frozen_dropout_cannot_be_cached(tmp_path):
    """The first shipped adapter's recipe (dropout in the frozen layers too) changes their output every step, so
    asking for it with the cache is refused, with the reason (the CLI: --frozen-dropout needs --no-cache)."""
    r = CliRunner().invoke(main, ["train-encoder", "--citances", str(_pack(tmp_path)), "--out", str(tmp_path / "x"),
                                  "--frozen-dropout"])
    assert r.exit_code != 0 and "cannot be cached" in r.output and "Traceback" not in r.output, r.output


def test_grouped_guidance_loss_is_the_unbatched_loss_of_each_slice(encoder):
    """Grouped citances: a batch holding two citing sentences per paper (each abstract encoded once) has the
    loss of the unbatched recipe run on each slice of one citing sentence per paper, averaged: the same in-batch
    negatives (the other papers), the same hard negatives (the cited abstract's other sentences)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from esqbe.encode.citations import CitedPaper, CitingSentence
    from esqbe.encode.identity import model_info
    from esqbe.encode.train import TrainConfig, _grouped_guidance_loss, _guidance_loss, _Pooler

    source = model_info(None).source
    model = AutoModel.from_pretrained(source, local_files_only=True).eval()
    pool = _Pooler(model, AutoTokenizer.from_pretrained(source, local_files_only=True), TrainConfig())
    papers = {pid: CitedPaper(pid, title, sents, [str(i + 1) for i in range(len(sents))])
              for pid, (title, sents) in PAPERS.items()}
    cites = {pid: [CitingSentence(pid, f"X{i}", t, [str(2 - i % 2)]) for i, t in enumerate(texts)]
             for pid, texts in CITING.items()}
    grouped = [(cites[pid], papers[pid]) for pid in PAPERS]
    slices = [[(cites[pid][g], papers[pid]) for pid in PAPERS] for g in range(2)]
    with torch.no_grad():
        got = _grouped_guidance_loss(pool, grouped, 0.05)
        want = (_guidance_loss(pool, slices[0], 0.05) + _guidance_loss(pool, slices[1], 0.05)) / 2
        one = _grouped_guidance_loss(pool, [([c], p) for c, p in slices[0]], 0.05)  # groups of one: the unbatched loss
        assert float(one) == pytest.approx(float(_guidance_loss(pool, slices[0], 0.05)), abs=1e-6)
    assert float(got) == pytest.approx(float(want), abs=1e-5) and float(got) > 0


def test_grouped_batches_keep_papers_distinct_and_train_the_same_with_the_cache(tmp_path):
    """Grouped citances: each batch's groups are of distinct papers, no citing sentence twice in a pass, no group
    over the size; with the cache the grouped recipe trains the same losses and adapter as without it, in fewer
    guidance batches than one citing sentence per paper."""
    import random

    from safetensors.torch import load_file

    from esqbe.encode.citations import read_citations
    from esqbe.encode.identity import model_info
    from esqbe.encode.train import TrainConfig, _batches, _groups, train_encoder

    pack = _pack(tmp_path)
    papers, sentences = read_citations(pack)
    guided = [(c, papers[c.cited]) for c in sentences]
    batches = _batches(_groups(guided, 2, random.Random(0)), 3, lambda x: x[1].paper_id, random.Random(0))
    seen = [id(c) for b in batches for group, _ in b for c in group]
    assert len(seen) == len(set(seen)) >= len(guided) - 2 and all(len(g) <= 2 for b in batches for g, _ in b)
    assert all(len({p.paper_id for _, p in b}) == len(b) >= 2 for b in batches)
    info = model_info(None)
    runs = {}
    for name, cache, group in (("cached", True, 2), ("full", False, 2), ("ungrouped", True, 1)):
        out = tmp_path / name
        runs[name] = train_encoder(str(pack), str(out), encoder_source=info.source, base_name=info.name,
                                   base_fingerprint=info.fingerprint, log=lambda m: None,
                                   cfg=TrainConfig(citances=0, epochs=2, batch=4, threads=1, cache=cache, lr=1e-3,
                                                   group=group))
        runs[name]["weights"] = load_file(str(out / "adapter_model.safetensors"))
    cached, full = runs["cached"], runs["full"]
    assert cached["config"]["group"] == 2 and cached["guidance_batches"] < runs["ungrouped"]["guidance_batches"]
    assert cached["steps"] == full["steps"] and len(cached["losses"]["guide"]) == cached["guidance_batches"] >= 2
    for kind in ("guide", "cocite"):
        assert np.allclose(cached["losses"][kind], full["losses"][kind], atol=1e-4), kind
    assert all(np.allclose(cached["weights"][k].numpy(), full["weights"][k].numpy(), atol=1e-5) for k in cached["weights"])
    assert any(float(v.abs().sum()) > 0 for k, v in cached["weights"].items() if "lora_B" in k)
