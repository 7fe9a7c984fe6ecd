"""Encoder throughput per backend, end-to-end indexing throughput, and the quality checks, as one table.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_encode.py [--papers 256] [--rounds 3]
        [--backends torch,torch-int8,onnx,onnx-int8] [--threads 2] [--quality] [--quality-dir DIR]

Texts: the first N CSFCube abstracts (../shared/data/csfcube-dev; title + labelled sentences) or,
without the shared data, the bundled sample (samples/csabstruct-sample.jsonl). For each backend:

- raw encoder papers/s: `Encoder.contextual_sentence_vectors` on the texts (tokenisation, the
  transformer, per-sentence pooling: what indexing asks of the encoder), no tagging;
- end-to-end papers/s: `Index.index_files` (what `esqbe index FILE` runs: read the JSONL file, split,
  look up, encode, write SQLite + tantivy, commit) into a fresh embedded index, the model already
  loaded (loading is a one-off of a few seconds per process, not throughput);
- ratios: raw and end-to-end against today's path ("torch serial": fp32 PyTorch and the serial index
  loop, `Index.pipelined = False`), and end-to-end / raw of the same backend (target: >= 0.9).

Backends are interleaved within each round (a shared machine's load drifts) and the median of
the rounds is reported. `--quality` adds, per backend, the CSFCube dev aggregated NDCG%20 (default
configuration; the index of each backend is built under --quality-dir once and reused) and the
tagger's macro-F1 on CSAbstruct's deduplicated test split (esqbe classes), with their differences to
torch fp32. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CSFCUBE = ROOT / ".." / "shared" / "data" / "csfcube-dev"
CSABSTRUCT = ROOT / ".." / "shared" / "data" / "csabstruct"
SAMPLE = ROOT / "samples" / "csabstruct-sample.jsonl"


def load_texts(n: int, workdir: Path):
    """(papers, a JSONL file holding exactly those papers, its format, a description)."""
    from esqbe.ingest.readers import read_papers

    if (CSFCUBE / "abstracts-csfcube-preds.jsonl").exists():
        src, fmt, name = CSFCUBE / "abstracts-csfcube-preds.jsonl", "csfcube", "CSFCube dev abstracts"
    else:
        src, fmt, name = SAMPLE, None, "bundled CSAbstruct sample"
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    path = workdir / f"texts{src.suffix}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    papers = list(read_papers(str(path), fmt))
    return papers, path, fmt, f"{len(papers)} {name}"


def raw_rate(encoder, papers) -> float:
    """The encoder alone, run as indexing runs it: in a worker thread (see docs/performance.md: on this
    machine the same call from the main thread is up to ~2x slower, an allocator effect)."""
    with ThreadPoolExecutor(1) as pool:
        t = time.perf_counter()
        pool.submit(encoder.contextual_sentence_vectors, papers).result()
        return len(papers) / (time.perf_counter() - t)


def e2e_rate(encoder, backend: str, path: Path, fmt, workdir: Path, n: int, pipelined: bool = True) -> float:
    import esqbe

    target = workdir / f"index-{backend}"
    shutil.rmtree(target, ignore_errors=True)
    with esqbe.open_index(str(target), encoder=encoder, encoder_backend=backend) as index:
        index.pipelined = pipelined
        t = time.perf_counter()
        report = index.index_files([str(path)], format=fmt)
        dt = time.perf_counter() - t
    shutil.rmtree(target, ignore_errors=True)
    assert report.indexed == n, report
    return n / dt


def quality(backend: str, qdir: Path) -> dict:
    """CSFCube dev aggregated NDCG%20 (default configuration) and tagger macro-F1 (deduplicated test)."""
    out = {}
    if CSFCUBE.exists():
        from esqbe.evaluation.evaluate import evaluate_csfcube
        from esqbe.settings.config import Settings

        settings = Settings(encoder_backend=backend)
        result = evaluate_csfcube(str(CSFCUBE), settings, index_path=str(qdir / f"csfcube-{backend}"), log=lambda m: None)
        split = next(iter(result.splits.values()))
        out["ndcg20"] = split["all"]["NDCG%20"]
    if (CSABSTRUCT / "test.jsonl").exists():
        from esqbe.encode.encoder import Encoder
        from esqbe.tagger.evaluate import evaluate_tagger

        r = evaluate_tagger(str(CSABSTRUCT / "test.jsonl"), encoder=Encoder.load(backend=backend),
                            exclude_duplicates_of=[str(CSABSTRUCT / "train.jsonl"), str(CSABSTRUCT / "dev.jsonl")])
        out["tagger_f1"] = r["esqbe"]["macro_f1"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--papers", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="torch,torch-int8,onnx,onnx-int8")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 4), help="torch / ONNX Runtime threads")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--quality", action="store_true", help="also the CSFCube NDCG%%20 and tagger F1 per backend (minutes each)")
    ap.add_argument("--quality-dir", default=str(Path(tempfile.gettempdir()) / "esqbe-bench-quality"))
    ap.add_argument("--quality-backends", help="the backends whose quality to measure (default: all of --backends)")
    ap.add_argument("--reference", default="61.92,80.41",
                    help="fp32 NDCG%%20,tagger F1 for the deltas when torch's quality is not measured "
                         "(default: the recorded figures, docs/results.md and docs/tagger.md)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from esqbe.encode.encoder import Encoder

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="esqbe-bench-encode-"))
    try:
        papers, path, fmt, described = load_texts(args.papers, workdir)
        encoders = {b: Encoder.load(backend=b, device="cpu", batch_size=args.batch_size) for b in backends}
        for b in backends:  # warm-up (first-call allocations, ONNX Runtime's lazy init)
            encoders[b].contextual_sentence_vectors(papers[:8])
        # rows: (label, backend, pipelined); "torch serial" is today's path: fp32, the serial index loop
        rows_spec = [("torch serial", "torch", False)] if "torch" in backends else []
        rows_spec += [(b, b, True) for b in backends]
        raw = {b: [] for b in backends}
        e2e = {label: [] for label, _, _ in rows_spec}
        for r in range(args.rounds):
            order = rows_spec if r % 2 == 0 else rows_spec[::-1]
            for label, b, pipelined in order:
                if pipelined:
                    raw[b].append(raw_rate(encoders[b], papers))
                e2e[label].append(e2e_rate(encoders[b], b, path, fmt, workdir, len(papers), pipelined))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{label} raw {raw[b][-1]:.1f} e2e {e2e[label][-1]:.1f}"
                                                                for label, b, _ in rows_spec), file=sys.stderr, flush=True)
        rows = {label: {"backend": b, "raw": statistics.median(raw[b]), "e2e": statistics.median(e2e[label])}
                for label, b, _ in rows_spec}
        # ratios: the median of each round's ratio (the load of a shared machine drifts between rounds)
        today = "torch serial" if "torch serial" in rows else None
        for label, b, _ in rows_spec:
            rows[label]["raw_x"] = statistics.median(x / y for x, y in zip(raw[b], raw["torch"])) if today else None
            rows[label]["e2e_x"] = statistics.median(x / y for x, y in zip(e2e[label], e2e[today])) if today else None
            rows[label]["e2e_over_raw"] = statistics.median(x / y for x, y in zip(e2e[label], raw[b]))
        if args.quality:
            qdir = Path(args.quality_dir)
            qdir.mkdir(parents=True, exist_ok=True)
            for b in (args.quality_backends.split(",") if args.quality_backends else backends):
                print(f"quality: {b}", file=sys.stderr, flush=True)
                rows[b].update(quality(b, qdir))
            if "torch serial" in rows:
                rows["torch serial"].update({k: rows["torch"][k] for k in ("ndcg20", "tagger_f1") if k in rows["torch"]})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    base = rows.get("torch serial")
    reference = dict(zip(("ndcg20", "tagger_f1"), (float(x) for x in args.reference.split(","))))
    quality_base = {k: (base or {}).get(k, reference[k]) for k in reference}
    for _b, row in rows.items():
        for k in ("ndcg20", "tagger_f1"):
            if k in row:
                row[k + "_delta"] = row[k] - quality_base[k]
    if args.json:
        print(json.dumps({"texts": described, "threads": args.threads, "rounds": args.rounds, "rows": rows}, indent=2))
        return

    def f(v, spec):
        return "n/a" if v is None else format(v, spec)

    print(f"texts: {described}; {args.threads} threads; batch {args.batch_size}; rates: median of {args.rounds} interleaved "
          "rounds; ratios: median of the rounds' ratios")
    if args.quality:
        print(f"quality deltas against fp32 NDCG%20 {quality_base['ndcg20']:.2f}, tagger F1 {quality_base['tagger_f1']:.2f}"
              + ("" if "ndcg20" in (base or {}) else " (--reference: recorded, not measured in this run)"))
    print("| path | raw encoder papers/s | x fp32 | end-to-end papers/s | x today (torch serial) | end-to-end / raw | NDCG%20 | Δ | tagger F1 | Δ |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, row in rows.items():
        print(f"| {b} | {row['raw']:.1f} | {f(row['raw_x'], '.2f')} | {row['e2e']:.1f} | {f(row['e2e_x'], '.2f')} | "
              f"{row['e2e_over_raw']:.2f} | {f(row.get('ndcg20'), '.2f')} | {f(row.get('ndcg20_delta'), '+.2f')} | "
              f"{f(row.get('tagger_f1'), '.2f')} | {f(row.get('tagger_f1_delta'), '+.2f')} |")


if __name__ == "__main__":
    main()
