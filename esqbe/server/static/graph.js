// esqbe's page, the Graph view: the hits of the query (POST /graph) drawn as an SVG of the page's own, no library.
// A hit is a circle (its rank inside, its size its score, its colour its group or year), a link the rescorer's similarity
// between two hits both ways (width: weight), the query's examples a black diamond and the papers to avoid a red square,
// each dashed to the hits it ranked most like it. Hover: what a hit or a link is (the sentence pair behind it); click: the
// hit's card, as the list shows it; double click: query by it. Uses app.js's state, el, $, fmt, hitItem, nextQueryHash.
"use strict";

// the server's colours (esqbe/query/graph_formats.py): a group's (past nine groups they repeat), a hit in no group
const GROUP_COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
const NO_GROUP = "#b8b8b8";
// years: from the oldest (dark blue) to the newest (yellow), viridis's stops
const YEAR_STOPS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];
const SVG = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

function showView(view) {
  state.view = view === "graph" ? "graph" : "list";
  for (const b of document.querySelectorAll(".view-btn")) b.setAttribute("aria-pressed", b.dataset.view === state.view ? "true" : "false");
  $("hits").hidden = state.view === "graph";
  $("graph-view").hidden = state.view !== "graph";
  if (state.view === "graph") draw();
}

// A click on List or Graph: the address keeps the view; the graph of the query shown is asked for once.
function switchView(view) {
  if (view === state.view) return;
  showView(view);
  if (!location.hash) return;
  const params = new URLSearchParams(location.hash.slice(1));
  if (state.view === "graph") params.set("view", "graph"); else params.delete("view");
  history.replaceState(null, "", `#${params.toString()}`);
  if (state.view === "graph" && state.result && (!state.graph || state.graph.result !== state.result)) runQuery();
}

function clearGraph() {
  state.graph = null;
  $("graph-svg").replaceChildren();
  $("graph-legend").replaceChildren();
  $("graph-info").textContent = "";
  closeCard();
}

function renderGraph(graph) {
  state.graph = graph;
  const g = graph.grouping || {};
  const groups = graph.groups.length ? `${graph.groups.length} groups` : "no groups";
  $("graph-info").textContent = `${graph.nodes.length} hits · ${graph.edges.length} links · ${groups} · ` +
    `${fmt((graph.timings_ms || {}).total, 0)} ms`;
  $("graph-info").title = `${graph.edge_rule.rule}. ${g.note || ""}`;
  // colour by group where there are groups, else by year where the hits have years
  const years = graph.nodes.some((n) => n.year !== null && n.year !== undefined);
  $("graph-colour").value = graph.groups.length || !years ? "group" : "year";
  draw();
}

function yearColour(year, low, high) {
  if (year === null || year === undefined) return NO_GROUP;
  const t = high > low ? (year - low) / (high - low) : 0.5;
  const at = t * (YEAR_STOPS.length - 1), i = Math.min(Math.floor(at), YEAR_STOPS.length - 2), f = at - i;
  const mix = (a, b) => Math.round(a + (b - a) * f);
  const rgb = (c) => [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16));
  const [a, b] = [rgb(YEAR_STOPS[i]), rgb(YEAR_STOPS[i + 1])];
  return `rgb(${mix(a[0], b[0])}, ${mix(a[1], b[1])}, ${mix(a[2], b[2])})`;
}

// white on a dark fill, black on a light one
function inkOn(colour) {
  const m = /rgb\((\d+), (\d+), (\d+)\)/.exec(colour);
  const [r, g, b] = m ? m.slice(1).map(Number) : [1, 3, 5].map((k) => parseInt(colour.slice(k, k + 2), 16));
  return 0.299 * r + 0.587 * g + 0.114 * b > 150 ? "#1d1d1f" : "#ffffff";
}

