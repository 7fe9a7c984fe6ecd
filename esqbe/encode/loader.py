"""One way to load a model: a `ModelSpec` says everything that decides which vectors come out (model, device,
batch size, runtime backend, ONNX cache, offline), and `load_encoder` loads it once per process.

Every path that needs an encoder goes through here: `Index.encoder` (indexing, querying, cite, the server
through its `Index`), evaluation, `esqbe tag` and `train-tagger`, and the tagger's own encoder. Keeping one
cache means one copy of a model per process, and one place that honours `encoder_backend` and the model an
index was built from (`model_source`). Below it, whatever loads a model's files (the encoder, `esqbe adapt`'s student,
`train-encoder`'s base, `check speed`'s reference) loads them through `esqbe.encode.modeldir`: the directory checked
before anything of it is read, and transformers never asked to run the directory's own code."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace

from ..domain import IndexMeta
from ..settings.config import Settings
from .encoder import Encoder
from .identity import ModelNotFoundError, _pick_device, backend_for, model_info, resolve_backend

_ENCODERS: dict = {}  # ModelSpec -> Encoder: loaded models, shared by the indexes of one process (the CLI, a server)
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how it runs. Two equal specs load the same encoder (and share it)."""

    model: str | None = None  # a directory, an installed model package or a hub name; None: the default model
    device: str | None = None  # auto/cpu/cuda[:N]/mps; None: auto
    batch_size: int = 32
    backend: str | None = None  # torch | torch-int8 | onnx | onnx-int8 | auto; None: torch (the library's exact path)
    cache_dir: str | None = None  # where ONNX exports are kept; None: $ESQBE_CACHE_DIR, else ~/.cache/esqbe
    offline: bool = False  # True: never reach for a hub, even for a hub name (local directories never do)
    adapter: str | None = None  # an encoder adapter merged at load (esqbe.encode.adapter); None / "none": none

    @classmethod
    def from_settings(cls, settings: Settings, model: str | None = None) -> ModelSpec:
        """The settings' model (or `model`), device, batch size and encoder backend."""
        return cls(model if model is not None else settings.model, settings.device, int(settings.batch_size),
                   settings.encoder_backend,
                   adapter=None if str(settings.adapter or "none").lower() == "none" else settings.adapter)

    @classmethod
    def for_index(cls, settings: Settings, meta: IndexMeta | None) -> ModelSpec:
        """The model an index is used with: the settings' model, else the one the index was built with (the
        directory it was loaded from, `model_source`, when it still exists); with `encoder_backend: auto`, the
        runtime the index was built with (see `backend_for`)."""
        backend = backend_for(settings.encoder_backend, meta)
        if backend is not None and backend != settings.encoder_backend:
            settings = replace(settings, encoder_backend=backend)
        if settings.model or meta is None:
            return cls.from_settings(settings)
        source = meta.model_source or meta.model
        if os.path.isabs(source) and not os.path.isdir(source):
            raise ModelNotFoundError(
                f"this index was built with model {meta.model!r} from {source}, which no longer exists; "
                f"pass --model with a copy of that model (fingerprint {meta.fingerprint or 'unknown'})")
        return cls.from_settings(settings, model=source)

    def resolved_backend(self) -> str:
        """The runtime this spec runs on here (`auto` and None resolved for the device), without loading."""
        fingerprint = model_info(self.model).fingerprint if self.backend in (None, "auto") else None
        return resolve_backend(self.backend, _pick_device(self.device), fingerprint)


def load_encoder(spec: ModelSpec, *, shared: bool = True) -> Encoder:
    """The encoder for `spec`, loaded on first use and shared by every later caller with an equal spec.
    `shared=False`: a new one of the caller's own (a server's threads: a tokenizer must not be used from two
    threads at once)."""
    if not shared:
        return Encoder.load(spec.model, device=spec.device, batch_size=spec.batch_size, backend=spec.backend,
                            cache_dir=spec.cache_dir, offline=spec.offline,
                            adapter=spec.adapter)
    encoder = _ENCODERS.get(spec)
    if encoder is None:
        with _LOCK:  # two threads asking at once load it once
            encoder = _ENCODERS.get(spec)
            if encoder is None:
                encoder = Encoder.load(spec.model, device=spec.device, batch_size=spec.batch_size, backend=spec.backend,
                                       cache_dir=spec.cache_dir, offline=spec.offline,
                            adapter=spec.adapter)
                _ENCODERS[spec] = encoder
    return encoder


__all__ = ["ModelSpec", "load_encoder"]
