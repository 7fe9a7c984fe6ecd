"""Raw unlabelled JSONL -> queryable index, end to end, with the default settings, as a user runs it.

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_index_e2e.py [--limit N] [--workdir DIR]
        [--no-tagging] [--json]          # ESQBE_SHARED=DIR: the shared/ directory, if not ../shared

1. The corpus: every real abstract in ../shared/data, written once to one JSONL without labels
   (`{"id", "title", "abstract"}`), deduplicated by text: CSFCube dev (4,205), CSAbstruct train/dev/test,
   the S2ORC metadata sample (those with an abstract), the S2AG `abstracts` sample, and ScisummNet's 978
   reference papers (title and <ABSTRACT> of each XML). `--limit N`: its first N papers (a quick run).
2. The baseline, in this process: a plain fp32 PyTorch forward pass of the default model over the same texts
   (`title + " [SEP] " + abstract`, length-sorted batches of 32, at most 512 tokens; tokenising included,
   loading the model not).
3. `esqbe index CORPUS --path NEW --facets none` and `esqbe index CORPUS --path NEW` (the default facets: the
   unlabelled papers are tagged), each a subprocess with the default settings, timed from start to exit
   (start-up and model load included), each index then checked queryable (`esqbe stats`, `esqbe query`).
   A warm-up run on 2 papers first builds the one-off ONNX export if it is not cached (timed apart).

Prints papers/s for each, the ratio to the baseline and hours per million papers on this machine. Asserts
nothing; run it on a quiet machine for figures (nothing else running).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = Path(os.environ.get("ESQBE_SHARED") or ROOT.parent / "shared") / "data"  # as tests/conftest.py: a worktree names it


def _records():
    """(source, id, title, abstract) of every real abstract under ../shared/data, source by source."""
    csf = DATA / "csfcube-dev" / "abstracts-csfcube-preds.jsonl"
    if csf.exists():
        for line in csf.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            yield "csfcube", r["paper_id"], r.get("title") or "", " ".join(r["abstract"])
    for split in ("train", "dev", "test"):
        path = DATA / "csabstruct" / f"{split}.jsonl"
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                r = json.loads(line)
                yield "csabstruct", r["paper_id"], r.get("title") or "", " ".join(r["sentences"])
    meta = DATA / "s2orc" / "metadata-sample.jsonl"
    if meta.exists():
        for line in meta.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r.get("abstract"):
                yield "s2orc", r["paper_id"], r.get("title") or "", r["abstract"]
    s2ag = DATA / "s2orc" / "s2ag-datasets-samples" / "abstracts-sample.jsonl.gz"
    if s2ag.exists():
        with gzip.open(s2ag, "rt", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                if r.get("abstract"):
                    yield "s2ag", str(r["corpusid"]), "", r["abstract"]
    tar = DATA / "clscisumm" / "Training-Set-2019" / "Task1" / "From-ScisummNet-2019.Reference_XML.tar.gz"
    if tar.exists():
        sentence = re.compile(r"<S [^>]*>(.*?)</S>", re.S)
        with tarfile.open(tar) as t:
            for m in t:
                if not m.name.endswith(".xml"):
                    continue
                fh = t.extractfile(m)
                if fh is None:
                    continue
                xml = fh.read().decode("utf-8", "replace")
                abstract = re.search(r"<ABSTRACT>(.*?)</ABSTRACT>", xml, re.S)
                if not abstract:
                    continue
                title = sentence.search(xml.split("<ABSTRACT>")[0])
                text = " ".join(" ".join(s.split()) for s in sentence.findall(abstract.group(1)))
                if text:
                    yield "scisummnet", Path(m.name).stem, " ".join(title.group(1).split()) if title else "", text


def write_corpus(path: Path, limit: int | None) -> dict:
    """The corpus JSONL (no labels, deduplicated by normalised title + abstract); counts per source."""
    seen, counts, n = set(), {}, 0
    with open(path, "w", encoding="utf-8") as out:
        for source, pid, title, abstract in _records():
            key = " ".join(f"{title} {abstract}".lower().split())
            if not abstract.strip() or key in seen:
                continue
            seen.add(key)
            out.write(json.dumps({"id": f"{source}:{pid}", "title": title, "abstract": abstract}) + "\n")
            counts[source] = counts.get(source, 0) + 1
            n += 1
            if limit and n >= limit:
                break
    return counts


def baseline_rate(corpus: Path) -> tuple[float, float]:
    """(papers/s, seconds) of a plain fp32 PyTorch forward pass over the corpus' texts."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from esqbe.encode.identity import resolve_model

    source, _ = resolve_model(None)
    tok = AutoTokenizer.from_pretrained(source)
    model = AutoModel.from_pretrained(source).eval()
    texts = [f"{r['title']} [SEP] {r['abstract']}" for r in map(json.loads, corpus.read_text(encoding="utf-8").splitlines())]
    start = time.perf_counter()
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    with torch.inference_mode():
        for b in range(0, len(order), 32):
            enc = tok([texts[i] for i in order[b : b + 32]], padding=True, truncation=True, max_length=512,
                      return_tensors="pt")
            model(**enc)
    seconds = time.perf_counter() - start
    return len(texts) / seconds, seconds


