"""A watch's matches as an Atom 1.0 feed (GET /watches/NAME.atom), and the access log kept free of feed secrets.

The XML is written by xml.etree.ElementTree (it escapes markup); every text from a paper first loses the characters
XML 1.0 cannot hold (C0 controls but tab and line feeds, surrogates, U+FFFE/U+FFFF) and the C1 controls, and is
bounded in length. Links are made from the paper's ids (DOI, arXiv) or taken from its metadata only as http(s) URLs;
an entry with neither links to the paper on the server's own page (its public base URL, `esqbe serve --public-url`),
so that a reader always has something to open. The summary is HTML (`type="html"`: every value escaped with
html.escape, then the whole escaped again as XML text): title, authors, year, venue and the matched sentence pairs,
each naming the example it belongs to.
"""
from __future__ import annotations

import datetime
import html
import logging
import re
import xml.etree.ElementTree as ET
from urllib.parse import quote

ATOM_NS = "http://www.w3.org/2005/Atom"
#: entries a feed holds at most (the newest), and what a client may ask for with ?limit=
FEED_ENTRIES, MAX_FEED_ENTRIES = 50, 200
_INVALID_XML = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_KEY_IN_QUERY = re.compile(r"(?i)([?&]key=)[^&#\s]*")
_TITLE_CHARS, _SUMMARY_CHARS, _NAME_CHARS = 1000, 20_000, 300


def xml_text(value, limit: int = _TITLE_CHARS) -> str:
    """`value` as text XML 1.0 can carry: invalid characters dropped, at most `limit` characters."""
    text = _INVALID_XML.sub("", str(value if value is not None else ""))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dict(value) -> dict:
    """`value` if it is a mapping, else an empty one (metadata is free-form: any shape may come)."""
    return value if isinstance(value, dict) else {}


