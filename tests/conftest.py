"""Shared fixtures: the real default model (loaded once) and small real indexes written by the tests."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "samples" / "csabstruct-sample.jsonl"
SHARED = Path(os.environ.get("ESQBE_SHARED", REPO.parent / "shared"))


def shared_path(*parts) -> Path:
    """A file under ../shared (the team's data), or skip with the reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (shared data is only on the team's machines)")
    return p


@pytest.fixture(scope="session")
def encoder():
    from esqbe.encode.encoder import Encoder

    return Encoder.load(batch_size=16)


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
