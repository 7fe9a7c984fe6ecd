"""A watch's Atom feed from a real server on 127.0.0.1, parsed by a real feed parser (feedparser):
every field checked, whatever markup, control characters or XML-invalid characters the papers hold; on a private
server the feed's secret URL works, is revocable, and never reaches the access log."""
from __future__ import annotations

import json
import logging
import shutil

import httpx
import pytest

import esqbe
from esqbe.index.watches import add_watch, get_watch, revoke_feed_key, run_watches
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import SAMPLE, LiveServer

feedparser = pytest.importorskip("feedparser")

QUERY = "csabstruct-train-0000"
TITLES = [
    "<script>alert('x')</script> & <b>bold</b> ]]> &amp; a study",
    "control \x1b[31mred\x1b[0m, a bell \x07, a nul \x00 and C1 \x9b2J in a title",
    "invalid XML: \ufffe \uffff \x0b \x0c \ud7ff\ue000 kept around them",
    "Plain title with unicode: Schrödinger's λ-calculus — 数学",
    "",  # no title: the entry is titled by its id
]


def _new_records(n: int) -> list[dict]:
    out = []
    for i, line in enumerate(SAMPLE.read_text().splitlines()[30 : 30 + n]):
        src = json.loads(line)
        rec = {"id": f"new-{i}", "title": TITLES[i % len(TITLES)], "abstract": src["sentences"], "facets": src["labels"]}
        rec.update(metadata={
            "year": 2020 + i, "venue": f"Venue <{i}> & \x1b co",
            "authors": [{"name": f"Ada <b>{i}</b> Lovelace\x07"}, "Alan Turing"],
            "external_ids": {"doi": f"10.1234/abc{i} <x>", "arxiv": f"2401.0000{i}"},
            "open_access_url": "javascript:alert(1)" if i % 2 else f"https://example.org/paper/{i}.pdf"})
        out.append(rec)
    return out


def _html_text(markup: str) -> list[str]:
    """The text of each paragraph and list item of an HTML fragment, as a reader shows them."""
    from lxml import html

    root = html.fragment_fromstring(markup, create_parent="div")
    return [" ".join(el.text_content().split()) for el in root.iter("p", "li")]


def check_atom_rfc4287(document: bytes) -> None:
    """RFC 4287's rules for a feed and its entries (section 4.1), checked on the parsed XML: no RELAX NG schema of
    RFC 4287 ships in a package the registries reach from here (the schema is the RFC's appendix B, not packaged)."""
    from datetime import datetime

    from lxml import etree

    ns = {"a": "http://www.w3.org/2005/Atom"}
    root = etree.fromstring(document)
    assert root.tag == "{http://www.w3.org/2005/Atom}feed"

    def one(el, tag):
        found = el.findall(f"a:{tag}", ns)
        assert len(found) == 1, (tag, len(found))
        return found[0]

    def date(el):
        datetime.strptime(el.text, "%Y-%m-%dT%H:%M:%SZ")  # RFC 3339

    for tag in ("id", "title"):
        assert one(root, tag).text.strip()
    date(one(root, "updated"))
    assert len(root.findall("a:subtitle", ns)) <= 1
    feed_author = bool(root.findall("a:author/a:name", ns))
    for entry in root.findall("a:entry", ns):
        assert one(entry, "id").text.startswith("urn:")
        assert one(entry, "title").text.strip()
        date(one(entry, "updated"))
        assert feed_author or entry.findall("a:author/a:name", ns)
        links = entry.findall("a:link", ns)
        alternates = [x for x in links if x.get("rel", "alternate") == "alternate"]
        assert len(alternates) == 1 or entry.find("a:content", ns) is not None  # 4.1.2: content or an alternate
        for link in links:
            assert link.get("href", "").startswith(("http://", "https://")) and " " not in link.get("href")
        summary = entry.findall("a:summary", ns)
        assert len(summary) <= 1 and all(x.get("type") in (None, "text", "html", "xhtml") for x in summary)


def _clean(text: str) -> str:
    from esqbe.server.feeds import xml_text

    return xml_text(text).strip()


