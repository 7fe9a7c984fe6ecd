"""The page at / in a real headless browser (Debian's chromium + chromedriver, driven by selenium) against a
real server over a real index: find a paper, click two sentences, run the query, see hits with the matched
sentence pairs highlighted. A screenshot is kept in test-artifacts/ (ignored by git) and the test's tmp dir."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import REPO, SAMPLE, LiveServer

RECORDS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:30]]
QID = RECORDS[0]["paper_id"]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def server(index_dir_30, encoder, tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "index"
    shutil.copytree(index_dir_30, path)
    with LiveServer(create_app(str(path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))) as url:
        yield url


def test_find_a_paper_click_two_sentences_and_see_matched_pairs(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(server + "/")
    assert browser.title.startswith("esqbe")

    # find the paper by words of its first sentence, with the keyboard only
    browser.find_element(By.TAG_NAME, "body").send_keys("/")
    words = " ".join(RECORDS[0]["sentences"][0].split()[:8])
    assert browser.switch_to.active_element.get_attribute("id") == "find-input"
    browser.switch_to.active_element.send_keys(words, Keys.ENTER)
    hit = wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, f'.finder-hit[data-paper-id="{QID}"]')))
    hit.click()

    # the abstract, each sentence coloured by its facet
    wait.until(EC.text_to_be_present_in_element((By.ID, "paper-id"), QID))
    sentences = browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")
    assert [s.get_attribute("data-index") for s in sentences] == [str(i) for i in range(len(RECORDS[0]["sentences"]))]
    for s, label in zip(sentences, RECORDS[0]["labels"]):
        facet = "background" if label == "objective" else label
        assert f"facet-{facet}" in s.get_attribute("class").split()
    colours = {s.value_of_css_property("background-color") for s in sentences}
    assert len(colours) >= 2, "facets are told apart by colour"

    # a sentence toggles with the keyboard too
    sentences[3].send_keys(Keys.SPACE)
    assert sentences[3].get_attribute("aria-pressed") == "true"
    sentences[3].send_keys(Keys.SPACE)
    assert sentences[3].get_attribute("aria-pressed") == "false"

    # click two sentences and run the query
    sentences[0].click()
    sentences[2].click()
    assert [s.get_attribute("aria-pressed") for s in sentences[:3]] == ["true", "false", "true"]
    browser.find_element(By.ID, "run-query").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#hits .hit .pair"))

    hits = browser.find_elements(By.CSS_SELECTOR, "#hits .hit")
    expected = httpx.post(server + "/query", json={"paper_id": QID, "sentences": [0, 2], "k": 10, "rescorer": "summax"}).json()
    assert [h.get_attribute("data-paper-id") for h in hits] == [h["paper_id"] for h in expected["hits"]]
    first = hits[0]
    pairs = first.find_elements(By.CSS_SELECTOR, ".pair")
    assert pairs and {p.get_attribute("data-query-index") for p in pairs} <= {"0", "2"}
    m = expected["hits"][0]["matches"][0]
    assert pairs[0].find_element(By.CSS_SELECTOR, "td.q").text.endswith(m["query_sentence"])
    assert pairs[0].find_element(By.CSS_SELECTOR, "td.c").text.endswith(m["candidate_sentence"])
    assert pairs[0].find_element(By.CSS_SELECTOR, "td.w strong").text == f"{m['weight']:.3f}"
    assert first.find_element(By.CSS_SELECTOR, ".similarity").text == f"{expected['hits'][0]['similarity']:.3f}"
    # the matched sentences are marked in the hit's abstract, and the query side lights up on hover
    first.find_element(By.CSS_SELECTOR, "details.abstract summary").click()
    marks = first.find_elements(By.CSS_SELECTOR, "mark.matched")
    assert {mk.get_attribute("data-index") for mk in marks} == {str(x["candidate_index"]) for x in expected["hits"][0]["matches"]}
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(pairs[0]).perform()
    linked = browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence.linked")
    assert [x.get_attribute("data-index") for x in linked] == [str(m["query_index"])]

    ARTIFACTS.mkdir(exist_ok=True)
    for out in (ARTIFACTS / "page-query.png", tmp_path / "page-query.png"):
        assert browser.save_screenshot(str(out))

    # switch the rescorer: the query runs again, and says what the weights now are
    Select(browser.find_element(By.ID, "rescorer")).select_by_value("ot")
    wait.until(EC.text_to_be_present_in_element((By.ID, "results-info"), "transport plan mass"))
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#hits .hit .pair"))

    # query by a hit next
    target = browser.find_elements(By.CSS_SELECTOR, "#hits .hit")[1]
    target_id = target.get_attribute("data-paper-id")
    target.find_element(By.CSS_SELECTOR, "a.query-next").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "paper-id"), target_id))
    assert "paper=" + target_id in browser.current_url

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # no script error, nothing blocked by the Content-Security-Policy, no CDN fetch


def test_unknown_paper_in_the_address_says_so(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/#paper=no-such-paper&facet=method")
    WebDriverWait(browser, 30).until(EC.text_to_be_present_in_element((By.ID, "error"), "not in the index"))
    assert browser.find_element(By.ID, "error").is_displayed()


def test_a_private_library_asks_for_the_token_once_and_keeps_it_for_the_tab(index_dir_30, encoder, tmp_path_factory, browser):
    """`esqbe serve --private`: the page's first call gets 401, the page asks for the token, keeps it in
    sessionStorage and sends it with every call after."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    token = "page-test-token-0123456789"
    path = tmp_path_factory.mktemp("page-private") / "index"
    shutil.copytree(index_dir_30, path)
    app = create_app(str(path), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", token=token, private=True, warm=False))
    with LiveServer(app) as url:
        wait = WebDriverWait(browser, 60)
        browser.get(url + f"/#paper={QID}&facet=method")
        prompt = wait.until(EC.alert_is_present())
        prompt.send_keys(token)
        prompt.accept()
        wait.until(EC.text_to_be_present_in_element((By.ID, "paper-id"), QID))
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#hits .hit"))  # the query ran with the kept token
        assert browser.execute_script("return sessionStorage.getItem('esqbe-token')") == token
        assert not EC.alert_is_present()(browser)
