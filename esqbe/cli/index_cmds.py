"""Commands that write or inspect an index: index, encode, attach, delete, stats."""
from __future__ import annotations

import contextlib
import json
import signal
import sys

import click

from esqbe.core.textsafe import printable, printable_tree
from esqbe.settings.generate import LazyChoice
from esqbe.settings.table import FORMATS, INDEX_FORMATS

from .errors import EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM, EXIT_STORAGE, handle_errors
from .options import _open, click_options, config_option
from .output import say

#: what each input format is, for `index --help` (every format is listed: a name missing here shows alone)
FORMAT_HELP = {
    "s2orc": "S2ORC metadata (JSON Lines)",
    "s2ag-abstracts": "Semantic Scholar Datasets `abstracts`",
    "s2ag-s2orc": "Semantic Scholar Datasets `s2orc`",
    "csfcube": "the CSFCube release",
    "csabstruct": "CSAbstruct (labelled sentences)",
    "jsonl": 'plain JSON Lines {"id", "title", "abstract", "facets"?}',
    "arxiv": "arXiv's metadata snapshot (Kaggle's JSON Lines)",
    "openalex": "OpenAlex works (JSON Lines)",
    "bibtex": "BibTeX (Zotero, JabRef; a first line starting with @ or %)",
    "ris": "RIS (a first line `TY  - `)",
    "csl-json": "CSL-JSON (Zotero's own; a JSON array of objects)",
    "parquet": "pre-encoded input from `esqbe encode` (*.parquet)",
    "zotero": "Zotero's own database (zotero.sqlite; read-only, also while Zotero runs)",
}


def _formats_help() -> str:
    width = max(map(len, INDEX_FORMATS))
    # the docstring's own indentation (click dedents the help as a whole)
    return "\n    ".join(f"  {name.ljust(width)}  {FORMAT_HELP.get(name, '')}".rstrip() for name in INDEX_FORMATS)


@click.command("index")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--format", "fmt", type=LazyChoice(INDEX_FORMATS), help="Input format (default: detected per file; *.parquet is pre-encoded input).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line or unreadable file (exit status 1), keeping the papers read before it, instead of reporting it and going on.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (every skipped record in `skipped_records`).")
@click.option("--skipped", "skipped_path", type=click.Path(dir_okay=False, writable=True),
              help="Write every skipped record (file, line, id, title, reason) to this file as JSON Lines.")
