"""`esqbe check`: measurements of the user's own index. `check recall`: the first stage's kNN against exact search."""
from __future__ import annotations

import json

import click

from .errors import handle_errors
from .options import FACET_CHOICES, _open, click_options, config_option


@click.group("check")
def check_group():
    """Measure what an index does (recall of its approximate kNN)."""


@check_group.command("recall")
@click.option("--queries", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="Query papers sampled (seeded) from the index.")
@click.option("--facet", type=click.Choice(FACET_CHOICES), help="Only this facet (default: every facet).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the query sample.")
@click.option("--calibrate", is_flag=True,
              help="First re-calibrate the approximate kNN for --knn-recall-target / --knn-recall-statistic (every "
                   "facet; takes the write lock; minutes at a million papers), then measure.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click_options("check recall")
@config_option
@handle_errors
def check_recall_cmd(queries, facet, seed, calibrate, as_json, **kw):
    """kNN recall@10 and @100 of the first stage against exact search, on the index's own papers.

    \b
    Each sampled paper's sentences of a facet are searched as a query does (facet-filtered kNN, papers,
    k=100, the paper itself left out) and exactly (every sentence of the facet); printed per facet:
    recall mean / min / p10, the latency of both, and the setting (nprobe calibrated or fixed, or exact).

    \b
    The writer calibrates each approximate structure for knn_recall_target when it builds it (and an
    `esqbe index` run with another target re-calibrates). --calibrate does it now, e.g.:
      esqbe check recall --calibrate --knn-recall-target 0.98
    """
    with _open(kw, "check recall", create=False) as index:
        calibrated = None
        if calibrate:
            calibrated = index.calibrate_knn(force=True, progress=lambda m: click.echo(f"esqbe: {m}...", err=True)) or {}
        report = index.check_recall(queries=queries, facet=facet, seed=seed)
    if as_json:
        out = report.to_dict()
        if calibrate:
            out["calibrated"] = calibrated
        click.echo(json.dumps(out, indent=2))
        return
    if calibrate:
        if not calibrated:
            click.echo("calibrated: nothing (no facet is searched approximately)")
        for label, cal in (calibrated or {}).items():
            click.echo(f"calibrated {label}: {_calibration_words(cal)}")
    click.echo(f"{report.backend} index, {report.papers} papers; {report.queries} query papers (seed {report.seed}), "
               f"k={report.k}")
    for f in report.facets:
        r10, r100 = f.recall["@10"], f.recall["@100"]
        click.echo(f"{f.facet:>10}: recall@10 {r10['mean']:.3f} (min {r10['min']:.2f}, p10 {r10['p10']:.2f})  "
                   f"recall@100 {r100['mean']:.3f} (min {r100['min']:.2f}, p10 {r100['p10']:.2f})  "
                   f"kNN p50 {f.latency_ms['knn']['p50']:.1f} ms, exact p50 {f.latency_ms['exact']['p50']:.1f} ms  "
                   f"[{f.queries} queries; {f.setting}]")


def _calibration_words(cal: dict) -> str:
    """A stored calibration in words: the embedded IVF's nprobe / refine, or an engine's candidates factor."""
    setting = ", ".join(f"{k} {cal[k]}" for k in ("nprobe", "refine", "num_candidates_factor") if k in cal)
    statistic = cal.get("statistic", "mean")
    return (f"{setting or 'stored'} (recall@100 {statistic} {cal.get('recall', cal.get(statistic, '?'))} >= "
            f"{cal.get('target')}, {cal.get('queries', '?')} query papers)")
