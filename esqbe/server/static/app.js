// esqbe's page: find a paper, choose a facet or sentences, see similar papers and why.
// Plain JS, no dependencies; every URL is relative so the page works where the app is mounted.
"use strict";

// One thing at a time: `gen` counts what the page was asked last (a paper loaded, a query run); an answer to an
// older request is dropped, so hits of an old query never show under a new query paper.
// `also` / `avoid`: papers added from the hits as more examples or as "not like this" (in the address as also= / not=).
// `view`: the hits as a list or as a graph (graph.js; in the address as view=graph).
const state = { paper: null, facet: null, chosen: new Set(), lastQuery: null, result: null, gen: 0, also: [], avoid: [],
  titles: new Map(), view: "list", graph: null };  // titles: paper id -> title, for the chips of the set (from hits and answers)
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;  // CSSOM: allowed by the page's Content-Security-Policy
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// A private library (`esqbe serve --private`) answers 401 until the page sends the token: it is asked
// for once and kept for this tab only (sessionStorage), then sent with every call.
const TOKEN_KEY = "esqbe-token";

async function api(path, options = {}, asked = false) {
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const resp = await fetch(path, { headers, ...options });
  if (resp.status === 401) {
    // calls made together all get 401 before the token is given: the one asked first keeps it, the others retry
    // with it instead of forgetting it and asking again
    const now = sessionStorage.getItem(TOKEN_KEY);
    if (now && now !== token) return api(path, options, asked);
    sessionStorage.removeItem(TOKEN_KEY);
    const given = asked ? null : window.prompt("This library is private. Its access token:");
    if (given && given.trim()) {
      sessionStorage.setItem(TOKEN_KEY, given.trim());
      return api(path, options, true);
    }
  }
  let body = null;
  try { body = await resp.json(); } catch (e) { /* not JSON */ }
  if (!resp.ok) {
    const msg = body && body.error ? body.error.message : `${resp.status} ${resp.statusText}`;
    const err = new Error(msg); err.status = resp.status; throw err;
  }
  return body;
}

// The error box sits at the top of the page, under the header: shown, it is scrolled into view.
function showError(message) {
  const box = $("error");
  if (!message) { box.hidden = true; box.textContent = ""; return; }
  box.textContent = message; box.hidden = false;
  box.scrollIntoView({ block: "start" });
}

// The results of the last query, gone: a new query paper (or an error) never sits above old hits.
function clearResults(info = "No query yet.") {
  state.result = null;
  $("hits").replaceChildren();
  clearGraph();
  $("results-info").textContent = info;
  $("export").hidden = true;
  linkQuerySentences([], false);
}

// A title cut at a word to name an example or a chip (its id where it has none).
function shortTitle(title, id, n = 48) {
  const t = String(title || "").replace(/\s+/g, " ").trim();
  if (!t) return id ? `paper ${id}` : "a text";
  if (t.length <= n) return t;
  const cut = t.slice(0, n - 1).replace(/\s+\S*$/, "");
  return (cut.length > n / 2 ? cut : t.slice(0, n - 1)) + "…";
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));

// ---------------------------------------------------------------- finding a paper

async function find(q) {
  showError(null);
  const list = $("finder-list");
  list.replaceChildren();
  $("finder").hidden = false;
  $("finder-title").textContent = "Searching…";
  try {
    const res = await api(`search?q=${encodeURIComponent(q)}&k=10`);
    $("finder-title").textContent = res.hits.length ? `Papers found for “${q}”` : `No paper matches “${q}”`;
    for (const hit of res.hits) {
      const button = el("button", { type: "button", class: "finder-hit", "data-paper-id": hit.paper_id,
        onclick: () => { location.hash = `paper=${encodeURIComponent(hit.paper_id)}`; } },
        el("strong", { text: hit.title || hit.first_sentence.slice(0, 90) || hit.paper_id }),
        el("span", { class: "pid", text: hit.paper_id + ({ id: " (exact id)", identifier: " (its identifier)", author: " (by this author)" }[hit.match] || "") }),
        el("span", { class: "first", text: hit.first_sentence }));
      list.append(el("li", {}, button));
    }
    const first = list.querySelector("button");
    if (first) first.focus();
  } catch (e) {
    $("finder-title").textContent = "Search failed";
    showError(e.message);
  }
}

// ---------------------------------------------------------------- the query paper

async function loadPaper(id, { facet = null, sentences = null, run = false } = {}) {
  const gen = ++state.gen;
  showError(null);
  clearResults("Loading the query paper…");
  let paper;
  try {
    paper = await api(`papers/${encodeURIComponent(id)}`);
  } catch (e) {
    if (gen !== state.gen) return;
    clearPaper();
    clearResults("No query.");
    showError(e.status === 404 ? `Paper ${id} is not in the index.` : e.message);
    return;
  }
  if (gen !== state.gen) return;
  state.paper = paper;
  clearResults(run ? "Searching…" : "No query yet: pick a facet or click sentences of the query paper.");
  $("finder").hidden = true;
  state.chosen = new Set(sentences || []);
  state.facet = sentences && sentences.length ? null : facet;
  renderPaper();
  if (run && (state.facet || state.chosen.size)) runQuery();
  else $("query-panel").focus();
}

function clearPaper() {
  state.paper = null; state.facet = null; state.chosen = new Set(); state.lastQuery = null;
  $("query-paper").hidden = true;
  $("query-empty").hidden = false;
  $("sentences").replaceChildren();
}

