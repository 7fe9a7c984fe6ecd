"""`esqbe watch`: saved queries that keep looking (add, list, show, remove, revoke-url, run); a thin skin over
esqbe.index.watches."""
from __future__ import annotations

import datetime

import click

from esqbe.core.textsafe import printable, printable_tree
from esqbe.query.export import EXPORT_FORMATS
from esqbe.settings.generate import LazyChoice

from .errors import handle_errors
from .options import (
    FACET_CHOICES,
    _open,
    click_options,
    config_option,
    open_settings,
    overrides_from_click,
    query_text_or_file,
)
from .output import echo_json, hit_head, say


@click.group("watch")
def watch_group():
    """Saved queries that keep looking: each run reports the papers indexed since the last one that match.

    \b
    esqbe watch add lstm-methods --paper 1791179 --facet method     # keeps the index's strong matches
    esqbe index today.jsonl && esqbe watch run        # the new papers that match, per watch
    esqbe serve                                       # GET /watches/lstm-methods.atom: a feed
    """


def _when(t: float | None) -> str:
    return "never" if t is None else datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _feed_path(watch) -> str:
    return f"/watches/{watch.name}.atom?key={watch.feed_key}"


@watch_group.command("add")
@click.argument("name")
@click.option("--min-score", "--min-sim", "min_score", type=float, default=None,
              help="Report a new paper only when its score (the number hits print, and are ordered by) is at least "
                   "this (-1..1; --min-sim is its old name). Default: the matches the index's own scale calls strong.")
@click.option("--paper", "paper_ids", multiple=True, metavar="ID[:FACET|:sentences=I,J]",
              help="Query paper id (must be in the index; the watch keeps its own copy). Repeat it for a query of "
                   "several examples, each with its own facet (ID:method) or sentences (ID:sentences=1,3), else --facet's.")
@click.option("--not", "avoid", multiple=True, metavar="ID[:FACET]",
              help="A paper the new papers should not resemble (repeatable; its --facet sentences, or ID:FACET's); "
                   "the watch keeps its own copy of it too.")
@click.option("--facet", type=LazyChoice(FACET_CHOICES), help="Use the query paper's sentences labelled with this facet.")
@click.option("--sentences", help="Use these sentences of the query paper or --text (0-based indices, e.g. 0,2).")
@click.option("--text", help="Query with this abstract text (a paper not in the index).")
@click.option("--file", "text_file", type=click.File("r"), help="Query with the abstract in this file (- for stdin).")
@click.option("--title", default="", help="Title of the --text/--file paper.")
@click.option("--filter", "filters", multiple=True, metavar="COND",
              help="Only papers whose metadata satisfies COND (repeatable; the grammar of `esqbe query --filter`).")
