"""The web console in a real browser (headless Chromium through its WebDriver), against a real
broker process (`stratalog serve`) fed by real Kafka clients: the page's topics, records as
text, JSON and hex, by offset and by time, groups' lag as the committed offsets say, a topic
created and deleted and a group's offsets reset from the page, each checked afterwards through
confluent-kafka; and the same page served by `stratalog console --bootstrap`.

With STRATALOG_CONSOLE_SCREENSHOTS=1 the views are saved to docs/console/*.png (docs/console.md
shows them); without it nothing is written to the tree.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from .browser import WAIT_S, after, cells, chromium, needs_chromium, notice, show, submit
from .conftest import REPO, BrokerProcess, committed_offsets, console_process, create_topic

pytestmark = needs_chromium
SCREENSHOTS = (
    REPO / "docs" / "console" if os.environ.get("STRATALOG_CONSOLE_SCREENSHOTS") == "1" else None
)
T0 = (int(time.time()) - 3600) * 1000  # partition 1's records: one a minute from an hour ago
BINARY = b"\x00\x01\xfe\xff"


class Env:
    def __init__(self, bootstrap: str, admin: str) -> None:
        self.bootstrap = bootstrap
        self.url = f"http://{admin}/"
        self.kafka = AdminClient({"bootstrap.servers": bootstrap})


def _admin_address(bootstrap: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource("broker", "0")
    return admin.describe_configs([res])[res].result(15)["admin.address"].value


def _status(admin: str) -> dict:
    with urllib.request.urlopen(f"http://{admin}/status", timeout=10) as r:
        return json.loads(r.read())


def _consumer(bootstrap: str, group: str, **extra) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("console")
    # A small hot tier over a cold one, so the console has migrated segments to show.
    tiers = {
        "tiers.cold.path": str(root / "cold"),
        "tiers.hot.capacity": "200000",
        "tiers.migrate.threshold": "0.5",
        "tiers.migrate.interval.ms": "100",
        "segment.bytes": "30000",
    }
    bp = BrokerProcess(root / "data", settings=tiers).start()
    live = None
    try:
        create_topic(bp.bootstrap, "orders", 2)
        create_topic(bp.bootstrap, "traffic", 1)
        p = Producer({"bootstrap.servers": bp.bootstrap, "linger.ms": 0})
        for i in range(8):
            order = {"order": i, "customer": f"c{i % 3}", "total": 10 * i + 0.5}
            p.produce("orders", json.dumps(order).encode(), f"customer-{i % 3}".encode(), 0)
        for i in range(5):
            p.produce("orders", f"plain text {i}".encode(), None, 1, timestamp=T0 + i * 60000)
        p.produce("orders", BINARY, b"bin", 1, timestamp=T0 + 5 * 60000)
        for _ in range(300):
            p.produce("traffic", b"t" * 1000)
        assert p.flush(30) == 0
        admin = _admin_address(bp.bootstrap)
        deadline = time.monotonic() + WAIT_S
        while _status(admin)["migration"]["migrated_segments"] == 0:
            assert time.monotonic() < deadline, "nothing migrated to the cold tier"
            time.sleep(0.1)
        # "billing": offsets committed outside any generation, no members: lag 3 and 4.
        c = _consumer(bp.bootstrap, "billing")
        c.commit(offsets=[TopicPartition("orders", 0, 5), TopicPartition("orders", 1, 2)],
                 asynchronous=False)  # fmt: skip
        c.close()
        # "live": a member that stays subscribed while the page looks.
        live = _consumer(bp.bootstrap, "live", **{"client.id": "live-client",
                                                  "auto.offset.reset": "earliest"})  # fmt: skip
        live.subscribe(["orders"])
        deadline = time.monotonic() + WAIT_S
        while not live.assignment() and time.monotonic() < deadline:
            live.poll(0.2)
        assert live.assignment()
        yield Env(bp.bootstrap, admin)
    finally:
        if live is not None:
            live.close()
        bp.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with chromium() as driver:
        yield driver


def shot(driver, name: str) -> None:
    """The whole page (beyond the window) as docs/console/NAME.png, when asked for."""
    if SCREENSHOTS is None:
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    png = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    (SCREENSHOTS / f"{name}.png").write_bytes(base64.b64decode(png["data"]))


def test_overview_shows_the_broker_tiers_and_live_charts(env: Env, browser) -> None:
    show(browser, env.url, "/overview")
    rows = cells(browser, "#brokers-table")
    assert len(rows) == 1
    assert rows[0][0] == "0" and rows[0][2] == "controller" and rows[0][-1] == "ok"
    tiers = cells(browser, "#tiers-table")
    assert [r[0] for r in tiers] == ["hot", "cold"]
    assert tiers[1][1].endswith("cold") and tiers[1][3] == "ok"
    migration = browser.find_element("id", "migration").text
    assert "migration: backlog" in migration and " 0 segment(s)" not in migration
    # Live charts: samples of /api/metrics every 2 s while records keep arriving.
    p = Producer({"bootstrap.servers": env.bootstrap, "linger.ms": 0})
    deadline = time.monotonic() + 2 * WAIT_S
    want = 3 if SCREENSHOTS is None else 12  # (a longer line for the picture)
    while browser.execute_script("return samples.length") < want and time.monotonic() < deadline:
        for _ in range(20):
            p.produce("traffic", b"x" * 512)
        p.flush(10)
        time.sleep(0.3)
    produced = browser.execute_script("return series().produced.map(p => p[1])")
    assert max(produced) > 0
    assert browser.find_element("id", "chart-latency").size["width"] > 100
    shot(browser, "overview")


def test_topics_with_partitions_tiers_and_configs(env: Env, browser) -> None:
    show(browser, env.url, "/topics")
    rows = {r[0]: r for r in cells(browser, "#topics-table")}
    assert rows["orders"][1] == "2"  # partitions
    assert rows["orders"][4] == "14"  # records
    assert rows["orders"][5].endswith("B")  # hot tier bytes
    shot(browser, "topics")
    show(browser, env.url, "/topics/orders")
    parts = cells(browser, "#partitions-table")
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in parts] == [
        ("0", "0", "0", "0", "8"),
        ("1", "0", "0", "0", "6"),
    ]
    configs = {r[0]: r[1] for r in cells(browser, "#configs-table")}
    assert configs["cleanup.policy"] == "delete"
    tiers = cells(browser, "#topic-tiers")
    assert [t[0] for t in tiers] == ["hot", "cold"]
    assert {t[1] for t in tiers} != {"0 B"}
    shot(browser, "topic")
    show(browser, env.url, "/topics")
    cold = {r[0]: r[6] for r in cells(browser, "#topics-table")}["traffic"]
    assert cold != "0 B"  # what migrated


def test_record_browser_as_text_json_and_hex(env: Env, browser) -> None:
    browser.execute_script("localStorage.setItem('stratalog.format', 'text')")
    show(browser, env.url, "/records?topic=orders&partition=0&limit=5")
    browser.refresh()  # the format remembered is taken at load
    show(browser, env.url, "/records?topic=orders&partition=0&limit=5")
    values = [e.text for e in browser.find_elements("css selector", "#records-table td.value")]
    assert values[0] == json.dumps({"order": 0, "customer": "c0", "total": 0.5})
    assert len(values) == 5
    keys = [e.text for e in browser.find_elements("css selector", "#records-table td.key")]
    assert keys[:3] == ["customer-0", "customer-1", "customer-2"]

    after(browser, lambda: browser.find_element("css selector", "[data-format=json]").click())
    first = browser.find_element("css selector", "#records-table td.value").text
    assert json.loads(first) == {"order": 0, "customer": "c0", "total": 0.5}
    assert first.count("\n") == 4  # pretty-printed
    shot(browser, "records-json")

    # Next page from offset 5
    after(browser, lambda: browser.find_element("id", "next-page").click())
    rows = browser.find_elements("css selector", "#records-table tbody tr")
    offsets = [r.get_attribute("data-offset") for r in rows]
    assert offsets == ["5", "6", "7"]

    after(browser, lambda: browser.find_element("css selector", "[data-format=hex]").click())
    show(browser, env.url, "/records?topic=orders&partition=1&offset=5")
    row = browser.find_element("css selector", "#records-table tr[data-offset='5']")
    assert row.find_element("css selector", "td.value").text == "00 01 fe ff"
    assert row.find_element("css selector", "td.key").text == "62 69 6e"  # "bin"
    shot(browser, "records-hex")

    # By time: the first record at or after T0 + 3 minutes is offset 3.
    after(browser, lambda: browser.find_element("css selector", "[data-format=text]").click())
    at = datetime.fromtimestamp((T0 + 3 * 60000) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    show(browser, env.url, f"/records?topic=orders&partition=1&time={at}")
    rows = cells(browser, "#records-table")
    assert [r[0] for r in rows] == ["3", "4", "5"]
    assert rows[0][3] == "plain text 3"


def _committed(bootstrap: str, group: str) -> dict[int, int]:
    return committed_offsets(bootstrap, group, "orders", (0, 1))


def test_groups_lag_as_the_committed_offsets_say(env: Env, browser) -> None:
    committed = _committed(env.bootstrap, "billing")
    assert committed == {0: 5, 1: 2}
    show(browser, env.url, "/groups")
    groups = {r[0]: r for r in cells(browser, "#groups-table")}
    assert groups["billing"][4] == str((8 - 5) + (6 - 2))
    assert "live" in groups
    show(browser, env.url, "/groups/billing")
    rows = cells(browser, "#offsets-table")
    # topic, partition, committed, end, lag, member
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("0", str(committed[0]), "8", str(8 - committed[0])),
        ("1", str(committed[1]), "6", str(6 - committed[1])),
    ]
    assert browser.find_element("id", "total-lag").text == "7"
    show(browser, env.url, "/groups/live")
    members = cells(browser, "#members-table")
    assert len(members) == 1 and members[0][1] == "live-client"
    assert members[0][3] == "orders-0, orders-1"
    shot(browser, "group")


def test_reset_offsets_from_the_page(env: Env, browser) -> None:
    show(browser, env.url, "/groups/live")
    submit(browser, "reset-offsets", topic="orders", to="earliest")
    kind, text = notice(browser)
    assert kind == "error" and "active member" in text  # a live group's offsets are its own

    show(browser, env.url, "/groups/billing")
    submit(browser, "reset-offsets", topic="orders", to="offset", offset="1")
    assert notice(browser) == ("ok", "group billing: 2 offset(s) of orders committed")
    rows = cells(browser, "#offsets-table")
    assert [(r[2], r[4]) for r in rows] == [("1", "7"), ("1", "5")]
    assert _committed(env.bootstrap, "billing") == {0: 1, 1: 1}
    # What a Kafka consumer of the group then reads: from offset 1 on each partition.
    c = _consumer(env.bootstrap, "billing", **{"enable.auto.commit": False})
    c.subscribe(["orders"])
    first: dict[int, int] = {}
    deadline = time.monotonic() + WAIT_S
    while len(first) < 2 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            first.setdefault(m.partition(), m.offset())
    c.close()
    assert first == {0: 1, 1: 1}


def test_create_and_delete_a_topic_from_the_page(env: Env, browser) -> None:
    show(browser, env.url, "/topics")
    submit(browser, "create-topic", name="made-in-console", partitions="3",
            configs="retention.ms=3600000")  # fmt: skip
    assert notice(browser) == ("ok", "topic made-in-console created")
    assert "made-in-console" in {r[0] for r in cells(browser, "#topics-table")}
    md = env.kafka.list_topics("made-in-console", timeout=15).topics["made-in-console"]
    assert md.error is None and len(md.partitions) == 3
    res = ConfigResource("topic", "made-in-console")
    assert env.kafka.describe_configs([res])[res].result(15)["retention.ms"].value == "3600000"

    submit(browser, "create-topic", name="made-in-console", partitions="1")
    assert notice(browser)[0] == "error"
    assert "already exists" in notice(browser)[1]

    button = browser.find_element("css selector", "button[data-delete='made-in-console']")

    def delete() -> None:
        button.click()
        browser.switch_to.alert.accept()

    after(browser, delete)
    assert notice(browser) == ("ok", "topic made-in-console deleted")
    assert "made-in-console" not in env.kafka.list_topics(timeout=15).topics


def test_stratalog_console_serves_a_remote_broker(env: Env, browser) -> None:
    with console_process(env.bootstrap) as url:
        remote = Env(env.bootstrap, url.removeprefix("http://"))
        show(browser, remote.url, "/topics")
        rows = {r[0]: r for r in cells(browser, "#topics-table")}
        assert rows["orders"][4] == "14"
        assert rows["orders"][6].endswith("B")  # sizes from the broker's /status
        show(browser, remote.url, "/groups/billing")
        assert [r[2] for r in cells(browser, "#offsets-table")] == ["1", "1"]
