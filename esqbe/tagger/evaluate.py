"""Measuring a tagger against gold labels: macro-F1 per esqbe class and per raw CSAbstruct label."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..domain import RAW_LABELS, Paper
from ..errors import DataError
from .net import _torch
from .runtime import FACET_CLASSES, FacetTagger, TagListener, _labels_from_probs, _merge


# ================================================================ metrics
def f1_report(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> dict:
    """Macro-F1 and per-label precision/recall/F1 in percent (numpy only: no scikit-learn at runtime)."""
    gold_a, pred_a = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    per = {}
    for lab in labels:
        tp = int(np.sum((gold_a == lab) & (pred_a == lab)))
        fp = int(np.sum((gold_a != lab) & (pred_a == lab)))
        fn = int(np.sum((gold_a == lab) & (pred_a != lab)))
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        per[lab] = {"precision": round(100 * p, 2), "recall": round(100 * r, 2), "f1": round(100 * f, 2), "support": tp + fn}
    return {
        "macro_f1": round(float(np.mean([per[lab]["f1"] for lab in labels])), 2) if labels else 0.0,
        "accuracy": round(100 * float(np.mean(gold_a == pred_a)), 2) if len(gold_a) else 0.0,
        "sentences": int(len(gold_a)),
        "per_label": per,
    }


# ================================================================ evaluation
def _text_key(paper: Paper) -> str:
    return " ".join(" ".join(paper.sentences).split())


def evaluate_tagger(
    gold,
    *,
    tagger: FacetTagger | None = None,
    encoder=None,
    format: str | None = None,
    exclude_duplicates_of: Iterable = (),
    ids: Iterable[str] | None = None,
    exclude_ids: Iterable[str] = (),
) -> dict:
    """Score the tagger against gold labels: macro-F1 and per-label F1 for the 4 esqbe classes and 5 raw labels.

    `gold` is a labelled source (path) or papers read with raw labels. `exclude_duplicates_of`:
    sources whose abstracts are dropped from `gold` when the text is identical (CSAbstruct test
    repeats train/dev abstracts). `ids` / `exclude_ids` keep or drop papers by id.
    """
    tagger = tagger or FacetTagger.load(encoder=encoder)
    papers = _gold_papers(gold, format=format)
    n_read = len(papers)
    seen: set[str] = set()
    for src in exclude_duplicates_of:
        seen.update(_text_key(p) for p in _gold_papers(src))
    papers = [p for p in papers if _text_key(p) not in seen]
    n_dups = n_read - len(papers)
    if ids is not None:
        ids = {str(i) for i in ids}
        papers = [p for p in papers if p.paper_id in ids]
    drop = {str(i) for i in exclude_ids}
    papers = [p for p in papers if p.paper_id not in drop]
    listener = TagListener(tagger)
    tagger.encoder.contextual_sentence_vectors(papers, on_batch=listener)
    probs = listener._probabilities(papers)
    scores = _scores(papers, probs)
    scores["duplicates_excluded"] = n_dups
    return scores


def _gold_papers(source, *, format=None, limit: int | None = None) -> list[Paper]:
    """Papers with the five raw labels; an unlabeled sentence is an error (it cannot train or score)."""
    from ..ingest.readers import read_papers

    if isinstance(source, (str, Path)) or hasattr(source, "read"):
        papers = list(read_papers(source, format=format, strict=True, raw_labels=True))
    else:
        papers = list(source)
    if limit is not None:
        papers = papers[:limit]
    for p in papers:
        bad = [f for f in p.facets if f not in RAW_LABELS]
        if bad:
            raise DataError(f"paper {p.paper_id}: label {bad[0]!r} is not one of {', '.join(RAW_LABELS)} "
                             "(read it with raw_labels=True; every sentence needs a label)")
    return papers


def _scores(papers: Sequence[Paper], probs) -> dict:
    gold5 = [f for p in papers for f in p.facets]
    pred5 = [lab for p, pr in zip(papers, probs) if p.sentences for lab in _labels_from_probs(pr, raw=True)]
    pred4 = [lab for p, pr in zip(papers, probs) if p.sentences for lab in _labels_from_probs(pr, raw=False)]
    return {
        "papers": len(papers),
        "esqbe": f1_report([_merge(g) for g in gold5], pred4, FACET_CLASSES),
        "raw": f1_report(gold5, pred5, RAW_LABELS),
    }


def calibrate_weights(weights, dev, out=None, *, encoder=None) -> dict:
    """Fit the temperature of existing tagger weights on labelled abstracts (`dev`, CSAbstruct dev by default in
    `esqbe train-tagger --calibrate`) and write the weights with it to `out` (default: in place, atomically).
    Labels do not change; the probabilities the index stores and the ranking reads do. Returns the
    calibration report (esqbe.tagger.calibrate.calibration_report)."""
    import os

    from .calibrate import calibration_report, fit_temperature

    torch = _torch()
    tagger = FacetTagger.load(weights, encoder=encoder)
    tagger.meta = {**tagger.meta, "temperature": 1.0}  # the raw probabilities, whatever the file held
    papers = [p for p in _gold_papers(dev) if p.sentences]
    listener = TagListener(tagger)
    tagger.encoder.contextual_sentence_vectors(papers, on_batch=listener)
    probs = listener._probabilities(papers)
    log_probs = np.log(np.clip(np.concatenate([pr.numpy() for pr in probs]), 1e-12, 1.0))
    labels = np.array([RAW_LABELS.index(f) for p in papers for f in p.facets])
    temperature = fit_temperature(log_probs, labels)
    report = calibration_report(log_probs, labels, temperature)
    blob = torch.load(weights, map_location="cpu", weights_only=True)
    blob["meta"]["temperature"] = float(temperature)
    blob["meta"]["calibration"] = {**report, "on": str(dev)}
    target = Path(out or weights)
    tmp = target.with_name(target.name + ".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, target)
    return report
