"""The int8 encoder on the kernels of other CPU classes, on one machine: vectors and speed of ONNX Runtime's
int8 variants as this CPU runs them, as it runs them with AMX hidden (AVX-512 VNNI), and as it runs them with
AVX-512, every VNNI and AMX hidden (the kernels of an AVX2-only CPU, e.g. an AMD EPYC before Zen 4).

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_int8_isa.py [--papers 60] [--rounds 2]
        [--views native,vnni,avx2] [--profile-rows 40] [--rows-only] [--work DIR] [--json]

The views: `native` (this CPU as it is), `vnni` (AMX hidden), `avx2` (AVX-512, VNNI and AMX hidden), each a
subprocess of this script under benchmarks/avx2_view.c (an LD_PRELOAD shim, built here with gcc, that uses Linux's
CPUID faulting to show the process fewer CPU features: ONNX Runtime's MLAS then dispatches to the kernels that CPU
class would run). The variants of the int8 model (the default model's cached fused fp32 export, quantised here):

- `u8s8-pc` — the shipped one: dynamic quantisation, uint8 activations x int8 weights per output channel (QOperator)
- `u8s8-pc-7bit` — the same with `reduce_range` (7-bit weights: no 16-bit overflow in AVX2's pair sums)
- `u8s8-pc+x64prec` — the shipped file with ONNX Runtime's `session.x64quantprecision = 1` (U8U8 kernels on
  AVX2 / AVX-512 without VNNI; no effect with VNNI)
- `u8u8-pc` — uint8 weights per channel (U8U8 kernels: 16-bit products widened before they are summed)
- `u8s8-pt` — per-tensor weight scales (ONNX Runtime's default; earlier measured ~0.94 cosine to fp32)
- `onnx-fp32` — the fused fp32 export itself (the `onnx` runtime), one row per call like the others here

For each view and variant: the cosine of its sentence vectors to the exact fp32 PyTorch vectors of the same papers
(mean, min, 1st percentile; deterministic: the load on the machine does not change it), and the encoder's papers/s
(`Encoder.contextual_sentence_vectors`, rows side by side as indexing runs them; median of --rounds interleaved
rounds: a timing, so run it on a quiet machine for figures). `--profile-rows N`: ONNX Runtime's own profile of
the shipped variant over N rows, the time per operator type (where an int8 pass goes, by kernel). First on each
view: the CPU-ms of one one-thread run on one 256-token row, shipped int8 and fp32 (`--rows-only`: just that)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = ("u8s8-pc", "u8s8-pc-7bit", "u8s8-pc+x64prec", "u8u8-pc", "u8s8-pt", "onnx-fp32")
VIEWS = {"native": None, "vnni": "amx", "avx2": "all"}


def build_shim(work: Path) -> Path:
    so = work / "avx2_view.so"
    if not so.exists():
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so), str(ROOT / "benchmarks" / "avx2_view.c")],
                       check=True)
    return so


def build_variants(work: Path) -> dict[str, Path]:
    """The int8 files, quantised from the encoder's own fused fp32 export (made once, cached by esqbe)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from esqbe.encode.encoder import Encoder
    from esqbe.encode.onnx import _quiet

    shipped = Path(Encoder.load(backend="onnx-int8", device="cpu")._runner.path)
    fused = shipped.parent / "model-fused.onnx"
    files = {"u8s8-pc": shipped, "u8s8-pc+x64prec": shipped, "onnx-fp32": fused}
    for name, kw in (("u8s8-pc-7bit", {"weight_type": QuantType.QInt8, "per_channel": True, "reduce_range": True}),
                     ("u8u8-pc", {"weight_type": QuantType.QUInt8, "per_channel": True}),
                     ("u8s8-pt", {"weight_type": QuantType.QInt8, "per_channel": False})):
        out = work / f"{name}.onnx"
        if not out.exists():
            with _quiet():
                quantize_dynamic(str(fused), str(out), op_types_to_quantize=["MatMul", "Attention"],
                                 extra_options={"DefaultTensorType": 1}, **kw)
        files[name] = out
    return files


class _Ort:
    """onnxruntime with extra session config entries in every SessionOptions it makes."""

    def __init__(self, ort, extra: dict[str, str]):
        self._ort, self._extra = ort, extra

    def __getattr__(self, name):
        return getattr(self._ort, name)

    def SessionOptions(self):  # noqa: N802  # onnxruntime's name
        opts = self._ort.SessionOptions()
        for k, v in self._extra.items():
            opts.add_session_config_entry(k, v)
        return opts


