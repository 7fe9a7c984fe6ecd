"""`esqbe graph`: a query's hits as a graph (esqbe.query.graph): how they relate to each other in the query's aspect,
as text for people, JSON for scripts, GraphML for Gephi and Cytoscape, or a standalone SVG."""
from __future__ import annotations

from pathlib import Path

import click

from esqbe.core.textsafe import printable_tree
from esqbe.settings.generate import LazyChoice

from .errors import handle_errors
from .options import click_options, config_option
from .output import echo_json, say
from .query_cmds import QueryArgs, _short, query_input_options

FORMATS = ("text", "json", "graphml", "svg")
#: the strongest links printed per hit in the text form (all are in --json)
TEXT_LINKS = 3


@click.command("graph")
@query_input_options
@click.option("--format", "fmt", type=LazyChoice(FORMATS), default="text", show_default=True,
              help="text: the groups and each hit's strongest links, for people; json: everything (nodes, edges with "
                   "their sentence pairs, groups, positions, and the query's result); graphml: for Gephi and "
                   "Cytoscape (attributes typed); svg: a drawing that opens in any browser.")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@click.option("--out", "-o", "out", type=click.Path(dir_okay=False, writable=True),
              help="Write the graph to this file instead of standard output.")
@click_options("query")
@config_option
@handle_errors
def graph_cmd(paper_ids, avoid, facet, sentences, text, text_file, title, filters, engine_filter, fmt, as_json, out,
              **kw):
    """The hits of a query as a graph: which of them are alike in the query's aspect, and in what groups.

    It takes what `esqbe query` takes, runs that query (k at most 100; the same hits, in the same order, with
    the same scores) and links each two hits by the rescorer's similarity between them, each way, in the
    query's facet. Each hit keeps its 5 strongest links that the index's scale calls fair or strong; groups
    are said only where the hits split more than shuffled links would, each named by the sentence its
    members share most.

    \b
    esqbe graph --paper 1791179 --facet method -k 30                      # groups and links, as text
    esqbe graph --paper 1791179 --facet method -k 30 --format graphml -o method.graphml   # Gephi, Cytoscape
    esqbe graph --paper 1791179 --facet result -k 50 --format svg -o result.svg           # a drawing
    esqbe graph --paper A --paper B --facet method --not C -k 30 --json
    """
    if as_json:
        if fmt not in ("text", "json"):
            raise click.UsageError("give --json or --format, not both")
        fmt = "json"
    args = QueryArgs.read(kw, paper_ids, avoid, facet, sentences, text, text_file, title, filters, engine_filter)
    import esqbe

    with esqbe.open_index(settings=args.settings, create=False) as index:
        graph = index.graph(**args.index_arguments()).to_dict()
    if fmt in ("graphml", "svg"):
        from esqbe.query.graph_formats import render

        body = render(graph, fmt)
    elif fmt == "json":
        body = None
    else:
        body = _text(printable_tree(graph))
    if out is None:
        if body is None:
            echo_json(graph)
        else:
            click.echo(body, nl=False)
        return
    import json

    Path(out).write_text(json.dumps(graph, indent=2, ensure_ascii=False) + "\n" if body is None else body,
                         encoding="utf-8")
    say(f"esqbe: wrote the graph of {len(graph['nodes'])} hits and {len(graph['edges'])} links to {out} ({fmt})",
        err=True)


def _text(graph: dict) -> str:
    """The graph for people: the rule, the groups (or why there are none), each hit with its strongest links and the
    sentence pair of the strongest. Every string in `graph` is already printable (one line, no control character)."""
    lines = []
    query = graph["query"]
    who = f"paper {query['paper_id']}" if query["paper_id"] else "the query text"
    what = f"facet {query['facet']}" if query["facet"] else "its chosen sentences" if query["selection"] and \
        query["selection"]["by"] == "sentences" else "all sentences"
    lines.append(f"graph of the {len(graph['nodes'])} hits of {who}, {what}, rescorer {graph['rescorer']}: "
                 f"{len(graph['edges'])} links")
    lines.append(f"links: {graph['edge_rule']['rule']}")
    lines.append(f"groups: {graph['grouping']['note']}")
    by_id = {n["id"]: n for n in graph["nodes"]}
    for g in graph["groups"]:
        lines.append(f"\ngroup {g['id'] + 1} ({g['size']} hits), named by {g['name_paper']} [{g['name_index']}]: "
                     f"\u201c{_short(g['name'], 200)}\u201d")
        lines.append("  hits: " + ", ".join(f"{by_id[m]['rank']}. {m}" for m in g["members"]))
    links: dict[str, list[tuple[float, str, dict]]] = {n["id"]: [] for n in graph["nodes"]}
    for e in graph["edges"]:
        links[e["source"]].append((e["weight"], e["target"], e))
        links[e["target"]].append((e["weight"], e["source"], e))
    lines.append("\nhits (score, band) and their strongest links (weight, band):")
    for n in graph["nodes"]:
        band = f", {n['band']}" if n["band"] else ""
        group = f"  [group {n['group'] + 1}]" if n["group"] is not None else ""
        lines.append(f"\n{n['rank']:>3}. {n['id']}  {_short(n['title'] or '', 90)} (score {n['score']:.4f}{band}){group}")
        mine = sorted(links[n["id"]], key=lambda x: (-x[0], by_id[x[1]]["rank"]))[:TEXT_LINKS]
        if not mine:
            lines.append("       no link at fair or above")
        for weight, other, e in mine:
            lines.append(f"       ~ {by_id[other]['rank']}. {other} ({weight:.3f}, {e['band']})")
        if mine:
            e = mine[0][2]
            mine_first = e["source"] == n["id"]
            pair = e["pair"]
            source, target = (pair["source_index"], pair["source_sentence"]), (pair["target_index"], pair["target_sentence"])
            ours, theirs = (source, target) if mine_first else (target, source)
            lines.append(f"         its [{ours[0]}] \u201c{_short(ours[1] or '', 120)}\u201d")
            lines.append(f"         ~ [{theirs[0]}] \u201c{_short(theirs[1] or '', 120)}\u201d")
    return "\n".join(lines) + "\n"
