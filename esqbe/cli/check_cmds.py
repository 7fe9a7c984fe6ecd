"""`esqbe check`: measurements of the user's own index and machine. `check recall`: the first stage's kNN against
exact search; `check speed`: what indexing costs on this machine (esqbe.index.speed)."""
from __future__ import annotations

import json
import sys

import click

from esqbe.index.speed import PAPERS_MAX, PAPERS_MIN, SECONDS_DEFAULT, SECONDS_MAX, SECONDS_MIN
from esqbe.settings.generate import LazyChoice

from .errors import handle_errors
from .options import FACET_CHOICES, _open, click_options, config_option


@click.group("check")
def check_group():
    """Measure what an index does (recall of its approximate kNN) and what indexing costs here (speed)."""


@check_group.command("recall")
@click.option("--queries", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="Query papers sampled (seeded) from the index.")
@click.option("--facet", type=LazyChoice(FACET_CHOICES), help="Only this facet (default: every facet).")
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


@check_group.command("speed")
@click.option("--seconds", type=click.IntRange(SECONDS_MIN, SECONDS_MAX), default=SECONDS_DEFAULT, show_default=True,
              help="Time the measurements share (loading the models comes on top: a few seconds each).")
@click.option("--papers", type=click.IntRange(PAPERS_MIN, PAPERS_MAX),
              help="At most this many papers per measurement (default: as many as its share of --seconds allows).")
@click.option("--no-runtimes", is_flag=True, help="Measure only the fp32 forward pass and the default run.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@handle_errors
def check_speed_cmd(seconds, papers, no_runtimes, as_json):
    """Papers/s of `esqbe index` on this machine, and of each encoder runtime here, against an fp32 forward pass.

    \b
    On 300 real abstracts shipped with esqbe (CSAbstruct, labels removed): a plain fp32 PyTorch forward pass
    (the reference), the default `esqbe index` run (tagging, encoding, writing into a temporary index that is
    removed), and the encoder alone on each runtime here (torch, torch-int8, onnx, onnx-int8; torch on a CUDA
    GPU when there is one). Printed: papers/s, the ratio to the fp32 forward pass, hours per million papers,
    and the CPU features that decide them (AVX2, AVX-512, VNNI, AMX, BF16; the GPU's name). Progress goes to
    stderr. Exit status 0 when measured (a runtime this machine cannot run is listed as skipped), an error's
    own status when the reference or the default run could not be measured, 130 on Ctrl-C or SIGTERM.
    """
    import signal

    from esqbe.index.speed import check_speed

    def terminated(signum, _frame):  # SIGTERM (a job killed): unwind as Ctrl-C does, so the temporary index goes too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    try:
        report = check_speed(seconds=seconds, papers=papers, runtimes=not no_runtimes,
                             progress=lambda m: click.echo(f"esqbe: {m}", err=True))
    except KeyboardInterrupt:  # the temporary index is gone (check_speed removes it on the way out)
        click.echo("interrupted: nothing measured, the temporary index removed", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    m = report.machine
    flags = ", ".join(f for f, on in m["flags"].items() if on) or "unknown"
    click.echo(f"CPU: {m['cpu']} ({m['arch']}, {m['cores']} cores; {flags})")
    click.echo(f"int8 kernels: {m['int8_kernels']}" + (f"; GPU: {m['gpu']}" if m["gpu"] else "; no GPU"))
    click.echo(f"{report.sample['papers']} abstracts ({report.sample['source']}); {report.threads} threads; "
               f"{report.seconds:.0f} s in all")
    for rate in [report.fp32_forward, report.default, *report.runtimes]:
        click.echo(_rate_line(rate) + ("" if report.reliable or rate.skipped else "  (unreliable)"))
    d = report.disturbance
    if not report.reliable:
        click.echo(f"warning: UNRELIABLE: {d['reason']} while measuring (esqbe's own CPU {d['own_cpu_seconds']:.0f} s "
                   f"in {d['wall_seconds']:.0f} s; load {d['load_before']} -> {d['load_after']}): the figures are lower "
                   "than this machine gives alone; run again when it is idle", err=True)
        click.echo(f"UNRELIABLE: {d['reason']} while measuring; run again when the machine is idle")


def _rate_line(rate) -> str:
    if rate.skipped:
        return f"{rate.name:>58}: skipped ({rate.skipped})"
    ratio = f"{rate.ratio_to_fp32_forward:.2f}x" if rate.ratio_to_fp32_forward is not None else "1.00x (reference)"
    return (f"{rate.name:>58}: {rate.papers_per_s:7.1f} papers/s  {ratio:>17} the fp32 forward pass  "
            f"{rate.hours_per_million:6.1f} h per million  [{rate.papers} papers in {rate.seconds:.1f} s]")
