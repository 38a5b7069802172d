"""The catalog's pages in a real browser (``make test-browser``; marker ``browser``).

Debian's headless Chromium, driven through Debian's chromedriver by selenium, loads every page
of a site built from real releases (tests/catalog_kit.py), and of its operator view, from
``file://``; the test reads the rendered DOM -- release ids and epsilons against catalog.json,
one chart per budget scope, drawn -- and requires no console error and no horizontal scrolling
at phone width. Screenshots of every page at desktop (1280 px) and phone (390 px) widths go to
``$BEAM_DP_BROWSER_OUT`` (``make test-browser``: out/browser/) or the test's temporary folder.

Skipped when selenium or Chromium is missing, unless ``BEAM_DP_REQUIRE_BROWSER=1`` (as
``make test-browser`` sets), which turns the skip into a failure.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest
from catalog_kit import make_releases

from pipelines.catalog import cli as catalog

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WIDTHS = {"desktop": 1280, "phone": 390}
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--disable-dev-shm-usage")


def _driver_or_skip():
    missing = []
    try:
        from selenium import webdriver  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[browser]')")
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            missing.append(f"{path} (apt-get install chromium chromium-driver)")
    if missing:
        message = "browser tests need " + ", ".join(missing) + "; run make test-browser"
        if os.environ.get("BEAM_DP_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _driver_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")   # selenium-manager: never download anything
    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    made = make_releases(tmp_path_factory.mktemp("releases"))
    out = tmp_path_factory.mktemp("sites")
    site, operator = str(out / "site"), str(out / "operator")
    assert catalog.main(made.args("--output", site, "--operator", operator, "--page_size", "2",
                                  "--as_of", "2026-11-06", "--coverage_window", "1")) == 0
    return {"site": site, "operator": operator}


@pytest.fixture(scope="module")
def shots():
    folder = os.environ.get("BEAM_DP_BROWSER_OUT") or tempfile.mkdtemp(prefix="catalog-shots-")
    os.makedirs(folder, exist_ok=True)
    return os.path.abspath(folder)


def _pages(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root)
                  for n in names if n.endswith(".html"))


def _load(driver, path, width):
    mobile = width < 500
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile})
    driver.get_log("browser")        # drop what an earlier page logged
    driver.get("file://" + path)
    driver.execute_script("return document.readyState")
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE",
                                                                                 "WARNING")]


def _screenshot(driver, path):
    import base64

    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.execute_script("return document.documentElement.clientWidth")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 16000), "scale": 1}})
    with open(path, "wb") as handle:
        handle.write(base64.b64decode(shot["data"]))


def _shot_name(rel, kind, view):
    return f"{kind}-" + rel.replace(os.sep, "_").replace(".html", "") + f"-{view}.png"


@pytest.mark.parametrize("kind", ["site", "operator"])
def test_every_page_renders_without_errors_at_desktop_and_phone_widths(browser, sites, shots,
                                                                       kind):
    root = sites[kind]
    pages = _pages(root)
    assert pages
    for rel in pages:
        for view, width in WIDTHS.items():
            problems = _load(browser, os.path.join(root, rel), width)
            assert problems == [], (rel, view, problems)
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{rel} scrolls sideways by {overflow}px at {width}px"
            _screenshot(browser, os.path.join(shots, _shot_name(rel, kind, view)))
            assert os.path.getsize(os.path.join(shots, _shot_name(rel, kind, view))) > 5000


def test_rendered_pages_show_the_releases_epsilons_and_charts(browser, sites):
    from selenium.webdriver.common.by import By

    site = sites["site"]
    doc = json.load(open(os.path.join(site, "catalog.json")))
    _load(browser, os.path.join(site, "index.html"), WIDTHS["desktop"])
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "main table a")]
    assert len(links) == len(doc["datasets"]) == 2
    for dataset in doc["datasets"]:
        shown = {}
        pages = sorted(p for p in _pages(site) if p.startswith(os.path.dirname(dataset["page"])))
        for rel in pages:
            _load(browser, os.path.join(site, rel), WIDTHS["desktop"])
            for row in browser.find_elements(By.CSS_SELECTOR, "table.releases tbody tr"):
                rid = row.find_element(By.CSS_SELECTOR, ".release-id").text
                version = row.find_element(By.CSS_SELECTOR, ".version").text
                eps = float(row.find_element(By.CSS_SELECTOR, ".epsilon").get_attribute(
                    "data-epsilon"))
                assert row.find_element(By.CSS_SELECTOR, ".epsilon").text.startswith("\u03b5=")
                shown[f"{rid}#{version}"] = eps
        want = {f"{r['release_id']}#v{r['version']}": r["guarantee"]["epsilon"]
                for r in dataset["releases"]}
        assert shown.keys() == want.keys()
        assert all(abs(shown[k] - want[k]) < 1e-12 for k in want)
        # The dataset page: one chart per budget-table row, drawn at a readable size.
        _load(browser, os.path.join(site, dataset["page"]), WIDTHS["desktop"])
        charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
        assert [c.get_attribute("data-scope") for c in charts] == \
            [s["name"] for s in dataset["scopes"]]
        for chart in charts:
            assert chart.size["width"] >= 300 and chart.size["height"] >= 120
            assert chart.find_elements(By.CSS_SELECTOR, ".spent")
            assert chart.find_elements(By.CSS_SELECTOR, "line.budget")
        _load(browser, os.path.join(site, dataset["page"]), WIDTHS["phone"])
        for chart in browser.find_elements(By.CSS_SELECTOR, "svg.chart"):
            assert chart.size["width"] >= 300
