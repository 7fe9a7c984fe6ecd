"""Sentence vectors for papers.

Contextual (default, after Aspire): encode `title [SEP] abstract` once and mean-pool each
sentence's final-layer token vectors, so a sentence's vector carries its abstract's context.
Independent: encode each sentence alone (what sentence-transformers does).
Vectors are L2-normalised, so cosine = dot product and L2 distance ranks the same.
"""
from __future__ import annotations

import sys
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from ..core import deadline
from ..core.limits import ENCODE_CHARS_PER_TOKEN
from ..domain import Paper
from ..errors import ParameterError
from ..settings.table import ENCODER_MODES
from .identity import (
    DEFAULT_MODEL,
    ModelNotFoundError,
    _pick_device,
    model_info,
    resolve_backend,
    runtime_name,
)
from .modeldir import pretrained
from .onnx import OnnxRunner

#: a title longer than this (in tokens) is cut, so the abstract keeps the window
MAX_TITLE_TOKENS = 64
#: bytes of token vectors an encoder keeps by text (`Encoder.token_vectors`): asym_token encodes every candidate
#: sentence at query time, and the same candidates recur across queries (a session's, the scale's measuring queries)
TOKEN_CACHE_BYTES = 64 << 20


@dataclass
class EncodedBatch:
    """One forward pass of the contextual encoder, handed to `on_batch` listeners (e.g. the facet
    tagger) so they can reuse its hidden states instead of running a second encoder."""

    hidden_states: tuple  # (layers + 1) tensors of shape (B, T, d): embeddings, then each layer
    attention_mask: object  # (B, T) tensor
    spans: list[list[tuple[int, int]]]  # per row: [start, end) token span of each sentence
    rows: list[tuple[int, list[int]]]  # per row: (index of the paper in the input, its sentence indices)