def _rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(float(t), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _http_url(value) -> str | None:
    """A metadata URL kept only when it is http(s) with a host, at most 2,000 characters."""
    url = xml_text(value, 2000).strip() if isinstance(value, str) else ""
    return url if re.match(r"https?://[^\s/?#]+", url) and not re.search(r"\s", url) else None


def entry_links(metadata: dict) -> list[tuple[str, str]]:
    """(title, URL) of each place to read the paper: DOI, arXiv, Semantic Scholar, open access (those it has)."""
    meta = _dict(metadata)
    ids = _dict(meta.get("external_ids"))
    links = []
    if ids.get("doi"):
        links.append(("DOI", "https://doi.org/" + quote(xml_text(ids["doi"], 300).strip(), safe="/:;()._-")))
    if ids.get("arxiv"):
        links.append(("arXiv", "https://arxiv.org/abs/" + quote(xml_text(ids["arxiv"], 100).strip(), safe="/._-")))
    s2 = _http_url(meta.get("s2_url"))
    if s2 is None and (ids.get("s2") or ids.get("corpusid")):
        s2 = "https://api.semanticscholar.org/CorpusID:" + quote(xml_text(ids.get("corpusid") or ids.get("s2"), 40).strip())
    if s2:
        links.append(("Semantic Scholar", s2))
    oa = _http_url(meta.get("open_access_url"))
    if oa:
        links.append(("open access", oa))
    url = _http_url(meta.get("url"))
    if url and url not in (u for _, u in links):
        links.insert(1 if ids.get("doi") else 0, ("link", url))  # DOI, then the record's own URL, then the others
    return links


def page_url(base: str, paper_id) -> str:
    """The paper on the server's page: `base` (the public base URL, ending in /) + `#paper=ID`."""
    return base + "#paper=" + quote(xml_text(paper_id, 500), safe="")


def short_title(title, paper_id=None, limit: int = 60) -> str:
    """A title cut to `limit` characters at a word (the id where there is no title), to name an example."""
    text = " ".join(xml_text(title, 2000).split())
    if not text:
        return f"paper {xml_text(paper_id, 200)}" if paper_id else "a text"
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0]
    return (cut if len(cut) > limit // 2 else text[: limit - 1]) + "…"


def _summary(hit: dict, authors: list[str], example_names: list[str]) -> str:
    """The entry's summary as HTML (every value escaped): title, authors, year and venue, similarity, and the matched
    sentence pairs, each named by its example (`example_names`, short titles) where the watch has several."""
    esc = html.escape
    meta = _dict(hit.get("metadata"))
    title = xml_text(hit.get("title")).strip() or xml_text(hit.get("paper_id"))
    parts = [f"<p><strong>{esc(title)}</strong></p>"]
    if authors:
        parts.append(f"<p>Authors: {esc(', '.join(authors[:10]) + (' et al.' if len(authors) > 10 else ''))}</p>")
    venue = meta.get("venue") or meta.get("journal")
    facts = [f"Year: {esc(xml_text(meta['year'], 20))}"] if meta.get("year") not in (None, "") else []
    if isinstance(venue, str) and venue.strip():
        facts.append(f"Venue: {esc(xml_text(venue, _NAME_CHARS).strip())}")
    score, band, sim = hit.get("score"), hit.get("band"), hit.get("similarity")
    facts.append((f"Score: {score:.3f}" if isinstance(score, (int, float)) else "Score: –")
                 + (f" ({band} match)" if band in ("strong", "fair", "weak") else ""))
    if isinstance(sim, (int, float)):
        facts.append(f"Sentence similarity: {sim:.3f}")
    parts.append("<p>" + " · ".join(facts) + "</p>")
    pairs = []
    for m in (hit.get("matches") or [])[:20]:
        x = m.get("example")
        named = (f"example “{esc(example_names[x])}”, " if len(example_names) > 1 and isinstance(x, int)
                 and 0 <= x < len(example_names) else "")
        weight = m.get("weight")
        pairs.append(f"<li>{named}query [{esc(str(m.get('query_index')))}]: {esc(xml_text(m.get('query_sentence')))}"
                     f"<br>~ this paper's [{esc(str(m.get('candidate_index')))}] "
                     f"({esc(xml_text(m.get('candidate_facet'), 40))}, "
                     f"{float(weight) if isinstance(weight, (int, float)) else 0.0:.3f}): "
                     f"{esc(xml_text(m.get('candidate_sentence')))}</li>")
    if pairs:
        parts.append("<p>Matched sentence pairs:</p><ul>" + "".join(pairs) + "</ul>")
    return xml_text("".join(parts), _SUMMARY_CHARS * 3)


def _authors(metadata: dict) -> list[str]:
    out = []
    for a in (metadata.get("authors") if isinstance(metadata, dict) else None) or []:
        name = a.get("name") if isinstance(a, dict) else a if isinstance(a, str) else None
        name = xml_text(name, _NAME_CHARS).strip() if name else ""
        if name:
            out.append(name)
    return out[:50]


def atom_feed(watch, matches: list[dict], *, self_url: str, base_url: str = "http://127.0.0.1:8000/") -> bytes:
    """The Atom 1.0 document of watch `watch`'s `matches` (newest first, as esqbe.index.watches.watch_matches gives
    them); `self_url` is where it was fetched, `base_url` the server's public base URL (its page, ending in /): an
    entry with no DOI or URL of its own links to the paper there."""
    ET.register_namespace("", ATOM_NS)

    def sub(parent, tag: str, text: str | None = None, **attrs) -> ET.Element:
        el = ET.SubElement(parent, f"{{{ATOM_NS}}}{tag}", {k: v for k, v in attrs.items()})
        if text is not None:
            el.text = text
        return el

    feed = ET.Element(f"{{{ATOM_NS}}}feed")
    sub(feed, "id", f"urn:esqbe:watch:{watch.name}")
    sub(feed, "title", f"esqbe watch {watch.name}")
    examples, avoided = watch.parts()

    def like(q: dict) -> str:
        return f"“{short_title(q.get('title'), q.get('paper_id'))}”" + (f" in its {q['facet']}" if q.get("facet") else "")

    sub(feed, "subtitle", xml_text("papers like " + ", ".join(map(like, examples))
                                   + ("; unlike " + ", ".join(map(like, avoided)) if avoided else "")
                                   + f", {watch.threshold}"))
    sub(feed, "updated", _rfc3339(max([m["found"] for m in matches] or [watch.last_run or watch.created])))
    sub(feed, "link", rel="self", href=xml_text(self_url, 4000), type="application/atom+xml")
    sub(feed, "generator", "esqbe")
    author = sub(feed, "author")
    sub(author, "name", "esqbe")
    names = [short_title(q.get("title"), q.get("paper_id")) for q in examples]
    for hit in matches:
        meta = _dict(hit.get("metadata"))
        entry = sub(feed, "entry")
        sub(entry, "id", "urn:esqbe:watch:" + watch.name + ":" + quote(xml_text(hit.get("paper_id"), 500), safe=""))
        sub(entry, "title", xml_text(hit.get("title")).strip() or xml_text(hit.get("paper_id")), type="text")
        sub(entry, "updated", _rfc3339(hit["found"]))
        authors = _authors(meta)
        for name in authors:
            sub(sub(entry, "author"), "name", name)
        on_page = page_url(base_url, hit.get("paper_id"))
        links = entry_links(meta) + [("on the esqbe page", on_page)]  # the page last: the alternate where nothing else is
        for i, (title, url) in enumerate(links):
            sub(entry, "link", rel="alternate" if i == 0 else "related", href=url, title=title)
        if isinstance(meta.get("venue"), str) and meta["venue"].strip():
            sub(entry, "category", term=xml_text(meta["venue"], _NAME_CHARS).strip() or "venue", label="venue")
        sub(entry, "summary", _summary(hit, authors, names), type="html")
    return ET.tostring(feed, encoding="utf-8", xml_declaration=True)


class RedactFeedKeys(logging.Filter):
    """The access log line of a feed request keeps its path but never its secret (`?key=` is written `key=…`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(_KEY_IN_QUERY.sub(r"\1…", a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = _KEY_IN_QUERY.sub(r"\1…", record.msg)
        return True


def redact_access_log() -> None:
    """Install `RedactFeedKeys` on uvicorn's access logger (once)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactFeedKeys) for f in logger.filters):
        logger.addFilter(RedactFeedKeys())


def feed_data(index, name: str, limit: int):
    """What a feed shows (on a reader's thread): the watch and its newest `limit` matches."""
    from ..index.watches import get_watch, watch_matches

    return get_watch(index, name), watch_matches(index, name, limit)


def watch_list(index, latest: int) -> list[dict]:
    """The index's watches for the page (GET /watches): each one's query, threshold, last run, count, its feed's path
    (never its secret) and its `latest` newest matches; none on a backend that keeps no watches."""
    from ..index.watches import WatchesUnsupportedError, list_watches, watch_matches

    try:
        watches = list_watches(index)
    except WatchesUnsupportedError:
        return []
    out = []
    for w in watches:
        found = watch_matches(index, w.name, latest) if latest else []
        out.append({**w.to_dict(), "feed": f"watches/{w.name}.atom",
                    "latest": [{k: m.get(k) for k in ("paper_id", "title", "score", "band", "similarity", "found")}
                               for m in found]})
    return out


def add_watch_work(index, req, text, overrides: dict) -> dict:
    """POST /watches on the writer's thread: the query (one paper or text, or several examples and papers to avoid,
    each text already split: `text`) saved as a watch; its feed's path with its secret (the requester may write, so
    may hold it)."""
    from ..index.watches import add_watch

    filters = [f if isinstance(f, str) else f.model_dump(exclude_none=True) for f in req.filters or []]
    if req.examples is not None or req.avoid:  # several examples (texts already split: `text`), papers to avoid
        examples = text if req.examples is not None else [
            {"paper_id": req.paper_id, "facet": req.facet, "sentences": req.sentences}
            if req.paper_id is not None else {"text": text, "title": req.title, "facet": req.facet, "sentences": req.sentences}]
        watch, _ = add_watch(index, req.name, examples=[{k: v for k, v in e.items() if v is not None} for e in examples],
                             avoid=[a.model_dump(exclude_none=True) for a in req.avoid or []], facet=req.facet,
                             filters=filters or None, min_score=req.min_score, min_sim=req.min_sim, **overrides)
    else:
        watch, _ = add_watch(index, req.name, paper_id=req.paper_id, facet=req.facet, sentences=req.sentences,
                             text=text, title=req.title, filters=filters or None, min_score=req.min_score,
                             min_sim=req.min_sim, **overrides)
    return {**watch.to_dict(), "feed": f"watches/{watch.name}.atom?key={watch.feed_key}"}