@pytest.fixture(scope="module")
def watched(tmp_path_factory, index_dir_30, encoder):
    """A copy of the 30-paper index with watch `feed` (min_sim -1, k 100: every new paper matches), two runs: three
    new papers found at t=1000, two at t=2000."""
    path = tmp_path_factory.mktemp("feeds") / "ix"
    shutil.copytree(index_dir_30, path)
    records = _new_records(5)
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        add_watch(index, "feed", paper_id=QUERY, facet="method", min_sim=-1.0, k=100)
        for start, stop, when in ((0, 3, 1000.0), (3, 5, 2000.0)):
            src = path.parent / f"new{start}.jsonl"
            src.write_text("".join(json.dumps(r) + "\n" for r in records[start:stop]))
            assert index.index_files([str(src)]).indexed == stop - start
            assert len(run_watches(index, now=when)[0].matches) == stop - start
    return path, records


def test_the_feed_parses_and_says_every_field(watched, encoder):
    path, records = watched
    by_id = {r["id"]: r for r in records}
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        r = httpx.get(url + "/watches/feed.atom")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/atom+xml")
        assert httpx.get(url + "/watches/nope.atom").status_code == 404
        assert len(feedparser.parse(httpx.get(url + "/watches/feed.atom?limit=2").content).entries) == 2
        assert httpx.get(url + "/watches/feed.atom?limit=100000").status_code == 422
    with esqbe.open_index(str(path), config=None, create=False) as index:
        stored = {pid: p.title for pid, p in index.get(list(by_id)).items()}
    assert "<script>" in stored["new-0"] and "\x1b" in stored["new-1"] and "\ufffe" in stored["new-2"]
    feed = feedparser.parse(r.content)
    assert not feed.bozo, feed.get("bozo_exception")
    check_atom_rfc4287(r.content)
    assert feed.version == "atom10" and feed.feed.title == "esqbe watch feed"
    # the query paper has no title: named by its id (tests/test_watch_examples.py: titles)
    assert feed.feed.subtitle == f"papers like “paper {QUERY}” in its method, score >= -1"
    assert [e.updated_parsed.tm_year for e in feed.entries] == [1970] * 5
    found = [e.id.rsplit(":", 1)[1] for e in feed.entries]
    assert set(found[:2]) == {"new-3", "new-4"} and set(found[2:]) == {"new-0", "new-1", "new-2"}  # newest first
    assert [e.updated for e in feed.entries] == ["1970-01-01T00:33:20Z"] * 2 + ["1970-01-01T00:16:40Z"] * 3
    for entry, pid in zip(feed.entries, found):
        rec = by_id[pid]
        assert entry.title == (_clean(stored[pid]) or pid)
        assert "\x1b" not in entry.title and "\x00" not in entry.title
        assert [a.name for a in entry.authors] == [_clean(f"Ada <b>{pid[-1]}</b> Lovelace\x07"), "Alan Turing"]
        hrefs = {link.title: link.href for link in entry.links}
        assert entry.link == hrefs["DOI"] == f"https://doi.org/10.1234/abc{pid[-1]}%20%3Cx%3E"  # the alternate
        assert hrefs["on the esqbe page"] == f"{url}/#paper={pid}"  # loopback: the server's own address
        assert hrefs["arXiv"] == f"https://arxiv.org/abs/2401.0000{pid[-1]}"
        assert ("open access" in hrefs) == (int(pid[-1]) % 2 == 0)  # a javascript: URL is never a link
        assert not any(h.startswith("javascript") for h in hrefs.values())
        assert entry.tags[0].term == _clean(f"Venue <{pid[-1]}> & \x1b co")
        # the summary is HTML a reader shows as paragraphs: each value escaped (markup in a paper is text, never tags)
        assert entry.summary_detail.type == "text/html"
        shown = _html_text(entry.summary)
        assert shown[0] == " ".join((_clean(stored[pid]) or pid).split())
        assert shown[1] == "Authors: " + ", ".join(a.name for a in entry.authors)
        assert shown[2].startswith(f"Year: {2020 + int(pid[-1])} · Venue: Venue <{pid[-1]}> & co · Score: ")
        assert shown[3] == "Matched sentence pairs:" and shown[4].startswith("query [")
        assert "~ this paper's [" in shown[4]
        assert any(" ".join(_clean(s).split())[:40] in " ".join(shown) for s in rec["abstract"])  # a matched sentence
        assert "<script" not in entry.summary and "<b>" not in entry.summary