@click.option("--quiet", "-q", is_flag=True, help="No progress (a bar on a terminal, else a line every 10 s).")
@click_options("index")
@config_option
@handle_errors
def index_cmd(files, fmt, strict, facets, as_json, skipped_path, quiet, **kw):
    """Index papers from FILES (JSONL, .gz, or - for stdin); re-indexing the same file changes nothing.

    \b
    Formats, detected per file (or named with --format):
    {formats}

    A BibTeX/RIS record without an abstract takes it from its attached PDF (`file`, `L1`) when that is readable;
    records without an abstract are skipped and named (file:line, id, reason: the first 10, all with --json or
    --skipped FILE); malformed lines and missing files are
    reported as file:line: field: reason and the run goes on (unless --strict). Exit status: 0 done,
    1 bad input/settings or nothing could be indexed, 2 usage, 3 the index could not be written.
    FILE.parquet is pre-encoded input (`esqbe encode`): loaded without running a model, its
    `esqbe` metadata (model, dim, encoder mode) checked against the index.
    """
    from esqbe.index.api import StorageError

    if skipped_path is not None:  # found before an hour of indexing, not after
        import os

        folder = os.path.dirname(os.path.abspath(skipped_path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise click.BadParameter(f"cannot write {skipped_path}: {folder} is not a writable directory",
                                     param_hint="--skipped")
    try:
        report, stopped, held = _run_index(kw, files, fmt, strict, facets, as_json, quiet)
    except KeyboardInterrupt as e:  # a second signal: stopped where it was; SQLite rolled the open transaction back
        name = str(e) or "SIGINT"
        say(f"esqbe: {name} again: stopped at once, without a summary; what was committed stays "
            "(`esqbe stats` counts it), run the same command again to index the rest", err=True)
        sys.exit(EXIT_SIGTERM if name == "SIGTERM" else EXIT_SIGINT)
    _print_index_report(report, as_json)  # always: what went in, even when the run stopped
    if skipped_path is not None:
        _write_skipped(skipped_path, report)
    if report.interrupted and stopped is None:
        say(printable(report.interrupt_message(held)), err=True)
        sys.exit(EXIT_SIGTERM if report.interrupted == "SIGTERM" else EXIT_SIGINT)
    if isinstance(stopped, StorageError):
        say(f"error: {stopped}", err=True)
        sys.exit(EXIT_STORAGE)
    if stopped is not None:
        say(f"error: {stopped}\n({report.stop_message()})", err=True)
        sys.exit(EXIT_ERROR)
    if report.failed:
        say(f"error: {report.failure_message()}", err=True)
        sys.exit(EXIT_ERROR)


index_cmd.help = (index_cmd.help or "").replace("{formats}", _formats_help())  # every format, from the code's list


def _run_index(kw, files, fmt, strict, facets, as_json, quiet):
    """(the run's report, the error it stopped at or None, the papers the index holds after an interrupt or None)."""
    from esqbe.index.api import StorageError
    from esqbe.ingest.readers import InputError

    with _interrupts() as token:
        index = _open(kw, "index")
        held = None
        try:
            try:
                report = index.index_files(list(files), format=fmt, strict=strict, facets=facets,
                                           progress=not quiet and not as_json, stop=token)
                stopped = None
            except (InputError, StorageError) as e:
                if e.report is None:
                    raise
                report, stopped = e.report, e
            if token.cancelled and stopped is None:
                report.interrupted = token.cancelled  # a signal after the last batch: all of it is in
                held = _papers_held(index)
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
    return report, stopped, held


@contextlib.contextmanager
def _interrupts():
    """A cancellation token that SIGINT and SIGTERM cancel (with the signal's name) while the block runs: the index
    run writes what it encoded and stops (IngestMixin.add_papers); a second signal stops at once (KeyboardInterrupt: SQLite rolls back
    the transaction it interrupts). The handlers before are put back after."""
    from esqbe.core.deadline import Deadline

    token = Deadline()

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if token.cancelled:
            raise KeyboardInterrupt(name)
        token.cancel(name)
        print(f"esqbe: {name}: writing the papers encoded so far, then stopping (again: stop at once)",
              file=sys.stderr, flush=True)

    before = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield token
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _papers_held(index) -> int | None:
    """How many papers the index holds now, for an interrupted run's summary (None: it cannot say)."""
    try:
        papers = index.stats().get("papers")
    except Exception:  # noqa: BLE001  # the summary goes on without the total
        return None
    return papers if isinstance(papers, int) else None


def _print_index_report(report, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
        return
    for err in report.errors:
        if err != report.stopped:
            say(f"warning: {printable(err)}", err=True)
    for note in report.repeated:
        say(f"warning: {note}", err=True)
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items())) or "none"
    say(
        f"read {report.read}, indexed {report.indexed}, replaced {report.replaced}, unchanged {report.unchanged}, "
        f"skipped {sum(report.skipped.values())} ({skipped}), errors {len(report.errors)}"
        + (f", tagged {report.tagged}" if report.tagged else "")
        + (f", abstracts from PDFs {report.abstracts_from_pdf}" if report.abstracts_from_pdf else "")
        + f" in {report.seconds:.1f}s"
    )
    for note in report.notes:
        say(f"  {printable(note)}")
    for line in report.skipped_lines(10):
        say(f"  skipped {line}" if not line.startswith("and ") else f"  {line} (all of them: --json, or --skipped FILE)")
    for line in report.merge_lines(10):
        say(f"  {line}")


def _write_skipped(path: str, report) -> None:
    """Every skipped record of the run as JSON Lines (an empty file when none was skipped)."""
    from esqbe.errors import StorageError

    try:
        with open(path, "w", encoding="utf-8") as f:
            for record in report.skipped_records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError as e:
        raise StorageError(f"cannot write --skipped {path}: {e.strerror or e}") from e


@click.command("encode")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory for the Parquet output (OUT/papers-<i>-of-<n>.parquet).")
@click.option("--shard", default="0/1", show_default=True, help="I/N: encode only the papers whose id hashes to shard I of N (run N of these anywhere).")
@click.option("--format", "fmt", type=LazyChoice(FORMATS), help="Input format (default: detected per file).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line (exit status 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file.")
@click_options("encode")
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
        raise click.BadParameter(f"expected I/N, e.g. 0/4 (got {shard!r})", param_hint="--shard") from None
    if not (n >= 1 and 0 <= i < n):
        raise click.BadParameter(f"I/N needs 0 <= I < N (got {shard!r})", param_hint="--shard")
    index = esqbe.encoder_only(config=config, **{k: v for k, v in kw.items() if v is not None})
    try:
        report = index.encode_files(list(files), out_dir, shard=(i, n), format=fmt, strict=strict, facets=facets,
                                    progress=not quiet and not as_json and sys.stderr.isatty())
    except InputError as e:
        say(f"error: {e} (--strict: stopped; nothing was written)", err=True)
        sys.exit(1)
    summary = report.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for err in report.errors:
        say(f"warning: {printable(err)}", err=True)
    say(f"read {report.read}, encoded {report.encoded} into {report.path}, skipped {sum(report.skipped.values())}, "
               f"errors {len(report.errors)}" + (f", tagged {report.tagged}" if report.tagged else "") + f" in {report.seconds:.1f}s")


@click.command("attach")
@click.option("--id-field", default="_id", show_default=True, help="Field holding each document's paper id (`esqbe query --paper` accepts it; hits are named by _id).")
@click.option("--text-fields", required=True, help="Comma-separated text fields: the title first, then the abstract (or body) fields, e.g. title,abstract.")
@click.option("--reindex-to", metavar="NEW_INDEX", help="OpenSearch indexes created without index.knn: copy into NEW_INDEX (with it) and attach there; an alias named --index is moved to it.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click_options("attach")
@config_option
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
    from esqbe.index.attach import run_attach

    fields = [f.strip() for f in text_fields.split(",") if f.strip()]
    with _open(kw, "attach") as index:
        report = run_attach(index, id_field, fields, facets=facets, reindex_to=reindex_to,
                            progress=not quiet and not as_json and sys.stderr.isatty())
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
        return
    for err in report.errors:
        say(f"warning: {printable(err)}", err=True)
    if report.reindex:
        r = report.reindex
        say(f"copied {r['from']} into {r['created']}" + (" and moved the alias to it" if r["alias_moved"] else
                   f"; to keep using the old name: delete {r['from']} and add alias {r['from']} -> {r['created']}"))
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "none"
    say(f"{report.index}: {report.documents} documents, attached {report.indexed}, updated {report.replaced}, "
               f"unchanged {report.unchanged}, skipped {sum(report.skipped.values())} ({skipped}), errors {len(report.errors)}"
               + (f", tagged {report.tagged}" if report.tagged else "") + f" in {report.seconds:.1f}s")


def _named(given: str) -> str:
    """How a delete's id named the paper it deleted: one of its identifiers (a DOI, an arXiv or PubMed id) or the id
    of a record merged into it."""
    from esqbe.core.workids import identifier_keys

    return "an identifier of" if identifier_keys(given) else "merged into"


@click.command("delete")
@click.argument("paper_ids", nargs=-1, required=True)
@click_options("delete")
@config_option
@handle_errors
def delete_cmd(paper_ids, **kw):
    """Delete papers by id (ids that are not in the index are named; the exit status stays 0)."""
    with _open(kw, "delete", create=False) as index:
        deleted, missing, merged = index.delete_papers(paper_ids)
    say(f"deleted {len(deleted)} of {len(deleted) + len(missing)}"
               + "".join(printable(f"; {p}: {_named(p)} paper {target}, deleted") for p, target in merged.items())
               + (f"; not in the index: {printable(', '.join(missing))}" if missing else ""))


@click.command("stats")
@click.option("--json", "as_json", is_flag=True)
@click_options("stats")
@config_option
@handle_errors
def stats_cmd(as_json, **kw):
    """Papers, sentences per facet, model and size of the index."""
    with _open(kw, "stats", create=False) as index:
        stats = index.stats()
        from esqbe.index.rerank import engine_reranker_status

        reranker = engine_reranker_status(index)  # `esqbe engine install-reranker` in this cluster
        if reranker is not None:
            stats["reranker"] = reranker
    if as_json:
        click.echo(json.dumps(stats, indent=2))
        return
    for key, value in printable_tree(stats).items():  # a path, a model name: one line each, controls shown
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        say(f"{key:>20}: {value}")