function nodeColours(graph) {
  const byYear = $("graph-colour").value === "year";
  const years = graph.nodes.map((n) => n.year).filter((y) => y !== null && y !== undefined);
  const low = Math.min(...years), high = Math.max(...years);
  return new Map(graph.nodes.map((n) => [n.id, byYear ? yearColour(n.year, low, high)
    : n.group === null || n.group === undefined ? NO_GROUP : GROUP_COLOURS[n.group % GROUP_COLOURS.length]]));
}

function short(text, n) {
  const t = String(text || "").replace(/\s+/g, " ").trim();
  return t.length <= n ? t : t.slice(0, n - 1) + "…";
}

function nodeName(node, hit) {
  return node.title || (hit && hit.sentences && hit.sentences[0] ? short(hit.sentences[0].text, 80) : node.id);
}

// Draw the graph the size of its box (again when the window is resized): positions from the server's seeded layout.
function draw() {
  const graph = state.graph;
  const svg = $("graph-svg");
  if (!graph || $("graph-view").hidden) return;
  const box = $("graph-box");
  const W = Math.max(300, Math.round(box.clientWidth || 600));
  const narrow = W < 640;
  const H = Math.round(narrow ? W * 1.15 : Math.min(W * 0.62, 680));
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  const pad = narrow ? 22 : 34;
  const at = (p) => [pad + p.x * (W - 2 * pad), pad + p.y * (H - 2 * pad)];
  const res = graph.result;
  const hits = new Map(res.hits.map((h) => [h.paper_id, h]));
  const where = new Map([...graph.nodes, ...graph.anchors].map((n) => [n.id, at(n)]));
  const colours = nodeColours(graph);
  const scores = graph.nodes.map((n) => n.score);
  const sLow = Math.min(...scores), sSpan = Math.max(Math.max(...scores) - sLow, 1e-9);
  const [rMin, rMax] = narrow ? [6, 13] : [8, 18];
  const weights = graph.edges.map((e) => e.weight);
  const wLow = Math.min(...weights), wSpan = Math.max(Math.max(...weights) - wLow, 1e-9);
  const names = new Map(graph.nodes.map((n) => [n.id, `${n.rank}. ${short(nodeName(n, hits.get(n.id)), 70)}`]));

  const links = svgEl("g", { class: "links" });
  for (const x of graph.anchor_links) {
    const [[x1, y1], [x2, y2]] = [where.get(x.anchor), where.get(x.target)];
    links.append(svgEl("line", { class: "anchor-link", x1, y1, x2, y2 }));
  }
  for (const e of graph.edges) {
    const [[x1, y1], [x2, y2]] = [where.get(e.source), where.get(e.target)];
    const width = 1 + 4 * (e.weight - wLow) / wSpan;
    const line = svgEl("line", { class: `edge band-${e.band}`, x1, y1, x2, y2, "stroke-width": width.toFixed(2),
      "data-source": e.source, "data-target": e.target });
    // a wider line, not drawn, for the pointer: a thin link is easy to hover
    const hit = svgEl("line", { class: "edge-hit", x1, y1, x2, y2, "data-source": e.source, "data-target": e.target,
      onmouseenter: (ev) => { line.classList.add("active"); showTip(ev, edgeTip(e, names)); },
      onmousemove: (ev) => moveTip(ev), onmouseleave: () => { line.classList.remove("active"); hideTip(); } });
    links.append(line, hit);
  }
  const marks = svgEl("g", { class: "anchors" });
  for (const a of graph.anchors) {
    const [x, y] = where.get(a.id);
    const s = narrow ? 8 : 10;
    const label = a.role === "example" ? "query" : "not like";
    const title = `${a.role === "example" ? "The query" : "Not like this"}: ${a.title || a.paper_id || "the pasted text"}` +
      (a.facet ? ` (its ${a.facet} sentences)` : "");
    const shape = a.role === "example"
      ? svgEl("polygon", { class: "anchor example", points: `${x},${y - s} ${x + s},${y} ${x},${y + s} ${x - s},${y}` })
      : svgEl("rect", { class: "anchor avoid", x: x - s * 0.8, y: y - s * 0.8, width: s * 1.6, height: s * 1.6 });
    marks.append(svgEl("g", { class: `anchor-mark ${a.role}`, "data-role": a.role, "data-paper-id": a.paper_id || "",
      onmouseenter: (ev) => showTip(ev, [title]), onmousemove: (ev) => moveTip(ev), onmouseleave: hideTip },
    shape, svgEl("text", { class: "anchor-label", x: x + s + 3, y: y + 4, text: label })));
  }
  const nodes = svgEl("g", { class: "nodes" });
  for (const n of graph.nodes) {
    const [x, y] = where.get(n.id);
    const r = rMin + (rMax - rMin) * (n.score - sLow) / sSpan;
    const fill = colours.get(n.id);
    const hit = hits.get(n.id);
    const node = svgEl("g", { class: "gnode", tabindex: "0", role: "button", "data-paper-id": n.id,
      "aria-label": `${names.get(n.id)}: score ${fmt(n.score)}${n.band ? `, ${n.band} match` : ""}; press to open`,
      onmouseenter: (ev) => { focusLinks(n.id, true); showTip(ev, nodeTip(n, hit, graph)); },
      onmousemove: (ev) => moveTip(ev), onmouseleave: () => { focusLinks(n.id, false); hideTip(); },
      onclick: () => openCard(n.id, 400),
      ondblclick: () => { clearTimeout(cardScroll); location.hash = nextQueryHash(hit, res); },
      onkeydown: (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); openCard(n.id, 0); } } },
    svgEl("circle", { cx: x, cy: y, r: r.toFixed(1), fill }),
    svgEl("text", { x, y: y + (narrow ? 3 : 4), "text-anchor": "middle", fill: inkOn(fill),
      "font-size": narrow ? 8 : 10, text: String(n.rank) }));
    if (state.card === n.id) node.classList.add("selected");
    nodes.append(node);
  }
  svg.setAttribute("aria-label", `The ${graph.nodes.length} hits as a graph, ${graph.edges.length} links: ` +
    "press a hit to open it, double-click to query by it");
  svg.replaceChildren(links, nodes, marks);
  legend(graph, colours);
}

