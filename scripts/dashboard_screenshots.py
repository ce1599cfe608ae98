"""Regenerates the dashboard screenshots in docs/screenshots/ (README.md and docs/dashboard.md show them): a broker with its dashboard on
free loopback ports over a temporary store, some traffic (a topic with JSON messages, a consumer group reading it,
pending transactions whose producer does not answer), then each main page in a headless Chromium.

    .venv/bin/python scripts/dashboard_screenshots.py            # needs chromium and chromedriver
                                                                  # (bash scripts/install_chromium.sh)
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench import run_main, start_broker  # noqa: E402
from halfmq.client import (ConsumeFrom, LocalTransactionState, Message, Producer, PushConsumer,  # noqa: E402
                           TransactionProducer)

OUT = ROOT / "docs" / "screenshots"
DASHBOARD = re.compile(rb"dashboard (\S+)")
#: (file name, path, a link to follow from it: the first whose href matches, or None)
PAGES = [
    ("overview", "/", None),
    ("topics", "/topics", None),
    ("topic", "/topics/Orders", None),
    ("messages", "/messages?topic=Orders", None),
    ("message", "/messages?topic=Orders", r"^/messages/[0-9A-F]+"),
    ("groups", "/groups", None),
    ("group", "/groups/Billing", None),
    ("producers", "/producers", None),
    ("transactions", "/transactions", None),
    ("config", "/config", None),
]


class NeverAnswers:
    """A transaction listener whose local transactions stay unknown: their halves stay pending."""

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


async def traffic(namesrv: str) -> list:
    """Messages, a consumer group reading them, pending halves; returns what must stay open while pictured."""
    async with Producer("PG_ORDERS", namesrv) as producer:
        for i in range(40):
            body = json.dumps({"order": 1000 + i, "item": ["book", "pen", "lamp"][i % 3], "amount": 12.5 * (i % 7)})
            await producer.send(Message("Orders", body.encode(), tags="created", keys=f"order-{1000 + i}"))
    consumer = PushConsumer("Billing", namesrv, lambda msgs: None, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe("Orders")
    await consumer.start()
    tx = TransactionProducer("PG_PAYMENTS", NeverAnswers(), namesrv)
    await tx.start()
    for i in range(5):
        await tx.send_message_in_transaction(Message("Payments", f'{{"payment": {i}}}'.encode(),
                                                     keys=f"payment-{i}"))
    return [consumer, tx]


def shoot(base: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900",
                "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        for name, path, follow in PAGES:
            driver.get(base + path)
            if follow:
                links = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a[href]")]
                target = next((h for h in links if re.match(follow, h.removeprefix(base))), None)
                if target is None:
                    raise SystemExit(f"{path}: no link like {follow} to follow for {name}")
                driver.get(target)
            driver.execute_script("return document.readyState")
            driver.save_screenshot(str(OUT / f"{name}.png"))
            print(f"docs/screenshots/{name}.png  {path}", flush=True)
    finally:
        driver.quit()


async def main() -> None:
    proc, ready = await start_broker("--dashboardPort=0", "--metricsPromExporterPort=-1", "--logLevel=WARNING",
                                     "--transactionTimeOut=3600000")
    try:
        base = "http://" + DASHBOARD.search(ready.string).group(1).decode()
        keep = await traffic(ready.group(2).decode())
        # Two samples of the brokers' figures (every 5 s) so the overview's charts have a line to draw.
        await asyncio.sleep(11)
        await asyncio.to_thread(shoot, base)
        for client in keep:
            await client.close()
    finally:
        proc.terminate()
        await proc.wait()


if __name__ == "__main__":
    run_main(main())