class Encoder:
    """A transformers model used as a sentence encoder (mean pooling, L2-normalised)."""

    def __init__(self, model: str | None = None, *, device: str | None = None, batch_size: int = 32,
                 max_length: int | None = None, backend: str | None = None, cache_dir: str | None = None, offline: bool = False,
                 adapter: str | None = None):
        """Load `model` (see `resolve_model`). `offline`: never reach for a hub, even for a hub name. Loading
        leaves transformers' logging and progress bars as the host process set them (the CLI quiets them)."""
        import torch

        info = model_info(model)
        source, self.name, self.location, self.fingerprint = info.source, info.name, info.location, info.fingerprint
        self.distilled = info.distilled  # `esqbe adapt`'s model: teacher, data, recipe (recorded in an index's meta)
        offline = bool(offline) or not source.count("/") or Path(source).is_dir()
        if int(batch_size) < 1:
            raise ParameterError(f"batch_size must be at least 1 (got {batch_size})")
        self.device = _pick_device(device)
        self.batch_size = int(batch_size)
        try:
            self.tokenizer = pretrained("tokenizer", source, offline=offline)
            self.config = pretrained("config", source, offline=offline)
        except OSError as e:
            raise ModelNotFoundError(f"cannot load model {model or DEFAULT_MODEL!r} from {source}: {e}") from e
        if getattr(self.config, "dtype", None) is None:
            self.config.dtype = torch.float32  # what loading the weights sets (the ONNX cache key reads the config)
        self._model = None
        self._recent: dict = {}  # id(paper) -> (paper, its sentences, their token ids), of the last contextual call
        #: (text as cut, max_tokens) -> (tokens, vectors), least recently used first, at most `token_cache_bytes`
        self._token_cache: OrderedDict[tuple[str, int], tuple[list[str], np.ndarray]] = OrderedDict()
        self._token_cache_held = 0
        self._token_lock = threading.Lock()
        self.token_cache_bytes = TOKEN_CACHE_BYTES
        self._source, self._offline, self._model_name = source, offline, model
        self.adapter = None
        if adapter is not None and str(adapter).lower() not in ("", "none"):
            from .adapter import combined_fingerprint, resolve_adapter

            self.adapter = resolve_adapter(adapter)
            if self.adapter is not None:  # merged into the weights (`model`): every runtime (and the ONNX cache key) sees it
                self.name = f"{self.name}+{self.adapter.name}"
                self.fingerprint = combined_fingerprint(self.fingerprint, self.adapter)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelNotFoundError(f"model {self.name!r} has no fast tokenizer; esqbe needs token offsets")
        limit = getattr(self.config, "max_position_embeddings", 512)
        if getattr(self.config, "model_type", "") in ("roberta", "mpnet", "xlm-roberta"):
            limit -= 2  # these reserve positions for padding offsets
        self.max_length = int(min(max_length or 512, limit, self.tokenizer.model_max_length))
        self.dim = int(self.config.hidden_size)
        self.num_layers = int(self.config.num_hidden_layers)
        self._torch = torch
        self.backend = resolve_backend(backend, self.device, info.fingerprint)  # the base model's, before an adapter
        if self.device.startswith("cuda"):
            self.batch_size = max(self.batch_size, GPU_MIN_BATCH)  # large length-sorted batches keep a GPU busy
        elif self.backend.endswith("int8"):
            # dynamic int8 gives each matrix product's activations one scale per call: rows encoded together
            # would share it, so a sentence's vector would depend on the texts beside it (CSFCube dev moved by
            # 0.6 NDCG%20 between 128- and 256-paper batches). One row per call makes it depend on its own
            # text only, and on 2 CPU cores it is also faster (no padding): 87 against 67 papers/s.
            self.batch_size = 1
        # an ONNX runtime whose export is cached never needs the PyTorch weights: they load on first use of `model`
        # (the tagger's compact weights, an export), not at start-up (a second or two per process)
        self._runner = make_runner(self.backend, lambda: self.model, self.config, source=source, device=self.device,
                                   cache_dir=cache_dir,
                                   offline=offline, fingerprint=self.fingerprint)
        #: how the vectors are computed, part of an index's model identity (IndexMeta.runtime)
        self.runtime = runtime_name(self.backend, getattr(self._runner, "precision", None))

    @property
    def model(self):
        """The PyTorch model (the adapter merged in), loaded on first use."""
        if self._model is None:
            try:
                model = pretrained("model", self._source, offline=self._offline).to(self.device).eval()
            except OSError as e:
                raise ModelNotFoundError(f"cannot load model {self._model_name or DEFAULT_MODEL!r} "
                                         f"from {self._source}: {e}") from e
            if self.adapter is not None:
                from .adapter import merge_adapter

                merge_adapter(model, self.adapter)
            self._model = model
        return self._model

    @classmethod
    def load(cls, model: str | None = None, **kwargs) -> Encoder:
        return cls(model, **kwargs)

    # --- whole texts ---------------------------------------------------------------------------
    def _cut(self, text: str, tokens: int | None = None) -> str:
        """`text` cut to what `tokens` tokens (default: the model's window) can come from, before tokenizing:
        the tokenizer reads all it is given before it truncates, so a megabyte sentence took seconds."""
        return text[: (tokens or self.max_length) * ENCODE_CHARS_PER_TOKEN]

    def encode_texts(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """One vector per text, each text encoded alone (sentence-transformers style)."""
        texts = [self._cut(t) for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        bar = _progress(len(texts), "encoding", progress)
        for start in range(0, len(texts), self.batch_size):
            deadline.check()
            idx = order[start : start + self.batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt").to(self.device)
            hidden = self._runner(enc, False)[0].float()  # fp32 pooling (the GPU path runs fp16/bf16)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out[idx] = _normalize(pooled.float().cpu().numpy())
            bar.update(len(idx))
        bar.close()
        return out

    def independent_sentence_vectors(self, papers: Sequence[Paper], *, progress: bool = False,
                                     on_progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
        """Each sentence encoded on its own, without its abstract."""
        flat = [s for p in papers for s in p.sentences]
        vecs = self.encode_texts(flat, progress=progress)
        if on_progress is not None:
            on_progress(len(papers))
        out, pos = [], 0
        for p in papers:
            out.append(vecs[pos : pos + len(p.sentences)])
            pos += len(p.sentences)
        return out

    # --- contextual ----------------------------------------------------------------------------
    def _windows(self, paper: Paper, title_len: int, sent_lens: list[int]) -> list[list[int]]:
        """Group a paper's sentences into windows that fit the model with the title in front."""
        budget = self.max_length - title_len - 3
        windows: list[list[int]] = []
        cur: list[int] = []
        used = 0
        for i, n in enumerate(sent_lens):
            if cur and used + n > budget:
                windows.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += n
        if cur:
            windows.append(cur)
        return windows

    def contextual_sentence_vectors(
        self,
        papers: Sequence[Paper],
        *,
        progress: bool = False,
        on_batch: Callable[[EncodedBatch], None] | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> list[np.ndarray]:
        """Encode `title [SEP] sentences...` once per paper; a sentence's vector is the mean of its tokens.

        Abstracts longer than the model's window are split into consecutive windows of whole
        sentences, each with the title in front.
        """
        tok = self.tokenizer
        rows: list[tuple[int, list[int]]] = []  # (paper index, sentence indices in this window)
        row_texts: list[tuple[str, str, np.ndarray]] = []  # (title, body, char start of each sentence)
        # every title and sentence is tokenised for its length in one call (the tokenizer's own threads), not two
        # calls per paper: with the encoder's runs side by side, that serial pass had left a core idle
        todo = [(pi, paper) for pi, paper in enumerate(papers) if paper.sentences]
        cut = [(self._cut(p.title or "", MAX_TITLE_TOKENS), [self._cut(s) for s in p.sentences]) for _, p in todo]
        ids = tok([x for title, ss in cut for x in (title, *ss)], add_special_tokens=False)["input_ids"] if todo else []
        at = 0
        recent = {}
        for (pi, paper), (full_title, sentences) in zip(todo, cut):
            title_ids, sent_ids = ids[at], ids[at + 1 : at + 1 + len(sentences)]
            sent_lens = [len(x) for x in sent_ids]
            recent[id(paper)] = (paper, list(paper.sentences), sent_ids)  # the paper held: its id stays its own
            at += 1 + len(sentences)
            title = str(tok.decode(title_ids[:MAX_TITLE_TOKENS])) if len(title_ids) > MAX_TITLE_TOKENS else full_title
            for window in self._windows(paper, min(len(title_ids), MAX_TITLE_TOKENS), sent_lens):
                texts = [" ".join(sentences[i].split()) for i in window]
                starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
                rows.append((pi, window))
                row_texts.append((title, " ".join(texts), starts))

        self._recent = recent  # for token_counts: indexing asks for each paper's counts right after this call
        vectors = [np.zeros((len(p.sentences), self.dim), dtype=np.float32) for p in papers]
        order = np.argsort([-(len(t) + len(b)) for t, b, _ in row_texts], kind="stable")
        bar = _progress(len(papers), "encoding", progress)
        rows_left = Counter(pi for pi, _ in rows)
        finished = 0
        want_states = on_batch is not None

        def tokenized(start: int):
            batch = [int(r) for r in order[start : start + self.batch_size]]
            enc = tok([row_texts[r][0] for r in batch], [row_texts[r][1] for r in batch], padding=True,
                      truncation="only_second", max_length=self.max_length, return_offsets_mapping=True,
                      return_tensors="pt")
            offsets = enc.pop("offset_mapping").numpy()
            return batch, enc.to(self.device), offsets

        def finish(batch, enc, offsets, last, hidden_states) -> None:
            nonlocal finished
            # pooling in numpy, one thread: torch's OpenMP ops here fought the runtime's threads for the 2 cores
            # (index_add_ took as long as the transformer)
            hidden = last.cpu().float().numpy()
            spans = []
            for i, r in enumerate(batch):
                pi, window = rows[r]
                in_body = np.array([s == 1 for s in enc.sequence_ids(i)])
                spans.append(_pool_row(hidden[i], in_body, offsets[i, :, 0], row_texts[r][2], vectors[pi], window))
                rows_left[pi] -= 1
                if rows_left[pi] == 0:
                    bar.update(1)
                    finished += 1
            if on_batch is not None:
                emit(EncodedBatch(hidden_states, enc["attention_mask"], spans, [rows[r] for r in batch]))
            if on_progress is not None and finished:
                on_progress(finished)  # papers whose every window is encoded, once per encoder batch
                finished = 0

        batch_starts = range(0, len(order), self.batch_size)
        workers = int(getattr(self._runner, "workers", 1)) if len(batch_starts) > 1 else 1
        listening: deque = deque()  # the listener's calls under way, on its own thread (rows side by side only)
        listener_pool = None

        def emit(encoded: EncodedBatch) -> None:
            assert on_batch is not None
            if listener_pool is None:
                on_batch(encoded)
                return
            # the listener (the tagger's copied layers) runs on a thread of its own, in batch order: on this thread
            # it held back tokenising and pooling, so the encoder's rows waited (+17% wall for +4% CPU);
            # at most two batches wait for it, so a slow listener bounds the hidden states held
            listening.append(listener_pool.submit(on_batch, encoded))
            while len(listening) > 2 or (listening and listening[0].done()):
                listening.popleft().result()

        if workers > 1:
            # batches run `workers` at a time on one-thread sessions (OnnxRunner.run_one); this thread tokenises the
            # next batch meanwhile (the tokenizer is not shared between threads) and pools the finished ones in
            # order, so listeners see the batches in the order of the serial loop
            from concurrent.futures import ThreadPoolExecutor

            with torch_threads(1), ThreadPoolExecutor(workers, thread_name_prefix="esqbe-onnx") as pool, \
                    ThreadPoolExecutor(1, thread_name_prefix="esqbe-listener") as listener_pool:
                running: deque = deque()
                for start in batch_starts:
                    deadline.check()
                    batch, enc, offsets = tokenized(start)
                    running.append((batch, enc, offsets, pool.submit(self._runner.run_one, enc, want_states)))
                    while len(running) > workers or (running and running[0][3].done()):
                        batch, enc, offsets, job = running.popleft()
                        finish(batch, enc, offsets, *job.result())
                while running:
                    batch, enc, offsets, job = running.popleft()
                    finish(batch, enc, offsets, *job.result())
                while listening:
                    listening.popleft().result()
        else:
            for start in batch_starts:
                deadline.check()
                batch, enc, offsets = tokenized(start)
                finish(batch, enc, offsets, *self._runner(enc, want_states))
        bar.close()
        return vectors

    def sentence_vectors(self, papers: Sequence[Paper], mode: str = "contextual", **kwargs) -> list[np.ndarray]:
        if mode == "contextual":
            return self.contextual_sentence_vectors(papers, **kwargs)
        if mode == "independent":
            kwargs.pop("on_batch", None)
            return self.independent_sentence_vectors(papers, **kwargs)
        raise ParameterError(f"unknown encoder mode {mode!r}; choose one of {', '.join(ENCODER_MODES)}")

    # --- tokens --------------------------------------------------------------------------------
    def token_vectors(self, texts: Sequence[str], *, max_tokens: int = 100) -> list[tuple[list[str], np.ndarray]]:
        """Per text: its wordpiece tokens (no special tokens) and their final-layer vectors (not normalised; read-only).

        Each text is encoded alone and cut at `max_tokens` tokens, as in asymmetric partial matching. A text encoded
        before (within `token_cache_bytes` of the most recently used) is not encoded again: the same text gets the
        same vectors for as long as it is kept.
        """
        cut = [self._cut(t, max_tokens) for t in texts]
        out: list[tuple[list[str], np.ndarray] | None] = [None] * len(cut)
        with self._token_lock:
            for i, t in enumerate(cut):
                hit = self._token_cache.get((t, max_tokens))
                if hit is not None:
                    self._token_cache.move_to_end((t, max_tokens))
                    out[i] = hit
        missing = list(dict.fromkeys(t for t, o in zip(cut, out) if o is None))
        fresh = dict(zip(missing, self._encode_tokens(missing, max_tokens)))
        with self._token_lock:
            for t, got in fresh.items():
                self._keep_tokens((t, max_tokens), got)
        return [o if o is not None else fresh[t] for t, o in zip(cut, out)]

    def forget_token_vectors(self) -> None:
        """Drop every token vector `token_vectors` keeps (`token_cache_bytes` 0 keeps none from then on)."""
        with self._token_lock:
            self._token_cache.clear()
            self._token_cache_held = 0

    def _keep_tokens(self, key: tuple[str, int], got: tuple[list[str], np.ndarray]) -> None:
        """Keep one text's token vectors (under `_token_lock`), dropping the least recently used past the bound."""
        size = got[1].nbytes + 64 * len(got[0]) + len(key[0])
        if key in self._token_cache or size > self.token_cache_bytes:
            return
        self._token_cache[key] = got
        self._token_cache_held += size
        while self._token_cache_held > self.token_cache_bytes:
            (text, _), (toks, vecs) = self._token_cache.popitem(last=False)
            self._token_cache_held -= vecs.nbytes + 64 * len(toks) + len(text)

    def _encode_tokens(self, texts: Sequence[str], max_tokens: int) -> list[tuple[list[str], np.ndarray]]:
        out: list[tuple[list[str], np.ndarray] | None] = [None] * len(texts)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), self.batch_size):
            deadline.check()
            idx = order[start : start + self.batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_tokens + 2,
                                 return_tensors="pt", return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask").bool()
            enc = enc.to(self.device)
            hidden = self._runner(enc, False)[0].float().cpu()
            keep = (~special) & enc["attention_mask"].cpu().bool()
            for row, i in enumerate(idx):
                sel = keep[row]
                ids = enc["input_ids"][row][sel.to(enc["input_ids"].device)].tolist()
                toks = cast(list[str], self.tokenizer.convert_ids_to_tokens(ids))  # a list, for a list of ids
                vecs = hidden[row][sel].numpy().copy()
                vecs.setflags(write=False)  # kept and shared: no caller may change it
                out[i] = (toks, vecs)
        return out  # type: ignore[return-value]

    def token_counts(self, paper: Paper) -> dict[str, int]:
        """Wordpiece token counts of a paper's sentences: the corpus statistics behind token weights."""
        if not paper.sentences:
            return {}
        hit = self._recent.get(id(paper))  # tokenised by the last contextual call: not again
        if hit is not None and hit[0] is paper and hit[1] == paper.sentences:
            ids = hit[2]
        else:
            ids = self.tokenizer([self._cut(s) for s in paper.sentences], add_special_tokens=False)["input_ids"]
        counts = Counter(i for row in ids for i in row)
        tokens = self.tokenizer.convert_ids_to_tokens(list(counts))
        return {t: int(c) for t, c in zip(tokens, counts.values())}


# ================================================================ how the transformer runs
#: rows per batch at least, on a GPU
GPU_MIN_BATCH = 256


def make_runner(backend: str, model: Callable, config, *, source: str, device: str, cache_dir: str | None = None,
                offline: bool = False,
                fingerprint: str | None = None):
    """A callable `(tokenizer output, want hidden states) -> (last hidden state, hidden states or None)`;
    `model()` returns the PyTorch model (loaded then, if it was not), `config` is its configuration.

    Every backend returns the final layer's token vectors (for pooling) and, when asked, the
    embeddings plus every layer's hidden states (the tagger reads a lower layer), as torch tensors.
    """
    if backend in ("torch", "torch-int8"):
        return TorchRunner(model(), device, int8=backend == "torch-int8")
    return OnnxRunner(model, config, source, int8=backend == "onnx-int8", cache_dir=cache_dir, offline=offline,
                      fingerprint=fingerprint, announce=_announce)


class TorchRunner:
    """PyTorch: fp32 as loaded; `int8`: dynamic int8 quantisation of the linear layers (CPU);
    on CUDA, fp16/bf16 autocast."""

    def __init__(self, model, device: str, *, int8: bool = False):
        import torch

        self.torch = torch
        self.device = device
        if int8:
            import copy

            # per output channel: per-tensor weight scales cost ~6% cosine to the fp32 vectors, per channel <1%
            spec = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
            model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), spec, dtype=torch.qint8)
        self.model = model
        self.autocast = None
        self.precision: str | None = None  # fp16 / bf16 under CUDA autocast; None: the weights' own (fp32, int8)
        if device.startswith("cuda"):
            self.autocast = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            self.precision = "bf16" if self.autocast is torch.bfloat16 else "fp16"

    def __call__(self, enc, hidden_states: bool):
        torch = self.torch
        with torch.inference_mode():
            if self.autocast is not None:
                with torch.autocast("cuda", dtype=self.autocast):
                    out = self.model(**enc, output_hidden_states=hidden_states)
            else:
                out = self.model(**enc, output_hidden_states=hidden_states)
        return out.last_hidden_state, (tuple(out.hidden_states) if hidden_states else None)


_THREADS_LOCK = threading.Lock()
_THREADS_HELD: list[int] = []  # torch's thread count before the first holder of `torch_threads`, while any holds it


@contextmanager
def torch_threads(n: int):
    """PyTorch's intra-op threads set to `n` for the block, back to what they were when the last such block ends
    (blocks in other threads nest: the count is process-wide). For the small torch ops beside an ONNX encoder whose
    rows already keep every core busy: with two threads, the tagger's BiLSTM over 256 abstracts took 0.22-0.53 s
    against 0.05-0.06 s on one, waiting for a core for its second thread."""
    import torch

    with _THREADS_LOCK:
        if not _THREADS_HELD:
            _THREADS_HELD.append(torch.get_num_threads())
            torch.set_num_threads(n)
        else:
            _THREADS_HELD.append(_THREADS_HELD[0])
    try:
        yield
    finally:
        with _THREADS_LOCK:
            before = _THREADS_HELD.pop()
            if not _THREADS_HELD:
                torch.set_num_threads(before)


def _pool_row(hidden: np.ndarray, in_body: np.ndarray, token_starts: np.ndarray, sentence_starts: np.ndarray,
              out: np.ndarray, window: list[int]) -> list[tuple[int, int]]:
    """Mean-pool one encoded row's body tokens into its sentences' vectors (written, normalised, into `out[window]`)
    and return each sentence's [start, end) token span ((0, 0): no token left after truncation). A sentence's
    tokens are contiguous and in order, so each one's sum is one `np.add.reduceat` segment."""
    body = np.flatnonzero(in_body)  # the second sequence's tokens (not the title, special or padding tokens)
    owner = np.searchsorted(sentence_starts, token_starts[body], side="right") - 1
    spans = [(0, 0)] * len(window)
    if not len(body):
        return spans
    present, first = np.unique(owner, return_index=True)
    sums = np.add.reduceat(hidden[body], first, axis=0)
    counts = np.diff(np.append(first, len(body))).astype(np.float32)[:, None]
    pooled = np.zeros((len(window), hidden.shape[-1]), dtype=np.float32)
    pooled[present] = sums / counts
    out[window] = _normalize(pooled)
    last = np.append(first[1:], len(body)) - 1
    for j, a, b in zip(present.tolist(), body[first].tolist(), body[last].tolist()):
        spans[j] = (a, b + 1)
    return spans


def _announce(message: str) -> None:
    """One line on stderr about slow one-off work (the first ONNX export), whatever the host's logging."""
    print(f"esqbe: {message}", file=sys.stderr, flush=True)


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


class _NoBar:
    n = 0

    def update(self, k):
        self.n += k

    def close(self):
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled or total < 2:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="paper" if desc == "encoding" else "it", file=sys.stderr, leave=False)

