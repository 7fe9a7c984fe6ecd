"""Commands that ask an index: query (papers similar in one aspect) and cite (the sentences a citation
refers to)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import click

from esqbe.core.textsafe import printable, printable_tree
from esqbe.query.export import EXPORT_FORMATS
from esqbe.settings.generate import LazyChoice

from .errors import handle_errors
from .options import (
    FACET_CHOICES,
    _open,
    _parse_params,
    click_options,
    config_option,
    open_settings,
    overrides_from_click,
    query_text_or_file,
    text_or_file,
)
from .output import echo_json, hit_head, say

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_math():
    """A query's matrices are small: one BLAS/OpenMP thread answers faster than a pool that must wake up
    (several times faster on a busy machine). Only for commands that do not encode or build indexes,
    and only before numpy is loaded (the commands import the library lazily)."""
    if "numpy" not in sys.modules:
        for var in _THREAD_VARS:
            os.environ.setdefault(var, "1")


#: the options that say what a query asks: its examples (a paper, several, a text), papers to avoid, the facet or
#: sentences and the filters; `esqbe query` and `esqbe graph` take them alike (`query_input_options`, `QueryArgs`)
_QUERY_INPUT = [
    click.option("--paper", "paper_ids", multiple=True, metavar="ID[:FACET|:sentences=I,J]",
                  help="Query paper id (must be in the index). Repeat it for a query of several examples, each with its own "
                       "facet (ID:method) or sentences (ID:sentences=1,3), else --facet's."),
    click.option("--not", "avoid", multiple=True, metavar="ID[:FACET]",
                  help="A paper the hits should not resemble (repeatable; its --facet sentences, or ID:FACET's). It and "
                       "the examples are never hits."),
    click.option("--facet", type=LazyChoice((*FACET_CHOICES, "all")),
                  help="Use the query paper's sentences labelled with this facet (all: every sentence; default: the "
                       "setting default_facet, else every sentence)."),
    click.option("--sentences", help="Use these sentences of the query paper or --text instead (0-based indices, e.g. 0,2)."),
    click.option("--text", help="Query with this abstract text (a paper not in the index)."),
    click.option("--file", "text_file", type=click.File("r"), help="Query with the abstract in this file (- for stdin)."),
    click.option("--title", default="", help="Title of the --text/--file paper (helps contextual vectors)."),
    click.option("--filter", "filters", multiple=True, metavar="COND",
                  help="Only papers whose metadata satisfies COND, applied before ranking (repeatable, all must hold): "
                       "'year>=2019', 'venue in (ACL, EMNLP)', 'author!=\"Jane Doe\"', 'external_ids.doi exists'. "
                       "Operators = != < <= > >= in, not in, exists, not exists; for text ~= (any case: 'venue~=arxiv') "
                       "and ^= (prefix, any case: 'author^=masashi'). An unknown key or a value no paper has is an "
                       "error that names the index's keys or the near values."),
    click.option("--engine-filter", metavar="JSON", help="Elasticsearch/OpenSearch only: a query DSL clause the papers must also match, e.g. '{\"term\": {\"lang\": \"en\"}}'."),
]


def query_input_options(command):
    """`command` with the query's input options (`_QUERY_INPUT`), in their order."""
    for option in reversed(_QUERY_INPUT):
        command = option(command)
    return command


