"""Commands that find and inspect: search (papers by words), show (one paper's numbered sentences with
their facets), list (the index's papers, filtered), config (the effective settings and where each came from)."""
from __future__ import annotations

import json

import click

from esqbe.core.textsafe import printable, printable_tree

from .errors import handle_errors
from .options import _open, click_options, config_option
from .output import echo_json, say


def _check_filters(filters) -> None:
    from esqbe.core.filters import FilterError, parse_filter

    for cond in filters:
        try:
            parse_filter(cond)
        except FilterError as e:
            raise click.BadParameter(str(e), param_hint="--filter") from None


@click.command("search")
@click.argument("words", nargs=-1, required=True)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True, help="How many papers.")
@click.option("--json", "as_json", is_flag=True, help="Print the hits as JSON.")
@click_options("stats")
@config_option
@handle_errors
def search_cmd(words, k, as_json, **kw):
    """Find papers to query by: an exact paper id, an identifier (DOI, arXiv id), an author's name (case and
    accents ignored), then BM25 over title and abstract words (as GET /search).

    \b
      esqbe search optimal transport sentence embeddings
      esqbe search 1791179            # an id: is it in the index?
      esqbe search 10.18653/v1/N19-1423 ; esqbe search arXiv:1706.03762v5
      esqbe search garcia-mateo       # Carmen García-Mateo's papers
    """
    from esqbe.index.browse import search_papers

    with _open(kw, "stats", create=False) as index:
        hits = search_papers(index, " ".join(words), k)
    if as_json:
        echo_json({"query": " ".join(words), "hits": hits})
        return
    if not hits:
        say("no papers match")
    for i, h in enumerate(printable_tree(hits), start=1):  # titles and sentences shown, their controls not obeyed
        score = f"{h['score']:.2f}" if h["match"] == "words" else h["match"]
        say(f"{i:>3}. {score:>6}  {h['paper_id']}  {h['title'] or _short(h['first_sentence'], 100)}")


@click.command("show")
@click.argument("paper_id")
@click.option("--json", "as_json", is_flag=True, help="Print the paper as JSON.")
@click_options("stats")
@config_option
@handle_errors
def show_cmd(paper_id, as_json, **kw):
    """One paper: its sentences numbered (the numbers `esqbe query --sentences` takes), each with its facet
    label and, where esqbe's tagger labelled it, the label's probability; then its metadata."""
    from esqbe.index.browse import metadata_text, show_paper

    with _open(kw, "stats", create=False) as index:
        view = show_paper(index, paper_id)
    if as_json:
        echo_json(view)
        return
    say(f"{printable(view['paper_id'])}  {printable(view['title'])}")  # each value one line, controls shown
    how = "predicted by esqbe's tagger (probability of the label)" if view["facets_predicted"] else "as given"
    say(f"facet labels {how}:")
    for s in view["sentences"]:
        prob = f" {s['probability']:.2f}" if s["probability"] is not None else ""
        say(f"  [{s['index']}] {printable(s['facet'])}{prob}: {printable(s['text'])}")
    if view["metadata"]:
        say("metadata:")
        for key, text in metadata_text(view["metadata"]):
            say(f"  {printable(key)}: {printable(text)}")


@click.command("list")
@click.option("--filter", "filters", multiple=True, metavar="COND",
              help="Only papers whose metadata satisfies COND (repeatable, all must hold; the grammar of "
                   "`esqbe query --filter`), e.g. 'year>=2019'.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True, help="Print at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print the papers as JSON.")
@click_options("stats")
@config_option
@handle_errors
def list_cmd(filters, limit, as_json, **kw):
    """The papers of the index in id order: id, year, title (and how many match in all)."""
    from esqbe.index.browse import list_papers

    _check_filters(filters)
    with _open(kw, "stats", create=False) as index:
        papers, total = list_papers(index, list(filters) or None, limit)
    if as_json:
        echo_json({"total": total, "papers": papers})
        return
    for p in papers:  # one line a paper, tab-separated: no value's tab, line feed or escape in it
        cells = (p["paper_id"], "-" if p["year"] is None else p["year"], p["title"])
        say("\t".join(printable(c).replace("\t", " ") for c in cells))
    shown = f"{len(papers)} of {total}" if total > len(papers) else str(total)
    say(f"{shown} paper(s)" + (" matching the filters" if filters else ""), err=not as_json)


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@click_options("query")
@config_option
@handle_errors
def config_cmd(as_json, **kw):
    """The effective settings and where each came from: default, file (the YAML config), env (a variable)
    or flag. Takes the flags `esqbe query` takes, to show what they would change."""
    from esqbe.settings.config import explain_settings
    from esqbe.settings.generate import overrides_from_click

    config = kw.pop("config", None)
    rows = explain_settings(config, **overrides_from_click(kw, "query"))
    if as_json:
        echo_json(rows)
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        where = r["source"] + (f" {r['from']}" if r["from"] else "")
        say(f"{r['name']:<{width}}  {printable(json.dumps(r['value'], ensure_ascii=False)):<24}  {printable(where)}")
    for r in rows:
        if r.get("note"):
            say(f"note: {r['name']}: {r['note']}")


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