// A pasted abstract as the query paper: its sentences (split and labelled by the server) show after a query.
function useText() {
  const text = $("text-input").value.trim();
  if (!text) { showError("Paste an abstract first."); return; }
  state.gen++;
  showError(null);
  clearResults("No query yet: pick a facet, or run the query with every sentence of the text.");
  state.paper = { paper_id: null, text, title: $("text-title").value.trim(), sentences: [], facet_queries: {}, isText: true };
  state.facet = null; state.chosen = new Set();
  $("finder").hidden = true;
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  renderPaper();
  $("query-panel").focus();
  listTextSentences(state.paper);
}

// Every sentence of a pasted text, split and labelled by the server (a one-hit query with every sentence and no
// rescorer), so that all can be clicked before any query, and after a facet query that used only some of them.
async function listTextSentences(p) {
  let res;
  try {
    res = await api("query", { method: "POST", body: JSON.stringify({ text: p.text, ...(p.title ? { title: p.title } : {}),
      k: 1, rescorer: "none" }) });
  } catch (e) { return; }  // the query itself will say what is wrong with the text
  if (state.paper !== p) return;  // another query paper since
  const known = new Map(p.sentences.map((s) => [s.index, s]));
  for (const s of res.query.sentences) {
    if (!known.has(s.index)) known.set(s.index, { index: s.index, text: s.text, facet: s.facet, probabilities: s.probabilities || null });
  }
  p.sentences = [...known.values()].sort((a, b) => a.index - b.index);
  const chosen = state.chosen;
  renderPaper();
  state.chosen = chosen;
  syncSelection();
  if (state.result) markQuerySentences(state.result);
}

function renderPaper() {
  const p = state.paper;
  $("query-empty").hidden = true;
  $("query-paper").hidden = false;
  $("paper-title").textContent = p.title || (p.isText ? "(pasted text)" : "(no title)");
  $("paper-meta").replaceChildren(...(p.isText ? [] : [hitMeta(p.metadata || {})].filter(Boolean)));
  $("paper-id").textContent = p.isText ?
    (p.sentences.length ? `pasted text · ${p.sentences.length} sentences, labelled by esqbe's tagger` :
      "pasted text · splitting it into sentences…") :
    `id: ${p.paper_id} · ${p.sentences.length} sentences` + (p.facets_predicted ? " · facet labels predicted by esqbe's tagger" : "");
  for (const b of document.querySelectorAll(".facet-btn")) {
    b.disabled = !p.isText && !(p.facet_queries && p.facet_queries[b.dataset.facet]);
    b.title = b.disabled ? `This paper has no ${b.dataset.facet} sentence` : `Query by the ${b.dataset.facet} sentences`;
  }
  const list = $("sentences");
  list.replaceChildren();
  for (const s of p.sentences) {
    const button = el("button", { type: "button", class: `sentence facet-${s.facet}`, "data-index": s.index,
      "aria-pressed": "false", onclick: () => toggleSentence(s.index) },
      el("span", { class: "num", text: `[${s.index}]` }), el("span", { class: "tag", text: s.facet }),
      el("span", { class: "why" }), s.text);
    list.append(el("li", {}, button));
  }
  syncSelection();
}

// The facet query's sentences as the server chooses them (GET /papers' facet_queries: the given labels, or the
// tagger's probabilities against query_facet_threshold), so what is marked is what the query uses.
function facetQuery() {
  const p = state.paper;
  return p && state.facet && p.facet_queries ? p.facet_queries[state.facet] || null : null;
}

function selectedIndices() {
  if (!state.paper) return [];
  if (state.facet) {
    const q = facetQuery();
    if (q) return q.sentences.map((s) => s.index);
    return state.paper.sentences.filter((s) => s.facet === state.facet).map((s) => s.index);
  }
  return [...state.chosen].sort((a, b) => a - b);
}

function toggleSentence(i) {
  if (state.facet) { state.chosen = new Set(); state.facet = null; }
  if (state.chosen.has(i)) state.chosen.delete(i); else state.chosen.add(i);
  syncSelection();
}

function chooseFacet(facet) {
  state.facet = state.facet === facet ? null : facet;
  state.chosen = new Set();
  syncSelection();
}

function syncSelection() {
  const chosen = new Set(selectedIndices());
  const q = facetQuery();
  const why = new Map((q ? q.sentences : []).map((s) => [s.index, s]));
  for (const b of document.querySelectorAll(".sentence")) {
    const i = Number(b.dataset.index);
    b.setAttribute("aria-pressed", chosen.has(i) ? "true" : "false");
    const w = why.get(i);
    // a pasted text's sentences: the label esqbe's tagger gave each, and how sure it was
    const s = !w && state.paper.isText ? state.paper.sentences.find((x) => x.index === i) : null;
    const own = s && s.probabilities ? s.probabilities[s.facet] : undefined;
    b.querySelector(".why").textContent = w && w.probability !== null && w.probability !== undefined ?
      `p(${state.facet}) ${fmt(w.probability, 2)}` : own !== undefined ? `p(${s.facet}) ${fmt(own, 2)}` : "";
  }
  for (const b of document.querySelectorAll(".facet-btn")) {
    b.setAttribute("aria-pressed", state.facet === b.dataset.facet ? "true" : "false");
  }
  const text = state.paper && state.paper.isText;
  $("run-query").disabled = chosen.size === 0 && !text;
  if (q) {
    const other = q.sentences.filter((s) => s.facet !== state.facet).map((s) => `[${s.index}] is labelled ${s.facet}`);
    $("selection-info").textContent = `Query: ${chosen.size} sentence(s), ${q.rule}` + (other.length ? ` (${other.join(", ")})` : "") + ".";
  } else if (text && chosen.size === 0) {
    $("selection-info").textContent = state.facet ? `Query: the text's ${state.facet} sentences, as esqbe's tagger finds them.` :
      "Query: every sentence of the text (or pick a facet).";
  } else {
    $("selection-info").textContent = chosen.size === 0 ? "Nothing selected: pick a facet or click sentences." :
      state.facet ? `Query: the ${chosen.size} ${state.facet} sentence(s).` : `Query: ${chosen.size} chosen sentence(s).`;
  }
}

