"""A query graph's files: GraphML (Gephi, Cytoscape: every attribute typed) and a standalone SVG, both from the graph's
one JSON shape (esqbe.query.graph.QueryGraph.to_dict), so each says what the JSON says.

Every text from a paper (a title, a sentence, an id) goes through `esqbe.core.textsafe.xml_text` and the XML writer's
own escaping: one line, no character XML cannot hold, `<` and `&` as entities; the SVG holds no script and no link.
"""
from __future__ import annotations

import io
import xml.etree.ElementTree as ET

from ..core.textsafe import xml_text

#: `format` choices of `esqbe graph` and POST /graph
GRAPH_FORMATS = ("json", "graphml", "svg")
MEDIA_TYPES = {"json": "application/json", "graphml": "application/graphml+xml", "svg": "image/svg+xml"}
#: a group's colour (Tableau 10 without its grey; past ten groups the colours repeat, the legend says so), the
#: colour of a hit in no group, of the query's examples and of the papers to avoid
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
UNGROUPED = "#b8b8b8"
EXAMPLE, AVOID = "#1d1d1f", "#c0392b"


def group_colour(group: int | None) -> str:
    return UNGROUPED if group is None else PALETTE[group % len(PALETTE)]


def _label(node: dict) -> str:
    return xml_text(node.get("title") or node.get("id") or "")


def to_graphml(graph: dict) -> str:
    """The graph as GraphML (networkx.write_graphml): the hits and the query's examples and papers to avoid as nodes
    (`role` hit, example, avoid), the edges and the anchors' links (`kind` similar, example, avoid), each attribute
    typed (int, double, string); Gephi reads `label`, `x`, `y`, `size` and `r`, `g`, `b`."""
    import networkx as nx

    g: nx.Graph = nx.Graph()
    g.graph.update({"rule": xml_text(graph["edge_rule"]["rule"]), "grouping": xml_text(graph["grouping"]["note"]),
                    "rescorer": xml_text(graph["rescorer"]), "facet": xml_text(graph["edge_rule"]["facet"] or "all"),
                    "layout": xml_text(graph["layout"]["method"])})
    scores = [float(n["score"]) for n in graph["nodes"]] or [0.0]
    low, span = min(scores), max(max(scores) - min(scores), 1e-9)
    for n in graph["nodes"]:
        colour = group_colour(n["group"])
        attrs = {"label": _label(n), "role": "hit", "rank": int(n["rank"]), "score": float(n["score"]),
                 "band": xml_text(n["band"] or ""), "x": round(1000.0 * n["x"], 2), "y": round(1000.0 * n["y"], 2),
                 "size": round(10.0 + 20.0 * (float(n["score"]) - low) / span, 2), "degree": int(n["degree"]),
                 **_rgb(colour)}
        for key in ("similarity", "percentile"):
            if n[key] is not None:
                attrs[key] = float(n[key])
        if n["year"] is not None:
            attrs["year"] = int(n["year"])
        if n["group"] is not None:
            attrs["group"] = int(n["group"])
            attrs["group_name"] = xml_text(graph["groups"][n["group"]]["name"])
        g.add_node(xml_text(n["id"]), **attrs)
    for a in graph["anchors"]:
        g.add_node(xml_text(a["id"]), label=xml_text(a["title"] or a["paper_id"] or "the query text"), role=a["role"],
                   paper_id=xml_text(a["paper_id"] or ""), x=round(1000.0 * a["x"], 2), y=round(1000.0 * a["y"], 2),
                   size=12.0, **_rgb(EXAMPLE if a["role"] == "example" else AVOID))
    for e in graph["edges"]:
        pair = e["pair"]
        g.add_edge(xml_text(e["source"]), xml_text(e["target"]), kind="similar", weight=float(e["weight"]),
                   band=xml_text(e["band"] or ""), forward=float(e["forward"]), backward=float(e["backward"]),
                   source_index=int(pair["source_index"]), source_sentence=xml_text(pair["source_sentence"] or ""),
                   target_index=int(pair["target_index"]), target_sentence=xml_text(pair["target_sentence"] or ""))
    roles = {a["id"]: a["role"] for a in graph["anchors"]}
    for x in graph["anchor_links"]:
        g.add_edge(xml_text(x["anchor"]), xml_text(x["target"]), kind=roles[x["anchor"]], weight=float(x["weight"]),
                   band=xml_text(x["band"] or ""))
    out = io.BytesIO()
    nx.write_graphml(g, out, encoding="utf-8", infer_numeric_types=True)
    return out.getvalue().decode("utf-8")


