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

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np

from ..domain import RAW_LABELS, Paper
from ..errors import DataError
from .net import TaggerMismatchError, TaggerNet, _hide_title, _torch
from .weights import TAGGER_FORMAT, _encoder_info, _from_deltas, shipped_weights

#: the four classes a tagged sentence can get in esqbe (objective merged into background)
FACET_CLASSES = ("background", "method", "result", "other")
_MERGE = {"background": "background", "objective": "background", "method": "method", "result": "result", "other": "other"}


def _merge(label: str) -> str:
    return _MERGE[label]


def _labels_from_probs(probs, raw: bool) -> list[str]:
    """Raw: the argmax of the five labels. esqbe facets: objective's probability counts for background."""
    if raw:
        return [RAW_LABELS[i] for i in probs.argmax(-1).tolist()]
    torch = _torch()
    merged = torch.stack([probs[:, 0] + probs[:, 1], probs[:, 2], probs[:, 3], probs[:, 4]], dim=-1)
    return [FACET_CLASSES[i] for i in merged.argmax(-1).tolist()]


# ================================================================ the tagger
class TagListener:
    """Collects what the tagger needs from one `contextual_sentence_vectors` call.

    Pass it as `on_batch`; afterwards `collect(papers)` labels exactly the papers of that call.
    Its row indices refer to positions in that call's `papers`, so use one listener per call.
    """

    def __init__(self, tagger: FacetTagger):
        self._tagger = tagger
        self._vecs: dict[int, dict[int, object]] = {}
        self._memo: tuple | None = None  # (the papers' ids and sentence counts, their probabilities)

    def __call__(self, batch) -> None:
        torch = _torch()
        t = self._tagger
        self._memo = None
        hidden_states = batch.hidden_states
        expected = t.meta["encoder"]
        if (hidden_states is None or len(hidden_states) != expected["num_layers"] + 1
                or hidden_states[-1].shape[-1] != expected["dim"]):
            got = ("no hidden states" if hidden_states is None
                   else f"{len(hidden_states) - 1} layers of dim {hidden_states[-1].shape[-1]}")
            raise TaggerMismatchError(f"tagger {t.path} expects the hidden states of {t.encoder_name!r} "
                                      f"({t.meta['encoder']['num_layers']} layers of dim {t.meta['encoder']['dim']}); got {got}")
        hidden = hidden_states[t.meta["input_layer"]]
        net = t._net_on(hidden.device)
        valid = batch.attention_mask.bool()
        if t.hide_title:
            valid = _hide_title(valid, batch.spans)
        with torch.inference_mode():
            vecs = net.sentence_vectors(hidden.float(), valid, batch.spans, layers=t._onnx_layers())
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
        out: list[list[list[float]]] = []
        for p in self._probabilities(papers):
            if p is None:
                out.append([])
                continue
            merged = np.stack([(p[:, 0] + p[:, 1]).numpy(), p[:, 2].numpy(), p[:, 3].numpy(), p[:, 4].numpy()], axis=-1)
            out.append(np.round(merged.astype(np.float64), 3).tolist())
        return out

    def _probabilities(self, papers: Sequence[Paper]) -> list:
        """(n_sentences, 5) probabilities per paper; None for a paper without sentences. Computed once per
        listener for the same papers: indexing asks for the labels, then the soft labels."""
        key = [(p.paper_id, len(p.sentences)) for p in papers]
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        out = self._compute_probabilities(papers)
        self._memo = (key, out)
        return out

    def _compute_probabilities(self, papers: Sequence[Paper]) -> list:
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
        temperature = self._tagger.temperature
        threads: AbstractContextManager = nullcontext()
        if self._tagger._onnx_layers() is not None:  # beside an ONNX encoder: one thread (encoder.torch_threads)
            from ..encode.encoder import torch_threads

            threads = torch_threads(1)
        with torch.inference_mode(), threads:
            for start in range(0, len(seqs), 256):
                assert net is not None  # there are sequences
                chunk = seqs[start : start + 256]
                for pi, logits in zip(todo[start : start + 256], net.classify(chunk)):
                    out[pi] = (logits.float() / temperature).softmax(-1).cpu()
        return out


