"""The library leaves the host process's state alone: loading a model and exporting it to ONNX keep the host's
`logging.disable` level, the `transformers` logger's level and handlers and the environment; importing the library
writes no environment variable; a query runs on the calling thread's own BLAS and OpenMP limits."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest

from .conftest import REPO


def test_importing_the_library_writes_no_environment_variable():
    code = ("import os; before = dict(os.environ); "
            "import esqbe, esqbe.encode.encoder, esqbe.encode.loader, esqbe.tagger.runtime, esqbe.index.api, "
            "esqbe.query.search; assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())")
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_encoder_load_and_onnx_export_leave_logging_and_environment_alone(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from transformers.utils import logging as hf_logging

    from esqbe.encode.encoder import Encoder

    hf_logging.get_logger("transformers")  # transformers installs its own default handler once, on first use
    hf = logging.getLogger("transformers")
    handler = logging.StreamHandler(open(os.devnull, "w"))
    old_level, old_handlers = hf.level, list(hf.handlers)
    hf.addHandler(handler)
    hf.setLevel(logging.INFO)
    previous_disable = logging.root.manager.disable
    logging.disable(logging.DEBUG)  # the host's own choice
    try:
        env = dict(os.environ)
        handlers = list(hf.handlers)
        filters = {name: list(lg.filters) for name, lg in logging.root.manager.loggerDict.items()
                   if isinstance(lg, logging.Logger)}
        # a fresh cache directory: the model really is exported, fused (no cached graph is reused)
        enc = Encoder.load(backend="onnx", device="cpu", batch_size=4, cache_dir=str(tmp_path / "cache"))
        assert list((tmp_path / "cache" / "onnx").rglob("model-fused.onnx"))
        assert enc.encode_texts(["A sentence."]).shape == (1, enc.dim)
        assert logging.root.manager.disable == logging.DEBUG
        assert hf.level == logging.INFO and list(hf.handlers) == handlers
        # torch's exporter records its own inductor cache directory (TORCHINDUCTOR_CACHE_DIR) the first time it
        # needs one: torch's doing, not esqbe's; every other variable is as it was
        assert {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")} == \
            {k: v for k, v in env.items() if not k.startswith("TORCHINDUCTOR_")}
        assert all(list(lg.filters) == filters[name] for name, lg in logging.root.manager.loggerDict.items()
                   if isinstance(lg, logging.Logger) and name in filters)  # the export's filters came off
    finally:
        logging.disable(previous_disable)
        hf.removeHandler(handler)
        handler.stream.close()
        hf.setLevel(old_level)
        assert list(hf.handlers) == old_handlers


def test_a_query_runs_on_the_host_threads_own_limits(small_index, monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    faiss = pytest.importorskip("faiss")
    from esqbe.index import api

    seen: dict = {}
    real = api.run_examples

    def watching(*args, **kwargs):  # the query's maths runs inside this call
        seen["blas"] = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "run_examples", watching)
    result: dict = {}

    def host():
        with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
            faiss.omp_set_num_threads(2)
            before = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
            small_index.query(small_index.backend.paper_ids()[0], k=3)
            result["before"] = before
            result["after"] = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
            result["omp"] = faiss.omp_get_max_threads()

    thread = threading.Thread(target=host)
    thread.start()
    thread.join()
    if not result.get("before"):
        pytest.skip("no BLAS library that threadpoolctl can see")
    assert seen["blas"] == result["before"] == result["after"]  # not limited during the query, nor after
    assert result["omp"] == 2