function focusLinks(id, on) {
  for (const line of document.querySelectorAll("#graph-svg .edge")) {
    line.classList.toggle("active", on && (line.dataset.source === id || line.dataset.target === id));
  }
}

function nodeTip(n, hit, graph) {
  const lines = [`${n.rank}. ${nodeName(n, hit)}`,
    `score ${fmt(n.score)}${n.band ? ` · ${n.band} match` : ""}${n.year !== null && n.year !== undefined ? ` · ${n.year}` : ""} · ` +
    `${n.degree} link${n.degree === 1 ? "" : "s"}`];
  if (n.group !== null && n.group !== undefined) lines.push(`group ${n.group + 1}: “${short(graph.groups[n.group].name, 110)}”`);
  if (n.truncated) lines.push("compared on its first 64 sentences of the facet");
  return lines;
}

function edgeTip(e, names) {
  const p = e.pair;
  return [`${names.get(e.source)}  ~  ${names.get(e.target)}`,
    `weight ${fmt(e.weight)} (${e.band}): ${fmt(e.forward)} one way, ${fmt(e.backward)} the other`,
    `[${p.source_index}] “${short(p.source_sentence, 220)}”`, `~ [${p.target_index}] “${short(p.target_sentence, 220)}”`];
}

function showTip(ev, lines) {
  const tip = $("graph-tip");
  tip.replaceChildren(...lines.map((t, i) => el(i ? "span" : "strong", { class: "tip-line", text: t })));
  tip.hidden = false;
  moveTip(ev);
}

function moveTip(ev) {
  const tip = $("graph-tip");
  const box = $("graph-box").getBoundingClientRect();
  const x = ev.clientX - box.left, y = ev.clientY - box.top;
  const left = Math.max(4, Math.min(x + 14, box.width - tip.offsetWidth - 4));
  const top = y + 16 + tip.offsetHeight > box.height ? Math.max(4, y - tip.offsetHeight - 12) : y + 16;
  tip.style.left = `${left}px`;
  tip.style.top = `${top}px`;
}

