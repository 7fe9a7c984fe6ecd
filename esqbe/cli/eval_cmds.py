"""`esqbe eval csfcube` and `esqbe eval clscisumm`: ranking quality on a test collection."""
from __future__ import annotations

import json
import sys

import click

from esqbe.settings.generate import LazyChoice
from esqbe.settings.table import FACET_MODES

from .errors import handle_errors
from .options import _parse_params, click_options, overrides_from_click


@click.command("csfcube")
@click.option("--data", "data_dir", required=True, type=click.Path(exists=True, file_okay=False), help="CSFCube release directory (abstracts-csfcube-preds.jsonl, test-pid2anns-csfcube-*.json, evaluation_splits.json).")
@click.option("--out", type=click.Path(file_okay=False), help="Write OUT/<config>.run (TREC) and merge OUT/results.json.")
@click.option("--index-path", type=click.Path(file_okay=False), help="Index to build or reuse (default: .esqbe-eval/csfcube-<model>-<mode>-<labels>).")
@click.option("--labels", "facets", type=LazyChoice([m for m in FACET_MODES if m != "none"]), default="keep", show_default=True, help="keep: the collection's sentence labels; predict: every paper's labels replaced by esqbe's tagger.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file.")
@click.option("--feedback", "feedback", metavar="P,N", help="Relevance feedback on the residual collection: a user marks "
              "up to P relevant (grade >= 2) and N non-relevant (grade 0) of the first 10 hits; the query of those "
              "examples is scored against the baseline over the pool less the marked papers (OUT: "
              "baseline-residual.run, feedback.run, residual-qrels/). Usually 2,1.")
@click_options("eval csfcube")
@handle_errors
def eval_csfcube_cmd(data_dir, out, index_path, facets, as_json, config, feedback, **kw):
    """Re-rank every CSFCube query's pool through esqbe's query path and print the collection's metrics.

    \b
    Prints RP, P@20, R@20, MAP and NDCG%20 per facet and for all facets, for every split whose
    queries are all judged (fold1_dev for ../shared/data/csfcube-dev; dev and test for the full release).
    Each configuration is one command, e.g.:
      esqbe eval csfcube --data DIR --rescorer ot --param tau=0.5 --out runs/
    With --feedback P,N: the residual-collection feedback runs instead (esqbe/evaluation/feedback.py).
    """
    from esqbe.evaluation.evaluate import (
        check_conformance,
        evaluate_csfcube,
        format_table,
    )
    from esqbe.settings.config import load_settings

    overrides = overrides_from_click(kw, "eval csfcube")
    settings = load_settings(config, **overrides)
    if feedback is not None:
        from esqbe.errors import ParameterError
        from esqbe.evaluation.feedback import evaluate_feedback, format_feedback, parse_feedback

        try:
            counts = parse_feedback(feedback)
        except ParameterError as e:
            raise click.BadParameter(str(e), param_hint="--feedback") from None
        fed = evaluate_feedback(data_dir, settings, counts, facets=facets, index_path=index_path, out=out,
                                progress=sys.stderr.isatty())
        click.echo(json.dumps({k: v for k, v in fed.to_dict().items() if k != "per_query"}, indent=2) if as_json
                   else format_feedback(fed))
        return
    conformance = check_conformance(data_dir)
    result = evaluate_csfcube(data_dir, settings, facets=facets, index_path=index_path, out=out,
                              progress=sys.stderr.isatty(), config_file=config)
    if as_json:
        data = {"name": result.name, "config": result.config, "splits": result.splits}
        if conformance:
            data["conformance"] = {"verdict": conformance[0], "splits": conformance[1].splits}
        click.echo(json.dumps(data, indent=2))
        return
    if conformance:
        click.echo(format_table(conformance[1]))
        click.echo(conformance[0] + "\n")
    click.echo(format_table(result))