def measure(files: dict[str, str], papers_n: int, rounds: int, profile_rows: int, work: Path,
            rows_only: bool = False) -> dict:
    """In this process (whatever CPU view it was started with): cosines and rates of every variant."""
    import numpy as np
    import torch

    from esqbe.encode.encoder import Encoder
    from esqbe.ingest.readers import read_papers

    out: dict = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                 "row_cost": {n: row_cost(files[n]) for n in ("u8s8-pc", "onnx-fp32") if n in files}}
    if rows_only:
        return out
    papers = list(read_papers(str(ROOT / "samples" / "csabstruct-sample.jsonl")))[:papers_n]
    ref = np.concatenate(Encoder.load(backend="torch", device="cpu").contextual_sentence_vectors(papers))
    encoders = {}
    for name, path in files.items():
        enc = Encoder.load(backend="onnx-int8", device="cpu")
        runner = enc._runner
        runner.path, runner._sessions = Path(path), {}
        if name.endswith("+x64prec"):
            runner._ort = _Ort(runner._ort, {"session.x64quantprecision": "1"})
        encoders[name] = enc
    out["variants"] = {}
    rates: dict[str, list[float]] = {n: [] for n in files}
    cpu: dict[str, list[float]] = {n: [] for n in files}  # CPU-ms per paper, all threads: steadier than wall under load
    vectors = {}
    for name, enc in encoders.items():  # warm-up, and the vectors (the same every round: deterministic)
        vectors[name] = np.concatenate(enc.contextual_sentence_vectors(papers))
    for _ in range(rounds):
        for name, enc in encoders.items():
            t0, c0 = time.perf_counter(), time.process_time()
            enc.contextual_sentence_vectors(papers)
            rates[name].append(len(papers) / (time.perf_counter() - t0))
            cpu[name].append((time.process_time() - c0) * 1000 / len(papers))
    for name in files:
        cos = (vectors[name] * ref).sum(1)
        out["variants"][name] = {"cos_mean": round(float(cos.mean()), 5), "cos_min": round(float(cos.min()), 5),
                                 "cos_p1": round(float(np.percentile(cos, 1)), 5),
                                 "papers_per_s": round(statistics.median(rates[name]), 2),
                                 "cpu_ms_per_paper": round(statistics.median(cpu[name]), 1),
                                 "rounds": [round(r, 2) for r in rates[name]]}
    out["sentences"] = int(len(ref))
    out["vectors"] = {}
    for name in files:
        path = work / f"vectors-{os.getpid()}-{name}.npy"
        np.save(path, vectors[name])
        out["vectors"][name] = str(path)
    if profile_rows:
        out["profile"] = profile(files["u8s8-pc"], papers[:profile_rows], encoders["u8s8-pc"])
        if "onnx-fp32" in files:
            out["profile_fp32"] = profile(files["onnx-fp32"], papers[:profile_rows], encoders["onnx-fp32"])
    return out


def row_cost(path, tokens: int = 256, runs: int = 10, repeats: int = 5) -> dict:
    """CPU-ms of one one-thread run of the model on one row of `tokens` tokens (seeded ids): the kernels' own cost,
    without tokenising or pooling; CPU time, so other processes on the machine move it less than wall time."""
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    ids = np.random.default_rng(0).integers(1000, 20000, (1, tokens))
    feed = {n: (ids if n == "input_ids" else np.zeros((1, tokens)) if n == "token_type_ids" else np.ones((1, tokens)))
            .astype(np.int64) for n in names}
    out = [sess.get_outputs()[-1].name]
    for _ in range(3):
        sess.run(out, feed)
    per = []
    for _ in range(repeats):
        c = time.process_time()
        for _ in range(runs):
            sess.run(out, feed)
        per.append((time.process_time() - c) * 1000 / runs)
    return {"tokens": tokens, "cpu_ms_min": round(min(per), 2), "cpu_ms_median": round(statistics.median(per), 2)}


