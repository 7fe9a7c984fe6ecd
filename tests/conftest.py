"""Shared fixtures: the real default model (loaded once) and small real indexes written by the tests."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A suite started in the background by a script (`pytest ... &`) inherits SIGINT ignored, and every process it starts
# would too (an ignored signal survives exec): the interrupt tests' Ctrl-C would never reach `esqbe`. A handler is
# reset to the default across exec, so the processes the tests start hear SIGINT as a user's terminal sends it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """Under pytest-xdist (`-n 2`), each worker's PyTorch gets its share of the cores: two workers of two threads
    each on two cores spent their time waiting for a core (the torch-heavy modules, test_tagger*.py,
    test_encoder_backends.py and test_query.py, took 52 s and 101 CPU-seconds that way, 35 s and 66 with one thread
    a worker). The processes the tests start keep the machine's default."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if os.environ.get("PYTEST_XDIST_WORKER") and workers:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(workers)))
SAMPLE = REPO / "samples" / "csabstruct-sample.jsonl"
SHARED = Path(os.environ.get("ESQBE_SHARED", REPO.parent / "shared"))


def shared_path(*parts) -> Path:
    """A file under ../shared (the evaluation data, docs/quality.md), or skip with the reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (the evaluation data: docs/quality.md, 'The data')")
    return p


@dataclass
class Ran:
    """What a command printed and its exit status, as `subprocess.run(..., capture_output=True, text=True)` gives."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def esqbe_cli(*args, env: dict | None = None, cwd: str | Path | None = None, input: str | None = None) -> Ran:
    """`esqbe ARGS` run in this process by click's runner: the real command (esqbe.cli.main), its options, output
    and exit status, without starting Python and loading torch and the model again (the model comes from the
    process's shared loader, esqbe.encode.loader). For what a test asks of a command; what is about the process
    itself (signals, kills, pipes, the installed binary's exit statuses, what a fresh interpreter imports) is tested
    with real processes. `env`: variables set for the run, None unsets one; `cwd`: the directory it runs in."""
    from click.testing import CliRunner

    from esqbe.cli.main import main

    argv = [str(a) for a in args]
    with contextlib.chdir(cwd or os.getcwd()):
        r = CliRunner().invoke(main, argv, env=env, input=input, catch_exceptions=False)
    return Ran(argv, r.exit_code, r.stdout, r.stderr)


def model_copy(dest: Path) -> Path:
    """`dest`, a directory holding the default model's files (hard links where the file system allows, else
    copies): a model directory of its own, since one whose files are links out of it is refused."""
    from esqbe.encode.identity import resolve_model

    dest.mkdir(parents=True, exist_ok=True)
    for f in Path(resolve_model(None)[0]).iterdir():
        if f.is_file():
            try:
                (dest / f.name).hardlink_to(f)
            except OSError:
                shutil.copyfile(f, dest / f.name)
    return dest


@pytest.fixture(scope="session")
def encoder():
    from esqbe.encode.encoder import Encoder

    return Encoder.load(batch_size=16)


#: how many CSFCube dev abstracts `csfcube_encoded` holds: the most any test's index takes (tests/test_ann_pq.py)
CSFCUBE_ENCODED = 700