@click.command("clscisumm")
@click.option("--data", "data_dir", required=True, type=click.Path(exists=True, file_okay=False), help="CL-SciSumm directory (derived/<split>-citances.jsonl, derived/<split>-reference-sentences.jsonl, gold CSVs).")
@click.option("--out", type=click.Path(file_okay=False), help="Write OUT/<split>.jsonl runs, OUT/official/<split>-k<K>/ (the official CSV layout) and merge OUT/results.json.")
@click.option("--index-path", type=click.Path(file_okay=False), help="Index of the reference papers to build or reuse (default: .esqbe-eval/clscisumm-<model>-<mode>).")
@click.option("--split", "splits", multiple=True, help="Only these splits (default: every split under DATA/derived).")
@click.option("--k", "-k", type=int, default=2, show_default=True, help="Sentences per citance that are scored (runs list at least 10).")
@click.option("--param", "params", multiple=True, help="Matcher option KEY=VALUE (repeatable): method, d, alpha, weights, words, max_tokens, markers, stopwords, exact, bm25_weight.")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), help="YAML mapping of matcher options (flags override it).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click_options("eval clscisumm")
@handle_errors
def eval_clscisumm_cmd(data_dir, out, index_path, splits, k, params, config, as_json, **kw):
    """CL-SciSumm Task 1a: rank each citing sentence's reference sentences through `esqbe cite`'s path
    and score them with the official metric (task1_eval.py, reproduced, quirks included).

    \b
    Indexes the reference papers of every split under DATA/derived, ranks each citance's paper, and
    prints micro precision, recall and F1 at K for every split with gold (train). When DATA ships
    conformance/ runs, they are scored first and must match the official script's figures exactly.
    Token vectors: the encoder's (default); --param words=DIR uses `esqbe train-words` vectors;
    --param words=auto trains word2vec once on DATA's unlabelled paper text (the packed ScisummNet
    papers, the reference and citing papers' XML) into .esqbe-eval/clscisumm-words and uses it.
    Each configuration is one command, e.g.:
      esqbe eval clscisumm --data ../shared/data/clscisumm --param words=auto --param d=1
      esqbe eval clscisumm --data ../shared/data/clscisumm --param method=bm25
    """
    from esqbe.evaluation.clscisumm import (
        check_conformance,
        evaluate_clscisumm,
        format_result,
    )
    from esqbe.query.cite import CiteOptions
    from esqbe.settings.config import load_settings

    options: dict = {}
    if config:
        import yaml

        try:
            options = yaml.safe_load(open(config).read()) or {}
        except yaml.YAMLError as e:
            raise click.BadParameter(f"{config}: not valid YAML: {e}", param_hint="--config") from None
        if not isinstance(options, dict):
            raise click.BadParameter(f"{config}: expected a mapping of matcher options", param_hint="--config")
    options.update(_parse_params(params))
    if options.get("words") == "auto":
        from esqbe.evaluation.clscisumm import ensure_words

        options["words"] = ensure_words(data_dir, log=lambda msg: click.echo(msg, err=True))
    cite_options = CiteOptions.from_params(options)
    if k < 1:
        raise click.BadParameter("must be at least 1", param_hint="-k")
    settings = load_settings(None, **{key: v for key, v in kw.items() if v is not None})
    conformance = check_conformance(data_dir)
    result = evaluate_clscisumm(data_dir, settings, cite_options, k=k, index_path=index_path, out=out,
                                splits=list(splits) or None, progress=sys.stderr.isatty())
    if as_json:
        data = result.to_dict()
        if conformance:
            data["conformance"] = {"verdict": conformance[0], "runs": conformance[1]}
        click.echo(json.dumps(data, indent=2))
        return
    if conformance:
        for row in conformance[1]:
            click.echo(f"  {row['run']:<24} K={row['k']:<3} P {row['precision']:.12g}  R {row['recall']:.12g}  F1 {row['f1']:.12g}")
        click.echo(conformance[0] + "\n")
    click.echo(format_result(result))
