"""The web console in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver (`infra/install_browser.sh`; nothing is downloaded). Sign in, see
usage, issue and revoke a key, a tenant admin never sees another tenant's rows, and
pagination. A missing browser fails these tests; it never skips them.

With LEDGERLM_CONSOLE_SCREENSHOTS=DIR, a screenshot of each view is written there
(`docs/console/` holds the README's: see "Web console" in the README).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.console_fixture import GENERATIONS_A

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT_S = 20  # every wait on the page is bounded by this
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


@pytest.fixture(scope="module")
def driver():
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `bash infra/install_browser.sh` (make install does)",
                    pytrace=False)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never look for a browser to download
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    browser.set_page_load_timeout(WAIT_S)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, css: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def open_page(driver, base: str, path: str, css: str = "main"):
    driver.get(base + path)
    return wait_for(driver, css)


def sign_in(driver, base: str, secret: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    open_page(driver, base, "/console/login", "#api-key").send_keys(secret)
    driver.find_element(By.ID, "sign-in").click()
    wait_for(driver, "#signed-in-as")


def shot(driver, name: str) -> None:
    folder = os.environ.get("LEDGERLM_CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def test_sign_in_and_see_usage_equal_to_the_ledger(driver, console_platform):
    cp = console_platform
    a = cp.tenants["a"]
    open_page(driver, cp.base_url, "/console/login", "#api-key")
    shot(driver, "sign-in")
    sign_in(driver, cp.base_url, a.admin)
    assert driver.current_url.endswith("/console/usage")
    total = wait_for(driver, "#total-cost")
    assert int(total.get_attribute("data-micros")) == cp.ledger_micros(a.tenant_id)
    assert wait_for(driver, "#total-generations").text == str(len(a.request_ids))
    assert driver.find_elements("css selector", "svg.chart rect"), "the spend chart has bars"


def test_issue_and_revoke_a_key(driver, console_platform):
    from selenium.webdriver.common.by import By

    cp = console_platform
    a = cp.tenants["a"]
    sign_in(driver, cp.base_url, a.admin)
    open_page(driver, cp.base_url, "/console/keys", "#issue-key")
    field = driver.find_element(By.ID, "issue-application")
    field.clear()
    field.send_keys("browser-app")
    driver.find_element(By.ID, "issue").click()
    secret_box = wait_for(driver, "#new-secret")
    key_id, secret = secret_box.get_attribute("data-key-id"), secret_box.text.strip()
    with cp.platform.client(secret) as client:
        assert client.get("/v1/models").status_code == 200
        row = wait_for(driver, f'tr[data-key-id="{key_id}"]')
        assert row.get_attribute("data-state") == "active" and "browser-app" in row.text
        row.find_element(By.CSS_SELECTOR, "button.revoke").click()
        assert wait_for(driver, f'tr[data-key-id="{key_id}"][data-state="revoked"]')
        assert client.get("/v1/models").status_code == 401


def test_a_tenant_admin_never_sees_another_tenants_rows(driver, console_platform):
    cp = console_platform
    a, b = cp.tenants["a"], cp.tenants["b"]
    sign_in(driver, cp.base_url, a.admin)
    for path in ("/console/usage", "/console/usage?group=day", "/console/limits", "/console/generations?limit=200",
                 "/console/batches", "/console/keys", "/console/audit?limit=200", "/console/routing"):
        open_page(driver, cp.base_url, path)
        source = driver.page_source
        leaked = [x for x in (b.tenant_id, *b.request_ids) if x in source]
        assert not leaked, f"{path} shows tenant b's {leaked}"
        tenants = set(re.findall(r'data-tenant="([^"]+)"', source))
        assert tenants <= {a.tenant_id}, (path, tenants)
        open_page(driver, cp.base_url, path + ("&" if "?" in path else "?") + f"tenant={b.tenant_id}", "h1")
        assert "No such tenant" in driver.page_source and b.tenant_id not in driver.page_source.split("<main>")[1]
    for path in ("/console/fleet", "/console/rollouts"):
        open_page(driver, cp.base_url, path, "h1")
        assert "No such page" in driver.page_source


def test_generations_pages_through_every_row_once(driver, console_platform):
    from selenium.webdriver.common.by import By

    cp = console_platform
    a = cp.tenants["a"]
    sign_in(driver, cp.base_url, a.admin)
    open_page(driver, cp.base_url, "/console/generations?limit=10", "#generations")
    first = [r.get_attribute("data-request-id") for r in driver.find_elements(By.CSS_SELECTOR, "tr.generation")]
    assert len(first) == 10
    driver.find_element(By.ID, "next-page").click()
    wait_for(driver, "#first-page")
    second = [r.get_attribute("data-request-id") for r in driver.find_elements(By.CSS_SELECTOR, "tr.generation")]
    assert len(second) == GENERATIONS_A - 10 and not driver.find_elements(By.ID, "next-page")
    assert sorted(first + second) == sorted(a.request_ids)


def test_every_view_renders_for_an_operator(driver, console_platform):
    """And, with LEDGERLM_CONSOLE_SCREENSHOTS set, is photographed."""
    cp = console_platform
    sign_in(driver, cp.base_url, cp.operator)
    views = {"usage": ("/console/usage", "#usage-totals"), "usage-per-key":
             (f"/console/usage?tenant={cp.tenants['a'].tenant_id}&group=key", "#usage-rows"),
             "limits": (f"/console/limits?tenant={cp.tenants['b'].tenant_id}", "#limits"),
             "generations": ("/console/generations?limit=25", "#generations"), "batches": ("/console/batches", "#batches"),
             "keys": (f"/console/keys?tenant={cp.tenants['a'].tenant_id}", "#keys"),
             "fleet": ("/console/fleet", "#workers"), "audit": ("/console/audit?limit=25", "#audit-events"),
             "rollouts": ("/console/rollouts", "#rollouts"), "routing": ("/console/routing", "#cache-policies")}
    for name, (path, css) in views.items():
        open_page(driver, cp.base_url, path, css)
        assert "server_error" not in driver.page_source, path
        shot(driver, name)
