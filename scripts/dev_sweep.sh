#!/usr/bin/env bash
# Every row of docs/results.md, one `esqbe eval` command each, on the CSFCube dev split (fold1_dev).
# Usage: scripts/dev_sweep.sh [DATA_DIR] [OUT_DIR] [MODES] [RESCORERS]
# Results merge into OUT_DIR/results.json; scripts/results_table.py turns it into the markdown table.
set -euo pipefail
DATA=${1:-../shared/data/csfcube-dev}
OUT=${2:-runs/dev}
MODES=${3:-"contextual independent"}
RESCORERS=${4:-"summax ts ot asym asym_token"}
ESQBE=${ESQBE:-esqbe}
# EXTRA: flags put before each row's own, e.g. EXTRA="--candidate-facet same --bm25-text abstract"
# re-measures the table as it was before issue 12 changed the default ranking
EXTRA=${EXTRA:-}
for mode in $MODES; do
  for rescorer in $RESCORERS; do
    for w in 0.1 0; do   # with and without BM25 fusion
      $ESQBE eval csfcube --data "$DATA" --out "$OUT" $EXTRA --encoder-mode "$mode" --rescorer "$rescorer" --bm25-weight "$w" >/dev/null
    done
  done
  # the first stage alone, and matching every candidate sentence instead of the facet's
  $ESQBE eval csfcube --data "$DATA" --out "$OUT" $EXTRA --encoder-mode "$mode" --rescorer none --bm25-weight 0 >/dev/null
  $ESQBE eval csfcube --data "$DATA" --out "$OUT" $EXTRA --encoder-mode "$mode" --candidate-facet all --bm25-weight 0 >/dev/null
  $ESQBE eval csfcube --data "$DATA" --out "$OUT" $EXTRA --encoder-mode "$mode" --candidate-facet all >/dev/null
done