// ---------------------------------------------------------------- querying

function filterConditions() {
  return $("filters").value.split(";").map((c) => c.trim()).filter(Boolean);
}

// The address of a query: opening it again (a bookmark, a link sent to a colleague) runs the same query: the
// paper or the pasted text (and its title), the facet or the sentences, the filters, the rescorer and k.
function queryHash({ paper = null, text = null, title = "", facet = null, sentences = [], filters = [], rescorer = null, k = 10,
  also = [], avoid = [], view = "list" }) {
  const params = new URLSearchParams();
  if (text !== null) { params.set("text", text); if (title) params.set("title", title); } else params.set("paper", paper);
  if (facet) params.set("facet", facet); else if (sentences.length) params.set("sentences", sentences.join(","));
  for (const id of also) params.append("also", id);
  for (const id of avoid) params.append("not", id);
  if (filters.length) params.set("filters", filters.join("; "));
  if (rescorer && rescorer !== "summax") params.set("rescorer", rescorer);  // absent: the default, summax
  if (k !== 10) params.set("k", String(k));
  if (view === "graph") params.set("view", "graph");  // absent: the list
  return params.toString();
}

async function runQuery() {
  const p = state.paper;
  if (!p) return;
  const indices = selectedIndices();
  if (!indices.length && !p.isText) return;
  const gen = ++state.gen;
  showError(null);
  const k = Math.max(1, Math.min(100, parseInt($("k").value, 10) || 10));
  const rescorer = $("rescorer").value;
  const body = { k, rescorer, with_sentences: true };
  if (state.also.length || state.avoid.length) {  // a query of several examples: this paper first, then the added ones
    const first = p.isText ? { text: p.text, ...(p.title ? { title: p.title } : {}) } : { paper_id: p.paper_id };
    if (!state.facet && indices.length) first.sentences = indices;
    body.examples = [first, ...state.also.map((id) => ({ paper_id: id }))];
    if (state.avoid.length) body.avoid = state.avoid.map((id) => ({ paper_id: id }));
    if (state.facet) body.facet = state.facet;
  } else {
    if (p.isText) { body.text = p.text; if (p.title) body.title = p.title; } else body.paper_id = p.paper_id;
    if (state.facet) body.facet = state.facet; else if (indices.length) body.sentences = indices;
  }
  const filters = filterConditions();
  if (filters.length) body.filters = filters;
  state.lastQuery = body;
  const hash = queryHash({ paper: p.paper_id, text: p.isText ? p.text : null, title: p.title, facet: state.facet,
    sentences: state.facet ? [] : indices, filters, rescorer, k, also: state.also, avoid: state.avoid, view: state.view });
  if (location.hash.slice(1) !== hash) history.replaceState(null, "", `#${hash}`);
  renderSet();
  clearResults("Searching…");
  $("run-query").disabled = true;
  try {
    // the graph view asks POST /graph, whose answer holds the query's result too: the list and the graph of one query
    const graph = state.view === "graph" ? await api("graph", { method: "POST", body: JSON.stringify(body) }) : null;
    const res = graph ? graph.result : await api("query", { method: "POST", body: JSON.stringify(body) });
    if (gen !== state.gen) return;  // another paper or query since: this answer is stale
    if (p.isText) adoptTextSentences(res);
    renderHits(res);
    if (graph) renderGraph(graph);
  } catch (e) {
    if (gen !== state.gen) return;
    clearResults("The query failed: see the message above.");
    showError(e.message);
  } finally {
    if (gen === state.gen) syncSelection();
  }
}

// A text query's answer names its sentences (index, label, why): they become the query paper's, to pick from.
function adoptTextSentences(res) {
  const p = state.paper;
  const known = new Map(p.sentences.map((s) => [s.index, s]));
  for (const s of res.query.sentences) {
    known.set(s.index, { index: s.index, text: s.text, facet: s.facet, probabilities: s.probabilities || null });
  }
  p.sentences = [...known.values()].sort((a, b) => a.index - b.index);
  const facet = state.facet;
  p.facet_queries = facet ? { [facet]: { rule: res.query.selection ? res.query.selection.rule : `the ${facet} sentences`,
    sentences: res.query.sentences } } : {};
  const chosen = state.chosen;
  renderPaper();
  state.chosen = chosen;
  syncSelection();
}

// Download the hits of the last query (POST /query with "format": csv, bibtex, ris or csl-json).
async function download(format) {
  if (!state.lastQuery) return;
  showError(null);
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  try {
    const resp = await fetch("query", { method: "POST", headers, body: JSON.stringify({ ...state.lastQuery, format }) });
    if (!resp.ok) {
      let msg = `${resp.status} ${resp.statusText}`;
      try { const b = await resp.json(); if (b && b.error) msg = b.error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    const blob = await resp.blob();
    const named = /filename="?([^";]+)"?/.exec(resp.headers.get("Content-Disposition") || "");
    const ext = { csv: "csv", bibtex: "bib", ris: "ris", "csl-json": "json" }[format];
    const a = el("a", { href: URL.createObjectURL(blob), download: named ? named[1] : `esqbe-hits.${ext}` });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  } catch (e) {
    showError(`The download failed: ${e.message}`);
  }
}

