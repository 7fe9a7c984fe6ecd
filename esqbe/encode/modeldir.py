"""A model directory checked before anything of it is read, and transformers' loads made through that check.

`check_model_dir` looks at every file at the top of the directory (where transformers and esqbe read): each must be
a regular file inside the directory (a link may name another file of it; in a hub cache snapshot, the repository's
`blobs/`), never a device, a named pipe or a link out of it, and hold at most its kind's bound (`FILE_BOUNDS`); its
`config.json` and `tokenizer_config.json` must not ask for the directory's own code (`auto_map`). `pretrained` is
the one call of transformers' `from_pretrained` in esqbe: the check, a `model_type` transformers knows, and
`trust_remote_code=False`, so a directory's Python is never imported and nothing asks on stdin. `read_bounded` reads
a small file of a model (or adapter) directory under a bound, without blocking on a pipe put in its place.
"""
from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path
from typing import ClassVar

from ..errors import ModelError

#: bytes one file of a model directory may hold, by its kind (`file_kind`): what is read whole (the configuration,
#: the tokenizer's files) stays small; weights (memory-mapped or streamed) are large but bounded, as is any other file
FILE_BOUNDS = {"configuration": 4 << 20, "tokenizer": 64 << 20, "weights": 32 << 30}

#: the tokenizer's files that are not configuration however they are named
_TOKENIZER_NAMES = ("tokenizer.json", "vocab.json", "vocab.txt", "merges.txt")
_TOKENIZER_SUFFIXES = (".model", ".tiktoken", ".txt")

#: the configurations that may name code of the directory to run (`auto_map`): the model's and the tokenizer's
_CODE_CONFIGS = ("config.json", "tokenizer_config.json")

#: what `pretrained` loads, by name: transformers' Auto classes
_AUTO = {"config": "AutoConfig", "tokenizer": "AutoTokenizer", "model": "AutoModel"}


class ModelFilesError(ModelError, ValueError):
    """A model (or adapter) directory esqbe will not read: a file that is not a regular file inside it, a file past
    its kind's size bound, or a configuration that asks to run the directory's own code."""

    http_status: ClassVar[int] = 503