class FacetTagger:
    """Labels sentences with background/objective/method/result/other (esqbe facets by default)."""

    def __init__(self, net, meta: dict, path: str | Path | None = None, encoder=None):
        self.net = net.eval()
        self.meta = meta
        self.path = str(path) if path else "<in memory>"
        self._encoder = None
        self._onnx: tuple | None = None  # (encoder, its ONNX copy of the layers or None): layers_onnx.py
        self._last: TagListener | None = None
        #: hide title tokens from the tagger's own layers (see _hide_title)
        self.hide_title = True
        if encoder is not None:
            self.check_encoder(encoder)
            self._encoder = encoder

    # --- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path | None = None, encoder=None) -> FacetTagger:
        """Load weights (default: the ones shipped in the package for `encoder`, else MiniLM's); refuse them for
        another encoder."""
        torch = _torch()
        path = Path(path) if path else shipped_weights(encoder)
        if not path.exists():
            raise FileNotFoundError(f"no tagger weights at {path}; train them with `esqbe train-tagger`")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            meta, state = blob["meta"], blob["state_dict"]
            fmt = meta["format"]
        except Exception as e:  # a wrong or damaged file: say which
            raise DataError(f"{path} is not an esqbe tagger weights file ({type(e).__name__}: {e})") from None
        if fmt != TAGGER_FORMAT:
            raise DataError(f"{path} has tagger format {fmt}; this esqbe reads format {TAGGER_FORMAT}: retrain it")
        if "delta_of" in meta:  # compact weights: the tuned layers as int8 differences from the encoder's own
            if encoder is not None and _encoder_info(encoder) != meta["encoder"]:
                raise TaggerMismatchError(f"tagger weights {path} were trained on encoder {meta['encoder']['name']!r}, "
                                          f"not {_encoder_info(encoder)['name']!r}")
            if encoder is None:
                from ..encode.loader import ModelSpec, load_encoder

                encoder = load_encoder(ModelSpec(meta["encoder"]["name"], backend="torch"))
            state = _from_deltas(state, meta, encoder, path)
        net = TaggerNet(**meta["arch"])
        net.load_state_dict({k: v.float() for k, v in state.items()})
        return cls(net, meta, path, encoder)

    @property
    def temperature(self) -> float:
        """The temperature its probabilities are computed at (fitted on held-out abstracts by `esqbe train-tagger`,
        esqbe.tagger.calibrate; 1.0 for weights that record none): softmax(logits / T)."""
        t = float(self.meta.get("temperature", 1.0))
        if not 0.01 <= t <= 100.0:  # a file's value, checked before it divides anything
            raise DataError(f"{self.path}: tagger temperature {t!r} is outside 0.01..100")
        return t

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
            from ..encode.loader import ModelSpec, load_encoder

            encoder = load_encoder(ModelSpec(self.encoder_name, backend="torch"))
            self.check_encoder(encoder)
            self._encoder = encoder
        return self._encoder

    def _onnx_layers(self):
        """The copied layers on ONNX Runtime when the encoder runs there (int8 like it), else None (PyTorch)."""
        if self._onnx is None or self._onnx[0] is not self._encoder:  # made for this encoder (files.py sets another)
            from .layers_onnx import layers_for

            self._onnx = (self._encoder, layers_for(self.net, self._encoder))
        return self._onnx[1]

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


def load_tagger(path: str | Path | None, encoder: Callable[[], object]) -> tuple[FacetTagger | None, bool]:
    """The facet tagger an index labels with, and whether it reuses the index's encoder pass.

    `path`'s weights (None: the shipped ones for that encoder, `weights.SHIPPED_WEIGHTS`: MiniLM's and the quality
    preset's all-mpnet-base-v2 have their own) on the encoder `encoder()` returns when they were trained on it; with
    another encoder they run the encoder they belong to, a second pass of its own.
    (None, False) when this build has no tagger (no weights shipped, no torch) and none was named; weights the
    user named that are gone raise, rather than leave papers unlabelled."""
    try:
        try:
            return FacetTagger.load(path, encoder=encoder()), True
        except TaggerMismatchError:
            return FacetTagger.load(path), False
    except (ImportError, FileNotFoundError):
        if path:
            raise
        return None, False