// The query's set: the papers added as examples and as "not like this", each removable; a change reruns the query.
function renderSet() {
  const box = $("query-set");
  box.hidden = !(state.also.length || state.avoid.length);
  const row = (ids, listId, kind) => $(listId).replaceChildren(...ids.map((id) => el("li", { "data-paper-id": id },
    el("span", { class: "chip-title", title: `id: ${id}` + (state.titles.get(id) ? ` · ${state.titles.get(id)}` : ""),
      text: shortTitle(state.titles.get(id), id) }),
    el("button", { type: "button", class: "set-remove", "aria-label": `Remove ${shortTitle(state.titles.get(id), id)} from ${kind === "also" ? "the examples" : "the papers to avoid"}`,
      onclick: () => { state[kind] = state[kind].filter((x) => x !== id); runQuery(); } }, "×"))));
  row(state.also, "also-list", "also");
  row(state.avoid, "avoid-list", "avoid");
}

function addToSet(kind, id, title = null) {
  if (title) state.titles.set(id, title);
  const other = kind === "also" ? "avoid" : "also";
  state[other] = state[other].filter((x) => x !== id);
  if (!state[kind].includes(id)) state[kind] = [...state[kind], id];
  runQuery();
}

function linkQuerySentences(indices, on) {
  for (const b of document.querySelectorAll(".sentence")) {
    b.classList.toggle("linked", on && indices.includes(Number(b.dataset.index)));
  }
}

// Links a hit's metadata allows: only http(s) URLs, ids put into known addresses piece by piece.
function safeUrl(u) {
  try {
    const x = new URL(String(u));
    return x.protocol === "https:" || x.protocol === "http:" ? x.href : null;
  } catch (e) { return null; }
}
const idPath = (id) => String(id).split("/").map(encodeURIComponent).join("/");

function hitLinks(meta) {
  const ids = meta.external_ids || {};
  const links = [];
  const s2 = safeUrl(meta.s2_url) || (ids.corpus_id ? `https://api.semanticscholar.org/CorpusID:${encodeURIComponent(ids.corpus_id)}` : null);
  if (s2) links.push(["S2", s2]);
  const arxiv = ids.arxiv || meta.arxiv;
  if (arxiv) links.push(["arXiv", `https://arxiv.org/abs/${idPath(arxiv)}`]);
  const doi = ids.doi || meta.doi;
  if (doi) links.push(["DOI", `https://doi.org/${idPath(doi)}`]);
  // "open access" only where the record says so (S2, OpenAlex, arXiv); a reference manager's `url` is a plain link
  const pdf = safeUrl(meta.open_access_url);
  if (pdf) links.push(["open access", pdf]);
  const url = safeUrl(meta.url);
  if (url && url !== pdf) links.push(["link", url]);
  return links;
}

// A paper's metadata, each field labelled (a hit's and the query paper's alike).
function hitMeta(meta) {
  const parts = [];
  const field = (cls, label, value) => el("span", { class: cls }, el("span", { class: "field", text: `${label}: ` }), value);
  if (meta.year !== undefined && meta.year !== null) parts.push(field("year", "Year", String(meta.year)));
  const venue = meta.venue || meta.journal;
  if (venue) parts.push(field("venue", "Venue", String(typeof venue === "object" ? venue.name || "" : venue)));
  const names = (Array.isArray(meta.authors) ? meta.authors : []).map((a) => (a && typeof a === "object" ? a.name : a)).filter(Boolean);
  if (names.length) parts.push(field("authors", "Authors", names.slice(0, 2).join(", ") + (names.length > 2 ? " et al." : "")));
  const doi = (meta.external_ids || {}).doi || meta.doi;
  if (doi) parts.push(field("doi", "DOI", String(doi)));
  const links = hitLinks(meta).map(([label, href]) => el("a", { href, target: "_blank", rel: "noopener noreferrer", class: "ext" }, label));
  if (!parts.length && !links.length) return null;
  const line = el("div", { class: "hit-meta" });
  parts.forEach((x, i) => { if (i) line.append(" · "); line.append(x); });
  if (links.length) line.append(el("span", { class: "links" }, el("span", { class: "field", text: "Read: " }), ...links));
  return line;
}

// The query's own sentences (from the answer): marked in the query panel, and the only ones hovering links.
function markQuerySentences(res) {
  const inQuery = new Map(res.query.sentences.map((s) => [s.index, s]));
  for (const b of document.querySelectorAll(".sentence")) {
    const s = inQuery.get(Number(b.dataset.index));
    b.classList.toggle("in-query", Boolean(s));
    if (s) b.title = `in the query: ${s.why === "probability" ? `p(${res.query.facet}) ${fmt(s.probability, 2)} >= ${res.query.selection.threshold}` :
      s.why === "label" ? `labelled ${s.facet}` : s.why || "chosen"}`;
    else b.removeAttribute("title");
  }
}

