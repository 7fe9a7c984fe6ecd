"""/docs (Swagger UI) and /redoc (ReDoc) work with no network: real headless Chromium whose every
host name but loopback resolves to nothing and whose other traffic goes to a dead proxy opens them against a real
server, the API's operations are drawn, and no request left the server's own address (FastAPI's default pages load
their scripts from a CDN: they would stay blank here and the request list would name it)."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import REPO, LiveServer

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def offline_browser():
    """Chromium with the network off but for loopback, logging every request it makes."""
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no chromium and chromedriver on this machine (scripts/install-test-browser installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield browser
    browser.quit()


def _requested(browser) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_api_docs_work_with_the_network_off(index_dir_30, encoder, offline_browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    browser = offline_browser
    with LiveServer(create_app(str(path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))) as url:
        paths = set(httpx.get(url + "/openapi.json").json()["paths"])
        assert httpx.get(url + "/static/docs/swagger-ui-bundle.js").status_code == 200

        # the network really is off: a CDN address does not load
        from selenium.common.exceptions import WebDriverException

        with pytest.raises(WebDriverException, match="ERR_PROXY_CONNECTION_FAILED|ERR_NAME_NOT_RESOLVED"):
            browser.get("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css")
        _requested(browser)  # the log so far, dropped

        browser.get(url + "/docs")
        WebDriverWait(browser, 60).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".opblock")) >= len(paths))
        drawn = {e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
        assert {p.replace("\u200b", "") for p in drawn} >= {"/query", "/watches/{name}.atom", "/papers"}
        assert browser.find_element(By.CSS_SELECTOR, ".info .title").text.startswith("esqbe")
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "api-docs-offline.png"))
        docs_requests = _requested(browser)

        browser.get(url + "/redoc")
        WebDriverWait(browser, 60).until(lambda b: "/query" in b.find_element(By.TAG_NAME, "body").text)
        redoc_requests = _requested(browser)

    # every script, style and font from the server itself; ReDoc's one exception is its "powered by" logo, an image
    # from its own site that no option turns off: offline, a missing picture in the footer of the menu
    for requested in docs_requests + [u for u in redoc_requests if u != "https://cdn.redoc.ly/redoc/logo-mini.svg"]:
        assert requested.startswith((url + "/", "data:", "blob:", "about:")), requested
    assert any(u.endswith("/static/docs/swagger-ui-bundle.js") for u in docs_requests)
    assert any(u.endswith("/static/docs/redoc.standalone.js") for u in redoc_requests)
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "logo-mini.svg" not in e["message"]]
    assert not severe, severe
