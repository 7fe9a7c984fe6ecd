"""What tagging costs while indexing: the CPU time of one encoder pass over the same abstracts without the tagger
and with it (its listener, the copied layers, the BiLSTM, the probabilities the index stores), interleaved.

CPU-seconds of the whole process (`time.process_time`), not wall time, so a shared machine's other work moves the
figure less; the encoder is loaded the way `esqbe index` loads it (the default runtime unless told). The share is
of encoding + tagging; `esqbe index` also writes, so its share of indexing time is lower than this figure."""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from ..domain import Paper
from .runtime import FacetTagger, TagListener


def tagging_cost(tagger: FacetTagger, papers: Sequence[Paper], *, rounds: int = 2) -> dict:
    """Median CPU-seconds of encoding `papers` without and with `tagger`, after one warm-up of each, and the share
    of the tagged pass that tagging takes (`share`, 0..1). `tagger` must hold the encoder to measure with."""
    encoder = tagger.encoder
    papers = [p for p in papers if p.sentences]
    if not papers:
        raise ValueError("tagging_cost needs papers with sentences")

    def plain() -> None:
        encoder.contextual_sentence_vectors(papers)

    def tagged() -> None:
        listener = TagListener(tagger)
        encoder.contextual_sentence_vectors(papers, on_batch=listener)
        listener.collect(papers)
        listener.facet_probabilities(papers)

    times: dict[str, list[float]] = {"plain": [], "tagged": []}
    for r in range(int(rounds) + 1):
        for name, fn in (("plain", plain), ("tagged", tagged)):
            t = time.process_time()
            fn()
            if r:  # round 0 warms both up (lazy exports, caches)
                times[name].append(time.process_time() - t)
    plain_s, tagged_s = statistics.median(times["plain"]), statistics.median(times["tagged"])
    return {"papers": len(papers), "rounds": int(rounds), "encode_cpu_s": round(plain_s, 3),
            "encode_and_tag_cpu_s": round(tagged_s, 3),
            "share": round(max(0.0, tagged_s - plain_s) / tagged_s, 4) if tagged_s > 0 else 0.0}