function renderHits(res) {
  state.result = res;
  markQuerySentences(res);
  $("export").hidden = !res.hits.length;
  const t = res.timings_ms || {};
  // the filters this query ran with (what was sent), so that a short or empty list says why
  const filters = (state.lastQuery && state.lastQuery.filters) || [];
  const filtered = filters.length ? ` · filters: ${filters.join("; ")}` : "";
  // likely versions of the query or of a hit above (hit.likely_version_of) are listed after the numbered hits
  const numbered = res.hits.filter((h) => h.rank !== null && h.rank !== undefined).length;
  const versionCount = res.hits.length - numbered;
  const versionWords = versionCount ? ` (and ${versionCount} likely version${versionCount > 1 ? "s" : ""})` : "";
  $("results-info").textContent = `${numbered} papers${versionWords}${filtered} · rescorer ${res.rescorer} · similarity = ${res.similarity}` +
    ` · pair weight = ${res.match_weight}${scaleWords(res.scale)} · ${fmt(t.total, 0)} ms`;
  const list = $("hits");
  list.replaceChildren();
  for (const x of [...(res.query.examples || []), ...(res.query.avoid || [])]) if (x.paper_id && x.title) state.titles.set(x.paper_id, x.title);
  for (const h of res.hits) if (h.title) state.titles.set(h.paper_id, h.title);
  renderSet();
  const ctx = hitContext(res);
  let versionsShown = false;
  for (const hit of res.hits) {
    if (hit.likely_version_of && !versionsShown) {
      versionsShown = true;
      list.append(el("li", { class: "versions-head", text: "Likely versions of the query or of a paper above " +
        "(nearly the same sentences; not numbered)" }));
    }
    list.append(hitItem(hit, res, ctx));
  }
  if (!res.hits.length) $("results-info").textContent = `No similar paper found${filters.length ? ` with filters: ${filters.join("; ")}` : ""}.`;
}

// The sentences of a hit that matched the query, in order.
function matchedSentences(hit) {
  return [...new Set(hit.matches.map((m) => m.candidate_index))].sort((a, b) => a - b);
}

// The address of the query by a hit next: the same facet, or (chosen sentences) the sentences of it that matched; the
// same filters, rescorer, k and view.
function nextQueryHash(hit, res) {
  const asked = state.lastQuery || {};
  return queryHash({ paper: hit.paper_id, facet: res.query.facet, sentences: res.query.facet ? [] : matchedSentences(hit),
    filters: asked.filters || [], rescorer: asked.rescorer || null, k: asked.k || 10, view: state.view });
}

// What every hit of an answer is drawn with: the strongest pair's weight (the bars' scale), the examples, the papers
// to avoid.
function hitContext(res) {
  const examples = res.query.examples || [];
  return { maxWeight: Math.max(1e-9, ...res.hits.flatMap((h) => h.matches.map((m) => Math.abs(m.weight)))),
    examples, avoidList: res.query.avoid || [], several: examples.length > 1 };
}