@dataclass
class QueryArgs:
    """What `query_input_options` and the settings flags ask, checked as usage before the index is opened or the model
    loaded (a filter's grammar, the text's caps, the examples' rules): the arguments of `Index.query` (`Index.graph`)."""

    paper_id: str | None
    facet: str | None
    chosen: list[int] | None
    text: str | None
    title: str
    #: a query of several examples or with papers to avoid: (examples, avoid) as mappings; None: one paper or text
    examples: tuple[list[dict], list[dict]] | None
    flt: Any  # the filter (esqbe.core.filters.MetadataFilter), None without one
    overrides: dict
    settings: Any  # esqbe.settings.config.Settings, which opens the index

    @classmethod
    def read(cls, kw, paper_ids, avoid, facet, sentences, text, text_file, title, filters, engine_filter) -> QueryArgs:
        """From the options (`kw`: the settings flags, popped), as `esqbe query` takes them."""
        if kw.get("rescorer") is not None:  # a usage error (2), like --facet's choices, not a failed run
            from esqbe.settings.config import check_value

            reason = check_value("rescorer", kw["rescorer"])
            if reason:
                raise click.BadParameter(reason, param_hint="--rescorer")
        from esqbe.core.filters import FilterError, parse_filter
        from esqbe.index.api import make_filter

        for cond in filters:
            try:
                parse_filter(cond)
            except FilterError as e:
                raise click.BadParameter(str(e), param_hint="--filter") from None
        try:
            flt = make_filter(list(filters), engine_filter)
        except FilterError as e:
            raise click.BadParameter(str(e), param_hint="--engine-filter") from None
        text = query_text_or_file(text, text_file)  # refused past the caps before the index or the model is opened
        examples = _examples(paper_ids, avoid, sentences, text, title)
        paper_id = paper_ids[0] if paper_ids else None
        if examples is not None:
            paper_id = text = None
        elif (paper_id is None) == (text is None):
            raise click.UsageError("give --paper ID (a paper in the index) or --text/--file (a paper that is not), "
                                   "not both" if paper_id is not None else
                                   "give --paper ID (a paper in the index) or --text/--file (a paper that is not)")
        if text is None and not (examples and any("text" in e for e in examples[0])):
            _single_threaded_math()  # --paper: no encoder runs in this process
        chosen = None
        if sentences is not None:
            try:
                chosen = [int(x) for x in sentences.split(",") if x.strip()]
            except ValueError:
                raise click.BadParameter("expected comma-separated sentence indices, e.g. 0,2",
                                         param_hint="--sentences") from None
        overrides = overrides_from_click(kw, "query", ("query",))
        settings = open_settings(kw, "query")
        if facet == "all":
            facet = None
        elif facet is None and chosen is None:
            facet = settings.default_facet  # a config's `default_facet: method`
        return cls(paper_id, facet, chosen, text, title, examples, flt, overrides, settings)

    def index_arguments(self) -> dict:
        """The keyword arguments of `Index.query` (and `Index.graph`) for this query."""
        flt, ex = self.flt, self.examples
        return {"paper_id": self.paper_id, "facet": self.facet, "sentences": None if ex else self.chosen,
                "text": self.text, "title": self.title, "examples": ex[0] if ex else None,
                "avoid": ex[1] if ex else None, "filters": list(flt.conditions) if flt else None,
                "engine_filter": flt.engine_query if flt else None, **self.overrides}


@click.command("query")
@query_input_options
@click.option("--json", "as_json", is_flag=True, help="Print hits as JSON.")
@click.option("--format", "export_format", type=LazyChoice(tuple(EXPORT_FORMATS)),
              help="Print the hits as CSV, BibTeX, RIS or CSL-JSON (each with its abstract, authors, year, venue, DOI, "
                   "the entry type and citation key it came with) to import into a reference manager, e.g. "
                   "--format bibtex > similar.bib.")
@click.option("--with-scores", is_flag=True,
              help="--format: write each hit's rank, score and similarity too (a BibTeX/RIS note, CSL-JSON custom, "
                   "CSV columns); left out by default, as a reference manager keeps them as notes.")
@click.option("--server", "server_url", metavar="URL",
              help="Ask the `esqbe serve` at URL (its index, its settings and your flags; a private one gets the token "
                   "in ESQBE_TOKEN); fails if it cannot answer. "
                   "Default: a server running on this same index with these settings answers when there is one "
                   "(its model is warm: no loading), else the query runs here.")
@click.option("--no-server", is_flag=True, help="Answer here, even when an `esqbe serve` runs on this index.")
@click.option("--server-timeout", type=click.FloatRange(0, 3600, min_open=True), default=60, show_default=True,
              help="Seconds the whole exchange with a server may take (connecting, its proof, the answer), however it drips.")