def _rgb(colour: str) -> dict:
    return {"r": int(colour[1:3], 16), "g": int(colour[3:5], 16), "b": int(colour[5:7], 16)}


def _short(text: str, n: int) -> str:
    text = xml_text(text).strip()
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


# the drawing's size (its viewBox): the plot, and a legend below it
WIDTH, PLOT, MARGIN = 960, 640, 40
SVG_NS = "http://www.w3.org/2000/svg"


def to_svg(graph: dict) -> str:
    """The graph as one standalone SVG document: edges (width by weight, a tooltip with the sentence pair), hits
    (size by score, colour by group; the rank inside; a tooltip with the title, score, band and year), the query's
    examples (black diamonds) and papers to avoid (red squares), and a legend with the groups' names and the rule."""
    nodes, anchors = graph["nodes"], graph["anchors"]
    legend_rows = 3 + len(graph["groups"])
    height = PLOT + 24 * legend_rows + MARGIN
    svg = ET.Element("svg", {"xmlns": SVG_NS, "width": str(WIDTH), "height": str(height),
                             "viewBox": f"0 0 {WIDTH} {height}", "font-family": "system-ui, sans-serif",
                             "font-size": "12"})
    query = graph["query"]
    what = xml_text(query.get("title") or query.get("paper_id") or "a query text")
    facet = graph["edge_rule"]["facet"] or "all-sentence"
    ET.SubElement(svg, "title").text = f"esqbe graph: the {len(nodes)} hits of a {facet} query by {what}"
    ET.SubElement(svg, "desc").text = xml_text(f"{graph['edge_rule']['rule']}. {graph['grouping']['note']}.")
    ET.SubElement(svg, "rect", {"width": str(WIDTH), "height": str(height), "fill": "#ffffff"})

    def at(point: dict) -> tuple[float, float]:
        return (round(MARGIN + point["x"] * (WIDTH - 2 * MARGIN), 1), round(MARGIN + point["y"] * (PLOT - 2 * MARGIN), 1))

    where = {n["id"]: at(n) for n in nodes} | {a["id"]: at(a) for a in anchors}
    titles = {n["id"]: n["title"] or n["id"] for n in nodes}
    weights = [e["weight"] for e in graph["edges"]] or [0.0]
    low, span = min(weights), max(max(weights) - min(weights), 1e-9)
    layer = ET.SubElement(svg, "g", {"class": "edges", "stroke": "#8a8f98", "stroke-linecap": "round"})
    for x in graph["anchor_links"]:
        (x1, y1), (x2, y2) = where[x["anchor"]], where[x["target"]]
        line = ET.SubElement(layer, "line", {"x1": str(x1), "y1": str(y1), "x2": str(x2), "y2": str(y2),
                                             "stroke-dasharray": "4 4", "stroke-width": "1", "opacity": "0.6"})
        ET.SubElement(line, "title").text = xml_text(f"{x['anchor']} ~ {titles[x['target']]}: the hit's similarity "
                                                     f"{x['weight']:.3f} ({x['band']})")
    for e in graph["edges"]:
        (x1, y1), (x2, y2) = where[e["source"]], where[e["target"]]
        width = 1.0 + 4.0 * (e["weight"] - low) / span
        line = ET.SubElement(layer, "line", {"x1": str(x1), "y1": str(y1), "x2": str(x2), "y2": str(y2),
                                             "stroke-width": f"{width:.2f}", "opacity": "0.7"})
        pair = e["pair"]
        ET.SubElement(line, "title").text = xml_text(
            f"{titles[e['source']]} ~ {titles[e['target']]}: weight {e['weight']:.3f} ({e['band']}); "
            f"[{pair['source_index']}] \u201c{pair['source_sentence']}\u201d ~ [{pair['target_index']}] "
            f"\u201c{pair['target_sentence']}\u201d")
    scores = [n["score"] for n in nodes] or [0.0]
    s_low, s_span = min(scores), max(max(scores) - min(scores), 1e-9)
    layer = ET.SubElement(svg, "g", {"class": "nodes", "stroke": "#ffffff", "stroke-width": "1.5"})
    for n in nodes:
        x, y = where[n["id"]]
        r = 7.0 + 11.0 * (n["score"] - s_low) / s_span
        node = ET.SubElement(layer, "g", {"class": "node"})
        circle = ET.SubElement(node, "circle", {"cx": str(x), "cy": str(y), "r": f"{r:.1f}", "fill": group_colour(n["group"])})
        year = f", {n['year']}" if n["year"] is not None else ""
        ET.SubElement(circle, "title").text = xml_text(f"{n['rank']}. {n['title'] or n['id']} (id {n['id']}{year}): "
                                                       f"score {n['score']:.3f}, {n['band'] or 'no band'}")
        label = ET.SubElement(node, "text", {"x": str(x), "y": str(y + 4), "text-anchor": "middle", "stroke": "none",
                                             "fill": "#ffffff", "font-size": "10", "font-weight": "700"})
        label.text = str(n["rank"])
    for a in anchors:
        x, y = where[a["id"]]
        colour = EXAMPLE if a["role"] == "example" else AVOID
        shape = (ET.SubElement(layer, "polygon", {"points": f"{x},{y - 10} {x + 10},{y} {x},{y + 10} {x - 10},{y}",
                                                  "fill": colour}) if a["role"] == "example" else
                 ET.SubElement(layer, "rect", {"x": str(x - 8), "y": str(y - 8), "width": "16", "height": "16",
                                               "fill": colour}))
        ET.SubElement(shape, "title").text = xml_text(f"{'the query' if a['role'] == 'example' else 'not like'}: "
                                                      f"{a['title'] or a['paper_id'] or 'the query text'}")
    _legend(svg, graph, PLOT)
    return ET.tostring(svg, encoding="unicode", xml_declaration=False) + "\n"


