"""`esqbe follow`: sources new papers arrive from by themselves (add, list, remove, run); a thin skin over
esqbe.index.follow and esqbe.index.follow_run."""
from __future__ import annotations

import datetime
import sys

import click

from esqbe.core.textsafe import printable, printable_tree

from .errors import EXIT_SIGINT, EXIT_SIGTERM, handle_errors
from .options import OPEN_GROUPS, click_options, config_option, overrides_from_click
from .output import echo_json, say


@click.group("follow")
def follow_group():
    """Sources new papers arrive from by themselves: arXiv, OpenAlex, a Zotero library, a folder.

    \b
    esqbe follow add arxiv-cl arxiv:cs.CL                   # arXiv's cs.CL, from its OAI-PMH interface
    esqbe follow add lab openalex:authorships.institutions.id:I97018004
    esqbe follow add mine zotero:~/Zotero/zotero.sqlite     # items added or changed since the last run
    esqbe follow add inbox dir:~/papers                     # files added or changed in a folder
    esqbe follow run                                        # fetch, index, then run every watch
    esqbe serve --follow-every 12h                          # or let the server run it on a schedule
    """


def _open(kw, command: str, *, create: bool = True):
    """The index the command's options name, opened with their settings, the follow ones too (timeouts, mailto,
    --max-pages, --deleted)."""
    import esqbe
    from esqbe.settings.config import load_settings

    config, path = kw.pop("config", None), kw.pop("path", None)
    settings = load_settings(config).replace(path=path, **overrides_from_click(kw, command, (*OPEN_GROUPS, "follow")))
    return esqbe.open_index(settings=settings, create=create)


def _when(t: float | None) -> str:
    return "never" if t is None else datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


@follow_group.command("add")
@click.argument("name")
@click.argument("spec")
@click.option("--since", metavar="YYYY-MM-DD", help="The day the first run starts from (default: follow_first_days "
              "back for arXiv and OpenAlex; a Zotero library or folder whole).")
@click.option("--source-url", "source_url", metavar="URL",
              help="Ask this address instead of the service's own (a mirror of arXiv's OAI-PMH or of OpenAlex's API).")
@click.option("--json", "as_json", is_flag=True, help="Print the source as JSON.")
@click_options("follow add")
@config_option
@handle_errors
def follow_add_cmd(name, spec, since, source_url, as_json, **kw):
    """Follow SPEC as source NAME: `arxiv:CATEGORY`, `openalex:FILTER`, `zotero:PATH` or `dir:PATH`.

    Nothing is fetched now: `esqbe follow run` (or `esqbe serve --follow-every`) does.

    \b
    esqbe follow add arxiv-cl arxiv:cs.CL --since 2024-05-01
    esqbe follow add nlp openalex:concepts.id:C204321447,type:article
    """
    from esqbe.index.follow import add_source

    with _open(kw, "follow add") as index:
        source = add_source(index, name, spec, url=source_url, since=since)
    if as_json:
        echo_json(source.to_dict())
        return
    start = f"from {source.since}" if source.since else "from the start" if source.kind in ("zotero", "dir") else \
        "from the last days (follow_first_days)"
    say(printable(f"following {source.name}: {source.spec}" + (f" at {source.url}" if source.url else "")
                  + f"; its first run reads {start} (`esqbe follow run {source.name}`)"))


@follow_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the sources as JSON.")
@click_options("follow list")
@config_option
@handle_errors
def follow_list_cmd(as_json, **kw):
    """The followed sources: spec, mark, and the last run's counts and error."""
    from esqbe.index.follow import list_sources

    with _open(kw, "follow list", create=False) as index:
        sources = list_sources(index)
    if as_json:
        echo_json([s.to_dict() for s in sources])
        return
    if not sources:
        say("no followed sources (`esqbe follow add NAME arxiv:cs.CL` follows one)")
    for s in sources:
        last = s.last
        ran = "never run" if not last else (
            f"last run {_when(last['at'])}: {last['fetched']} fetched, {last['indexed']} indexed, {last['replaced']} "
            f"replaced, {last['unchanged']} unchanged, {last['deleted']} deleted at the source"
            + (f"; error: {last['error']}" if last.get("error") else ""))
        mark = f"; next from {s.state['mark']}" if s.state.get("mark") and s.kind != "dir" else ""
        going = "; a harvest to go on from" if s.state.get("run") else ""
        say(printable(f"{s.name}: {s.spec}{' at ' + s.url if s.url else ''}; {ran}{mark}{going}"))


