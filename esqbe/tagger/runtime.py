"""Facet tagger: label the sentences of abstracts that arrive without labels.

Why this shape: indexing already runs the encoder over `title [SEP] abstract`, so the tagger
reuses that pass. It takes the encoder's hidden states at a lower layer (handed over by
`Encoder.contextual_sentence_vectors(on_batch=...)`), runs its own copies of the top encoder
layer(s) fine-tuned for tagging, mean-pools each sentence's tokens, and labels the sentences of
each abstract with a small BiLSTM over those vectors plus position features (a sentence's label
depends on where it sits and on its neighbours). Cost: the copied layers only, no second encoder
pass. It predicts the five CSAbstruct labels; esqbe facets merge `objective` into `background`
by adding their probabilities.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..domain import RAW_LABELS, Paper

#: bump when the weights file layout changes
TAGGER_FORMAT = 1
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "data" / "tagger-minilm-l6.pt"
#: the four classes a tagged sentence can get in esqbe (objective merged into background)
FACET_CLASSES = ("background", "method", "result", "other")
_MERGE = {"background": "background", "objective": "background", "method": "method", "result": "result", "other": "other"}
#: position features per sentence: relative position, first, last, abstract length
N_POSITION_FEATURES = 4


class TaggerMismatchError(ValueError):
    """The weights were trained on another encoder's hidden states and would tag garbage."""


# ================================================================ model
def _torch():
    import torch

    return torch


def _nn():
    import torch.nn as nn

    return nn


class _Layer(_nn().Module):
    """A BERT (post-LayerNorm) transformer layer, initialised from the encoder's own layer.

    Ours rather than transformers' class, so the weights file does not depend on the installed
    transformers version's module layout or attention dispatch.
    """

    def __init__(self, dim: int, heads: int, ff: int, eps: float, dropout: float = 0.1):
        nn = _nn()
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.attn_out = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.ff_in = nn.Linear(dim, ff)
        self.ff_out = nn.Linear(ff, dim)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_hf(cls, layer, config) -> "_Layer":
        """Copy a transformers BERT-style layer (bert, MiniLM, roberta)."""
        act = getattr(config, "hidden_act", "gelu")
        if act != "gelu":
            raise TaggerMismatchError(f"the tagger copies GELU BERT layers; this encoder uses {act!r}")
        try:
            attn = layer.attention
            src = {
                "query": attn.self.query, "key": attn.self.key, "value": attn.self.value,
                "attn_out": attn.output.dense, "ln1": attn.output.LayerNorm,
                "ff_in": layer.intermediate.dense, "ff_out": layer.output.dense, "ln2": layer.output.LayerNorm,
            }
        except AttributeError as e:
            raise TaggerMismatchError(f"the tagger needs a BERT-style encoder layer: {e}") from None
        new = cls(config.hidden_size, config.num_attention_heads, config.intermediate_size, config.layer_norm_eps,
                  getattr(config, "hidden_dropout_prob", 0.1))
        for name, module in src.items():
            getattr(new, name).load_state_dict(module.state_dict())
        return new

    def forward(self, x, valid):
        """x: (B, T, d); valid: (B, T) bool, False for padding (never attended to)."""
        torch = _torch()
        import torch.nn.functional as F

        B, T, d = x.shape
        h = self.heads

        def split(t):
            return t.view(B, T, h, d // h).transpose(1, 2)

        mask = valid[:, None, None, :]
        a = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)), attn_mask=mask,
                                           dropout_p=0.0)
        a = a.transpose(1, 2).reshape(B, T, d)
        x = self.ln1(x + self.dropout(self.attn_out(a)))
        f = self.ff_out(F.gelu(self.ff_in(x)))
        return self.ln2(x + self.dropout(f))


