"""Where "nearly the same sentences" ends (esqbe.query.versions.VERSION_OVERLAP): the sentence overlap of distinct
papers against that of a paper and its other version, on CSFCube dev through the product's own path.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/bench_versions.py ../shared/data/csfcube-dev/abstracts-csfcube-preds.jsonl OUT_DIR [N_VERSIONS] [SEED]

1. Every abstract of the file, and for N_VERSIONS of them (seeded) two other versions each, is indexed by `esqbe
   index`'s path (the default model and runtime): a **re-titled** copy (the same sentences under another title, as a
   preprint and its journal version often are), and a **light edit** (another title; about one word in ten replaced
   by a synonym, a word dropped from a third of the sentences, numbers changed, one sentence dropped or one added).
   A **heavier edit** (a third of the words replaced, two sentences dropped, one added) is measured too: a rewrite
   that should not count as "nearly".
2. **Distinct**: each original abstract's overlap with its nearest other original (the highest over the whole
   collection, so the distribution's top is the most alike two distinct papers of CSFCube dev get).
3. Prints the quantiles of each, the top distinct pairs (to be read: a genuine duplicate inside the collection would
   show there), and writes every number to OUT_DIR/versions.json.
"""
from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import numpy as np

import esqbe
from esqbe.query.versions import VERSION_OVERLAP, overlap_matrix

SYNONYMS = {
    "propose": "present", "present": "propose", "novel": "new", "new": "novel", "method": "approach",
    "approach": "method", "show": "demonstrate", "demonstrate": "show", "results": "findings", "paper": "work",
    "use": "employ", "using": "employing", "improve": "enhance", "improves": "enhances", "significantly": "markedly",
    "large": "big", "model": "framework", "models": "frameworks", "task": "problem", "tasks": "problems",
    "performance": "accuracy", "data": "datasets", "based": "built", "learn": "acquire", "learning": "training",
    "efficient": "fast", "problem": "task", "study": "investigate", "we": "we", "experiments": "evaluations",
    "evaluate": "assess", "existing": "prior", "previous": "earlier", "framework": "system", "system": "framework",
}
EXTRA = ["We also release our code and data to support further research.",
         "This article extends our earlier conference version with additional experiments and analysis.",
         "Extensive experiments on further benchmarks confirm these findings."]


def retitle(title: str, rng: random.Random) -> str:
    head = title.split(":")[0].strip() if ":" in title else title
    return rng.choice([f"Towards {head[:1].lower()}{head[1:]}", f"{head}: an extended study", f"On {head[:1].lower()}{head[1:]}",
                       f"{head} revisited"])


def edit(sentences: list[str], rng: random.Random, *, swap: float, drops: int, adds: int, word_drop: float) -> list[str]:
    out = []
    for s in sentences:
        words = s.split()
        words = [SYNONYMS.get(w.lower(), w) if rng.random() < swap * 3 and w.lower() in SYNONYMS else
                 (w if rng.random() >= swap else rng.choice(list(SYNONYMS.values()))) for w in words]
        if len(words) > 6 and rng.random() < word_drop:
            del words[rng.randrange(1, len(words))]
        text = re.sub(r"\d+(\.\d+)?", lambda m: str(round(float(m.group()) * 1.01 + 0.1, 1)), " ".join(words))
        out.append(text)
    for _ in range(drops):
        if len(out) > 3:
            del out[rng.randrange(1, len(out))]
    for _ in range(adds):
        out.insert(rng.randrange(1, len(out) + 1), rng.choice(EXTRA))
    return out


def quantiles(x) -> dict:
    x = np.asarray(x, dtype=float)
    return {"n": int(len(x)), "min": round(float(x.min()), 4), "p1": round(float(np.quantile(x, 0.01)), 4),
            "p5": round(float(np.quantile(x, 0.05)), 4), "p50": round(float(np.quantile(x, 0.5)), 4),
            "p95": round(float(np.quantile(x, 0.95)), 4), "p99": round(float(np.quantile(x, 0.99)), 4),
            "p99.9": round(float(np.quantile(x, 0.999)), 4), "max": round(float(x.max()), 4)}


def main(src: str, out: str, n_versions: int = 300, seed: int = 0) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [json.loads(line) for line in open(src)]
    rng = random.Random(seed)
    chosen = rng.sample(range(len(records)), n_versions)
    kinds = {"retitled": dict(swap=0.0, drops=0, adds=0, word_drop=0.0),
             "light": dict(swap=0.08, drops=1, adds=0, word_drop=0.33),
             "light+added": dict(swap=0.08, drops=0, adds=1, word_drop=0.33),
             "heavier": dict(swap=0.33, drops=2, adds=1, word_drop=0.66)}
    variants = []
    for i in chosen:
        r = records[i]
        for kind, how in kinds.items():
            sents = list(r["abstract"]) if kind == "retitled" else edit(list(r["abstract"]), rng, **how)
            variants.append({"paper_id": f"{kind}-{r['paper_id']}", "title": retitle(r["title"], rng),
                             "abstract": sents, "pred_labels": ["background"] * len(sents)})
    (out_dir / "versions.jsonl").write_text("".join(json.dumps(v) + "\n" for v in variants))
    with esqbe.open_index(str(out_dir / "ix"), config=None) as index:
        if not index.backend.meta():
            report = index.index_files([src, str(out_dir / "versions.jsonl")])
            print(f"indexed {report.stored} in {report.seconds:.0f}s", file=sys.stderr)
        originals = [r["paper_id"] for r in records]
        got = {}
        for start in range(0, len(originals) + len(variants), 256):
            ids = (originals + [v["paper_id"] for v in variants])[start:start + 256]
            got.update({pid: ip.vectors for pid, ip in index.backend.get(ids).items()})
    orig_vecs = [got[p] for p in originals]
    sims = overlap_matrix(orig_vecs, orig_vecs)
    np.fill_diagonal(sims, -1.0)
    nearest = sims.max(axis=1)
    pairs = sorted(((float(sims[i, j]), originals[i], originals[j]) for i, j in enumerate(sims.argmax(axis=1))
                    if i < j or sims[j].argmax() != i), reverse=True)[:10]
    result = {"papers": len(originals), "versions_per_kind": n_versions, "threshold_now": VERSION_OVERLAP,
              "distinct_nearest": quantiles(nearest), "top_distinct_pairs": pairs}
    for kind in kinds:
        own = [float(overlap_matrix([got[f"{kind}-{records[i]['paper_id']}"]], [got[records[i]["paper_id"]]])[0, 0])
               for i in chosen]
        result[kind] = quantiles(own)
        result[kind + "_values"] = own
    (out_dir / "versions.json").write_text(json.dumps({**result, "distinct_values": nearest.tolist()}, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_values")}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:5]))
