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
        rows.append((c["encoder_mode"], c["labels"], c["rescorer"], json.dumps(c["rescorer_params"]) if c["rescorer_params"] else "",
                     c["candidate_facet"], c["final_bm25_weight"], t, r["command"], name))
    rows.sort(key=lambda x: -x[6]["all"]["NDCG%20"])
    print("| encoder | labels | rescorer | params | candidate sentences | BM25 fusion | bg NDCG%20 | method NDCG%20 | result NDCG%20 | all MAP | all NDCG%20 | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, labels, rescorer, params, cand, w, t, cmd, name in rows:
        mark = " **(default)**" if name == "default" else ""
        print(f"| {mode} | {labels} | {rescorer}{mark} | {params} | {cand} | {w:g} | {t['background']['NDCG%20']:.2f} | "
              f"{t['method']['NDCG%20']:.2f} | {t['result']['NDCG%20']:.2f} | {t['all']['MAP']:.2f} | "
              f"{t['all']['NDCG%20']:.2f} | `{cmd}` |")


if __name__ == "__main__":
    main(*sys.argv[1:])
