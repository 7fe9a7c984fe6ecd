"""What the writer's nprobe calibration (esqbe.backends.embedded.recall) costs on a facet the size of the
largest one at 1M papers (~3M sentence rows): the rows are written in the embedded index's own layout (float16
vectors, paper numbers, facet codes; seeded clustered unit vectors, 384-d), an IVF-SQ8 is built as the writer
builds it (nlist 2048), and `calibrate_nprobe` is timed. The build is CPU-heavy (run it with
--build-only), the timing short (run it alone, with nothing else on the machine, on the kept directory).

    python benchmarks/bench_calibration.py --rows 3000000 --work /tmp/cal --build-only
    python benchmarks/bench_calibration.py --rows 3000000 --work /tmp/cal
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def build(work: Path, rows: int, dim: int, rows_per_paper: int) -> None:
    import faiss

    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(max(1, rows // 1500), dim)).astype(np.float32)
    vec = np.memmap(work / "vectors.f16", mode="w+", dtype=np.float16, shape=(rows, dim))
    for lo in range(0, rows, 500_000):
        hi = min(rows, lo + 500_000)
        x = centres[rng.integers(0, len(centres), hi - lo)] * 0.6 + rng.normal(size=(hi - lo, dim)).astype(np.float32) * 0.04
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        vec[lo:hi] = x
    vec.flush()
    (np.arange(rows, dtype=np.int64) // rows_per_paper).astype(np.int32).tofile(work / "rows.pno")
    np.zeros(rows, dtype=np.int8).tofile(work / "rows.facet")
    nlist = int(np.clip(min(2 * np.sqrt(rows), rows / 39), 1, 2048))
    sample = np.sort(rng.choice(rows, size=min(rows, 40 * nlist), replace=False))
    ivf = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                        faiss.METRIC_INNER_PRODUCT)
    ivf.cp.niter = 10
    ivf.train(np.asarray(vec[sample], dtype=np.float32))
    pno = np.fromfile(work / "rows.pno", dtype=np.int32)
    for lo in range(0, rows, 200_000):
        ivf.add_with_ids(np.asarray(vec[lo:lo + 200_000], dtype=np.float32), pno[lo:lo + 200_000].astype(np.int64))
    faiss.write_index(ivf, str(work / "ivf.faiss"))
    (work / "meta.json").write_text(json.dumps({"rows": rows, "dim": dim, "papers": int(pno[-1]) + 1}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--rows-per-paper", type=int, default=3)
    ap.add_argument("--work", default="/tmp/esqbe-calibration")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--target", type=float, default=0.95)
    args = ap.parse_args()
    work = Path(args.work)
    if not (work / "meta.json").exists():
        t = time.perf_counter()
        build(work, args.rows, args.dim, args.rows_per_paper)
        print(f"built {args.rows} rows + IVF in {time.perf_counter() - t:.0f} s")
    if args.build_only:
        return
    import faiss
    from threadpoolctl import threadpool_limits

    from esqbe.backends.embedded.layout import _State
    from esqbe.backends.embedded.recall import calibrate_nprobe

    meta = json.loads((work / "meta.json").read_text())
    st = _State(1, meta["rows"], meta["dim"], work, np.zeros(0, dtype=np.int64), meta["papers"], {})
    index = faiss.read_index(str(work / "ivf.faiss"))
    with threadpool_limits(None):
        t, c = time.perf_counter(), time.process_time()
        out = calibrate_nprobe(st, 0, index, target=args.target, oversample=4)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"rows": meta["rows"], "nlist": int(index.nlist), **out, "wall_s": round(wall, 1),
                      "cpu_s": round(cpu, 1)}))


if __name__ == "__main__":
    main()
