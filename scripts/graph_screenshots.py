"""The page's Graph view in headless Chromium at 1440 and 420 px: docs/graph.png and docs/graph-narrow.png.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/graph_screenshots.py --index /tmp/csf-index \
        --paper 1003611 --facet background -k 30 --out docs

`--index` is an embedded index (docs/graph.md: the first 1,500 CSFCube dev abstracts, `esqbe index` of
../shared/data/csfcube-dev/abstracts-csfcube-preds.jsonl cut to its first 1,500 lines). A real server on loopback
answers the page; the desktop shot hovers a link (its sentence pair shows) and opens the best hit's card, the narrow
one shows the graph and its legend. Needs Debian's chromium and chromium-driver (scripts/install-test-browser)."""
from __future__ import annotations

import argparse
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def serve(index: str) -> tuple[str, object]:
    import httpx
    import uvicorn

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(index, config=None, options=ServeOptions(host="127.0.0.1")),
                                           host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return url, server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not start")


def browser(width: int, height: int):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--force-device-scale-factor=1", "--hide-scrollbars"):
        options.add_argument(arg)
    b = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")))
    b.set_window_size(width, height)
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--paper", required=True)
    ap.add_argument("--facet", default="method")
    ap.add_argument("-k", type=int, default=30)
    ap.add_argument("--out", default="docs")
    args = ap.parse_args()
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, server = serve(args.index)
    address = urlencode([("paper", args.paper), ("facet", args.facet), ("k", str(args.k)), ("view", "graph")])
    for name, (width, height) in (("graph.png", (1440, 1500)), ("graph-narrow.png", (420, 1500))):
        b = browser(width, height)
        try:
            b.get(f"{url}/#{address}")
            WebDriverWait(b, 120).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#graph-svg .gnode")) == args.k)
            if width > 1000:
                edges = b.find_elements(By.CSS_SELECTOR, "#graph-svg .edge-hit")
                first = b.find_element(By.CSS_SELECTOR, '#graph-svg .gnode[data-paper-id]')
                first.click()  # the best hit's card
                WebDriverWait(b, 10).until(lambda d: d.find_element(By.ID, "graph-card").is_displayed())
                widths = [float(b.execute_script("return arguments[0].previousSibling.getAttribute('stroke-width')", e))
                          for e in edges]
                b.execute_script("window.scrollTo(0, 0)")
                ActionChains(b).move_to_element(edges[widths.index(max(widths))]).perform()  # the strongest link
                WebDriverWait(b, 10).until(lambda d: d.find_element(By.ID, "graph-tip").is_displayed())
            else:  # the graph at the top of the screen
                b.execute_script("document.querySelector('.results-head').scrollIntoView({block: 'start'})")
            time.sleep(0.3)
            out = Path(args.out) / name
            b.save_screenshot(str(out))
            print(f"wrote {out}")
        finally:
            b.quit()
    server.should_exit = True  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
