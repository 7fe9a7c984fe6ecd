"""Paired per-query comparison of two `esqbe eval csfcube --out DIR` configurations (the rule of docs/results.md):
mean NDCG%20 difference over the dev queries, wins/losses, per facet, a paired bootstrap 95% interval, and the mean
difference in each of 4 folds (queries sorted by id, consecutive blocks) as the spread.

    python scripts/paired.py RESULTS.json BASE_NAME OTHER_NAME [--metric NDCG%20]
"""
import json
import random
import sys


def main(path: str, base: str, other: str, metric: str = "NDCG%20", folds: int = 4) -> None:
    results = json.loads(open(path).read())
    a, b = results[base]["per_query"], results[other]["per_query"]
    qids = sorted(set(a) & set(b))
    diff = {q: 100 * (b[q][metric] - a[q][metric]) for q in qids}  # per-query figures are fractions
    d = [diff[q] for q in qids]
    mean = sum(d) / len(d)
    rng = random.Random(0)
    boots = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(10000))
    size = -(-len(qids) // folds)
    fold_means = [sum(diff[q] for q in qids[i:i + size]) / len(qids[i:i + size]) for i in range(0, len(qids), size)]
    print(f"{other} vs {base}, {metric}, {len(qids)} queries: mean {mean:+.2f}, wins {sum(x > 0 for x in d)}, "
          f"losses {sum(x < 0 for x in d)}, bootstrap 95% [{boots[250]:+.2f}, {boots[9750]:+.2f}]")
    print("  folds: " + ", ".join(f"{m:+.2f}" for m in fold_means)
          + f"  ({sum(m > 0 for m in fold_means)} of {len(fold_means)} positive)")
    facets = {}
    for q in qids:
        facets.setdefault(q.rsplit("_", 1)[-1], []).append(diff[q])
    if len(facets) > 1:
        print("  by facet: " + ", ".join(f"{f} {sum(v) / len(v):+.2f} ({sum(x > 0 for x in v)}/{len(v)} better)"
                                          for f, v in sorted(facets.items())))


if __name__ == "__main__":
    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    main(*args[:3], **({"metric": sys.argv[sys.argv.index("--metric") + 1]} if "--metric" in sys.argv else {}))
