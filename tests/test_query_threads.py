"""`limit_for_query` (what `esqbe serve` runs once at start) limits every BLAS the query path uses: numpy's and
faiss's own OpenBLAS (faiss's computes each ANN search's look-up tables), even when neither is loaded yet."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
assert "numpy" not in sys.modules and "faiss" not in sys.modules  # as at the start of `esqbe serve`
from esqbe.core.threads import limit_for_query
limit_for_query()
import faiss, numpy
from threadpoolctl import threadpool_info
print(json.dumps([(i["user_api"], i["filepath"], i["num_threads"]) for i in threadpool_info()]))
"""


def test_limit_for_query_limits_numpy_and_faiss_blas():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["OPENBLAS_NUM_THREADS"] = "2"  # the host's count, as on a 2-core machine, so that 1 is a change
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120, check=True).stdout
    blas = [(path, n) for api, path, n in json.loads(out) if api == "blas"]
    assert any("faiss" in path for path, _ in blas), blas  # faiss's own OpenBLAS is among those found
    assert any("numpy" in path for path, _ in blas), blas
    assert all(n == 1 for _, n in blas), blas