@click.option("--quiet", "-q", is_flag=True, help="Do not say on stderr that a server answered.")
@click_options("query")
@config_option
@handle_errors
def query_cmd(paper_ids, avoid, facet, sentences, text, text_file, title, filters, engine_filter, as_json,
              export_format, with_scores, server_url, no_server, server_timeout, quiet, **kw):
    """Papers most similar to one paper in one aspect, with the sentences that matched.

    \b
    esqbe query --paper 1791179 --facet method          # the paper's sentences labelled method
    esqbe query --paper 1791179 --sentences 0,2         # any sentences you choose (numbers: esqbe show ID)
    esqbe query --text "We propose ..." --facet result  # a paper not in the index
    esqbe query --paper 1791179 --facet method --filter 'year>=2019' --filter 'venue in (ACL, EMNLP)'
    esqbe query --paper 1791179 --facet method --format bibtex > similar.bib   # or csv, ris
    esqbe query --paper A --paper B --facet method --not C   # like A and B in their method, unlike C's
    esqbe query --paper A:method --paper B:sentences=1,3 --text "We propose ..." --not C:result
    While `esqbe serve` runs on the same index, it answers (its model is loaded: a --text query does not
    wait ~10 s for loading); --no-server answers here, --server URL asks another server.
    """
    if as_json and export_format:
        raise click.UsageError("give --json or --format, not both")
    if with_scores and not export_format:
        raise click.UsageError("--with-scores goes with --format (the text and --json show the scores anyway)")
    if server_url is not None and no_server:
        raise click.UsageError("give --server URL or --no-server, not both")
    args = QueryArgs.read(kw, paper_ids, avoid, facet, sentences, text, text_file, title, filters, engine_filter)
    if args.examples is not None:
        if server_url is not None:
            raise click.UsageError("--server: a query of several examples or with --not is answered here "
                                   "(leave out --server)")
        no_server = True
    settings, flt = args.settings, args.flt
    result = None
    if not no_server:
        result = _from_server(settings, server_url, server_timeout, quiet, paper_id=args.paper_id, facet=args.facet,
                              sentences=args.chosen, text=args.text, title=title, filters=list(filters),
                              engine_filter=flt.engine_query if flt else None, overrides=args.overrides)
    if result is None:
        import esqbe

        with esqbe.open_index(settings=settings, create=False) as index:
            answer = index.query(**args.index_arguments())
            # an export carries each hit's abstract: its sentences
            result = answer.to_dict(index.get([h.paper_id for h in answer.hits]) if export_format else None)
    elif export_format:
        _abstracts_from_here(result, settings)
    for note in result.get("notes") or []:  # e.g. fewer hits than asked: said on stderr, beside any output
        say(f"esqbe: note: {printable(note)}", err=True)
    if as_json:
        echo_json(result)
        return
    if export_format:
        from esqbe.query.export import export_hits

        click.echo(export_hits(result, export_format, with_scores=with_scores), nl=False)
        return
    _print_result(printable_tree(result), chosen=args.chosen is not None, filters=printable_tree(list(filters)),
                  engine_filter=printable(engine_filter) if engine_filter else None)


def _abstracts_from_here(result: dict, settings) -> None:
    """A server's result has no hit's sentences: each hit's from this index (the one the server answered for, a
    discovery record says so), where it can be read here; else the export goes without those abstracts."""
    import esqbe

    wanted = [h["paper_id"] for h in result.get("hits") or [] if h.get("sentences") is None]
    if not wanted:
        return
    try:
        with esqbe.open_index(settings=settings, create=False) as index:
            papers = index.get(wanted)
    except Exception:  # noqa: BLE001  # not readable here (a server elsewhere): no abstracts, said on stderr
        say("esqbe: warning: the hits' abstracts cannot be read from this machine's index; the export has none",
            err=True)
        return
    from esqbe.query.results import sentences_json

    for h in result["hits"]:
        if h.get("sentences") is None and h["paper_id"] in papers:
            h["sentences"] = sentences_json(papers[h["paper_id"]])


def _example(value: str, option: str, sentences_allowed: bool = True) -> dict:
    """`ID`, `ID:FACET` or `ID:sentences=1,3` as an example mapping (a paper id may hold colons: only a known
    suffix is read as the facet or the sentences)."""
    pid, _, suffix = value.rpartition(":")
    if pid and suffix in FACET_CHOICES:
        return {"paper_id": pid, "facet": suffix}
    if pid and suffix.startswith("sentences="):
        if not sentences_allowed:
            raise click.BadParameter(f"{value}: a paper to avoid takes a facet (ID:method), not sentences",
                                     param_hint=option)
        try:
            chosen = [int(x) for x in suffix[len("sentences="):].split(",") if x.strip()]
        except ValueError:
            chosen = []
        if not chosen:
            raise click.BadParameter(f"{value}: expected ID:sentences=I,J with 0-based indices, e.g. {pid}:sentences=0,2",
                                     param_hint=option)
        return {"paper_id": pid, "sentences": chosen}
    if not value.strip():
        raise click.BadParameter("an empty paper id", param_hint=option)
    return {"paper_id": value}