// One hit as the list shows it (and the graph's card of a clicked node): title, scores, metadata and links, the matched
// pairs, the abstract, and what can be done with it (+ More like this, Not like this, query by it).
function hitItem(hit, res, { maxWeight, examples, avoidList, several }) {
  const matchedQ = [...new Set(hit.matches.filter((m) => !m.example).map((m) => m.query_index))];  // the panel's paper's
  const weightOf = new Map();
  for (const m of hit.matches) weightOf.set(m.candidate_index, Math.max(weightOf.get(m.candidate_index) || -Infinity, m.weight));

  // each pair names its example where the query has several (the query sentences of each are numbered in their own
  // paper); the best SHOWN_PAIRS pairs show, the rest a click away
  const byWeight = [...hit.matches].sort((a, b) => b.weight - a.weight);
  const rows = byWeight.map((m, n) => {
    const ex = examples[m.example || 0];
    const own = m.example === 0 || m.example === undefined;  // the query paper in the panel
    const row = el("tr", { class: n < SHOWN_PAIRS ? "pair" : "pair more", "data-query-index": m.query_index,
      "data-candidate-index": m.candidate_index, "data-example": m.example || 0, hidden: n >= SHOWN_PAIRS },
      el("td", { class: `q facet-${exampleFacet(ex, m.query_index)}` },
        el("button", { type: "button", class: "pair-focus", "aria-label": several ?
          `Show query sentence ${m.query_index} of example ${(m.example || 0) + 1}` : `Show query sentence ${m.query_index}`,
          onfocus: () => { if (own && state.result === res) linkQuerySentences([m.query_index], true); }, onblur: () => linkQuerySentences([], false) },
          el("span", { class: "stext", title: m.query_sentence },
            several ? el("span", { class: "example-of", title: ex ? `example ${(m.example || 0) + 1}: ${ex.paper_id ? "id " + ex.paper_id + " · " : ""}${ex.title || ""}` : "",
              text: `ex. ${(m.example || 0) + 1} “${ex ? shortTitle(ex.title, ex.paper_id, 32) : "?"}”` }) : null,
            el("span", { class: "num", text: `[${m.query_index}] ` }), m.query_sentence))),
      el("td", { class: "w", title: res.match_weight },
        el("strong", { text: fmt(m.weight) }),
        el("span", { class: "weight-bar", "aria-hidden": "true" },
          el("span", { style: `width:${Math.round(100 * Math.abs(m.weight) / maxWeight)}%` }))),
      el("td", { class: `c facet-${m.candidate_facet}` },
        el("span", { class: "stext", title: m.candidate_sentence }, el("span", { class: "num", text: `[${m.candidate_index}] ` }),
          el("span", { class: "tag", text: m.candidate_facet }), m.candidate_sentence)));
    row.addEventListener("mouseenter", () => { if (own && state.result === res) linkQuerySentences([m.query_index], true); });
    row.addEventListener("mouseleave", () => linkQuerySentences([], false));
    return row;
  });
  const hiddenPairs = Math.max(0, rows.length - SHOWN_PAIRS);
  let table = null;
  const more = hiddenPairs ? el("button", { type: "button", class: "more-pairs", "aria-expanded": "false",
    onclick: () => {
      const open = more.getAttribute("aria-expanded") !== "true";
      for (const r of rows.slice(SHOWN_PAIRS)) r.hidden = !open;
      table.classList.toggle("open", open);  // open: every pair, each sentence whole
      more.setAttribute("aria-expanded", open ? "true" : "false");
      more.textContent = open ? "Fewer pairs" : `${hiddenPairs} more pair${hiddenPairs > 1 ? "s" : ""}`;
    } }, `${hiddenPairs} more pair${hiddenPairs > 1 ? "s" : ""}`) : null;
  table = el("table", { class: "pairs" },
    el("thead", {}, el("tr", {}, el("th", { text: several ? "Query sentence (of which example)" : "Query sentence" }),
      el("th", { text: "Weight" }), el("th", { text: "Matched sentence of this paper" }))),
    el("tbody", {}, ...rows));
  // the papers to avoid that this hit is like: shown as such, by title, with the pair that made it so
  const pulled = (hit.avoided || []).filter((a) => a.penalty > 0);
  const avoidedBox = pulled.length ? el("div", { class: "avoided" },
    el("span", { class: "field", text: "Like a paper to avoid: " }),
    ...pulled.map((a) => {
      const t = state.titles.get(a.paper_id) || (avoidList.find((x) => x.paper_id === a.paper_id) || {}).title;
      return el("span", { class: "avoided-pair", "data-paper-id": a.paper_id, title: `id: ${a.paper_id}; its [${a.avoid_index}] “${a.avoid_sentence || ""}”` },
        `“${shortTitle(t, a.paper_id, 32)}” (score −${fmt(a.penalty)}): its [${a.avoid_index}] ~ this paper's [${a.candidate_index}] `,
        el("q", { text: a.candidate_sentence || "" }));
    })) : null;

  const abstract = el("div", { class: "abstract-text" });
  for (const s of hit.sentences || []) {
    const text = `${s.text} `;
    if (weightOf.has(s.index)) {
      abstract.append(el("mark", { class: `matched`, "data-index": s.index, title: `${s.facet}, weight ${fmt(weightOf.get(s.index))}` },
        text, el("sup", { text: fmt(weightOf.get(s.index), 2) })), " ");
    } else {
      abstract.append(el("span", { class: `facet-${s.facet}`, title: s.facet, text }), " ");
    }
  }
  const matchedC = matchedSentences(hit);
  const nextHash = nextQueryHash(hit, res);
  const band = strength(hit, res);
  const version = hit.likely_version_of || null;  // a likely version of the query or of a hit above: not numbered
  const item = el("li", { class: (band && band.classList.contains("strength-weak") ? "hit weak" : "hit") + (version ? " version" : ""), "data-paper-id": hit.paper_id, "data-query-paper": res.query.paper_id || "(text)" },
    el("div", { class: "hit-head" }, el("span", { class: "hit-rank", text: version ? "–" : `${hit.rank}.` }),
      el("h3", { class: "hit-title", text: hit.title || (hit.sentences && hit.sentences[0] ? hit.sentences[0].text.slice(0, 100) + "…" : hit.paper_id) }),
      el("span", { class: "pid" }, el("span", { class: "field", text: "id " }), hit.paper_id),
      version ? el("span", { class: "version-mark", "data-version-of": version,
        title: `nearly the same sentences as ${version}` + (typeof hit.version_overlap === "number" ?
          ` (sentence overlap ${fmt(hit.version_overlap, 3)})` : "") + ": likely another version of it, not numbered",
        text: `likely a version of ${state.titles.get(version) ? `“${state.titles.get(version)}” (${version})` : version}` }) : null),
    el("div", { class: "scores" },
      // the one number: it orders the hits and its band places it; the parts that make it follow, each explained
      el("span", { class: "score-main", title: `score: ${(res.score || {}).formula || "what the hits are ordered by"}; ` +
        "the query and this paper alone decide it, so it compares across pages, reranks and watches of this query" },
        "score ", el("strong", { class: "score", text: fmt(hit.score) })),
      band,
      el("span", { class: "score-similarity", title: `similarity (part of the score): ${res.similarity}` }, "similarity ",
        el("strong", { class: "similarity", text: fmt(hit.similarity) })),
      el("span", { class: "score-bm25", title: "word match (BM25): how strongly the query's words occur in this paper's " +
        "title and abstract (first stage; 0: no word in common; unbounded, compare only within this query)" },
        "word match (bm25) ", el("strong", { text: fmt(hit.bm25, 1) })),
      el("span", { class: "score-knn", title: "sentence kNN: for each query sentence the best cosine the first-stage " +
        "nearest-neighbour search found among this paper's sentences, averaged (-1..1; 0: found by words only)" },
        "sentence kNN ", el("strong", { text: fmt(hit.knn) })),
),
    hitMeta(hit.metadata || {}),
    table, avoidedBox,
    el("div", { class: "hit-actions" }, more,
      el("button", { type: "button", class: "add-example", "data-paper-id": hit.paper_id,
        onclick: () => addToSet("also", hit.paper_id, hit.title) }, "+ More like this"),
      el("button", { type: "button", class: "add-avoid", "data-paper-id": hit.paper_id,
        onclick: () => addToSet("avoid", hit.paper_id, hit.title) }, "Not like this"),
      el("a", { href: `#${nextHash}`, class: "query-next" }, res.query.facet ? `Query by this paper's ${res.query.facet}` :
        matchedC.length ? `Query by this paper's matched sentences [${matchedC.join(", ")}]` : "Query by this paper"),
      hit.sentences ? el("details", { class: "abstract" }, el("summary", { text: "Abstract", title: "The whole abstract, matched sentences marked" }), abstract) : null));
  item.addEventListener("mouseenter", () => { if (state.result === res) linkQuerySentences(matchedQ, true); });
  item.addEventListener("mouseleave", () => linkQuerySentences([], false));
  return item;
}

