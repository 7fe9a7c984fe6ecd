"""`esqbe serve --follow-every`: the server runs `follow run` on its schedule (on the writer's thread), so a watch's
Atom feed fills by itself; GET /stats and the page show each source's last run, counts and error. The arXiv stand-in
(tests/fakes/services.py) answers on 127.0.0.1 as arXiv's OAI-PMH documentation shows; not an integration test."""
from __future__ import annotations

import shutil
import time

import httpx
import pytest

import esqbe
from esqbe.index.follow import add_source
from esqbe.index.watches import add_watch
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import LiveServer
from .fakes.services import OaiPmh
from .test_follow import QUERY, rec

feedparser = pytest.importorskip("feedparser")


def test_a_feed_fills_by_itself_each_paper_once_and_the_page_shows_the_sources(tmp_path, index_dir_30, encoder,
                                                                               browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    with OaiPmh([[rec(0), rec(1)]]) as oai, OaiPmh([[]]) as down:  # `down`: asked at an address it does not serve
        with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
            add_watch(index, "feed", paper_id=QUERY, facet="method", min_sim=-1.0, k=100)  # every new paper a find
            add_source(index, "cl", "arxiv:cs.CL", url=oai.url + "/oai", since="2024-05-01")
            add_source(index, "down", "arxiv:cs.CL", url=down.url + "/moved", since="2024-05-01")
        app = create_app(str(path), config=None, encoder=encoder, arxiv_interval=0.05,
                         options=ServeOptions(host="127.0.0.1", follow_every=1))
        with LiveServer(app) as url:
            deadline = time.time() + 120
            while (stats := httpx.get(url + "/stats").json())["server"]["follow"]["runs"] < 2:  # two runs, nobody asked
                assert time.time() < deadline, stats["server"]["follow"]
                time.sleep(0.2)
            feed = feedparser.parse(httpx.get(url + "/watches/feed.atom").content)
            assert not feed.bozo
            titles = sorted(e.title for e in feed.entries)
            assert titles == ["A study of case 0", "A study of case 1"]  # each once, though the source ran twice
            schedule = stats["server"]["follow"]
            assert schedule["every_s"] == 1 and schedule["last"]["failed"] and schedule["next_run"]
            sources = {s["name"]: s for s in stats["follow"]}
            assert sources["cl"]["spec"] == "arxiv:cs.CL" and sources["cl"]["mark"] == "2024-05-03"
            assert sources["cl"]["last"]["error"] is None and sources["cl"]["last"]["complete"]
            said = sources["down"]["last"]["error"]
            assert "answered HTTP 400: not an OAI-PMH request" in said and "<url>" in said and down.url not in said
            assert len(oai.asked()) >= 2  # it asked again by itself: the second time from the mark
            assert oai.asked()[1]["params"]["from"] == "2024-05-03"

            browser.get(url + "/")
            WebDriverWait(browser, 60).until(EC.visibility_of_element_located((By.ID, "follow-panel")))
            shown = {li.get_attribute("data-source"): li.text
                     for li in browser.find_elements(By.CSS_SELECTOR, "#follow-list .follow-source")}
            assert set(shown) == {"cl", "down"} and "arxiv:cs.CL" in shown["cl"] and "last run" in shown["cl"]
            assert "last error: " in shown["down"] and "answered HTTP 400" in shown["down"]
            assert "last error" not in shown["cl"]