@click.option("--json", "as_json", is_flag=True, help="Print the watch as JSON.")
@click_options("watch add")
@config_option
@handle_errors
def watch_add_cmd(name, min_score, paper_ids, avoid, facet, sentences, text, text_file, title, filters, as_json, **kw):
    """Save a query (what `esqbe query` takes) as watch NAME, with a threshold.

    Papers indexed from now on are new to it; `esqbe watch run` reports those whose score reaches --min-score (by
    default: what the index's own scale calls a strong match) and that rank within its k. It keeps its own copy of the query sentences and their vectors, every example's and every
    avoided paper's (re-indexing or deleting them changes nothing).

    \b
    esqbe watch add lstm --paper 1791179 --facet method
    esqbe watch add two --paper A --paper B:result --facet method --not C --min-score 0.5
    """
    from esqbe.index.watches import add_watch, result_settings, strong_cut

    from .query_cmds import _examples

    text = query_text_or_file(text, text_file)  # refused past the caps before the index or the model is opened
    several = _examples(paper_ids, avoid, sentences, text, title)  # several examples or --not: as `esqbe query`
    paper_id = paper_ids[0] if paper_ids and several is None else None
    if several is not None:
        text = None
    elif (paper_id is None) == (text is None):
        raise click.UsageError("give --paper ID (a paper in the index) or --text/--file (a paper that is not)")
    chosen = None
    if sentences is not None:
        try:
            chosen = [int(x) for x in sentences.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter("expected comma-separated sentence indices, e.g. 0,2", param_hint="--sentences") from None
    overrides = overrides_from_click(kw, "watch add", ("query",))
    settings = open_settings(kw, "watch add")
    import esqbe

    with esqbe.open_index(settings=settings, create=False) as index:
        watch, result = add_watch(index, name, paper_id=paper_id, facet=facet,
                                  sentences=None if several else chosen, text=text, title=title,
                                  examples=several[0] if several else None, avoid=several[1] if several else None,
                                  filters=list(filters) or None, min_score=min_score, **overrides)
        cut = watch.min_score if watch.min_score is not None else strong_cut(index, result_settings(index, facet, overrides))
    if as_json:
        echo_json({**watch.to_dict(with_key=True), "feed": _feed_path(watch)})
        return
    examples, avoided = watch.parts()
    kept = sum(len(p["sentences"]) for p in (*examples, *avoided))
    what = f" of {len(examples)} example(s)" + (f" and {len(avoided)} paper(s) to avoid" if avoided else "") \
        if watch.examples else ""
    say(f"watch {watch.name}: {kept} query sentence(s){what} kept with it; papers indexed from now on are new to it "
        f"(threshold: {_threshold(watch, cut)})")
    passing = [h for h in result.hits if cut is not None and h.score >= cut]
    say(f"  of today's top {len(result.hits)} hits, {len(passing)} pass its threshold (they are not new: not reported)")
    say(f"  feed: {_feed_path(watch)} on `esqbe serve` (the key is needed on a --private server)")


@watch_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the watches as JSON.")
@click_options("watch list")
@config_option
@handle_errors
def watch_list_cmd(as_json, **kw):
    """The index's watches: name, query, threshold, last run, papers found."""
    from esqbe.index.watches import list_watches

    with _open(kw, "watch list", create=False) as index:
        watches = list_watches(index)
    if as_json:
        echo_json([w.to_dict() for w in watches])
        return
    if not watches:
        say("no watches (`esqbe watch add NAME --paper ID --facet method` makes one)")
    for w in watches:
        examples, avoided = w.parts()
        what = "; ".join(_part(q) for q in examples) + "".join(f"; not {_part(q)}" for q in avoided)
        say(f"{w.name}: {printable(what)}, {_threshold(w)}; last run {_when(w.last_run)}; found {w.found}")


def _threshold(watch, cut: float | None = None) -> str:
    """The threshold for people: `score >= 0.5`, or `strong matches (score >= 0.4123 on the index's scale now)`."""
    if watch.min_score is not None:
        return f"score >= {watch.min_score:g}"
    now = f" >= {cut:.4f}" if cut is not None else ""
    return f"strong matches (score{now} on the index's own scale now; the default, looked up at each run)"


def _part(q: dict) -> str:
    """`paper A, facet method` (or `text`, chosen sentences, all sentences): one example or paper to avoid."""
    what = f"paper {q['paper_id']}" if q["paper_id"] else "text"
    how = f"facet {q['facet']}" if q["facet"] else "chosen sentences" if q["chosen"] is not None else "all sentences"
    return f"{what}, {how}"


@watch_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the watch and its latest matches as JSON.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="Latest matches shown (or exported).")
@click.option("--format", "export_format", type=LazyChoice(tuple(EXPORT_FORMATS)),
              help="Print the watch's past finds (the latest --limit, newest first) as CSV, BibTeX, RIS or CSL-JSON, "
                   "each with its abstract: e.g. --format bibtex > finds.bib.")
@click_options("watch show")
@config_option
@handle_errors
def watch_show_cmd(name, as_json, limit, export_format, **kw):
    """A watch: its query (its own copy of the sentences), settings, threshold, model, feed URL, latest matches.

    \b
    esqbe watch show lstm-methods --format bibtex --limit 100 > finds.bib   # or csv, ris, csl-json
    """
    from esqbe.errors import EsqbeError
    from esqbe.index.watches import get_watch, strong_cut, watch_matches, watch_settings, with_abstracts

    if as_json and export_format:
        raise click.UsageError("give --json or --format, not both")
    with _open(kw, "watch show", create=False) as index:
        watch = get_watch(index, name)
        found = watch_matches(index, name, limit)
        if export_format:
            found = with_abstracts(index, found)
        cut = None
        if watch.min_score is None and not export_format:
            try:
                cut = strong_cut(index, watch_settings(index, watch))
            except EsqbeError:
                cut = None
    if export_format:
        from esqbe.query.export import export_hits

        if not found:
            say(f"esqbe: watch {name} has found nothing yet; nothing to export", err=True)
            return
        click.echo(export_hits({"hits": found}, export_format), nl=False)
        return
    if as_json:
        echo_json({**watch.to_dict(with_key=True), "feed": _feed_path(watch), "matches": found, "strong_from": cut})
        return
    w = printable_tree(watch.to_dict())
    q = w["query"]
    examples, avoided = w.get("examples") or [q], w.get("avoid") or []
    for n, (label, p) in enumerate([("", e) for e in examples] + [("not like ", a) for a in avoided]):
        say((f"watch {w['name']}: " if n == 0 else "  " + label)
            + (f"paper {p['paper_id']}" if p["paper_id"] else f"text {p['title']!r}")
            + (f", facet {p['facet']}" if p["facet"] else ""))
        for (i, s), f in zip(p["sentences"], p["facets"]):
            say(f"  [{i}] ({f}) {s}")
    say(f"  threshold: {_threshold(watch, cut)}")
    if w["filters"]:
        say("  filters: " + "; ".join(f"{c['key']} {c['op']} {c.get('value', '')}".rstrip() for c in w["filters"]))
    if w["settings"]:
        say("  settings: " + ", ".join(f"{k}={v}" for k, v in w["settings"].items()))
    m = w["model"]
    say(f"  model: {m['model']} ({m['dim']}-d, {m['encoder_mode']})")
    say(f"  last run {_when(watch.last_run)}; found {watch.found}; feed: {_feed_path(watch)}")
    for hit in printable_tree(found):
        say(f"  {_when(hit['found'])}  score {hit['score']:.4f}  {hit['paper_id']}  {hit['title']}")