// Where a hit's score stands, so that a weak match looks weak: the band and percentile the server placed it at
// (hit.band, hit.percentile) on the response's scale (res.scale): this index's own matches, or the shipped fixed
// scale where the index is too small for its own (or while it is being measured). No scale (rescorer none, or a
// rescorer the fixed scale has no cuts for): no band.
// which scale the bands are on, in the results line (the tooltip of each band says the rest)
function scaleWords(scale) {
  if (!scale || scale.source === "none") return "";
  const what = scale.source === "index" ? "this index's own matches" : "the fixed scale";
  return ` · bands on ${what}${scale.measuring ? " (this index's own scale is being measured)" : ""}`;
}

function strength(hit, res) {
  if (!hit.band || typeof hit.score !== "number") return null;
  const scale = res.scale || {};
  const best = Math.max(...res.hits.map((h) => h.score).filter((x) => typeof x === "number"));
  const where = typeof hit.percentile === "number"
    ? `higher than ${Math.floor(hit.percentile)}% of this index's matches`
    : `on the fixed scale (strong from ${fmt((scale.cuts || {}).strong, 2)}, fair from ${fmt((scale.cuts || {}).fair, 2)})`;
  const title = `${hit.band} match: score ${fmt(hit.score)}, ${where}. This query's best hit: ${fmt(best)}. ` +
    `Scale: ${scale.description || "?"}.`;
  return el("span", { class: `strength strength-${hit.band}`, title, "data-scale": scale.source || "none",
    text: `${hit.band} match` });
}

// how many of a hit's pairs show before "N more pairs"
const SHOWN_PAIRS = 2;

// the label of query sentence `i` of example `ex` (the answer's own copy of its sentences)
function exampleFacet(ex, i) {
  const s = ex && (ex.sentences || []).find((x) => x.index === i);
  return s ? s.facet : facetOfQuery(i);
}

function facetOfQuery(i) {
  const s = state.paper && state.paper.sentences.find((x) => x.index === i);
  return s ? s.facet : "unlabeled";
}

// ---------------------------------------------------------------- routing and keys

function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  const id = params.get("paper");
  const text = params.get("text");
  if (!id && text === null) return;
  if (!["background", "method", "result", null].includes(params.get("facet"))) {
    state.gen++; clearPaper(); clearResults("No query.");
    showError(`Unknown facet “${params.get("facet")}” in the address: background, method or result.`);
    return;
  }
  $("rescorer").value = params.get("rescorer") || "summax";  // absent: the default, not the last query's
  $("k").value = params.get("k") || "10";  // what the address says, so that it reproduces the query
  $("filters").value = params.get("filters") || "";
  showView(params.get("view") === "graph" ? "graph" : "list");
  state.also = params.getAll("also").filter(Boolean);
  state.avoid = params.getAll("not").filter(Boolean);
  const sentences = params.get("sentences");
  const chosen = sentences ? sentences.split(",").map(Number).filter((n) => Number.isInteger(n)) : null;
  if (text !== null) {  // a pasted text: shown in its box, and queried as the address says
    $("text-query").open = true;
    $("text-input").value = text;
    $("text-title").value = params.get("title") || "";
    useText();
    state.facet = chosen && chosen.length ? null : params.get("facet");
    state.chosen = new Set(chosen || []);
    syncSelection();
    runQuery();
    return;
  }
  loadPaper(id, { facet: params.get("facet"), sentences: chosen, run: Boolean(params.get("facet") || sentences) });
}

async function showIndexInfo() {
  try {
    const h = await api("health");
    $("index-info").textContent = `${h.backend}: ${h.detail || h.status}`;
    const s = await api("stats");
    $("paper-count").textContent = `${Number(s.papers).toLocaleString("en")} papers in the index`;
    showFollowed(s.follow);
  } catch (e) {
    $("index-info").textContent = `index: ${e.message}`;
  }
}

// The followed sources (GET /stats `follow`, `esqbe follow add`): each one's last run, its counts and its last error.
function showFollowed(sources) {
  const panel = $("follow-panel"), list = $("follow-list");
  list.replaceChildren();
  if (!Array.isArray(sources) || !sources.length) { panel.hidden = true; return; }
  for (const src of sources) {
    if (!src.name) { list.append(el("li", { class: "follow-error", text: src.error || "unreadable" })); continue; }
    const last = src.last;
    const ran = last ? `last run ${utcDate(last.at, 16)} UTC: ${last.fetched} fetched, ${last.indexed} indexed, `
      + `${last.replaced} updated, ${last.unchanged} unchanged, ${last.deleted} gone at the source`
      + (last.stopped ? ` (stopped: ${last.stopped})` : "") : "never run";
    list.append(el("li", { class: "follow-source", "data-source": src.name },
      el("span", { class: "watch-name", text: src.name }),
      el("span", { class: "muted", text: ` ${src.spec} · ${ran}` }),
      last && last.error ? el("span", { class: "follow-error", role: "status", text: ` · last error: ${last.error}` }) : null));
  }
  panel.hidden = false;
}

