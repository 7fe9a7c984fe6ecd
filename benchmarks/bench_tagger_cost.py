"""Where tagging's CPU time goes, in one process (issue 22): the default encoder runtime over the same abstracts
three ways, interleaved — without hidden states, with every hidden state handed to a listener that does nothing,
and with the facet tagger's listener (labels and soft labels collected) — and, inside the last, the CPU time of
the tagger's parts on the calling thread (its copied layers' ONNX run, title masking, per-sentence pooling, the
BiLSTM, the probabilities).

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_tagger_cost.py PAPERS.jsonl [ROUNDS] [--tagger FILE] [--backend B]

CPU-seconds (`time.process_time()`: all the process's threads; `time.thread_time()` for the parts), not wall
time, so a shared machine's load matters less; medians of ROUNDS rounds (default 2) after a warm-up round.
Asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from esqbe.encode.loader import ModelSpec, load_encoder
from esqbe.ingest.readers import read_papers
from esqbe.tagger import layers_onnx, net, runtime
from esqbe.tagger.runtime import FacetTagger

PARTS: dict[str, float] = defaultdict(float)


def _timed(name, fn):
    def wrapper(*args, **kwargs):
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            PARTS[name] += time.thread_time() - t
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("papers")
    ap.add_argument("rounds", nargs="?", type=int, default=2)
    ap.add_argument("--tagger", default=None, help="tagger weights (default: the shipped ones)")
    ap.add_argument("--backend", default="onnx-int8", help="encoder runtime (default: onnx-int8, what auto picks on a CPU)")
    args = ap.parse_args()
    papers = list(read_papers(args.papers))
    encoder = load_encoder(ModelSpec(backend=args.backend))
    tagger = FacetTagger.load(args.tagger, encoder=encoder)
    layers_onnx.OnnxTaggerLayers.__call__ = _timed("copied layers (ONNX run)", layers_onnx.OnnxTaggerLayers.__call__)
    net._group_tokens = _timed("token groups (stride > 1)", net._group_tokens)
    net._mean_pool_numpy = _timed("per-sentence pooling", net._mean_pool_numpy)
    runtime._hide_title = _timed("title mask", runtime._hide_title)
    net.TaggerNet.classify = _timed("BiLSTM + output layer", net.TaggerNet.classify)
    runtime.TagListener.__call__ = _timed("listener per batch (all of the above but the BiLSTM)", runtime.TagListener.__call__)
    runtime.TagListener._compute_probabilities = _timed("probabilities (BiLSTM included)", runtime.TagListener._compute_probabilities)
    runtime.TagListener.facet_probabilities = _timed("soft labels (probabilities included)", runtime.TagListener.facet_probabilities)

    results: dict[str, list[float]] = defaultdict(list)
    for rnd in range(args.rounds + 1):
        for mode in ("encoder", "encoder + states out", "encoder + tagger"):
            PARTS.clear()
            c = time.process_time()
            if mode == "encoder":
                encoder.contextual_sentence_vectors(papers)
            elif mode == "encoder + states out":
                encoder.contextual_sentence_vectors(papers, on_batch=lambda batch: None)
            else:
                listener = tagger.listener()
                encoder.contextual_sentence_vectors(papers, on_batch=listener)
                listener.collect(papers)
                listener.facet_probabilities(papers)
            if rnd:  # round 0 warms up
                results[mode].append(time.process_time() - c)
                for k, v in PARTS.items():
                    results["  " + k].append(v)
    n = len(papers)
    print(f"{n} papers, runtime {encoder.backend}, tagger {tagger.path} (stride {tagger.net.stride}), "
          f"medians of {args.rounds} rounds")
    for k, v in results.items():
        m = statistics.median(v)
        print(f"{k:58s} {m:7.3f} CPU-s  {1000 * m / n:6.2f} ms/paper")


if __name__ == "__main__":
    main()