def esqbe(*args, env=None) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"esqbe {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done


def index_run(corpus: Path, path: Path, n: int, facets: str | None, env) -> dict:
    shutil.rmtree(path, ignore_errors=True)
    args = ["index", corpus, "--path", path] + (["--facets", facets] if facets else [])
    seconds, _ = esqbe(*args, env=env)
    stats = json.loads(esqbe("stats", "--path", path, "--json", env=env)[1].stdout)
    _, query = esqbe("query", "--path", path, "--text", "We propose a neural method for parsing.", "-k", "3",
                     "--json", env=env)
    hits = len(json.loads(query.stdout).get("hits", []))
    assert stats["papers"] == n and hits, (stats, hits)  # queryable, every paper in
    return {"seconds": seconds, "papers_per_s": n / seconds, "runtime": stats.get("encoder_runtime"),
            "sentences": stats["sentences"], "query_hits": hits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, help="only the corpus' first N papers (a quick run)")
    ap.add_argument("--workdir", help="where the corpus and the indexes go (default: a temporary directory)")
    ap.add_argument("--no-tagging", action="store_true", help="skip the run with tagging")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="esqbe-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    counts = write_corpus(corpus, args.limit)
    n = sum(counts.values())
    if not n:
        raise SystemExit(f"no abstracts under {DATA} (set ESQBE_SHARED to the shared/ directory)")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    warm = work / "warm.jsonl"
    warm.write_text("".join(corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:2]), encoding="utf-8")
    shutil.rmtree(work / "warm-index", ignore_errors=True)
    warm_s, warm_run = esqbe("index", warm, "--path", work / "warm-index", "--facets", "none", env=env)

    base, base_s = baseline_rate(corpus)
    runs = {"no tagging (--facets none)": index_run(corpus, work / "ix-none", n, "none", env)}
    if not args.no_tagging:
        runs["tagging (default facets)"] = index_run(corpus, work / "ix-tagged", n, None, env)
    result = {"papers": n, "sources": counts, "machine": f"{platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs", "baseline_papers_per_s": base, "baseline_seconds": base_s,
              "warm_up_seconds": warm_s, "warm_up_exported": "exporting the model to ONNX" in warm_run.stderr, "runs": {}}
    for name, r in runs.items():
        r["ratio_to_baseline"] = r["papers_per_s"] / base
        r["hours_per_million"] = 1e6 / r["papers_per_s"] / 3600
        result["runs"][name] = r
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"corpus: {n} unlabelled abstracts ({', '.join(f'{k} {v}' for k, v in counts.items())}); {result['machine']}")
    print(f"warm-up (2 papers, ONNX export {'built now' if result['warm_up_exported'] else 'cached'}): {warm_s:.1f} s")
    print(f"baseline, fp32 PyTorch forward pass (batches of 32, <= 512 tokens): {base:.1f} papers/s "
          f"({1e6 / base / 3600:.1f} h per million)")
    for name, r in result["runs"].items():
        print(f"esqbe index, {name}: {r['papers_per_s']:.1f} papers/s ({r['seconds']:.1f} s, runtime {r['runtime']}), "
              f"{r['ratio_to_baseline']:.2f}x the baseline, {r['hours_per_million']:.1f} h per million")


if __name__ == "__main__":
    main()
