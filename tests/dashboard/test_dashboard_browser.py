"""The dashboard in a real headless browser (Debian's chromium through chromedriver, driven by
selenium): log in with the admin key, watch real traffic arrive through the auto-refresh, check what
is drawn and written on the page against the API, and save a screenshot (to the test's tmp dir and
to ``/tmp/dashboard.png``, for a person to look at).

The browser is required: without ``chromium`` and ``chromedriver`` the test fails saying how to
install them (``.ci/run`` does). ``POINTSMAN_SKIP_BROWSER=1`` skips it on a machine that cannot
have them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard.traffic import ADMIN_KEY, SECRET, drive, start
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

SCREENSHOT = Path("/tmp/dashboard.png")

pytestmark = pytest.mark.timeout(240)


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    if os.environ.get("POINTSMAN_SKIP_BROWSER") == "1":
        pytest.skip("POINTSMAN_SKIP_BROWSER=1 and no chromium/chromedriver")
    pytest.fail("the dashboard's browser test needs Debian's chromium and chromedriver: "
                "`apt-get install -y chromium chromium-driver` (.ci/run installs them)", pytrace=False)


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = start(upstream, tmp_path_factory.mktemp("dashboard-browser"), slow_strong=0.12)
    yield proc
    proc.terminate()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1000", "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # the page is mid-render: the element was just replaced
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"not seen in the browser after {timeout}s: {what} (last: {last!r})")


def api(gateway: GatewayProcess, window: int) -> dict[str, Any]:
    reply = httpx.get(f"{gateway.url}/dashboard/api/summary", params={"window": window},
                      headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    assert reply.status_code == 200
    data: dict[str, Any] = reply.json()
    return data


def test_the_dashboard_in_a_real_browser(gateway: GatewayProcess, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def text(css: str) -> str:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)

    # Some traffic before the page opens, more while it is open (the auto-refresh picks it up).
    drive(gateway, strong=2, weak=6, failing=1, rejected=0, split=4, cached=4, users="early")
    browser.get(f"{gateway.url}/dashboard")
    # Keys are configured: the page asks for the admin key and shows no data until it has one.
    login = wait_for("the login form", lambda: browser.find_element(By.ID, "login-key").is_displayed())
    assert login and not browser.find_element(By.ID, "main").is_displayed()
    browser.find_element(By.ID, "login-key").send_keys("sk-not-the-key")
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait_for("the refusal", lambda: "invalid admin key" in text("#login-error"))
    assert not browser.find_element(By.ID, "main").is_displayed()
    browser.find_element(By.ID, "login-key").send_keys(ADMIN_KEY)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait_for("the dashboard", lambda: browser.find_element(By.ID, "main").is_displayed())
    # The key stays in this tab's sessionStorage, never in the URL.
    assert browser.execute_script("return sessionStorage.getItem('pointsman.adminKey')") == ADMIN_KEY
    assert ADMIN_KEY not in browser.current_url
    Select(browser.find_element(By.ID, "window")).select_by_value("300")  # 5 s buckets
    for round_ in range(3):
        time.sleep(2.5)
        drive(gateway, strong=1 + round_, weak=4 + 2 * round_, failing=round_ % 2, rejected=1, split=3,
              cached=3 + round_, users=f"round{round_}")
    expected = api(gateway, 300)
    total = expected["totals"]["requests"]
    wait_for(f"{total} requests on the page", lambda: text("#kpi-requests") == f"{total:,}", timeout=15)
    rendered = browser.find_element(By.TAG_NAME, "body").get_attribute("data-rendered")
    assert rendered

    # What the page shows is what the API says.
    assert text("#router-version") == expected["router"]["version"]
    assert f"{expected['totals']['errors']} (" in text("#kpi-errors")
    assert "saved" in text("#kpi-cost-sub") and "always-strong" in text("#kpi-cost-sub")
    p50, p95 = text("#kpi-latency").split(" · ")  # "3.6 · 169 ms"
    assert float(p50) <= float(p95.removesuffix(" ms")) and float(p95.removesuffix(" ms")) >= 100  # strong: 120 ms
    routes = text("#routes-table")
    for route in ("auto", "flaky", "split", "(direct)"):
        assert route in routes
    assert "strong" in routes and "weak" in routes
    experiments = text("#experiments")
    assert "ab-alt" in experiments and "running" in experiments and "control" in experiments
    recent = browser.find_elements(By.CSS_SELECTOR, "#recent-table tbody tr")
    assert len(recent) == len(expected["recent"]) == 25
    assert "difficulty" in text("#recent-table") and "threshold" in text("#recent-table")
    assert SECRET not in browser.page_source  # no prompt text on the page
    # The charts were drawn: stacked bars per model, cost and latency lines.
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-mix svg rect")) >= 6
    legend = text("#legend-mix")
    assert "strong" in legend and "weak" in legend
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-cost svg path")) >= 2
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-latency svg path")) >= 2
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-errors svg rect")) >= 2
    assert "%" in text("#kpi-cache") and "hits of" in text("#kpi-cache-sub")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-cache svg path")) >= 1
    # The route view of the mix.
    browser.find_element(By.CSS_SELECTOR, "#mix-by button[data-by=routes]").click()
    wait_for("the mix by route", lambda: "flaky" in text("#legend-mix"))
    browser.find_element(By.CSS_SELECTOR, "#mix-by button[data-by=models]").click()
    wait_for("the mix by model", lambda: "weak" in text("#legend-mix"))

    # The whole page in one screenshot.
    height = int(browser.execute_script("return document.documentElement.scrollHeight"))
    browser.set_window_size(1440, min(height + 40, 6000))
    time.sleep(0.5)  # the resize re-renders the charts
    wait_for("a refresh after the resize", lambda: text("#kpi-requests") == f"{total:,}")
    png = browser.get_screenshot_as_png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    (tmp_path / "dashboard.png").write_bytes(png)
    SCREENSHOT.write_bytes(png)

    # Signing out forgets the key.
    browser.find_element(By.ID, "logout").click()
    wait_for("the login form again", lambda: browser.find_element(By.ID, "login-key").is_displayed())
    assert browser.execute_script("return sessionStorage.getItem('pointsman.adminKey')") is None