def _examples(paper_ids, avoid, sentences, text, title) -> tuple[list[dict], list[dict]] | None:
    """The examples and papers to avoid of a query of several (None: the single-paper query), checked as usage."""
    if len(paper_ids) <= 1 and not avoid and not (paper_ids and text is not None):
        if paper_ids and ":" in paper_ids[0]:  # ID:FACET on its own is a query of one example too
            one = _example(paper_ids[0], "--paper")
            if len(one) > 1:
                return [one], []
        return None
    if sentences is not None:
        raise click.UsageError("with several --paper (or --not), choose sentences per paper: --paper ID:sentences=1,3")
    examples = [_example(v, "--paper") for v in paper_ids]
    if text is not None:
        examples.append({"text": text, "title": title})
    avoided = [_example(v, "--not", sentences_allowed=False) for v in avoid]
    from esqbe.index.api import check_examples
    from esqbe.query.results import ExampleSpec, QueryError

    try:
        check_examples([ExampleSpec.of(e) for e in examples], [ExampleSpec.of(a) for a in avoided])
    except QueryError as e:
        raise click.UsageError(str(e)) from None
    return examples, avoided


def _from_server(settings, url, timeout, quiet, **query) -> dict | None:
    """The result from a running `esqbe serve` (esqbe.server.client.ask_server): the one named by `url`, else one
    serving this index with these settings; None to answer here. Says on stderr which answered, or why none did."""
    from esqbe.server.client import NotSendable, ask_server

    try:
        answer = ask_server(settings, url=url, timeout=timeout,
                            token=os.environ.get("ESQBE_TOKEN") if url is not None else None, **query)
    except NotSendable as e:  # only with --server: what the command line asks cannot go over HTTP
        raise click.UsageError(f"--server: this query cannot be sent to a server: {e} (leave out --server)") from None
    for line in answer.warnings:  # a server's words: shown, never obeyed
        say(f"esqbe: warning: {printable(line)}", err=True)
    for line in ([] if quiet else [*answer.notes, *([answer.served] if answer.served else [])]):
        say(f"esqbe: {printable(line)}", err=True)
    return answer.result


def _print_result(result: dict, *, chosen: bool, filters, engine_filter) -> None:
    """A query's result (its one JSON shape, esqbe.query.results, from here or from a server) for people;
    every string in it already `printable_tree` (one line each, no control character)."""
    query = result["query"]
    facet = query["facet"]
    who = f"paper {query['paper_id']}" if query["paper_id"] else "query text"
    what = f"facet {facet}" if facet else "chosen sentences" if chosen else "all sentences"
    say(f"{who}, {what}, rescorer {result['rescorer']}:")
    if query.get("selection") is not None:
        say(f"  query = {query['selection']['rule']}:")
        for q in query["sentences"]:
            soft = q.get("probabilities") or {}
            p = f", p({facet}) {q['probability']:.2f}" if q["probability"] is not None else \
                f", p {soft[q['facet']]:.2f}" if q["facet"] in soft else ""  # the tagger's label, how sure it was
            say(f"  [{q['index']}] ({q['facet']}{p}) {q['text']}")
    else:
        for q in query["sentences"]:
            say(f"  [{q['index']}] {q['text']}")
    if len(query.get("examples") or []) > 1 or query.get("avoid"):
        say("  examples: " + "; ".join(_example_line(n, e) for n, e in enumerate(query["examples"])))
        if query.get("avoid"):
            say("  not like: " + "; ".join(_example_line(None, e) for e in query["avoid"]))
    if filters or engine_filter:
        say("  filtered: " + "; ".join([*filters, *([f"engine {engine_filter}"] if engine_filter else [])]))
    hits = result["hits"]
    if not hits:
        say("no hits" + (" (no paper satisfies the filters)" if filters or engine_filter else ""))
    else:
        formula = (result.get("score") or {}).get("formula") or "what the hits are ordered by"
        say(f"\nscore: {formula}; the query and the paper alone decide it. (sim, bm25: its parts; the number before "
            "each hit is its position)")
        scale = result.get("scale") or {}
        if scale.get("source") in ("index", "fixed"):
            say(f"[strong/fair/weak, pN]: where the score stands on {scale['description']}"
                + ("; pN: higher than N% of them" if scale["source"] == "index" else ""))
    versions = False
    for hit in hits:
        if hit.get("rank") is None and not versions:
            versions = True
            say("\nlikely versions of the query or of a hit above (nearly the same sentences; not numbered):")
        say("")
        for line in hit_head(hit):
            say(line)
        line = _metadata_line(hit["metadata"])
        if line:
            say(f"       {line}")
        several = len(query.get("examples") or []) > 1
        for m in hit["matches"][:2]:
            ex = f"example {m.get('example', 0) + 1} " if several else ""
            say(f"       {ex}query [{m['query_index']}] ~ [{m['candidate_index']}] ({m['candidate_facet']}, "
                f"{m['weight']:.3f}): {_short(m['candidate_sentence'])}")
        for a in hit.get("avoided") or []:
            if a["penalty"] > 0 and a["candidate_index"] is not None:
                say(f"       pulled down {a['penalty']:.3f} by {a['paper_id']} [{a['avoid_index']}] ~ "
                    f"[{a['candidate_index']}]: {_short(a['candidate_sentence'] or '')}")