def _legend(svg: ET.Element, graph: dict, top: int) -> None:
    """Below the plot: what size, colour, marks and edges mean, and each group's colour and name."""
    legend = ET.SubElement(svg, "g", {"class": "legend"})
    y = top + 4
    ET.SubElement(legend, "polygon", {"points": f"{MARGIN},{y - 6} {MARGIN + 6},{y} {MARGIN},{y + 6} {MARGIN - 6},{y}",
                                      "fill": EXAMPLE})
    ET.SubElement(legend, "rect", {"x": str(MARGIN + 150), "y": str(y - 6), "width": "12", "height": "12", "fill": AVOID})
    row = ET.SubElement(legend, "text", {"x": str(MARGIN + 12), "y": str(y + 4)})
    row.text = "the query"
    row = ET.SubElement(legend, "text", {"x": str(MARGIN + 168), "y": str(y + 4)})
    row.text = "a paper to avoid   \u00b7   circle: a hit (its rank inside; size: its score)   \u00b7   line: weight"
    y += 24
    ET.SubElement(legend, "text", {"x": str(MARGIN - 6), "y": str(y + 4)}).text = _short(graph["edge_rule"]["rule"], 150)
    y += 24
    ET.SubElement(legend, "text", {"x": str(MARGIN - 6), "y": str(y + 4)}).text = _short(graph["grouping"]["note"], 150)
    for g in graph["groups"]:
        y += 24
        ET.SubElement(legend, "circle", {"cx": str(MARGIN), "cy": str(y), "r": "7", "fill": group_colour(g["id"])})
        ET.SubElement(legend, "text", {"x": str(MARGIN + 14), "y": str(y + 4)}).text = \
            _short(f"group {g['id'] + 1} ({g['size']} hits): \u201c{g['name']}\u201d", 140)


def render(graph: dict, fmt: str) -> str:
    """The graph (its JSON shape) as `fmt`: graphml or svg (json is the shape itself)."""
    if fmt == "graphml":
        return to_graphml(graph)
    if fmt == "svg":
        return to_svg(graph)
    raise ValueError(f"a graph's file format is graphml or svg (got {fmt!r})")