def test_an_entry_with_no_doi_or_url_links_to_the_paper_on_the_public_page(tmp_path, index_dir_30, encoder):
    from esqbe.server.options import options_from_env
    from esqbe.settings.config import ConfigError

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    lines = SAMPLE.read_text().splitlines()[40:42]
    records = [{"id": f"bare-{i}", "title": f"A bare paper {i} & <i>co</i>", "abstract": json.loads(x)["sentences"]}
               for i, x in enumerate(lines)]
    records[1]["metadata"] = {"url": "https://example.org/bare-1"}  # a record's own URL comes before the page
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        add_watch(index, "bare", paper_id=QUERY, facet="method", min_sim=-1.0, k=100)
        index.index_files([str(tmp_path / "bare.jsonl")])
        assert len(run_watches(index, now=3000.0)[0].matches) == 2
    with pytest.raises(ConfigError, match="--public-url"):
        options_from_env(host="127.0.0.1", public_url="javascript:alert(1)")
    options = options_from_env(host="127.0.0.1", public_url="https://papers.example.org/esqbe")
    with LiveServer(create_app(str(path), config=None, options=options, encoder=encoder)) as url:
        body = httpx.get(url + "/watches/bare.atom").content
    check_atom_rfc4287(body)
    feed = feedparser.parse(body)
    assert not feed.bozo and len(feed.entries) == 2
    assert [x.href for x in feed.feed.links if x.rel == "self"] == ["https://papers.example.org/esqbe/watches/bare.atom"]
    links = {e.id.rsplit(":", 1)[1]: e.link for e in feed.entries}
    assert links == {"bare-0": "https://papers.example.org/esqbe/#paper=bare-0", "bare-1": "https://example.org/bare-1"}
    for e in feed.entries:
        assert _html_text(e.summary)[0] == " ".join(e.title.split()) and e.title.startswith("A bare paper")
        assert "<i>" not in e.summary


def test_a_private_feed_has_a_secret_url_that_is_revocable_and_never_logged(watched, encoder):
    path, _ = watched
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    access = logging.getLogger("uvicorn.access")
    handler = Keep()
    options = ServeOptions(host="127.0.0.1", token="the-bearer-token", private=True)
    with LiveServer(create_app(str(path), config=None, options=options, encoder=encoder)) as url:
        access.setLevel(logging.INFO)
        access.addHandler(handler)
        try:
            with esqbe.open_index(str(path), config=None, create=False) as index:
                key = get_watch(index, "feed").feed_key
            assert httpx.get(url + "/watches/feed.atom").status_code == 401
            assert httpx.get(url + "/watches/feed.atom?key=wrong").status_code == 401
            assert httpx.get(url + f"/watches/nope.atom?key={key}").status_code == 401  # no telling which exist
            assert httpx.get(url + "/query").status_code in (401, 405)  # the rest stays behind the token
            ok = httpx.get(url + f"/watches/feed.atom?key={key}")
            assert ok.status_code == 200 and not feedparser.parse(ok.content).bozo
            assert httpx.get(url + "/watches/feed.atom",
                             headers={"Authorization": "Bearer the-bearer-token"}).status_code == 200
            with esqbe.open_index(str(path), config=None, create=False) as index:
                new = revoke_feed_key(index, "feed")
            assert httpx.get(url + f"/watches/feed.atom?key={key}").status_code == 401
            assert httpx.get(url + f"/watches/feed.atom?key={new}").status_code == 200
        finally:
            access.removeHandler(handler)
    feed_lines = [line for line in lines if "/watches/feed.atom" in line]
    assert len(feed_lines) >= 6, lines
    assert not any(key in line or new in line for line in lines)