def _example_line(n: int | None, example: dict) -> str:
    """`1. A (method: sentences 2, 3)` for the list of a query's examples (or papers to avoid)."""
    what = example["facet"] or "sentences"
    name = example["paper_id"] if example["paper_id"] is not None else "the text"
    head = f"{n + 1}. " if n is not None else ""
    return f"{head}{name} ({what}: sentences {', '.join(str(s['index']) for s in example['sentences'])})"


def _metadata_line(meta: dict) -> str:
    """year · venue · first authors · doi/arXiv, for the human-readable hit list (all of it is in --json)."""
    parts = []
    if meta.get("year") is not None:
        parts.append(str(meta["year"]))
    venue = meta.get("venue") or meta.get("journal")
    if venue:
        parts.append(_short(str(venue), 60))
    from esqbe.index.browse import author_names

    authors = author_names(meta)
    if authors:
        parts.append(", ".join(authors[:3]) + (" et al." if len(authors) > 3 else ""))
    ids = meta.get("external_ids")
    ids = ids if isinstance(ids, dict) else {}  # (metadata is free-form: any shape may come)
    for key, label in (("doi", "doi:"), ("arxiv", "arXiv:"), ("acl", "ACL:")):
        if ids.get(key):
            parts.append(f"{label}{ids[key]}")
            break
    return " · ".join(parts)


def _short(s: str, n: int = 160) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@click.command("cite")
@click.option("--paper", "paper_id", required=True, help="The cited paper (must be in the index).")
@click.option("--text", help="The citing sentence.")
@click.option("--file", "text_file", type=click.File("r"), help="Read the citing sentence from this file (- for stdin).")
@click.option("--k", "-k", type=click.IntRange(1, 1000), default=2, show_default=True, help="Number of sentences to return.")
@click.option("--param", "params", multiple=True, help="Matcher option KEY=VALUE (repeatable): method=asym|symm|bm25, d=4, alpha=1e-4, words=DIR, max_tokens=100, markers, stopwords, exact, weights, bm25_weight.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click_options("cite")
@config_option
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
    text = text_or_file(text, text_file)
    if text is None or not text.strip():
        raise click.UsageError("give the citing sentence with --text or --file")
    with _open(kw, "cite", create=False) as index:
        result = index.cite(paper_id, " ".join(text.split()), k=k, **_parse_params(params))
    if as_json:
        echo_json(result.to_dict())
        return
    say(f"paper {printable(result.paper_id)}, method {result.method}: sentences cited by\n  "
        f"{_short(printable(result.text), 300)}")
    bm25 = result.method == "bm25"
    say("score: the sentence's " + ("BM25 score for the citing words" if bm25 else
        f"{result.method} match score"), nl=False)
    say("; matched: the citing words it shares" if bm25 else
        "; matched: citing word ~ its closest word in the sentence (cosine, weight: the citing word's share)")
    for hit in result.hits:
        say(f"\n{hit.rank:>3}. score {hit.score:.4f}  sentence {hit.sentence_id}: {_short(printable(hit.text), 300)}")
        if hit.matches:
            say("       matched: " + printable(", ".join(
                m.query_word if bm25 else
                f"{m.query_word}" + (f"~{m.matched_word}" if m.matched_word != m.query_word else "")
                + f" ({m.cosine:.2f}, w {m.weight:.2f})" for m in hit.matches)))
