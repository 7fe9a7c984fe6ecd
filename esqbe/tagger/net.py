"""The tagger's network (torch): copies of the encoder's top layers (`_Layer`), mean pooling per sentence, a
BiLSTM over the sentences with position features (`TaggerNet`); `TaggerMismatchError` when an encoder cannot host it."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..domain import RAW_LABELS
from ..errors import ModelError

#: position features per sentence: relative position, first, last, abstract length
N_POSITION_FEATURES = 4


# ================================================================ model
def _torch():
    import torch

    return torch


def _nn():
    import torch.nn as nn

    return nn


class _Layer(_nn().Module):  # type: ignore[misc]  # torch.nn.Module, imported on first use
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
    def from_hf(cls, layer, config) -> _Layer:
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
        _torch()
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


class TaggerNet(_nn().Module):  # type: ignore[misc]  # torch.nn.Module, imported on first use
    """Copied top encoder layers -> per-sentence mean pooling -> BiLSTM with position features -> labels."""

    def __init__(self, *, dim: int, n_layers: int, heads: int, ff: int, eps: float, lstm: int = 128,
                 n_labels: int = len(RAW_LABELS), dropout: float = 0.2, pool: str = "mean", stride: int = 1):
        nn = _nn()
        super().__init__()
        if pool not in ("mean", "mean+attn"):
            raise ValueError(f"unknown pooling {pool!r}")
        if int(stride) < 1:
            raise ValueError(f"the token stride must be at least 1, not {stride!r}")
        self.pool = pool
        #: > 1: each sentence's tokens are averaged in groups of `stride` before the copied layers (`_group_tokens`)
        self.stride = int(stride)
        self.layers = nn.ModuleList([_Layer(dim, heads, ff, eps) for _ in range(n_layers)])
        # attention pooling lets cue words ("we propose", "results show") outweigh the rest of a sentence
        self.attn = nn.Linear(dim, 1) if pool == "mean+attn" else None
        width = dim * (2 if self.attn is not None else 1)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(width + N_POSITION_FEATURES, lstm, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * lstm, n_labels)

    def sentence_vectors(self, hidden, valid, spans: Sequence[Sequence[tuple[int, int]]], layers=None):
        """Run the copied layers over a batch of rows; pool each sentence's tokens, per row. `layers`: another
        runtime's copy of them (`layers_onnx.OnnxTaggerLayers`), called as `layers(hidden, valid)`."""
        torch = _torch()
        if self.stride > 1:
            hidden, valid, spans = _group_tokens(hidden, valid, spans, self.stride)
        x = hidden
        if layers is not None:
            x = layers(x, valid).to(hidden.device)
        else:
            for layer in self.layers:
                x = layer(x, valid)
        if layers is not None and self.attn is None:
            return _mean_pool_numpy(x, spans)
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


def _group_tokens(hidden, valid, spans: Sequence[Sequence[tuple[int, int]]], stride: int):
    """Shorter rows for the copied layers: per row its first token ([CLS]), each sentence's tokens averaged in
    consecutive groups of `stride` (a sentence's last group may be smaller), and its last valid token ([SEP]);
    everything else (the title, separators, padding) is dropped, as `_hide_title` masks the title. Returns the
    grouped (B, T', d) states, their validity and each sentence's span in group positions ((0, 0) stays (0, 0)).

    Why: the copied layers' arithmetic grows with the row's length, and they were most of tagging's
    cost (two int8 layers over every token: ~12 ms CPU a paper against ~31 ms for the encoder's six); a
    sentence's label needs its gist, not each wordpiece. The lower states are frozen, so this is no part of
    what is trained, and the same function runs at training and at indexing time."""
    torch = _torch()
    B, T, _ = hidden.shape
    on = valid.detach().cpu().numpy()
    members: list[list[tuple[int, int]]] = []  # per row, per new position: the [start, end) of old tokens
    new_spans: list[list[tuple[int, int]]] = []
    for i, row in enumerate(spans):
        groups: list[tuple[int, int]] = [(0, 1)] if on[i, 0] else []
        row_spans = []
        for a, b in row:
            if b <= a:
                row_spans.append((0, 0))
                continue
            first = len(groups)
            groups.extend((s, min(s + stride, b)) for s in range(a, b, stride))
            row_spans.append((first, len(groups)))
        where = np.flatnonzero(on[i])
        last = int(where[-1]) if len(where) else 0
        if last > 0 and all(not (a <= last < b) for a, b in row):
            groups.append((last, last + 1))
        members.append(groups)
        new_spans.append(row_spans)
    width = max(1, max((len(g) for g in members), default=1))
    weights = np.zeros((B, width, T), dtype=np.float32)
    new_valid = np.zeros((B, width), dtype=np.bool_)
    for i, groups in enumerate(members):
        new_valid[i, : len(groups)] = True
        for j, (a, b) in enumerate(groups):
            weights[i, j, a:b] = 1.0 / (b - a)
    grouped = torch.bmm(torch.from_numpy(weights).to(hidden.device, hidden.dtype), hidden)
    return grouped, torch.from_numpy(new_valid).to(valid.device), new_spans


def _mean_pool_numpy(x, spans: Sequence[Sequence[tuple[int, int]]]) -> list:
    """Each sentence's mean token vector, per row, in numpy on the calling thread: the same as `sentence_vectors`'
    batched product (to float rounding), without torch's BLAS threads. Beside an ONNX encoder whose rows run on
    both cores, that small product waited ~20 ms a row for a core for its second thread: it cost as much as the
    tagger's layers. (0, 0) spans (a sentence truncated away) pool to zeros, as there."""
    torch = _torch()
    hidden = x.detach().cpu().float().numpy()
    out = []
    for i, row in enumerate(spans):
        pooled = np.zeros((len(row), hidden.shape[-1]), dtype=np.float32)
        for j, (a, b) in enumerate(row):
            if b > a:
                pooled[j] = hidden[i, a:b].mean(0)
        out.append(torch.from_numpy(pooled).to(x.device))
    return out


def _position_features(n: int, device, dtype):
    torch = _torch()
    i = torch.arange(n, device=device, dtype=dtype)
    rel = i / max(n - 1, 1)
    first = (i == 0).to(dtype)
    last = (i == n - 1).to(dtype)
    length = torch.full_like(i, min(n, 20) / 20.0)
    return torch.stack([rel, first, last, length], dim=-1)


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


class TaggerMismatchError(ModelError, ValueError):
    """The weights were trained on another encoder's hidden states and would tag garbage."""