def test_the_page_lists_the_watches_and_their_latest_matches_in_chromium(watched, encoder, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    path, _ = watched
    with esqbe.open_index(str(path), config=None, create=False) as index:
        stored = {pid: p.title for pid, p in index.get([f"new-{i}" for i in range(5)]).items()}
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        listing = httpx.get(url + "/watches?latest=3").json()
        assert [w["name"] for w in listing] == ["feed"] and len(listing[0]["latest"]) == 3
        assert "feed_key" not in listing[0] and listing[0]["feed"] == "watches/feed.atom"
        wait = WebDriverWait(browser, 60)
        browser.get(url + "/")
        wait.until(EC.visibility_of_element_located((By.ID, "watch-panel")))
        watch = browser.find_element(By.CSS_SELECTOR, '#watch-list .watch[data-watch="feed"]')
        assert watch.find_element(By.CSS_SELECTOR, ".watch-name").text == "feed"
        assert "paper " + QUERY in watch.text and "5 found" in watch.text and "score >= -1" in watch.text
        assert not watch.find_element(By.CSS_SELECTOR, ".watch-match").is_displayed()  # closed until opened
        watch.find_element(By.TAG_NAME, "summary").click()  # the watch opens to its finds and its feed's address
        items = watch.find_elements(By.CSS_SELECTOR, ".watch-match")
        assert len(items) == 5 and all(i.is_displayed() for i in items)  # the newest first
        feed_box = watch.find_element(By.CSS_SELECTOR, "input.feed-url")
        assert feed_box.get_attribute("value") == url + "/watches/feed.atom" and feed_box.get_attribute("readonly")
        assert watch.find_element(By.CSS_SELECTOR, "a.feed-link").get_attribute("href") == url + "/watches/feed.atom"
        assert not feedparser.parse(httpx.get(feed_box.get_attribute("value")).content).bozo  # the address works
        watch.find_element(By.CSS_SELECTOR, "button.copy-feed").click()
        WebDriverWait(browser, 10).until(lambda b: watch.find_element(By.CSS_SELECTOR, "button.copy-feed").text != "Copy")
        assert browser.execute_script("return document.activeElement === arguments[0] || "
                                      "window.getSelection().toString() !== '' || arguments[0].selectionEnd > 0",
                                      feed_box)  # selected for copying, whether or not the clipboard is open
        assert {i.get_attribute("data-paper-id") for i in items[:2]} == {"new-3", "new-4"}
        for item in items:  # hostile titles shown as text, never as markup
            pid = item.get_attribute("data-paper-id")
            a = item.find_element(By.TAG_NAME, "a")
            assert a.get_attribute("textContent") == (stored[pid] or pid)
            assert not item.find_elements(By.TAG_NAME, "script") and not item.find_elements(By.TAG_NAME, "b")
        first = items[0]
        first.find_element(By.TAG_NAME, "a").click()  # a match is a query paper a click away
        wait.until(EC.text_to_be_present_in_element((By.ID, "paper-id"), first.get_attribute("data-paper-id")))
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_watch_this_query_on_the_page_saves_a_watch_in_chromium(tmp_path, index_dir_30, encoder, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        bad = httpx.post(url + "/watches", json={"paper_id": QUERY, "facet": "method", "name": "../x", "min_sim": 0.5})
        assert bad.status_code == 422
        nan = httpx.post(url + "/watches", content=b'{"paper_id": "%s", "name": "x", "min_sim": NaN}' % QUERY.encode(),
                         headers={"Content-Type": "application/json"})
        assert nan.status_code == 422
        several = httpx.post(url + "/watches", json={"examples": [{"paper_id": QUERY}], "avoid": [{"paper_id": QUERY}],
                                                     "facet": "method", "name": "several", "min_sim": 0.5})
        assert several.status_code == 400 and "both an example and to avoid" in several.text  # as POST /query
        assert "several" not in httpx.get(url + "/watches").text
        wait = WebDriverWait(browser, 60)
        browser.get(url + f"/#paper={QUERY}&facet=method&k=5")
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#hits li")))
        assert browser.find_element(By.ID, "watch-panel").get_attribute("hidden") is not None  # no watches yet
        browser.find_element(By.ID, "watch-query").click()
        wait.until(EC.alert_is_present()).send_keys("page-watch")
        browser.switch_to.alert.accept()
        wait.until(EC.alert_is_present()).send_keys("0.25")
        browser.switch_to.alert.accept()
        listed = wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, '#watch-list .watch[data-watch="page-watch"]')))
        assert "paper " + QUERY in listed.text and "method" in listed.text and "score >= 0.25" in listed.text
        assert "0 found" in listed.text and "nothing found yet" in listed.get_attribute("textContent")  # opened: said
        info = browser.find_element(By.ID, "watch-info")
        assert "page-watch" in info.text and "watches/page-watch.atom?key=" in info.find_element(
            By.TAG_NAME, "a").get_attribute("href")
        browser.find_element(By.ID, "watch-query").click()  # the same name again: said, not saved twice
        wait.until(EC.alert_is_present()).send_keys("page-watch")
        browser.switch_to.alert.accept()
        wait.until(EC.alert_is_present()).accept()
        wait.until(EC.text_to_be_present_in_element((By.ID, "error"), "exists already"))
    with esqbe.open_index(str(path), config=None, create=False) as index:
        watch = get_watch(index, "page-watch")
    assert watch.min_score == 0.25 and watch.query["facet"] == "method" and watch.settings["k"] == 5
    assert watch.query["paper_id"] == QUERY and watch.vectors.shape[0] == len(watch.query["sentences"])
