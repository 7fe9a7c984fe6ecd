"""A model directory is a stranger's files: esqbe never runs its code (not on a "y" at a prompt, not without a
terminal), never reads a file of it that is not a regular file inside it or that is past its kind's bound, and says
which directory, which file and which bound. Every command that loads a model is tried (index, query, serve, tag,
adapt's teacher and student, the model an index reloads from where it was built). Every child process here has a
wall clock, and the hostile files' own children a memory bound, so that a regression fails instead of hanging."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import esqbe
from esqbe.encode.encoder import Encoder
from esqbe.encode.identity import model_info, resolve_model
from esqbe.encode.modeldir import FILE_BOUNDS, ModelFilesError, check_model_dir

from .conftest import SAMPLE

REPO = Path(__file__).resolve().parent.parent
MODEL = Path(resolve_model(None)[0])  # the default model's directory (the installed package's)
#: the files a model needs up to its weights: enough for every check and for the prompt transformers would show
LIGHT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")

#: what the directory's code does when it is imported: leaves a file beside the directory
EVIL_CODE = """
import pathlib
pathlib.Path(__file__).resolve().parent.with_name(pathlib.Path(__file__).resolve().parent.name + "-ran").write_text("x")
from transformers import BertConfig, BertModel
class EvilConfig(BertConfig):
    model_type = "evilbert"
class EvilModel(BertModel):
    config_class = EvilConfig
"""


def light_copy(dest: Path, weights: bool = False) -> Path:
    """A copy of the default model's files (its weights too when asked) in `dest`."""
    dest.mkdir(parents=True)
    for name in LIGHT_FILES + (("model.safetensors",) if weights else ()):
        shutil.copyfile(MODEL / name, dest / name)
    return dest


def make_evil(directory: Path, auto_map: bool = True) -> Path:
    """`directory` asking for its own code: a config whose model_type transformers does not know (with an
    `auto_map` naming its module, or without); the marker its code would leave is returned."""
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "evilbert"
    if auto_map:
        config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "evil.py").write_text(EVIL_CODE)
    return directory.with_name(directory.name + "-ran")


def esqbe_cli(*args: str, stdin: str | None = "y\n" * 50, timeout: float = 240) -> subprocess.CompletedProcess:
    """`esqbe ARGS` with `stdin` typed in (None: no stdin at all)."""
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def assert_refused(r: subprocess.CompletedProcess, directory: Path, marker: Path, why: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert str(directory) in r.stderr and why in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "[y/N]" not in r.stderr + r.stdout
    assert not marker.exists(), "the directory's code ran"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def papers(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("papers") / "papers.jsonl"
    path.write_text("\n".join(SAMPLE.read_text().splitlines()[:2]) + "\n")
    return path


@pytest.mark.parametrize("command", ["index", "index-no-stdin", "query", "serve", "tag", "adapt-teacher",
                                     "adapt-student"])
def test_no_command_runs_a_model_directorys_code(command, tmp_path, papers, index_dir_30):
    """`yes | esqbe index --model DIR` once imported DIR's Python (transformers asks on stdin; without one it was
    exit 70); each command that takes a model refuses the directory, naming it, and nothing of it runs."""
    evil = light_copy(tmp_path / "evil")
    marker = make_evil(evil, auto_map=command != "tag")  # tag: the unknown model_type alone
    args = {"index": ["index", "--path", str(tmp_path / "ix"), "--model", str(evil), str(papers)],
            "query": ["query", "--path", str(index_dir_30), "--model", str(evil), "--text", "A method for parsing."],
            "serve": ["serve", "--path", str(index_dir_30), "--model", str(evil), "--port", str(free_port())],
            "tag": ["tag", "--model", str(evil), str(papers)],
            "adapt-teacher": ["adapt", "--teacher", str(evil), "--out", str(tmp_path / "out"), str(papers)],
            "adapt-student": ["adapt", "--student", str(evil), "--out", str(tmp_path / "out"), str(papers)]}
    r = esqbe_cli(*args[command.removesuffix("-no-stdin")], stdin=None if command.endswith("no-stdin") else "y\n" * 50)
    assert_refused(r, evil, marker, "own Python code" if command != "tag" else "model_type 'evilbert'")


def test_the_model_an_index_reloads_is_checked_as_one_given(tmp_path, papers):
    """An index records where its model was loaded from, and later commands load it from there: a directory turned
    hostile since is refused as one named on the command line is."""
    model = light_copy(tmp_path / "model", weights=True)
    with esqbe.open_index(str(tmp_path / "ix"), config=None, encoder=Encoder(str(model), backend="torch")) as index:
        assert index.index_files([str(papers)]).indexed == 2
    assert esqbe.open_index(str(tmp_path / "ix"), config=None).stats()["model_source"] == str(model)
    marker = make_evil(model)
    r = esqbe_cli("query", "--path", str(tmp_path / "ix"), "--text", "A method for parsing.")
    assert_refused(r, model, marker, "own Python code")


def test_the_loader_itself_passes_no_code_and_never_asks(tmp_path):
    """Below the directory check, the one call of transformers' from_pretrained: a config whose auto_map is read
    by transformers only (the check passed: model_type is transformers' own) still runs nothing and asks nothing."""
    from esqbe.encode.modeldir import pretrained

    directory = light_copy(tmp_path / "tok")
    marker = make_evil(directory, auto_map=False)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        **json.loads((directory / "tokenizer_config.json").read_text()), "auto_map": {"AutoTokenizer": ["evil.T", None]}}))
    with pytest.raises(ModelFilesError, match="tokenizer_config.json asks to run the directory's own Python code"):
        pretrained("tokenizer", str(directory), offline=True)
    assert not marker.exists()


