"""The tagger's probabilities made honest: one temperature fitted on held-out labelled abstracts (temperature
scaling, Guo et al. 2017: softmax(logits / T), so no label changes, only how sure the tagger says it is), and the
expected calibration error (ECE) that says how far its confidence is from its accuracy.

The ranking consumes these probabilities (a query paper's facet sentences are those whose probability reaches
`query_facet_threshold`; a candidate's sentence of another facet loses `facet_penalty` x (1 - its probability)), so
an over- or under-confident tagger moves the ranking without changing a single label."""
from __future__ import annotations

import numpy as np

#: the bins of the expected calibration error (equal-width over the top-label confidence, as Guo et al.)
ECE_BINS = 15


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of `labels` under softmax(logits / temperature)."""
    logp = _log_softmax(np.asarray(logits, dtype=np.float64) / float(temperature))
    return float(-logp[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray, *, low: float = 0.05, high: float = 20.0,
                    tol: float = 1e-4) -> float:
    """The temperature T in [low, high] that minimises the mean NLL of softmax(logits / T).

    The NLL is convex in 1/T (a log-sum-exp of linear functions minus a linear term), so a golden-section search
    over 1/T finds its minimum. `logits` may be log-probabilities: softmax ignores a per-row constant.
    """
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if logits.ndim != 2 or len(logits) != len(labels) or len(labels) == 0:
        raise ValueError(f"need (n, classes) logits and n labels, got {logits.shape} and {labels.shape}")
    if not np.isfinite(logits).all():
        logits = np.nan_to_num(logits, neginf=-1e4)  # a zero probability's log: a very unlikely class
    g = (np.sqrt(5.0) - 1) / 2
    a, b = 1.0 / high, 1.0 / low
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(logits, labels, 1 / c), nll(logits, labels, 1 / d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(logits, labels, 1 / c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(logits, labels, 1 / d)
    return float(2.0 / (a + b))


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE: over equal-width bins of the top-label confidence, the gap |accuracy - mean confidence| weighted by the
    share of rows in the bin (0 = perfectly calibrated; in probability units, so x100 reads as points)."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) == 0:
        return 0.0
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    which = np.clip(np.ceil(conf * bins).astype(np.int64) - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    gap = np.abs(np.bincount(which, weights=correct, minlength=bins) - np.bincount(which, weights=conf, minlength=bins))
    return float(gap.sum() / len(labels)) if count.sum() else 0.0


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    return np.exp(_log_softmax(np.asarray(logits, dtype=np.float64) / float(temperature)))


def merged(probs: np.ndarray) -> np.ndarray:
    """The five raw labels' probabilities as esqbe's four classes (objective counted as background)."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.stack([probs[:, 0] + probs[:, 1], probs[:, 2], probs[:, 3], probs[:, 4]], axis=1)


def calibration_report(log_probs: np.ndarray, labels5: np.ndarray, temperature: float) -> dict:
    """ECE before and after the temperature, on the five raw labels and on esqbe's four classes (what ranking
    consumes), and the NLL, for `log_probs` of held-out sentences and their gold raw labels."""
    merge = np.array([0, 0, 1, 2, 3])
    out = {"temperature": round(float(temperature), 4), "sentences": int(len(labels5))}
    for name, t in (("before", 1.0), ("after", float(temperature))):
        p5 = softmax(log_probs, t)
        out[f"ece_{name}"] = round(100 * expected_calibration_error(merged(p5), merge[labels5]), 2)
        out[f"ece_raw_{name}"] = round(100 * expected_calibration_error(p5, labels5), 2)
        out[f"nll_{name}"] = round(nll(log_probs, labels5, t), 4)
    return out