def once_per_run(tmp_path_factory, name: str, make) -> Path:
    """`make(directory)` -> a path, run once for the whole test run. Alone, in a new temporary directory; under
    pytest-xdist (`-n 2`) by the first worker that asks, in the run's shared temporary directory, while the others
    wait on a file lock and then use the path it returned. For what is slow to make and only read afterwards."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    directory = tmp_path_factory.getbasetemp().parent / name  # the run's, shared by its workers
    made = directory.with_name(name + ".made")
    with FileLock(str(directory) + ".lock"):
        if not made.exists():
            directory.mkdir(exist_ok=True)  # a worker whose make failed left it: the next one tries again
            made.write_text(str(make(directory)))
    return Path(made.read_text())


@pytest.fixture(scope="session")
def csfcube_encoded(tmp_path_factory) -> Path:
    """The first CSFCUBE_ENCODED CSFCube dev abstracts (the collection's labels), encoded once by the real default
    model into `esqbe encode`'s Parquet: every CSFCube index the tests build is written from it without encoding
    again (tests/test_recall.py `csfcube_index`), and under `-n 2` both workers read the one encoding. In the runtime
    a new index gets by default on CPU (onnx-int8, as `esqbe index` and `esqbe encode` choose it): twice as fast
    here as the exact torch path of `encoder`."""
    src = shared_path("data", "csfcube-dev", "abstracts-csfcube-preds.jsonl")

    def make(base: Path) -> Path:
        import esqbe
        from esqbe.encode.encoder import Encoder

        encoder = Encoder.load(batch_size=16, backend="auto", device="cpu")
        papers = base / "papers.jsonl"
        with open(src) as f:
            papers.write_text("".join(line for _, line in zip(range(CSFCUBE_ENCODED), f)))
        with esqbe.open_index(str(base / "unused"), encoder=encoder, config=None) as index:
            report = index.encode_files([str(papers)], str(base / "encoded"))
        assert report.encoded == CSFCUBE_ENCODED, report
        return Path(report.path)

    return once_per_run(tmp_path_factory, "csfcube-encoded", make)


@pytest.fixture(scope="session")
def sample_lines() -> list[str]:
    return SAMPLE.read_text().splitlines()


@pytest.fixture
def write_jsonl(tmp_path):
    """Write records (dicts or raw strings) as a JSONL file and return its path."""

    def write(name: str, records) -> Path:
        path = tmp_path / name
        with open(path, "w") as f:
            for r in records:
                f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
        return path

    return write


@pytest.fixture(scope="session")
def small_index(tmp_path_factory, encoder, sample_lines):
    """A real embedded index of 40 sample abstracts (given labels), shared read-only by query tests."""
    import esqbe

    path = tmp_path_factory.mktemp("small-index") / "index"
    src = path.parent / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:40]) + "\n")
    index = esqbe.open_index(str(path), encoder=encoder, config=None)
    report = index.index_files([str(src)])
    assert report.indexed == 40
    yield index
    index.close()


@pytest.fixture(scope="session")
def index_dir_30(tmp_path_factory, encoder, sample_lines):
    """A real embedded index directory of the first 30 sample abstracts (given labels), closed after
    building. Tests that write copy it first (`shutil.copytree`)."""
    import esqbe

    path = tmp_path_factory.mktemp("index-30") / "index"
    src = path.parent / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:30]) + "\n")
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 30
    return path


@pytest.fixture(scope="module")
def index_copy(index_dir_30, tmp_path_factory) -> Path:
    """A copy of `index_dir_30` of the test module's own, to write to or serve."""
    path = tmp_path_factory.mktemp("index-copy") / "index"
    shutil.copytree(index_dir_30, path)
    return path


@pytest.fixture(scope="module")
def page_server(index_copy, encoder):
    """A real server on 127.0.0.1 over the module's `index_copy`, for the page in a real browser: its URL."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    with LiveServer(create_app(str(index_copy), config=None, encoder=encoder,
                               options=ServeOptions(host="127.0.0.1"))) as url:
        yield url


class LiveServer:
    """A real uvicorn server on a free loopback port, in a thread of this process (`with LiveServer(app) as url:`)."""

    def __init__(self, app):
        import socket

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        import threading
        import time

        import httpx

        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 180
        while True:  # until the index is open and warm
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.1)

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


# --- the page in a real headless browser (tests/test_page*.py) ----------------------------------------------
def _browser():
    """Debian's chromium + chromedriver driven by selenium; the test is skipped (with how to install them) where
    they are missing."""
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no chromium and chromedriver on this machine (scripts/install-test-browser installs "
                    "Debian's `chromium` and `chromium-driver` when run as root)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1440,1100",
                "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


@pytest.fixture
def browser():
    b = _browser()
    yield b
    b.quit()


# --- hostile text in an index (items 4 to 6: exports, ids, the terminal) -----------------------------
#: what a terminal would obey: the window title (OSC 0), a screen clear (CSI), a disguised link (OSC 8), their
#: 8-bit C1 forms, BEL, DEL, backspaces
TERMINAL_PAYLOADS = ("\x1b]0;pwned-title\x07", "\x1b[2J\x1b[3J\x1bc",
                     "\x1b]8;;http://evil.example/\x1b\\docs.python.org\x1b]8;;\x1b\\", "\x9b2J\x9d0;c1-title\x9c",
                     "\x07\x7f\x08\x08")
#: what a spreadsheet would run (OWASP's CSV injection starts), and a text year that forges RIS records
FORMULA_PAYLOADS = ('=HYPERLINK("http://evil.example","x")', "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
                    "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", " =1+1")
RIS_FORGING_YEAR = "2019\r\nER  - \r\n\r\nTY  - JOUR\r\nUR  - http://evil.example\r\nER  - \r\n\r\nTY  - JOUR"


def hostile_records(sample_lines: list[str], n: int = 10) -> list[dict]:
    """`n` sample abstracts (ids `paper-0`..), every one after the first with hostile text in each place a person
    reads: title, a sentence, venue, authors, a metadata key and value, a text year; the first is the clean query."""
    out = []
    for i, line in enumerate(sample_lines[:n]):
        rec = json.loads(line)
        rec = {"id": f"paper-{i}", "abstract": rec["sentences"], "facets": rec["labels"]}
        if i == 0:
            out.append({**rec, "title": "The clean query paper", "metadata": {"year": 2020}})
            continue
        t, f = TERMINAL_PAYLOADS[i % len(TERMINAL_PAYLOADS)], FORMULA_PAYLOADS[i % len(FORMULA_PAYLOADS)]
        rec["title"] = f + " study " + t + " of things"
        rec["abstract"] = [rec["abstract"][0] + " " + t + "done", *rec["abstract"][1:]]
        rec["metadata"] = {"year": RIS_FORGING_YEAR if i % 2 else 2000 + i, "venue": f + t,
                           "authors": [f, "Ada " + t + "Lovelace"], "key" + t: "value " + t,
                           "external_ids": {"doi": "10.1/" + t}}
        out.append(rec)
    return out


@pytest.fixture(scope="session")
def hostile_index_dir(tmp_path_factory, encoder, sample_lines):
    """A real embedded index directory of `hostile_records` (10 papers, given labels), closed after building;
    shared read-only by the export and terminal tests."""
    import esqbe

    path = tmp_path_factory.mktemp("hostile-text") / "index"
    src = path.parent / "papers.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in hostile_records(sample_lines)))
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 10
    return path


@pytest.fixture(scope="session")
def hostile_server(hostile_index_dir, encoder):
    """A real server on 127.0.0.1 over `hostile_index_dir` (read-only use), shared by the export, page and
    `--server` terminal tests."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    with LiveServer(create_app(str(hostile_index_dir), config=None, options=ServeOptions(host="127.0.0.1"),
                               encoder=encoder)) as url:
        yield url
