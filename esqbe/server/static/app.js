// esqbe's page: find a paper, choose a facet or sentences, see similar papers and why.
// Plain JS, no dependencies; every URL is relative so the page works where the app is mounted.
"use strict";

const state = { paper: null, facet: null, chosen: new Set(), lastQuery: null };
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

function showError(message) {
  const box = $("error");
  if (!message) { box.hidden = true; box.textContent = ""; return; }
  box.textContent = message; box.hidden = false;
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
        el("span", { class: "pid", text: hit.paper_id + (hit.match === "id" ? " (exact id)" : "") }),
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
  showError(null);
  try {
    state.paper = await api(`papers/${encodeURIComponent(id)}`);
  } catch (e) {
    showError(e.status === 404 ? `Paper ${id} is not in the index.` : e.message);
    return;
  }
  $("finder").hidden = true;
  state.chosen = new Set(sentences || []);
  state.facet = sentences && sentences.length ? null : facet;
  renderPaper();
  if (run && (state.facet || state.chosen.size)) runQuery();
  else $("query-panel").focus();
}

function renderPaper() {
  const p = state.paper;
  $("query-empty").hidden = true;
  $("query-paper").hidden = false;
  $("paper-title").textContent = p.title || "(no title)";
  $("paper-id").textContent = `${p.paper_id} · ${p.sentences.length} sentences` +
    (p.facets_predicted ? " · facet labels predicted by esqbe's tagger" : "");
  const present = new Set(p.sentences.map((s) => s.facet));
  for (const b of document.querySelectorAll(".facet-btn")) {
    b.disabled = !present.has(b.dataset.facet);
    b.title = b.disabled ? `This paper has no ${b.dataset.facet} sentence` : `Query by the ${b.dataset.facet} sentences`;
  }
  const list = $("sentences");
  list.replaceChildren();
  for (const s of p.sentences) {
    const button = el("button", { type: "button", class: `sentence facet-${s.facet}`, "data-index": s.index,
      "aria-pressed": "false", onclick: () => toggleSentence(s.index) },
      el("span", { class: "num", text: `[${s.index}]` }), el("span", { class: "tag", text: s.facet }), s.text);
    list.append(el("li", {}, button));
  }
  syncSelection();
}

function selectedIndices() {
  if (!state.paper) return [];
  if (state.facet) return state.paper.sentences.filter((s) => s.facet === state.facet).map((s) => s.index);
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
  for (const b of document.querySelectorAll(".sentence")) {
    b.setAttribute("aria-pressed", chosen.has(Number(b.dataset.index)) ? "true" : "false");
  }
  for (const b of document.querySelectorAll(".facet-btn")) {
    b.setAttribute("aria-pressed", state.facet === b.dataset.facet ? "true" : "false");
  }
  $("run-query").disabled = chosen.size === 0;
  $("selection-info").textContent = chosen.size === 0 ? "Nothing selected: pick a facet or click sentences." :
    state.facet ? `Query: the ${chosen.size} ${state.facet} sentence(s).` : `Query: ${chosen.size} chosen sentence(s).`;
}

// ---------------------------------------------------------------- querying

async function runQuery() {
  const p = state.paper;
  if (!p) return;
  const indices = selectedIndices();
  if (!indices.length) return;
  showError(null);
  const k = Math.max(1, Math.min(100, parseInt($("k").value, 10) || 10));
  const rescorer = $("rescorer").value;
  const body = { paper_id: p.paper_id, k, rescorer, with_sentences: true };
  if (state.facet) body.facet = state.facet; else body.sentences = indices;
  state.lastQuery = body;
  const hash = `paper=${encodeURIComponent(p.paper_id)}&` +
    (state.facet ? `facet=${state.facet}` : `sentences=${indices.join(",")}`) + `&rescorer=${rescorer}`;
  if (location.hash.slice(1) !== hash) history.replaceState(null, "", `#${hash}`);
  $("results-info").textContent = "Searching…";
  $("hits").replaceChildren();
  $("run-query").disabled = true;
  try {
    const res = await api("query", { method: "POST", body: JSON.stringify(body) });
    renderHits(res);
  } catch (e) {
    $("results-info").textContent = "The query failed.";
    showError(e.message);
  } finally {
    $("run-query").disabled = selectedIndices().length === 0;
  }
}

function linkQuerySentences(indices, on) {
  for (const b of document.querySelectorAll(".sentence")) {
    b.classList.toggle("linked", on && indices.includes(Number(b.dataset.index)));
  }
}