// "Watch this query": the last query saved as a watch (POST /watches, a write) under a name and a threshold the
// reader gives; new papers that reach it show in the Watches list and the watch's Atom feed.
async function watchQuery() {
  if (!state.lastQuery) return;
  const name = window.prompt("Name of the watch (letters, digits, _ and -):");
  if (!name || !name.trim()) return;
  const given = window.prompt("Report new papers whose score is at least (empty: the index's strong matches):", "");
  if (given === null) return;
  const { with_sentences, format, ...query } = state.lastQuery;
  showError(null);
  try {
    const w = await api("watches", { method: "POST",
      body: JSON.stringify({ ...query, name: name.trim(), min_score: given.trim() === "" ? null : Number(given) }) });
    const info = $("watch-info");
    info.replaceChildren(`Watching as “${w.name}” (${w.threshold}); its feed: `,
      el("a", { href: w.feed, text: `watches/${w.name}.atom` }));
    info.hidden = false;
    showWatches();
  } catch (e) {
    showError(`The watch was not saved: ${e.message}`);
  }
}

// The index's watches (GET /watches): each opens to its finds (a query by each a click away) and its feed's address. A server
// without watches (or an older one) shows no panel.
function utcDate(seconds, n = 10) {
  return new Date(seconds * 1000).toISOString().slice(0, n).replace("T", " ");
}

async function showWatches() {
  let list = null;
  try { list = await api("watches?latest=10"); } catch (e) { list = null; }
  const panel = $("watch-panel"), ol = $("watch-list");
  ol.replaceChildren();
  if (!Array.isArray(list) || !list.length) { panel.hidden = true; $("watches-link").hidden = true; return; }
  $("watches-link").hidden = false;  // in the header: the panel is a click away wherever the page is scrolled
  $("watches-link").textContent = `Watches (${list.length})`;
  for (const w of list) {
    // each example (one for a single query) and each paper to avoid, by its title as the feed names it (cut at a
    // word past 60 characters; the id where a paper has none): `“Title A”, method; text “T”; not paper C`
    const short = (t) => {
      const text = (t || "").split(/\s+/).join(" ").trim();
      if (text.length <= 60) return text;
      const cut = text.slice(0, 59).replace(/\s+\S*$/, "");
      return (cut.length > 30 ? cut : text.slice(0, 59)) + "…";
    };
    const part = (q) => (q.paper_id ? (short(q.title) ? `“${short(q.title)}”` : `paper ${q.paper_id}`)
      : `text “${short(q.title) || "untitled"}”`) + (q.facet ? ", " + q.facet : "");
    const what = ((w.examples && w.examples.length) ? w.examples : [w.query || {}]).map(part).join("; ")
      + (w.avoid || []).map((a) => `; not ${part(a)}`).join("");
    const run = w.last_run ? `last run ${utcDate(w.last_run, 16)} UTC` : "never run";
    const matches = (w.latest || []).map((m) => el("li", { class: "watch-match", "data-paper-id": m.paper_id },
      el("a", { href: `#paper=${encodeURIComponent(m.paper_id)}`, text: m.title || m.paper_id }),
      el("span", { class: "muted", text: ` score ${typeof m.score === "number" ? m.score.toFixed(3) : "-"}`
        + ` · found ${utcDate(m.found)}` })));
    // the watch opens to what it found, and offers its feed's address to copy into a feed reader
    const feedUrl = new URL(w.feed, location.href).href;
    const copy = el("button", { type: "button", class: "copy-feed", "aria-label": `Copy the feed address of ${w.name}`,
      onclick: async () => {
        const box = item.querySelector(".feed-url");
        box.select();
        let ok = false;
        try { await navigator.clipboard.writeText(feedUrl); ok = true; } catch (e) { ok = document.execCommand("copy"); }
        copy.textContent = ok ? "Copied" : "Select and copy";
      } }, "Copy");
    const item = el("li", { class: "watch", "data-watch": w.name },
      el("details", { class: "watch-details" },
        el("summary", {}, el("span", { class: "watch-name", text: w.name }),
          el("span", { class: "muted", text: ` ${what}, ${w.threshold || "score ≥ " + w.min_score} · ${w.found} found · ${run}` })),
        matches.length ? el("ol", { class: "watch-matches", "aria-label": `What ${w.name} found, newest first` }, ...matches)
          : el("p", { class: "muted", text: "nothing found yet" }),
        el("p", { class: "watch-feed" },
          el("label", {}, "Atom feed ", el("input", { type: "text", class: "feed-url", readonly: true, value: feedUrl,
            size: Math.min(60, feedUrl.length), onfocus: (e) => e.target.select() })), " ", copy,
          " ", el("a", { href: w.feed, class: "feed-link", text: "open" }),
          w.feed.includes("?key=") ? null : el("span", { class: "muted",
            text: " (on a private server: its secret address, from esqbe watch show NAME)" }))));
    ol.append(item);
  }
  panel.hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("find-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = $("find-input").value.trim();
    if (q) find(q);
  });
  for (const b of document.querySelectorAll(".facet-btn")) b.addEventListener("click", () => chooseFacet(b.dataset.facet));
  $("run-query").addEventListener("click", runQuery);
  $("use-text").addEventListener("click", useText);
  $("watch-query").addEventListener("click", watchQuery);
  $("watches-link").addEventListener("click", () => { $("watch-panel").scrollIntoView({ block: "start" }); $("watch-panel").focus(); });
  for (const b of document.querySelectorAll(".export-btn")) b.addEventListener("click", () => download(b.dataset.format));
  $("filters").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); runQuery(); } });
  $("rescorer").addEventListener("change", () => { if (state.lastQuery) runQuery(); });
  for (const b of document.querySelectorAll(".view-btn")) b.addEventListener("click", () => switchView(b.dataset.view));
  document.addEventListener("keydown", (e) => {
    const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
    if (e.key === "/" && !typing) { e.preventDefault(); $("find-input").focus(); }
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); runQuery(); }
  });
  window.addEventListener("hashchange", route);
  showIndexInfo().then(showWatches);
  route();
});