def profile(path, papers, enc) -> dict:
    """ONNX Runtime's profile of one-thread runs over the papers' rows: milliseconds per operator type."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"esqbe-isa-prof-{os.getpid()}")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    import numpy as np

    for p in papers:
        enc_in = enc.tokenizer(p.title or "", " ".join(p.sentences), truncation="only_second", max_length=enc.max_length,
                               return_tensors="np")
        feed = {k: enc_in[k].astype(np.int64) for k in names if k in enc_in}
        if "token_type_ids" in names and "token_type_ids" not in feed:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        sess.run([sess.get_outputs()[-1].name], feed)
    trace = Path(sess.end_profiling())
    per_op: dict[str, float] = {}
    for ev in json.loads(trace.read_text()):
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            op = ev.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + ev["dur"] / 1000
    trace.unlink(missing_ok=True)
    total = sum(per_op.values())
    return {"rows": len(papers), "total_ms": round(total, 1),
            "per_op_ms": {k: round(v, 1) for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])},
            "per_op_share": {k: round(v / total, 3) for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--papers", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--views", default="native,vnni,avx2")
    ap.add_argument("--profile-rows", type=int, default=40)
    ap.add_argument("--work", help="where the variants and the shim go (default: a temporary directory)")
    ap.add_argument("--rows-only", action="store_true",
                    help="only the kernels' CPU-ms per 256-token row (shipped int8 and fp32) on each view: ~1 minute")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: measure in this process, files as JSON
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["files"], args.papers, args.rounds, args.profile_rows, Path(spec["work"]),
                                 spec.get("rows_only", False))))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="esqbe-isa-"))
    work.mkdir(parents=True, exist_ok=True)
    shim = build_shim(work)
    files = {k: str(v) for k, v in build_variants(work).items()}
    results = {}
    for view in args.views.split(","):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        if VIEWS[view] is not None:
            env.update(LD_PRELOAD=str(shim), AVX2_VIEW_REQUIRED="1")
            if VIEWS[view] == "amx":
                env["AVX2_VIEW_HIDE"] = "amx"
        done = subprocess.run([sys.executable, __file__, "--papers", str(args.papers), "--rounds", str(args.rounds),
                               "--profile-rows", str(args.profile_rows),
                               "--child", json.dumps({"files": files, "work": str(work), "rows_only": args.rows_only})],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"view {view} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        results[view] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"view {view} done (torch sees {results[view]['torch_cpu_capability']})", file=sys.stderr)
    import numpy as np

    native = results.get("native")
    for view, r in results.items():  # each variant's vectors on this view against the same variant's native ones
        if args.rows_only:
            break
        if native is not None and view != "native":
            for name, v in r["variants"].items():
                a, b = np.load(native["vectors"][name]), np.load(r["vectors"][name])
                c = (a * b).sum(1)
                v["vs_native"] = {"cos_mean": round(float(c.mean()), 6), "cos_min": round(float(c.min()), 6),
                                  "identical": bool(np.array_equal(a, b))}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print("| view | torch sees | int8 (shipped) CPU-ms per 256-token row, min / median | fp32 CPU-ms per row |\n|---|---|---|---|")
    for view, r in results.items():
        rc = r["row_cost"]
        print(f"| {view} | {r['torch_cpu_capability']} | {rc['u8s8-pc']['cpu_ms_min']:.1f} / "
              f"{rc['u8s8-pc']['cpu_ms_median']:.1f} | {rc['onnx-fp32']['cpu_ms_min']:.1f} / "
              f"{rc['onnx-fp32']['cpu_ms_median']:.1f} |")
    if args.rows_only:
        return
    for view, r in results.items():
        print(f"\n## view {view} (torch: {r['torch_cpu_capability']}); {args.papers} CSAbstruct abstracts, "
              f"{r['sentences']} sentences; papers/s median of {args.rounds} rounds")
        print("| variant | cos to fp32 mean | min | p1 | vs the native view's vectors: mean / min | papers/s | CPU-ms a paper |\n"
              "|---|---|---|---|---|---|---|")
        for name, v in r["variants"].items():
            vs = v.get("vs_native")
            same = "—" if vs is None else "identical" if vs["identical"] else f"{vs['cos_mean']:.4f} / {vs['cos_min']:.4f}"
            print(f"| {name} | {v['cos_mean']:.4f} | {v['cos_min']:.4f} | {v['cos_p1']:.4f} | {same} | "
                  f"{v['papers_per_s']:.1f} | {v['cpu_ms_per_paper']:.0f} |")
        for key in ("profile", "profile_fp32"):
            if key in r:
                p = r[key]
                top = ", ".join(f"{k} {v:.0f} ms" for k, v in list(p["per_op_ms"].items())[:8])
                print(f"{key} ({p['rows']} rows, one thread, {p['total_ms']:.0f} ms in kernels): {top}")


if __name__ == "__main__":
    main()