function renderHits(res) {
  const t = res.timings_ms || {};
  $("results-info").textContent = `${res.hits.length} papers, rescorer ${res.rescorer} · similarity = ${res.similarity}` +
    ` · pair weight = ${res.match_weight} · ${fmt(t.total, 0)} ms`;
  const list = $("hits");
  list.replaceChildren();
  const maxWeight = Math.max(1e-9, ...res.hits.flatMap((h) => h.matches.map((m) => Math.abs(m.weight))));
  for (const hit of res.hits) {
    const matchedQ = [...new Set(hit.matches.map((m) => m.query_index))];
    const weightOf = new Map();
    for (const m of hit.matches) weightOf.set(m.candidate_index, Math.max(weightOf.get(m.candidate_index) || -Infinity, m.weight));

    const rows = hit.matches.map((m) => {
      const row = el("tr", { class: "pair", "data-query-index": m.query_index, "data-candidate-index": m.candidate_index },
        el("td", { class: `q facet-${facetOfQuery(m.query_index)}` },
          el("button", { type: "button", class: "pair-focus", "aria-label": `Show query sentence ${m.query_index}`,
            onfocus: () => linkQuerySentences([m.query_index], true), onblur: () => linkQuerySentences([], false) },
            el("span", { class: "num", text: `[${m.query_index}] ` }), m.query_sentence)),
        el("td", { class: "w", title: res.match_weight },
          el("strong", { text: fmt(m.weight) }),
          el("span", { class: "weight-bar", "aria-hidden": "true" },
            el("span", { style: `width:${Math.round(100 * Math.abs(m.weight) / maxWeight)}%` }))),
        el("td", { class: `c facet-${m.candidate_facet}` },
          el("span", { class: "num", text: `[${m.candidate_index}] ` }), el("span", { class: "tag", text: m.candidate_facet }),
          m.candidate_sentence));
      row.addEventListener("mouseenter", () => linkQuerySentences([m.query_index], true));
      row.addEventListener("mouseleave", () => linkQuerySentences([], false));
      return row;
    });
    const table = el("table", { class: "pairs" },
      el("thead", {}, el("tr", {}, el("th", { text: "Query sentence" }), el("th", { text: "Weight" }),
        el("th", { text: "Matched sentence of this paper" }))),
      el("tbody", {}, ...rows));

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
    const nextHash = `paper=${encodeURIComponent(hit.paper_id)}` + (state.facet ? `&facet=${state.facet}` : "");
    const item = el("li", { class: "hit", "data-paper-id": hit.paper_id },
      el("div", { class: "hit-head" }, el("span", { class: "hit-rank", text: `${hit.rank}.` }),
        el("h3", { class: "hit-title", text: hit.title || (hit.sentences && hit.sentences[0] ? hit.sentences[0].text.slice(0, 100) + "…" : hit.paper_id) })),
      el("div", { class: "scores" },
        el("span", {}, "similarity ", el("strong", { class: "similarity", text: fmt(hit.similarity) })),
        el("span", { title: "rank score within this query (similarity fused with BM25)" }, "rank score ", el("strong", { text: fmt(hit.score) })),
        el("span", { text: `bm25 ${fmt(hit.bm25, 1)} · knn ${fmt(hit.knn)}` }),
        el("span", { class: "pid", text: hit.paper_id })),
      table,
      hit.sentences ? el("details", { class: "abstract" }, el("summary", { text: "Whole abstract, matched sentences marked" }), abstract) : null,
      el("div", { class: "hit-actions" },
        el("a", { href: `#${nextHash}`, class: "query-next" }, state.facet ? `Query by this paper's ${state.facet}` : "Query by this paper")));
    item.addEventListener("mouseenter", () => linkQuerySentences(matchedQ, true));
    item.addEventListener("mouseleave", () => linkQuerySentences([], false));
    list.append(item);
  }
  if (!res.hits.length) $("results-info").textContent = "No similar paper found.";
}

function facetOfQuery(i) {
  const s = state.paper && state.paper.sentences[i];
  return s ? s.facet : "unlabeled";
}

// ---------------------------------------------------------------- routing and keys

function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  const id = params.get("paper");
  if (!id) return;
  const rescorer = params.get("rescorer");
  if (rescorer) $("rescorer").value = rescorer;
  const sentences = params.get("sentences");
  loadPaper(id, {
    facet: params.get("facet"),
    sentences: sentences ? sentences.split(",").map(Number).filter((n) => Number.isInteger(n)) : null,
    run: Boolean(params.get("facet") || sentences),
  });
}

async function showIndexInfo() {
  try {
    const h = await api("health");
    $("index-info").textContent = `${h.backend}: ${h.detail || h.status}`;
  } catch (e) {
    $("index-info").textContent = `index: ${e.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("find-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = $("find-input").value.trim();
    if (q) find(q);
  });
  for (const b of document.querySelectorAll(".facet-btn")) b.addEventListener("click", () => chooseFacet(b.dataset.facet));
  $("run-query").addEventListener("click", runQuery);
  $("rescorer").addEventListener("change", () => { if (state.lastQuery) runQuery(); });
  document.addEventListener("keydown", (e) => {
    const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
    if (e.key === "/" && !typing) { e.preventDefault(); $("find-input").focus(); }
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); runQuery(); }
  });
  window.addEventListener("hashchange", route);
  showIndexInfo();
  route();
});
