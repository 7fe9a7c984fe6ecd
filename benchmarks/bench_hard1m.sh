#!/usr/bin/env bash
# docs/performance.md's hard-1M figures (several examples, POST /rerank, watch run) in one run, on the index bench_scale.py --corpus hard --keep built.
#
#   benchmarks/bench_hard1m.sh INDEX
#
# Environment: REPO (checkout whose benchmarks/ run, default this one), PY (default $REPO/.venv/bin/python),
# LOGDIR (default /tmp/esqbe-bench1m), ESQBE_SHARED (default ../shared), CSFCUBE_INDEX (optional: an esqbe index of
# CSFCube dev, e.g. the one `esqbe eval csfcube` builds: the rerank latency there too).
# Order: warm the page cache (read every index file once), then
#   (a) bench_examples.py   5 examples + 1 avoided against the single-paper query, warm p50/p99 -> bench1m-examples.log
#   (b) bench_rerank.py     POST /rerank per call for 50/100/500 candidates         -> bench1m-rerank.log
#   (c) bench_watch_run.py  1,000 new papers against 50 watches (bound 60 s)        -> bench1m-watch.log
# (c) writes to the index it is given (50 watches, 1,000 copies of papers) and puts it back by deleting them, which
# leaves ~7K retired rows in the exact delta each time: so it runs on a copy (INDEX.watch-copy, ~9 GB, removed
# afterwards) and every run of this script measures the same index. Each log starts with the machine, the commit,
# the index, its size and the load average, and ends with the step's wall seconds and the load average after it
# (a quiet run has a 1-minute load average near 1 or below).
set -euo pipefail
INDEX=${1:?usage: benchmarks/bench_hard1m.sh INDEX}
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
PY=${PY:-$REPO/.venv/bin/python}
LOGDIR=${LOGDIR:-/tmp/esqbe-bench1m}; mkdir -p "$LOGDIR"
export PYTHONPATH=$REPO HF_HUB_OFFLINE=1 ESQBE_SHARED=${ESQBE_SHARED:-$REPO/../shared}
[ -d "$INDEX" ] || { echo "no index at $INDEX" >&2; exit 2; }
cd "$REPO"

header() {  # header INDEX COMMAND...
  local index=$1; shift
  echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host $(hostname)  $(lscpu | sed -n 's/^Model name: *//p')  $(nproc) CPUs ($(grep -o -w -E 'avx512_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '))"
  echo "# repo $REPO at $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (+ uncommitted changes)')"
  echo "# index $index: $(du -sh "$index" | cut -f1) on disk; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# command: $*"
}

step() {  # step NAME INDEX COMMAND...: runs COMMAND (on INDEX), its output and timing into LOGDIR/bench1m-NAME.log
  local name=$1 index=$2; shift 2
  local log=$LOGDIR/bench1m-$name.log
  local t0=$SECONDS
  if ! { header "$index" "$@"; "$@" 2>&1; } > "$log"; then
    echo "$name: FAILED after $((SECONDS - t0)) s; see $log" >&2
    exit 1
  fi
  echo "# step wall $((SECONDS - t0)) s; load average after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
  echo "$name: $((SECONDS - t0)) s -> $log"
}

t_all=$SECONDS
t0=$SECONDS
find "$INDEX" -type f -print0 | xargs -0 cat > /dev/null
echo "page cache warmed: $((SECONDS - t0)) s ($(du -sh "$INDEX" | cut -f1))"

step examples "$INDEX" "$PY" benchmarks/bench_examples.py "$INDEX" --facet method --queries 50 --seed 0 --k 10
step rerank "$INDEX" "$PY" benchmarks/bench_rerank.py "$INDEX" --docs 50,100,500 --calls 30 --facet method --seed 0
if [ -n "${CSFCUBE_INDEX:-}" ]; then
  step rerank-csfcube "$CSFCUBE_INDEX" "$PY" benchmarks/bench_rerank.py "$CSFCUBE_INDEX" --docs 50,100,500 --calls 30 --facet method --seed 0
fi
COPY=$INDEX.watch-copy
trap 'rm -rf "$COPY"' EXIT
rm -rf "$COPY"
t0=$SECONDS
cp -a "$INDEX" "$COPY"
echo "copied for the watch run: $((SECONDS - t0)) s"
step watch "$COPY" "$PY" benchmarks/bench_watch_run.py "$COPY" --new 1000 --watches 50 --min-sim 0.5
rm -rf "$COPY"
echo "all: $((SECONDS - t_all)) s"
