""" the tagger's probabilities calibrated (temperature, ECE), what tagging costs, and the rule that
chooses a tagger by the ranking it gives."""
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from esqbe.domain import Paper
from esqbe.evaluation.tagger_choice import MAX_COST, TIE, CandidateRow, choose, format_choice
from esqbe.tagger.calibrate import expected_calibration_error, fit_temperature, nll, softmax
from esqbe.tagger.runtime import FacetTagger

from .conftest import SHARED

CSABSTRUCT = SHARED / "data" / "csabstruct"
needs_data = pytest.mark.skipif(not CSABSTRUCT.exists(), reason="CSAbstruct not available")


def _sampled(temperature, n=6000, classes=5, seed=0):
    """Labels drawn from softmax(z / temperature): the temperature that made them is the one to recover."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 3, size=(n, classes))
    p = softmax(z, temperature)
    labels = np.array([rng.choice(classes, p=row) for row in p])
    return z, labels


@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_fit_temperature_recovers_the_temperature_the_labels_were_drawn_at(true_t):
    z, labels = _sampled(true_t)
    t = fit_temperature(z, labels)
    assert abs(t - true_t) / true_t < 0.1
    assert nll(z, labels, t) <= min(nll(z, labels, t * 1.2), nll(z, labels, t / 1.2))
    # calibrated at the fitted temperature, not at 1 (unless 1 is the truth)
    before, after = (expected_calibration_error(softmax(z, x), labels) for x in (1.0, t))
    assert after < 0.03 and (true_t == 1.0 or after < before)


def test_ece_is_zero_when_confidence_is_accuracy_and_the_gap_otherwise():
    probs = np.array([[0.8, 0.2]] * 10)
    right = np.array([0] * 8 + [1] * 2)  # 80% right at 0.8 confidence
    assert expected_calibration_error(probs, right) == pytest.approx(0.0)
    assert expected_calibration_error(probs, np.zeros(10, dtype=int)) == pytest.approx(0.2)


def _row(name, ndcg, f1, cost):
    return CandidateRow(name, {}, f"{name}.pt", f1, cost, {"all": {"NDCG%20": ndcg, "MAP": 40.0}})


def test_the_rule_ranking_first_ties_to_label_quality_then_cost_and_cost_bounds_eligibility():
    # the best ranking wins outright past the tie margin, whatever its F1
    assert choose([_row("a", 61.0, 70.0, 0.1), _row("b", 61.0 + TIE + 0.01, 60.0, 0.1)]).name == "b"
    # within the margin: the better labels
    assert choose([_row("a", 61.0, 70.0, 0.1), _row("b", 61.0 + TIE - 0.01, 60.0, 0.1)]).name == "a"
    # same ranking and labels: the cheaper
    assert choose([_row("a", 61.0, 70.0, 0.12), _row("b", 61.0, 70.0, 0.05)]).name == "b"
    # too costly is not eligible, however good
    assert choose([_row("a", 70.0, 90.0, MAX_COST + 0.01), _row("b", 60.0, 60.0, 0.1)]).name == "b"
    table = format_choice({"rows": [{**r.__dict__, "ndcg": r.ndcg, "eligible": r.eligible}
                                    for r in (_row("a", 61.0, 70.0, 0.1),)], "chosen": "a"})
    assert "a (chosen)" in table and "10.0%" in table and "**61.00**" in table


@pytest.fixture(scope="module")
def encoder():
    from esqbe.encode.encoder import Encoder

    return Encoder.load()


def _abstracts(split, n):
    from esqbe.ingest.readers import read_papers

    return list(read_papers(CSABSTRUCT / f"{split}.jsonl", raw_labels=True))[:n]


@needs_data
def test_temperature_changes_probabilities_not_labels_and_calibrate_writes_it(encoder, tmp_path):
    from click.testing import CliRunner

    from cli import main
    from esqbe.tagger.weights import shipped_weights

    dev = tmp_path / "dev.jsonl"
    lines = [json.loads(x) for x in (CSABSTRUCT / "dev.jsonl").read_text().splitlines()[:40]]
    dev.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "calibrated.pt"
    r = CliRunner().invoke(main, ["train-tagger", "--calibrate", str(shipped_weights(encoder)), "--dev", str(dev),
                                  "--out", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{"):])
    assert 0.01 <= report["temperature"] <= 100 and report["sentences"] > 100
    assert report["nll_after"] <= report["nll_before"]  # the fitted temperature never fits worse than 1
    plain, cal = FacetTagger.load(encoder=encoder), FacetTagger.load(out, encoder=encoder)
    assert cal.temperature == pytest.approx(report["temperature"], abs=1e-4) and plain.temperature == 1.0
    papers = [Paper(p.paper_id, p.title, p.sentences) for p in _abstracts("test", 3)]
    (_, p1), (_, p2) = plain.tag_with_probabilities(papers), cal.tag_with_probabilities(papers)
    # the five raw labels are the argmax of the logits, which a temperature does not move (esqbe's merged classes
    # can: objective's and background's probabilities are added after it)
    assert plain.tag(papers, raw=True) == cal.tag(papers, raw=True)
    assert not np.allclose(np.concatenate(p1), np.concatenate(p2), atol=1e-4)
    # a hostile temperature in a weights file is refused before it divides anything
    import torch

    blob = torch.load(out, map_location="cpu", weights_only=True)
    blob["meta"]["temperature"] = float("inf")
    torch.save(blob, tmp_path / "bad.pt")
    from esqbe.errors import DataError

    with pytest.raises(DataError, match="temperature"):
        FacetTagger.load(tmp_path / "bad.pt", encoder=encoder).tag(papers[:1])


@needs_data
def test_tagging_cost_is_a_share_of_the_tagged_pass(encoder):
    from esqbe.tagger.cost import tagging_cost

    papers = [Paper(p.paper_id, p.title, p.sentences) for p in _abstracts("dev", 6)]
    cost = tagging_cost(FacetTagger.load(encoder=encoder), papers, rounds=1)
    assert cost["papers"] == 6 and cost["encode_and_tag_cpu_s"] > 0
    assert 0.0 <= cost["share"] < 1.0