class TaggerNet(_nn().Module):
    """Copied top encoder layers -> per-sentence mean pooling -> BiLSTM with position features -> labels."""

    def __init__(self, *, dim: int, n_layers: int, heads: int, ff: int, eps: float, lstm: int = 128,
                 n_labels: int = len(RAW_LABELS), dropout: float = 0.2, pool: str = "mean"):
        nn = _nn()
        super().__init__()
        if pool not in ("mean", "mean+attn"):
            raise ValueError(f"unknown pooling {pool!r}")
        self.pool = pool
        self.layers = nn.ModuleList([_Layer(dim, heads, ff, eps) for _ in range(n_layers)])
        # attention pooling lets cue words ("we propose", "results show") outweigh the rest of a sentence
        self.attn = nn.Linear(dim, 1) if pool == "mean+attn" else None
        width = dim * (2 if self.attn is not None else 1)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(width + N_POSITION_FEATURES, lstm, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * lstm, n_labels)

    def sentence_vectors(self, hidden, valid, spans: Sequence[Sequence[tuple[int, int]]]):
        """Run the copied layers over a batch of rows; pool each sentence's tokens, per row."""
        torch = _torch()
        x = hidden
        for layer in self.layers:
            x = layer(x, valid)
        B, T, _ = x.shape
        S = max((len(s) for s in spans), default=0)
        member = torch.zeros(B, max(S, 1), T, dtype=torch.bool, device=x.device)
        for i, row in enumerate(spans):
            for j, (a, b) in enumerate(row):
                if b > a:
                    member[i, j, a:b] = True
        counts = member.sum(-1, keepdim=True).clamp(min=1)
        pooled = torch.bmm(member.to(x.dtype) / counts.to(x.dtype), x)
        if self.attn is not None:
            scores = self.attn(x).transpose(1, 2).expand(B, member.shape[1], T)  # (B, S, T)
            weights = scores.masked_fill(~member, float("-inf")).softmax(-1).nan_to_num(0.0)
            pooled = torch.cat([pooled, torch.bmm(weights.to(x.dtype), x)], dim=-1)
        return [pooled[i, : len(row)] for i, row in enumerate(spans)]

    def classify(self, papers_vecs: Sequence):
        """Logits (n_sentences, n_labels) for each paper, given its sentence vectors in order."""
        torch = _torch()
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        lengths = [len(v) for v in papers_vecs]
        feats = [torch.cat([v, _position_features(len(v), v.device, v.dtype)], dim=-1) for v in papers_vecs]
        padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        packed = pack_padded_sequence(self.drop(padded), torch.tensor(lengths), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=padded.shape[1])
        logits = self.out(self.drop(out))
        return [logits[i, :n] for i, n in enumerate(lengths)]


def _position_features(n: int, device, dtype):
    torch = _torch()
    i = torch.arange(n, device=device, dtype=dtype)
    rel = i / max(n - 1, 1)
    first = (i == 0).to(dtype)
    last = (i == n - 1).to(dtype)
    length = torch.full_like(i, min(n, 20) / 20.0)
    return torch.stack([rel, first, last, length], dim=-1)


# ================================================================ metrics
def f1_report(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> dict:
    """Macro-F1 and per-label precision/recall/F1 in percent (numpy only: no scikit-learn at runtime)."""
    gold, pred = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    per = {}
    for lab in labels:
        tp = int(np.sum((gold == lab) & (pred == lab)))
        fp = int(np.sum((gold != lab) & (pred == lab)))
        fn = int(np.sum((gold == lab) & (pred != lab)))
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        per[lab] = {"precision": round(100 * p, 2), "recall": round(100 * r, 2), "f1": round(100 * f, 2), "support": tp + fn}
    return {
        "macro_f1": round(float(np.mean([per[lab]["f1"] for lab in labels])), 2) if labels else 0.0,
        "accuracy": round(100 * float(np.mean(gold == pred)), 2) if len(gold) else 0.0,
        "sentences": int(len(gold)),
        "per_label": per,
    }


def _merge(label: str) -> str:
    return _MERGE[label]


def _labels_from_probs(probs, raw: bool) -> list[str]:
    """Raw: the argmax of the five labels. esqbe facets: objective's probability counts for background."""
    if raw:
        return [RAW_LABELS[i] for i in probs.argmax(-1).tolist()]
    torch = _torch()
    merged = torch.stack([probs[:, 0] + probs[:, 1], probs[:, 2], probs[:, 3], probs[:, 4]], dim=-1)
    return [FACET_CLASSES[i] for i in merged.argmax(-1).tolist()]


def _hide_title(valid, spans):
    """Mask the title's tokens (between [CLS] and the [SEP] before the first sentence) from the copied layers.

    CSAbstruct has no titles, so the tagger was trained on `[CLS] [SEP] sentences [SEP]`; hiding
    the title keeps what its own layers attend to the same at indexing time (the frozen lower
    layers have still seen the title).
    """
    valid = valid.clone()
    for i, row in enumerate(spans):
        starts = [a for a, b in row if b > a]
        if starts and min(starts) > 2:
            valid[i, 1 : min(starts) - 1] = False
    return valid


def _encoder_info(encoder) -> dict:
    return {"name": encoder.name, "dim": int(encoder.dim), "num_layers": int(encoder.num_layers)}


# ================================================================ compact weights
def _base_layers(encoder, meta: dict) -> dict:
    """The encoder's own copies of the layers the tagger tunes, as the tagger's state-dict entries (fp32, CPU)."""
    hf = encoder.model.encoder.layer
    out = {}
    for k in range(meta["arch"]["n_layers"]):
        for name, v in _Layer.from_hf(hf[meta["input_layer"] + k], encoder.model.config).state_dict().items():
            out[f"layers.{k}.{name}"] = v.detach().float().cpu()
    return out


def _digest(tensors: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].numpy().tobytes())
    return h.hexdigest()