function hideTip() {
  $("graph-tip").hidden = true;
}

// A clicked hit's card: the hit as the list shows it (title, authors, links, its pairs, + More like this, Not like this),
// scrolled into view `after` ms unless a double click (query by the hit) came first: a page that moved under the
// pointer between the two clicks would lose the second.
let cardScroll = null;

function openCard(id, after = 0) {
  const graph = state.graph;
  const res = graph && graph.result;
  const hit = res && res.hits.find((h) => h.paper_id === id);
  if (!hit) return;
  state.card = id;
  for (const g of document.querySelectorAll("#graph-svg .gnode")) g.classList.toggle("selected", g.dataset.paperId === id);
  const card = $("graph-card");
  card.replaceChildren(el("div", { class: "card-head" },
    el("span", { class: "muted", text: "The hit you clicked (double-click a hit to query by it):" }),
    el("button", { type: "button", class: "card-close", "aria-label": "Close the card", onclick: closeCard }, "×")),
  el("ol", { class: "hits" }, hitItem(hit, res, hitContext(res))));
  card.hidden = false;
  clearTimeout(cardScroll);
  cardScroll = setTimeout(() => { if (state.card === id) card.scrollIntoView({ block: "nearest" }); }, after);
}

function closeCard() {
  state.card = null;
  $("graph-card").hidden = true;
  $("graph-card").replaceChildren();
  for (const g of document.querySelectorAll("#graph-svg .gnode.selected")) g.classList.remove("selected");
}

function legend(graph, colours) {
  const items = [];
  const swatch = (colour, cls = "swatch") => el("span", { class: cls, style: `background:${colour}` });
  if ($("graph-colour").value === "year") {
    const years = graph.nodes.map((n) => n.year).filter((y) => y !== null && y !== undefined);
    if (years.length) {
      items.push(el("li", { class: "legend-years" }, "year: ", el("span", { class: "year-low", text: String(Math.min(...years)) }),
        el("span", { class: "year-ramp", style: `background:linear-gradient(to right, ${YEAR_STOPS.join(", ")})` }),
        el("span", { class: "year-high", text: String(Math.max(...years)) })));
    }
    if (years.length < graph.nodes.length) items.push(el("li", {}, swatch(NO_GROUP), "no year"));
  } else {
    for (const g of graph.groups) {
      items.push(el("li", { class: "legend-group", "data-group": g.id, title: `named by ${g.name_paper} [${g.name_index}]: ${g.name}` },
        swatch(GROUP_COLOURS[g.id % GROUP_COLOURS.length]),
        el("strong", { text: `Group ${g.id + 1}` }), ` · ${g.size} hits: “${short(g.name, 140)}”`));
    }
    if (graph.nodes.some((n) => n.group === null || n.group === undefined)) {
      items.push(el("li", {}, swatch(NO_GROUP), graph.groups.length ? "in no group" : "no groups"));
    }
  }
  const marks = el("ul", { class: "legend-marks" },
    el("li", {}, el("span", { class: "mark-example", "aria-hidden": "true", text: "◆" }), " the query"),
    graph.anchors.some((a) => a.role === "avoid") ? el("li", {}, el("span", { class: "mark-avoid", "aria-hidden": "true", text: "■" }), " a paper to avoid") : null,
    el("li", { text: "● a hit: its rank inside, size by score" }),
    el("li", { text: "— a link: width by weight (dashed: to the query)" }));
  $("graph-legend").replaceChildren(el("ul", { class: "legend-colours" }, ...items), marks,
    el("p", { class: "muted grouping-note", text: `${(graph.grouping || {}).note || ""}. Links: ${graph.edge_rule.rule}.` }));
}

document.addEventListener("DOMContentLoaded", () => {
  $("graph-colour").addEventListener("change", draw);
  let pending = null;
  window.addEventListener("resize", () => { clearTimeout(pending); pending = setTimeout(draw, 120); });
});