@follow_group.command("remove")
@click.argument("name")
@click_options("follow remove")
@config_option
@handle_errors
def follow_remove_cmd(name, **kw):
    """Stop following a source (the papers it brought stay in the index)."""
    from esqbe.index.follow import remove_source

    with _open(kw, "follow remove", create=False) as index:
        remove_source(index, name)
    say(f"no longer following {name} (its papers stay in the index)")


@follow_group.command("run")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the run (each source, each watch) as JSON.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click_options("follow run")
@config_option
@handle_errors
def follow_run_cmd(names, as_json, quiet, **kw):
    """Fetch what is new since each source's last run (all, or those NAMEd), index it as `esqbe index` does (merges,
    identifiers, likely duplicates; the source named in each paper's `sources`), then run every watch.

    Each source's mark moves only once the papers before it are committed: Ctrl-C, a kill or a failure goes on
    from there at the next run, and nothing is indexed twice. A source that fails is said and the next one runs.
    Exit status 1 if a source failed or a watch was refused; 130 / 143 when interrupted (what was committed stays).

    \b
    esqbe follow run                 # every source, then every watch
    esqbe follow run arxiv-cl --json
    """
    from esqbe.index.follow_run import run_follow

    from .index_cmds import _interrupts

    progress = None if quiet or as_json else (lambda line: say(f"esqbe: {line}", err=True))
    with _open(kw, "follow run", create=False) as index, _interrupts() as stop:
        run = run_follow(index, list(names), stop=stop, say=progress)
    if as_json:
        echo_json(run.to_dict())
    else:
        _summary(run)
    if run.interrupted:
        sys.exit(EXIT_SIGTERM if run.interrupted == "SIGTERM" else EXIT_SIGINT)
    if run.failed:
        sys.exit(1)


def _summary(run) -> None:
    """The run in words: per source its counts, what it skipped and why, what its service said is gone; per watch its
    new finds."""
    if not run.sources:
        say("no followed sources (`esqbe follow add NAME arxiv:cs.CL` follows one)")
    for s in run.sources:
        counts = (f"{s.fetched} fetched ({s.pages} page(s)), {s.indexed} indexed, {s.replaced} replaced, "
                  f"{s.unchanged} unchanged, {s.merged} merged, {sum(s.skipped.values())} skipped")
        if s.filtered:
            counts += f", {s.filtered} of other categories passed over"
        say(printable(f"{s.name} ({s.spec}): {counts}"))
        if s.skipped:
            say("  skipped: " + ", ".join(f"{n} {reason}" for reason, n in sorted(s.skipped.items())))
        for e in s.errors[:10]:
            say(printable(f"  error: {e}"))
        if s.error_count > 10:
            say(f"  and {s.error_count - 10} more errors (all: --json)")
        for d in s.deleted[:10]:
            say(printable(f"  gone at the source: {d['id']} ({d['how']}{', ' + str(d['when']) if d.get('when') else ''})"
                          f": {d['action']}"))
        if s.deleted_count > 10:
            say(f"  and {s.deleted_count - 10} more gone at the source (all: --json)")
        for note in s.notes:
            say(printable(f"  note: {note}"))
        if s.waited:
            say(f"  the service asked to wait {len(s.waited)} time(s) (Retry-After {', '.join(f'{w:g}' for w in s.waited)}"
                " s): waited")
        if s.error:
            say(printable(f"  FAILED: {s.error}"))
        elif s.stopped:
            say(printable(f"  stopped: {s.stopped}"))
        elif s.mark and not s.spec.startswith("dir:"):
            say(f"  next run from {s.mark}")
    if run.watches_skipped and run.sources:
        say(printable(f"watches: not run: {run.watches_skipped}"))
    for w in run.watches:
        if w.refused:
            say(printable(f"watch {w.name}: refused: {w.refused}"))
            continue
        say(f"watch {w.name}: {w.new_papers} new paper(s), {len(w.matches)} new find(s)")
        for hit in printable_tree(w.matches):
            say(f"  {hit['rank']:>3}. score {hit['score']:.4f}  {hit['paper_id']}  {hit['title']}")