def compact_weights(src, dst, encoder=None) -> dict:
    """Rewrite tagger weights with each tuned layer's matrices stored as int8 differences from the encoder's
    own layers (one scale per row), the rest as they were (fp16): the shipped 8.2 MB file becomes ~4.6 MB.
    Fine-tuning moves those weights by at most ~0.01, so a row's int8 step (<= 1e-4) is below the fp16
    rounding of the weights themselves. Loading needs the same encoder weights (their sha256 is kept).
    Returns the new file's size and the largest reconstruction error."""
    torch = _torch()
    blob = torch.load(src, map_location="cpu", weights_only=True)
    meta, state = dict(blob["meta"]), dict(blob["state_dict"])
    if "delta_of" in meta:
        raise ValueError(f"{src} is compact already")
    if encoder is None:
        from ..encode.encoder import Encoder

        encoder = Encoder.load(meta["encoder"]["name"], backend="torch")
    if _encoder_info(encoder) != meta["encoder"]:
        raise TaggerMismatchError(f"{src} belongs to encoder {meta['encoder']['name']!r}, not {encoder.name!r}")
    base = _base_layers(encoder, meta)
    out, worst = {}, 0.0
    for name, v in state.items():
        if name in base and v.ndim == 2:
            delta = v.float() - base[name]
            scale = (delta.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
            q = torch.round(delta / scale).clamp(-127, 127).to(torch.int8)
            out[name] = q
            out[name + ".__scale"] = scale.squeeze(1)
            worst = max(worst, float((base[name] + q.float() * scale - v.float()).abs().max()))
        else:
            out[name] = v
    meta["delta_of"] = {"layers": [meta["input_layer"] + k for k in range(meta["arch"]["n_layers"])],
                        "sha256": _digest(base)}
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    torch.save({"meta": meta, "state_dict": out}, tmp)
    os.replace(tmp, dst)
    return {"bytes": dst.stat().st_size, "max_abs_error": worst}


def _from_deltas(state: dict, meta: dict, encoder, path) -> dict:
    base = _base_layers(encoder, meta)
    if _digest(base) != meta["delta_of"]["sha256"]:
        raise TaggerMismatchError(
            f"tagger weights {path} are stored as differences from {meta['encoder']['name']!r}'s layers "
            f"{meta['delta_of']['layers']}, but the installed copy of that model has other weights there; "
            "reinstall it, or use weights written by `esqbe train-tagger` (self-contained)")
    out = {}
    for name, v in state.items():
        if name.endswith(".__scale"):
            continue
        out[name] = base[name] + v.float() * state[name + ".__scale"].float()[:, None] if name + ".__scale" in state else v
    return out


# ================================================================ the tagger
class TagListener:
    """Collects what the tagger needs from one `contextual_sentence_vectors` call.

    Pass it as `on_batch`; afterwards `collect(papers)` labels exactly the papers of that call.
    Its row indices refer to positions in that call's `papers`, so use one listener per call.
    """

    def __init__(self, tagger: "FacetTagger"):
        self._tagger = tagger
        self._vecs: dict[int, dict[int, object]] = {}

    def __call__(self, batch) -> None:
        torch = _torch()
        t = self._tagger
        hidden_states = batch.hidden_states
        if hidden_states is None or len(hidden_states) != t.meta["encoder"]["num_layers"] + 1 or hidden_states[-1].shape[-1] != t.meta["encoder"]["dim"]:
            got = "no hidden states" if hidden_states is None else f"{len(hidden_states) - 1} layers of dim {hidden_states[-1].shape[-1]}"
            raise TaggerMismatchError(f"tagger {t.path} expects the hidden states of {t.encoder_name!r} "
                                      f"({t.meta['encoder']['num_layers']} layers of dim {t.meta['encoder']['dim']}); got {got}")
        hidden = hidden_states[t.meta["input_layer"]]
        net = t._net_on(hidden.device)
        valid = batch.attention_mask.bool()
        if t.hide_title:
            valid = _hide_title(valid, batch.spans)
        with torch.inference_mode():
            vecs = net.sentence_vectors(hidden.float(), valid, batch.spans)
        for (pi, sentences), v in zip(batch.rows, vecs):
            slots = self._vecs.setdefault(int(pi), {})
            for j, vec in zip(sentences, v):
                if j in slots:
                    raise RuntimeError("a TagListener saw the same sentence twice: use a fresh tagger.listener() "
                                       "for each contextual_sentence_vectors call")
                slots[j] = vec

    def collect(self, papers: Sequence[Paper], raw: bool = False) -> list[list[str]]:
        """Labels per sentence of `papers` (the same sequence, in the same order, that was encoded)."""
        return [_labels_from_probs(p, raw) if p is not None else [] for p in self._probabilities(papers)]

    def facet_probabilities(self, papers: Sequence[Paper]) -> list[list[list[float]]]:
        """Per paper, per sentence: the probabilities of the esqbe classes (background, method, result,
        other; objective counts as background), rounded to 3 decimals: soft labels for matching."""
        out = []
        for p in self._probabilities(papers):
            if p is None:
                out.append([])
                continue
            merged = np.stack([(p[:, 0] + p[:, 1]).numpy(), p[:, 2].numpy(), p[:, 3].numpy(), p[:, 4].numpy()], axis=-1)
            out.append(np.round(merged.astype(np.float64), 3).tolist())
        return out

    def _probabilities(self, papers: Sequence[Paper]) -> list:
        """(n_sentences, 5) probabilities per paper; None for a paper without sentences."""
        torch = _torch()
        if self._vecs and max(self._vecs) >= len(papers):
            raise ValueError(f"this listener saw paper #{max(self._vecs)} but collect() got {len(papers)} papers: "
                             "pass the same papers that were encoded")
        out: list = [None] * len(papers)
        todo, seqs = [], []
        for pi, paper in enumerate(papers):
            n = len(paper.sentences)
            if n == 0:
                continue
            slots = self._vecs.get(pi, {})
            if len(slots) != n or set(slots) != set(range(n)):
                raise ValueError(f"paper #{pi} ({paper.paper_id}) has {n} sentences but {len(slots)} were encoded "
                                 "with this listener: pass the same papers that were encoded")
            todo.append(pi)
            seqs.append(torch.stack([slots[j] for j in range(n)]))
        net = self._tagger._net_on(seqs[0].device) if seqs else None
        with torch.inference_mode():
            for start in range(0, len(seqs), 256):
                chunk = seqs[start : start + 256]
                for pi, logits in zip(todo[start : start + 256], net.classify(chunk)):
                    out[pi] = logits.float().softmax(-1).cpu()
        return out


class FacetTagger:
    """Labels sentences with background/objective/method/result/other (esqbe facets by default)."""

    def __init__(self, net, meta: dict, path: str | Path | None = None, encoder=None):
        self.net = net.eval()
        self.meta = meta
        self.path = str(path) if path else "<in memory>"
        self._encoder = None
        self._last: TagListener | None = None
        #: hide title tokens from the tagger's own layers (see _hide_title)
        self.hide_title = True
        if encoder is not None:
            self.check_encoder(encoder)
            self._encoder = encoder

    # --- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path | None = None, encoder=None) -> "FacetTagger":
        """Load weights (default: the ones shipped in the package); refuse them for another encoder."""
        torch = _torch()
        path = Path(path) if path else DEFAULT_WEIGHTS
        if not path.exists():
            raise FileNotFoundError(f"no tagger weights at {path}; train them with `esqbe train-tagger`")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            meta, state = blob["meta"], blob["state_dict"]
            fmt = meta["format"]
        except Exception as e:  # a wrong or damaged file: say which
            raise ValueError(f"{path} is not an esqbe tagger weights file ({type(e).__name__}: {e})") from None
        if fmt != TAGGER_FORMAT:
            raise ValueError(f"{path} has tagger format {fmt}; this esqbe reads format {TAGGER_FORMAT}: retrain it")
        if "delta_of" in meta:  # compact weights: the tuned layers as int8 differences from the encoder's own
            if encoder is not None and _encoder_info(encoder) != meta["encoder"]:
                raise TaggerMismatchError(f"tagger weights {path} were trained on encoder {meta['encoder']['name']!r}, "
                                          f"not {_encoder_info(encoder)['name']!r}")
            if encoder is None:
                from ..encode.encoder import Encoder

                encoder = Encoder.load(meta["encoder"]["name"], backend="torch")
            state = _from_deltas(state, meta, encoder, path)
        net = TaggerNet(**meta["arch"])
        net.load_state_dict({k: v.float() for k, v in state.items()})
        return cls(net, meta, path, encoder)

    @property
    def encoder_name(self) -> str:
        return self.meta["encoder"]["name"]

    def check_encoder(self, encoder) -> None:
        """TaggerMismatchError unless `encoder` is the one whose hidden states the weights were trained on."""
        want, got = self.meta["encoder"], _encoder_info(encoder)
        if want != got:
            raise TaggerMismatchError(
                f"tagger weights {self.path} were trained on encoder {want['name']!r} ({want['num_layers']} layers, "
                f"dim {want['dim']}) but the encoder in use is {got['name']!r} ({got['num_layers']} layers, dim {got['dim']}); "
                f"encode with {want['name']!r} or train a tagger for {got['name']!r} with `esqbe train-tagger`"
            )

    @property
    def encoder(self):
        """The encoder the weights belong to, loaded on first use (for standalone tagging)."""
        if self._encoder is None:
            from ..encode.encoder import Encoder

            encoder = Encoder.load(self.encoder_name)
            self.check_encoder(encoder)
            self._encoder = encoder
        return self._encoder

    def _net_on(self, device):
        if next(self.net.parameters()).device != device:
            self.net.to(device)
        return self.net

    # --- tagging ---------------------------------------------------------------------------------
    def listener(self) -> TagListener:
        """A fresh `on_batch` callback for one encoder call; `collect` (or `listener.collect`) then labels it."""
        self._last = TagListener(self)
        return self._last

    def collect(self, papers: Sequence[Paper], raw: bool = False) -> list[list[str]]:
        """Labels for the papers encoded since the last `listener()` (esqbe facets, or the five raw labels)."""
        if self._last is None:
            raise RuntimeError("collect() needs a listener: pass tagger.listener() as on_batch when encoding")
        return self._last.collect(papers, raw)

    def collect_probabilities(self, papers: Sequence[Paper]) -> list[list[list[float]]]:
        """Soft labels (`TagListener.facet_probabilities`) for the papers encoded since the last `listener()`."""
        if self._last is None:
            raise RuntimeError("collect_probabilities() needs a listener: pass tagger.listener() as on_batch when encoding")
        return self._last.facet_probabilities(papers)

    def tag(self, papers: Sequence[Paper], raw: bool = False, *, progress: bool = False) -> list[list[str]]:
        """Standalone tagging: runs the encoder itself (use a listener when the index encodes anyway)."""
        return self._tag_encoded(list(papers), raw, progress)

    def tag_with_probabilities(self, papers: Sequence[Paper], *, progress: bool = False):
        """Standalone tagging: (esqbe-facet labels, soft labels) per paper (see `TagListener.facet_probabilities`)."""
        papers = list(papers)
        listener = TagListener(self)
        self.encoder.contextual_sentence_vectors(papers, on_batch=listener, progress=progress)
        return listener.collect(papers), listener.facet_probabilities(papers)

    def _tag_encoded(self, papers: list[Paper], raw: bool, progress: bool) -> list[list[str]]:
        listener = TagListener(self)  # not self._last: a standalone call must not disturb an indexer's listener
        self.encoder.contextual_sentence_vectors(papers, on_batch=listener, progress=progress)
        return listener.collect(papers, raw)


# ================================================================ training
#: defaults chosen on the CSAbstruct dev split (see docs/tagger.md); `esqbe train-tagger` uses them
TUNED_LAYERS = 2
EPOCHS = 4
LR = 1e-4
HEAD_LR = 1e-3
BATCH_SIZE = 16
LSTM = 128
DROPOUT = 0.2
POOL = "mean"


def _gold_papers(source, *, format=None, limit: int | None = None) -> list[Paper]:
    """Papers with the five raw labels; an unlabeled sentence is an error (it cannot train or score)."""
    from ..ingest.readers import read_papers

    if isinstance(source, (str, Path)) or hasattr(source, "read"):
        papers = list(read_papers(source, format=format, strict=True, raw_labels=True))
    else:
        papers = list(source)
    if limit is not None:
        papers = papers[:limit]
    for p in papers:
        bad = [f for f in p.facets if f not in RAW_LABELS]
        if bad:
            raise ValueError(f"paper {p.paper_id}: label {bad[0]!r} is not one of {', '.join(RAW_LABELS)} "
                             "(read it with raw_labels=True; every sentence needs a label)")
    return papers


def _cache_lower_states(encoder, papers: Sequence[Paper], layer: int, progress: bool) -> list[list[dict]]:
    """Per paper, its encoder rows: the frozen hidden states at `layer` (fp16), sentence spans and indices.

    Computed through the very `on_batch` path the listener uses, so training sees what indexing sees.
    """
    rows: list[list[dict]] = [[] for _ in papers]

    def keep(batch):
        mask = batch.attention_mask.bool().cpu()
        hidden = batch.hidden_states[layer]
        for i, (pi, sentences) in enumerate(batch.rows):
            n = int(mask[i].sum())
            rows[pi].append({"h": hidden[i, :n].to("cpu", _torch().float16).clone(), "spans": list(batch.spans[i]),
                             "sents": list(sentences)})

    encoder.contextual_sentence_vectors(papers, on_batch=keep, progress=progress)
    return rows


def _forward_cached(net, batch_rows: Sequence[list[dict]], n_sents: Sequence[int], bf16: bool):
    """Logits per paper from cached lower-layer states (the training-time twin of TagListener)."""
    torch = _torch()
    rows = [r for paper_rows in batch_rows for r in paper_rows]
    T = max(len(r["h"]) for r in rows)
    dim = rows[0]["h"].shape[-1]
    device = next(net.parameters()).device
    x = torch.zeros(len(rows), T, dim, device=device)
    valid = torch.zeros(len(rows), T, dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        x[i, : len(r["h"])] = r["h"].to(device).float()
        valid[i, : len(r["h"])] = True
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        vecs = net.sentence_vectors(x, valid, [r["spans"] for r in rows])
    per_paper, k = [], 0
    width = vecs[0].shape[-1]  # dim, or 2 x dim with mean+attn pooling
    for paper_rows, n in zip(batch_rows, n_sents):
        v = torch.zeros(n, width, device=device)
        for r in paper_rows:
            v = v.index_copy(0, torch.tensor(r["sents"], device=device), vecs[k].float())
            k += 1
        per_paper.append(v)
    return net.classify(per_paper)


def _predict_cached(net, rows, papers, bf16: bool, batch_size: int = 32):
    """Softmax probabilities (n_sentences, 5) per paper, in order."""
    torch = _torch()
    net.eval()
    out = [None] * len(papers)
    order = sorted(range(len(papers)), key=lambda i: sum(len(r["h"]) for r in rows[i]))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = [i for i in order[start : start + batch_size] if papers[i].sentences]
            if not idx:
                continue
            for i, logits in zip(idx, _forward_cached(net, [rows[i] for i in idx], [len(papers[i].sentences) for i in idx], bf16)):
                out[i] = logits.float().softmax(-1).cpu()
    return out


def _scores(papers: Sequence[Paper], probs) -> dict:
    gold5 = [f for p in papers for f in p.facets]
    pred5 = [lab for p, pr in zip(papers, probs) if p.sentences for lab in _labels_from_probs(pr, raw=True)]
    pred4 = [lab for p, pr in zip(papers, probs) if p.sentences for lab in _labels_from_probs(pr, raw=False)]
    return {
        "papers": len(papers),
        "esqbe": f1_report([_merge(g) for g in gold5], pred4, FACET_CLASSES),
        "raw": f1_report(gold5, pred5, RAW_LABELS),
    }


def _auto_bf16(device) -> bool:
    """bf16 autocast for training where the hardware runs it natively (AMX/AVX512-BF16 CPUs, recent GPUs)."""
    torch = _torch()
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch._C._cpu._is_amx_tile_supported() or torch._C._cpu._is_avx512_bf16_supported())
    except AttributeError:
        return False


def _seed_everything(seed: int) -> None:
    torch = _torch()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_tagger(
    train_path,
    dev_path,
    out_path,
    *,
    encoder=None,
    seed: int = 0,
    epochs: int = EPOCHS,
    progress: bool = True,
    tuned_layers: int = TUNED_LAYERS,
    lr: float = LR,
    head_lr: float = HEAD_LR,
    batch_size: int = BATCH_SIZE,
    lstm: int = LSTM,
    dropout: float = DROPOUT,
    pool: str = POOL,
    limit: int | None = None,
    bf16: bool | None = None,
) -> dict:
    """Train the tagger on CSAbstruct-style data; keep the epoch with the best dev macro-F1 (esqbe classes).

    The encoder's lower layers stay frozen (their states are cached once); copies of its top
    `tuned_layers` layers are fine-tuned with the BiLSTM head. Writes fp16 weights that record the
    encoder, and returns the dev metrics. `limit` keeps the first N train and dev papers (smoke tests).
    """
    torch = _torch()
    import torch.nn.functional as F

    from ..encode.encoder import Encoder

    started = time.time()
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    encoder = encoder or Encoder.load(backend="torch")  # trained on the exact fp32 hidden states
    info = _encoder_info(encoder)
    if not 0 <= tuned_layers <= encoder.num_layers:
        raise ValueError(f"tuned_layers must be between 0 and {encoder.num_layers}")
    input_layer = encoder.num_layers - tuned_layers
    try:
        hf_layers = encoder.model.encoder.layer
    except AttributeError:
        raise TaggerMismatchError(f"encoder {encoder.name!r} is not a BERT-style model; the tagger cannot copy its layers") from None

    train = _gold_papers(train_path, limit=limit)
    dev = _gold_papers(dev_path, limit=limit)
    if not train or not dev:
        raise ValueError("train and dev data must each hold at least one labelled paper")
    say(f"caching layer-{input_layer} states of {len(train)} train and {len(dev)} dev abstracts")
    train_rows = _cache_lower_states(encoder, train, input_layer, progress)
    dev_rows = _cache_lower_states(encoder, dev, input_layer, progress)

    _seed_everything(seed)
    config = encoder.model.config
    arch = {"dim": info["dim"], "n_layers": tuned_layers, "heads": int(config.num_attention_heads),
            "ff": int(config.intermediate_size), "eps": float(config.layer_norm_eps), "lstm": int(lstm),
            "n_labels": len(RAW_LABELS), "dropout": float(dropout), "pool": pool}
    net = TaggerNet(**arch)
    for k in range(tuned_layers):
        net.layers[k] = _Layer.from_hf(hf_layers[input_layer + k], config)
    device = torch.device(encoder.device)
    net.to(device)
    use_bf16 = _auto_bf16(device) if bf16 is None else bool(bf16)

    groups = [{"params": list(net.layers.parameters()), "lr": lr},
              {"params": [p for n, p in net.named_parameters() if not n.startswith("layers.")], "lr": head_lr}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=0.01)
    per_epoch = math.ceil(len(train) / batch_size)
    total = max(1, epochs * per_epoch)
    warmup = int(0.1 * total)

    def schedule(step: int) -> float:  # linear warm-up over 10% of the steps, then linear decay to 0
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    labels = [torch.tensor([RAW_LABELS.index(f) for f in p.facets], device=device) for p in train]
    lengths = [sum(len(r["h"]) for r in rows) for rows in train_rows]
    rng = random.Random(seed)

    history, best = [], None
    for epoch in range(epochs):
        net.train()
        t0 = time.time()
        # batches of similar length (less padding), in random order
        order = sorted(range(len(train)), key=lambda i: lengths[i] + rng.random() * 30)
        batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
        rng.shuffle(batches)
        loss_sum = 0.0
        for idx in batches:
            idx = [i for i in idx if train[i].sentences]
            logits = torch.cat(_forward_cached(net, [train_rows[i] for i in idx], [len(train[i].sentences) for i in idx], use_bf16))
            loss = F.cross_entropy(logits.float(), torch.cat([labels[i] for i in idx]))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_sum += loss.item()
        dev_scores = _scores(dev, _predict_cached(net, dev_rows, dev, use_bf16))
        row = {"epoch": epoch + 1, "loss": round(loss_sum / max(len(batches), 1), 4), "dev_macro_f1": dev_scores["esqbe"]["macro_f1"],
               "dev_macro_f1_raw": dev_scores["raw"]["macro_f1"], "seconds": round(time.time() - t0, 1)}
        history.append(row)
        say(f"epoch {row['epoch']}/{epochs}: loss {row['loss']}, dev macro-F1 {row['dev_macro_f1']} "
            f"(raw {row['dev_macro_f1_raw']}), {row['seconds']}s")
        if best is None or row["dev_macro_f1"] > best[0]["dev_macro_f1"]:
            best = (row, dev_scores, {k: v.detach().to("cpu", torch.float16).clone() for k, v in net.state_dict().items()})

    best_row, best_dev, state = best
    meta = {
        "format": TAGGER_FORMAT,
        "encoder": info,
        "input_layer": input_layer,
        "arch": arch,
        "labels": list(RAW_LABELS),
        "training": {
            "train": str(train_path) if isinstance(train_path, (str, Path)) else "<papers>",
            "dev": str(dev_path) if isinstance(dev_path, (str, Path)) else "<papers>",
            "train_papers": len(train), "dev_papers": len(dev), "seed": seed, "epochs": epochs,
            "best_epoch": best_row["epoch"], "lr": lr, "head_lr": head_lr, "batch_size": batch_size,
            "bf16": use_bf16, "limit": limit, "dev_macro_f1": best_row["dev_macro_f1"],
            "dev_macro_f1_raw": best_row["dev_macro_f1_raw"], "torch": str(torch.__version__),
        },
    }
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    torch.save({"meta": meta, "state_dict": state}, tmp)
    os.replace(tmp, out_path)
    say(f"wrote {out_path} ({out_path.stat().st_size / 1e6:.1f} MB), best epoch {best_row['epoch']}")
    return {"out": str(out_path), "best_epoch": best_row["epoch"], "dev": best_dev, "history": history,
            "seconds": round(time.time() - started, 1)}


# ================================================================ evaluation
def _text_key(paper: Paper) -> str:
    return " ".join(" ".join(paper.sentences).split())


def evaluate_tagger(
    gold,
    *,
    tagger: FacetTagger | None = None,
    encoder=None,
    format: str | None = None,
    exclude_duplicates_of: Iterable = (),
    ids: Iterable[str] | None = None,
    exclude_ids: Iterable[str] = (),
) -> dict:
    """Score the tagger against gold labels: macro-F1 and per-label F1 for the 4 esqbe classes and 5 raw labels.

    `gold` is a labelled source (path) or papers read with raw labels. `exclude_duplicates_of`:
    sources whose abstracts are dropped from `gold` when the text is identical (CSAbstruct test
    repeats train/dev abstracts). `ids` / `exclude_ids` keep or drop papers by id.
    """
    tagger = tagger or FacetTagger.load(encoder=encoder)
    papers = _gold_papers(gold, format=format)
    n_read = len(papers)
    seen = set()
    for src in exclude_duplicates_of:
        seen.update(_text_key(p) for p in _gold_papers(src))
    papers = [p for p in papers if _text_key(p) not in seen]
    n_dups = n_read - len(papers)
    if ids is not None:
        ids = {str(i) for i in ids}
        papers = [p for p in papers if p.paper_id in ids]
    drop = {str(i) for i in exclude_ids}
    papers = [p for p in papers if p.paper_id not in drop]
    listener = TagListener(tagger)
    tagger.encoder.contextual_sentence_vectors(papers, on_batch=listener)
    probs = listener._probabilities(papers)
    scores = _scores(papers, probs)
    scores["duplicates_excluded"] = n_dups
    return scores


# ================================================================ tagging a file
_ID_KEYS = {"s2orc": "paper_id", "csfcube": "paper_id", "csabstruct": "paper_id", "jsonl": "id",
            "s2ag-abstracts": "corpusid", "s2ag-s2orc": "corpusid"}


def _open_lines(source, stack):
    """(name, iterator of raw lines) for a path (gzip detected by content), `-` (stdin) or a stream."""
    import gzip

    if isinstance(source, str) and source == "-":
        return "<stdin>", iter(getattr(sys.stdin, "buffer", sys.stdin))
    if hasattr(source, "read"):
        return str(getattr(source, "name", "<stream>")), iter(source)
    f = stack.enter_context(open(source, "rb"))
    if f.peek(2)[:2] == b"\x1f\x8b":
        f = stack.enter_context(gzip.open(f, "rb"))
    return str(source), iter(f)


def _record_id(raw, fmt: str | None):
    """Best-effort paper id of a line that yielded no paper, so its output line can still be matched up."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    keys = [_ID_KEYS[fmt]] if fmt else ["paper_id", "corpusid", "id"]
    lower = {str(k).lower(): v for k, v in record.items()}
    for key in keys:
        value = lower.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    return None


def _records(lines, name: str, fmt: str | None, strict: bool, summary: dict):
    """Yield, per non-blank line and in order, `("paper", Paper)` or `("other", output record)` for a
    line without an abstract or (unless `strict`) a bad one. Each line is parsed by `read_papers`,
    so every format and every check of the readers applies; line numbers are the file's."""
    import io

    from ..ingest.readers import InputError, ReadReport, detect_format, read_papers

    for lineno, raw_line in enumerate(lines, start=1):
        if not raw_line.strip():
            continue
        summary["records"] += 1
        if fmt is None:  # detected once, from the first parseable record, as read_papers does
            try:
                first = json.loads(raw_line)
            except (ValueError, UnicodeDecodeError):
                first = None
            if isinstance(first, dict):
                try:
                    fmt = detect_format(first)
                except ValueError as e:
                    raise InputError(name, lineno, "format", str(e)) from None
        report = ReadReport()
        one = io.BytesIO(raw_line) if isinstance(raw_line, bytes) else io.StringIO(raw_line)
        try:
            papers = list(read_papers(one, format=fmt, strict=True, report=report))
        except InputError as e:
            error = InputError(name, lineno, e.field, e.reason)
            if strict:
                raise error from None
            summary["errors"].append(str(error))
            yield "other", {"paper_id": _record_id(raw_line, fmt), "sentences": [], "facets": [], "error": str(error)}
            continue
        if papers:
            yield "paper", papers[0]
        else:
            reason = next(iter(report.skipped), "skipped")
            summary["skipped"][reason] += 1
            yield "other", {"paper_id": _record_id(raw_line, fmt), "sentences": [], "facets": [], "skipped": reason}


def tag_file(source, out, *, format: str | None = None, raw: bool = False, tagger: FacetTagger | None = None,
             encoder=None, strict: bool = False, chunk_size: int = 256, progress: bool = False) -> dict:
    """Tag every abstract of `source` and write JSONL `{"paper_id","title","sentences","facets"}`.

    One output line per input record (non-blank line), in input order, so outputs line up with
    inputs: a record without an abstract gets `"sentences": [], "facets": [], "skipped": "no abstract"`,
    and (unless `strict`, which raises) a bad line gets `"error": "file:line: field: reason"`.
    `source` is a path (gzip or not), `-` (stdin) or a stream; `out` a path, `-` (stdout) or a stream.
    A path is written aside and renamed at the end, so a failed run leaves no half-written file.
    Returns a summary with counts per label.
    """
    import collections
    from contextlib import ExitStack

    if tagger is None:
        tagger = FacetTagger.load(encoder=encoder)
    elif encoder is not None:
        tagger.check_encoder(encoder)
        tagger._encoder = encoder
    started = time.time()
    summary = {"records": 0, "tagged": 0, "sentences": 0, "skipped": collections.Counter(), "errors": [],
               "labels": collections.Counter()}

    def flush(pending, sink):
        papers = [item for kind, item in pending if kind == "paper"]
        labels = iter(tagger._tag_encoded(papers, raw, progress) if papers else [])
        for kind, item in pending:
            if kind == "paper":
                facets = next(labels)
                summary["tagged"] += 1
                summary["sentences"] += len(facets)
                summary["labels"].update(facets)
                item = {"paper_id": item.paper_id, "title": item.title, "sentences": item.sentences, "facets": facets}
            sink.write(json.dumps(item, ensure_ascii=False) + "\n")

    to_path = not hasattr(out, "write") and not (isinstance(out, str) and out == "-")
    tmp = Path(str(out) + ".tmp") if to_path else None
    try:
        with ExitStack() as stack:
            name, lines = _open_lines(source, stack)
            sink = stack.enter_context(open(tmp, "w", encoding="utf-8")) if to_path else (sys.stdout if isinstance(out, str) else out)
            pending, n_papers = [], 0
            for kind, item in _records(lines, name, format, strict, summary):
                pending.append((kind, item))
                n_papers += kind == "paper"
                if n_papers >= chunk_size:
                    flush(pending, sink)
                    pending, n_papers = [], 0
            flush(pending, sink)
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    if to_path:
        os.replace(tmp, out)
    summary["skipped"] = dict(sorted(summary["skipped"].items()))
    summary["labels"] = dict(sorted(summary["labels"].items()))
    summary["out"] = str(out) if not hasattr(out, "write") else getattr(out, "name", "<stream>")
    summary["seconds"] = round(time.time() - started, 1)
    return summary