def file_kind(name: str) -> str:
    """`configuration`, `tokenizer` or `weights` (weights and any other file): which of `FILE_BOUNDS` holds."""
    if name in _TOKENIZER_NAMES or name.endswith(_TOKENIZER_SUFFIXES):
        return "tokenizer"
    if name.endswith((".json", ".jinja")):
        return "configuration"
    return "weights"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n:,} bytes ({n // size} {unit})"
    return f"{n:,} bytes"


def _root(directory: Path) -> Path:
    """Where the files of `directory` may live: itself, or for a hub cache snapshot (`models--o--n/snapshots/<rev>`,
    whose files are links to `../../blobs/<sha>`), the repository's cache folder."""
    if directory.parent.name == "snapshots" and (directory.parent.parent / "blobs").is_dir():
        return directory.parent.parent
    return directory


def check_model_dir(directory: str | os.PathLike, what: str = "model") -> Path:
    """`directory` resolved, after checking every file at its top (see the module's docstring) and that its
    configurations ask for no code of its own; `ModelFilesError` naming the directory, the file and the bound."""
    path = Path(directory).expanduser()
    try:
        resolved = path.resolve(strict=True)
        entries = sorted(os.scandir(resolved), key=lambda e: e.name)
    except OSError as e:
        raise ModelFilesError(f"{what} directory {path}: cannot be listed ({e.strerror or e})") from None
    root = _root(resolved)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            continue  # not read (transformers reads the top of the directory)
        where = f"{what} directory {path}: {entry.name}"
        target = Path(os.path.realpath(entry.path))
        if entry.is_symlink() and not target.is_relative_to(root):
            raise ModelFilesError(f"{where} is a link to {target}, outside the directory: a model's files are read "
                                  "from the directory itself (copy the file into it)")
        try:
            info = os.stat(target)
        except OSError as e:
            raise ModelFilesError(f"{where} cannot be read ({e.strerror or e})") from None
        if stat.S_ISDIR(info.st_mode):
            continue
        if not stat.S_ISREG(info.st_mode):
            raise ModelFilesError(f"{where} is not a regular file (a device, a named pipe or a socket): "
                                  "a model's files are regular files")
        kind = file_kind(entry.name)
        if info.st_size > FILE_BOUNDS[kind]:
            raise ModelFilesError(f"{where} holds {info.st_size:,} bytes; a {kind} file of a model directory holds at "
                                  f"most {_bytes(FILE_BOUNDS[kind])}")
    for name in _CODE_CONFIGS:
        if (resolved / name).exists():
            config = _json(resolved / name, what, path)
            if "auto_map" in config:
                raise ModelFilesError(f"{what} directory {path}: {name} asks to run the directory's own Python code "
                                      "(auto_map); esqbe loads only models whose code is transformers' own")
    return resolved


def _json(file: Path, what: str, shown: Path) -> dict:
    try:
        value = json.loads(read_bounded(file, FILE_BOUNDS[file_kind(file.name)]))
    except ValueError as e:
        raise ModelFilesError(f"{what} directory {shown}: {file.name} is not a JSON file ({e})") from None
    if not isinstance(value, dict):
        raise ModelFilesError(f"{what} directory {shown}: {file.name} is not a JSON object")
    return value


def read_bounded(file: str | os.PathLike, bound: int) -> bytes:
    """The bytes of `file`, a regular file of at most `bound` bytes; `ModelFilesError` naming it otherwise. Opened
    without blocking (a named pipe put in its place is refused, not waited on) and read no further than the bound."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ModelFilesError(f"{file}: cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelFilesError(f"{file} is not a regular file (a device, a named pipe or a socket)")
        data = f.read(bound + 1)
    if len(data) > bound:
        raise ModelFilesError(f"{file} holds more than {_bytes(bound)}, its bound")
    return data


def pretrained(what: str, source: str, *, offline: bool, **kwargs):
    """transformers' `AutoConfig`/`AutoTokenizer`/`AutoModel` (`what`: config, tokenizer, model) `.from_pretrained`
    of `source` (a directory or a hub name), with `trust_remote_code=False`, after `check_model_dir` of the directory
    it loads from (a hub name: its cached snapshot, which is then what is loaded) and a check that transformers
    knows its `model_type`. A download (a hub name not cached, online) is made under trust_remote_code=False alone."""
    import transformers

    directory = _local_dir(source, offline)
    if directory is not None:
        directory = check_model_dir(directory)
        config = _json(directory / "config.json", "model", Path(source)) if (directory / "config.json").exists() else {}
        _check_model_type(config, source)
        source = str(directory)
    try:
        return getattr(transformers, _AUTO[what]).from_pretrained(source, local_files_only=offline,
                                                                  trust_remote_code=False, **kwargs)
    except ValueError as e:  # it would need code of the directory (or the hub), or a class transformers lacks
        raise ModelFilesError(f"model {source}: transformers cannot load its {what} without running code that is not "
                              f"its own ({' '.join(str(e).split())[:300]})") from None
    except pickle.UnpicklingError as e:  # pickled weights (pytorch_model.bin) that hold more than tensors
        raise ModelFilesError(f"model {source}: its weights are a pickle that holds more than tensors; refused, "
                              f"nothing of it run ({' '.join(str(e).split())[:200]})") from None


def _local_dir(source: str, offline: bool) -> Path | None:
    """The directory `source` loads from: itself, or a hub name's cached snapshot (None: not cached)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001  # not cached (or no hub library): transformers downloads it, when online
        return None


def _check_model_type(config: dict, source: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise ModelFilesError(f"model directory {source}: config.json's model_type {model_type!r} is not one "
                              "transformers knows, so its code would come from the directory; esqbe loads only "
                              "models whose code is transformers' own")