@watch_group.command("remove")
@click.argument("name")
@click_options("watch remove")
@config_option
@handle_errors
def watch_remove_cmd(name, **kw):
    """Remove a watch and what it found."""
    from esqbe.index.watches import remove_watch

    with _open(kw, "watch remove", create=False) as index:
        remove_watch(index, name)
    say(f"removed watch {name}")


@watch_group.command("revoke-url")
@click.argument("name")
@click_options("watch revoke-url")
@config_option
@handle_errors
def watch_revoke_cmd(name, **kw):
    """Give a watch's feed a new secret URL: the old one stops working on a --private server."""
    from esqbe.index.watches import get_watch, revoke_feed_key

    with _open(kw, "watch revoke-url", create=False) as index:
        revoke_feed_key(index, name)
        watch = get_watch(index, name)
    say(f"watch {name}: new feed URL {_feed_path(watch)} (the old one is refused)")


@watch_group.command("run")
@click.argument("names", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Report, but do not advance the watches' marks.")
@click.option("--json", "as_json", is_flag=True, help="Print each watch's run as JSON.")
@click.option("--format", "export_format", type=LazyChoice(tuple(EXPORT_FORMATS)),
              help="Print the new matches (all watches together) as CSV, BibTeX, RIS or CSL-JSON, each with its "
                   "abstract; with none, nothing is printed and stderr says so (exit status 0).")
@click_options("watch run")
@config_option
@handle_errors
def watch_run_cmd(names, dry_run, as_json, export_format, **kw):
    """Per watch (all, or those NAMEd), the papers indexed since its last run that pass its threshold and rank
    within its k against the index now, with the matched sentences; then its mark moves on (not with --dry-run).

    Takes the index's write lock like `esqbe index` (queries go on meanwhile). Run it after each `esqbe index`.
    A watch refused (its vectors are of another model) is said, the others still run, and the exit status is 1.
    """
    if as_json and export_format:
        raise click.UsageError("give --json or --format, not both")
    from esqbe.index.watches import run_watches, with_abstracts

    with _open(kw, "watch run", create=False) as index:
        runs = run_watches(index, list(names), dry_run=dry_run)
        found = with_abstracts(index, [m for r in runs for m in r.matches]) if export_format else []
    if as_json or export_format:
        if as_json:
            echo_json([r.to_dict() for r in runs])
        elif found:
            from esqbe.query.export import export_hits

            click.echo(export_hits({"hits": found}, export_format), nl=False)
        else:  # an empty file would look like a failure: say why there is nothing
            ran = [r for r in runs if not r.refused]
            say("esqbe: nothing new: " + (f"{len(ran)} watch(es) ran, {sum(r.new_papers for r in ran)} new paper(s) "
                                          "looked at, none matched" if ran else "no watch ran"), err=True)
        for r in runs:  # the others ran; a refused one is said on stderr, and the exit status is 1
            if r.refused:
                say(f"esqbe: watch {r.name} refused: {r.refused}", err=True)
        if any(r.refused for r in runs):
            raise SystemExit(1)
        return
    if not runs:
        say("no watches (`esqbe watch add` makes one)")
    for r in runs:
        if r.refused:
            say(f"watch {r.name}: refused: {r.refused}")
            continue
        cut = f" with score >= {r.threshold:.4f}" if r.threshold is not None else ""
        say(f"watch {r.name}: {r.new_papers} new paper(s), {len(r.matches)} match(es){cut}"
            + ("" if r.advanced else " (dry run: mark not moved)" if dry_run else ""))
        for hit in printable_tree(r.matches):
            for line in hit_head(hit):  # the score it thresholds, then its parts, as `esqbe query` prints them
                say(f"  {line}")
            several = len(hit.get("example_similarities") or []) > 1  # which example each pair is of
            for m in hit["matches"][:2]:
                of = f"example {int(m.get('example') or 0) + 1} " if several else ""
                say(f"       {of}query [{m['query_index']}] {m['query_sentence'][:80]}")
                say(f"         ~ [{m['candidate_index']}] ({m['candidate_facet']}, {m['weight']:.3f}) "
                    f"{m['candidate_sentence'][:160]}")
    if any(r.refused for r in runs):
        raise SystemExit(1)
