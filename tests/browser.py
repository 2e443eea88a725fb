"""Driving the web console in headless Chromium (Debian's chromium and chromium-driver, which
`make setup` installs) with Selenium: open a view and wait until it is drawn, act and wait for
the view to be drawn again, read a table. The page marks its main element with the route it
drew and a turn that grows with each drawing (console/static/console.js)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import pytest

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="Chromium and chromedriver are not installed (make setup installs the Debian "
    "packages chromium and chromium-driver: scripts/install-system-deps.sh)",
)
WAIT_S = 20


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium driven through its chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1360,900", "--lang=en-US"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER or "chromedriver"))
    try:
        yield driver
    finally:
        driver.quit()


def _turn(driver) -> int:
    return int(driver.execute_script("return document.getElementById('main').dataset.turn || 0"))


def wait(driver, what, message: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: what(d), message)


def show(driver, url: str, route: str) -> None:
    """Open the console at ``url`` on ``route`` (a hash route) and wait until the view is
    drawn."""
    if not driver.current_url.startswith(url):
        driver.get(url + "#" + route)
    else:
        driver.execute_script("location.hash = arguments[0]", route)
    wait(
        driver,
        lambda d: d.execute_script(
            "const m = document.getElementById('main');"
            "return m.dataset.ready === '1' && m.dataset.route === arguments[0]",
            route.lstrip("/"),
        ),
        f"the view {route} was not drawn",
    )
    error = driver.find_elements("id", "view-error")
    assert not error, error[0].text


def after(driver, action) -> None:
    """Do ``action`` (a click, a form submission) and wait until the view is drawn again, or
    an error is shown instead."""
    before = _turn(driver)
    driver.execute_script("notice('')")  # (an error shown before is not this action's)
    action()
    wait(
        driver,
        lambda d: _turn(d) > before or notice(d)[0] == "error",
        "the view was not drawn again",
    )


def cells(driver, selector: str) -> list[list[str]]:
    rows = driver.find_elements("css selector", f"{selector} tbody tr")
    return [[td.text for td in row.find_elements("tag name", "td")] for row in rows]


def submit(driver, form: str, **fields: str) -> None:
    from selenium.webdriver.support.select import Select

    f = driver.find_element("id", form)
    for name, value in fields.items():
        field = f.find_element("name", name)
        if field.tag_name == "select":
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(value)
    after(driver, lambda: f.find_element("css selector", "button[type=submit]").click())


def notice(driver) -> tuple[str, str]:
    n = driver.find_element("id", "notice")
    return n.get_attribute("class"), n.text