def test_pickled_weights_are_not_unpickled(tmp_path):
    """Held: a model whose weights are a pickle that runs code (pytorch_model.bin) is refused by the loader,
    nothing of it run."""
    directory = light_copy(tmp_path / "pickled")
    marker = tmp_path / "unpickled"

    class Touch:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (directory / "pytorch_model.bin").write_bytes(pickle.dumps({"w": Touch()}))
    with pytest.raises(ModelFilesError, match="a pickle that holds more than tensors"):
        Encoder(str(directory), backend="torch").model  # noqa: B018  # the weights (loaded on first use at the latest)
    assert not marker.exists()


def _load_in_child(*directories: Path) -> list[str]:
    """Each of `directories` loaded as `esqbe index --model DIR` loads it, in one child with a wall clock and 4 GB
    of address space (a regression, a pipe waited on or /dev/zero read whole, fails the test instead of hanging it
    or filling the memory): what each load said."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "from esqbe.errors import EsqbeError\n"
            "from esqbe.encode.encoder import Encoder\n"
            "for directory in sys.argv[1:]:\n"
            "    try:\n        Encoder(directory)\n        print('loaded', flush=True)\n"
            "    except EsqbeError as e:\n        print('refused:', ' '.join(str(e).split()), flush=True)\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, *map(str, directories)], cwd=REPO, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"loading did not end within 120 s (a file waited on?); said: {e.stdout!r}")
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def test_a_model_directorys_files_are_checked_before_any_is_read(tmp_path):
    """config.json a link to /dev/zero (read whole, it grew past 3 GB in seconds), tokenizer.json a named pipe
    (waited on forever), a config.json past the configuration bound: each refused before it is read, the message
    naming the directory, the file and (for sizes) the bound."""
    dev_zero, fifo, oversized = (light_copy(tmp_path / name) for name in ("dev-zero", "fifo", "oversized"))
    (dev_zero / "config.json").unlink()
    (dev_zero / "config.json").symlink_to("/dev/zero")
    (fifo / "tokenizer.json").unlink()
    os.mkfifo(fifo / "tokenizer.json")
    with open(oversized / "config.json", "r+b") as f:  # valid JSON, padded past the bound with spaces
        f.seek(0, 2)
        f.write(b" " * (FILE_BOUNDS["configuration"] + 1 - f.tell()))
    said = _load_in_child(dev_zero, fifo, oversized)
    expected = [(dev_zero, "config.json", "is a link to /dev/zero, outside the directory"),
                (fifo, "tokenizer.json", "is not a regular file"),
                (oversized, "config.json", f"at most {FILE_BOUNDS['configuration']:,} bytes (4 MiB)")]
    assert len(said) == len(expected), said
    for line, (directory, named, why) in zip(said, expected):
        assert line.startswith(f"refused: model directory {directory}: {named} ") and why in line, line


def test_links_inside_a_model_directory_and_a_hub_snapshot_are_followed(tmp_path):
    """A link to another file of the directory is read; so is a hub cache snapshot, whose files are links to the
    repository's blobs; a link out of either is refused."""
    directory = light_copy(tmp_path / "model")
    (directory / "vocab.txt").rename(directory / "vocab-real.txt")
    (directory / "vocab.txt").symlink_to("vocab-real.txt")
    assert check_model_dir(directory) == directory.resolve()

    repo = tmp_path / "hub" / "models--someone--model"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in LIGHT_FILES:
        shutil.copyfile(MODEL / name, repo / "blobs" / name)
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / name)
    assert check_model_dir(snapshot) == snapshot.resolve()
    (snapshot / "notes.txt").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere.txt").write_text("x")
    with pytest.raises(ModelFilesError, match="notes.txt is a link to .* outside the directory"):
        check_model_dir(snapshot)
    with pytest.raises(ModelFilesError):
        model_info(str(snapshot))


def test_transformers_loads_only_through_the_checked_loader():
    """No module of esqbe calls transformers' from_pretrained (or names an Auto class) but the checked loader, so a
    load added later cannot skip the directory's check or trust_remote_code=False."""
    package = REPO / "esqbe"
    found = [f"{path.relative_to(REPO)}:{n}" for path in package.rglob("*.py") if path.name != "modeldir.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if any(word in line for word in ("from_pretrained", "AutoModel", "AutoTokenizer", "AutoConfig",
                                               "trust_remote_code", "SentenceTransformer("))]
    assert not found, found
