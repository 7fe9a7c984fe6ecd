"""Encoder adapters: LoRA weights (as `esqbe train-encoder` writes them, in peft's file layout) merged into the base
model's weights at load time with plain torch, so loading one needs no `peft` (only training does), and every
runtime (torch, torch-int8, the ONNX export, which is keyed by the merged weights) sees the adapted model.

An adapter is a directory with `adapter_config.json` (peft's: `r`, `lora_alpha`, `target_modules`) and
`adapter_model.safetensors` (`...<module>.lora_A.weight` / `lora_B.weight`), plus esqbe's `esqbe-adapter.json`
(the base model's name and fingerprint, how it was trained). The `adapter` setting names one: `none`, a name
shipped in `esqbe/data/adapters/`, or a local directory (never a URL). Its identity, a name and the sha256 of its
files, is part of the model's (see `identity.model_info`)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from .modeldir import FILE_BOUNDS, check_model_dir, read_bounded

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "adapters"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
META_FILE = "esqbe-adapter.json"


class AdapterError(ModelError, ValueError):
    """An adapter that cannot be found, read or applied to this model."""


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: Path
    sha256: str  # over the config and weights files


def shipped_adapters() -> list[str]:
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / CONFIG_FILE).is_file()) if SHIPPED_DIR.is_dir() else []


def resolve_adapter(adapter: str | None) -> AdapterInfo | None:
    """None for no adapter (`None`, "", "none"); else the shipped adapter of that name or a local directory."""
    if adapter is None or str(adapter).strip().lower() in ("", "none"):
        return None
    text = str(adapter)
    if "://" in text:
        raise AdapterError(f"adapter {text!r}: adapters load from a shipped name or a local directory, never a URL")
    is_shipped = "/" not in text and (SHIPPED_DIR / text / CONFIG_FILE).is_file()
    path = SHIPPED_DIR / text if is_shipped else Path(text).expanduser()
    if not path.is_dir():
        raise AdapterError(f"adapter {text!r} is neither a shipped adapter ({', '.join(shipped_adapters()) or 'none'}) "
                           "nor a directory")
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        raise AdapterError(f"{path}: not an adapter directory (missing {', '.join(missing)})")
    check_model_dir(path, "adapter")  # regular files inside it, each under its kind's bound, before any is read
    h = hashlib.sha256()
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        with open(path / f, "rb") as fh:  # streamed: the weights may be large
            h.update(f.encode() + b"\0" + hashlib.file_digest(fh, "sha256").digest())
    name = text if is_shipped else path.resolve().name
    return AdapterInfo(name, path.resolve(), "sha256:" + h.hexdigest())


def combined_fingerprint(model_fingerprint: str | None, adapter: AdapterInfo | None) -> str | None:
    """The model's fingerprint with the adapter's folded in (unchanged without an adapter)."""
    if adapter is None:
        return model_fingerprint
    return "sha256:" + hashlib.sha256(f"{model_fingerprint or ''}|adapter|{adapter.sha256}".encode()).hexdigest()


def merge_adapter(model, adapter: AdapterInfo) -> int:
    """Add each LoRA pair's `scaling * B @ A` to its module's weight in place; returns the modules changed."""
    import torch
    from safetensors.torch import load_file

    try:
        config = json.loads(read_bounded(adapter.path / CONFIG_FILE, FILE_BOUNDS["configuration"]))
        r, alpha = int(config["r"]), float(config["lora_alpha"])
        tensors = load_file(str(adapter.path / WEIGHTS_FILE))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AdapterError(f"{adapter.path}: cannot read the adapter: {e}") from None
    if config.get("use_rslora") or config.get("use_dora"):
        raise AdapterError(f"{adapter.path}: rsLoRA / DoRA adapters are not supported")
    scaling = alpha / r
    modules = dict(model.named_modules())
    changed = 0
    with torch.no_grad():
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                continue
            prefix = key[: -len(".lora_A.weight")]
            b = tensors.get(prefix + ".lora_B.weight")
            name = prefix.removeprefix("base_model.model.")
            module = modules.get(name)
            if b is None or module is None or not hasattr(module, "weight"):
                raise AdapterError(f"{adapter.path}: {name} is not a module of this model (trained for another base?)")
            delta = (b.float() @ a.float()) * scaling
            if delta.shape != module.weight.shape:
                raise AdapterError(f"{adapter.path}: {name} has shape {tuple(module.weight.shape)}, the adapter "
                                   f"{tuple(delta.shape)} (trained for another base model?)")
            module.weight += delta.to(module.weight.dtype)
            changed += 1
    return changed
