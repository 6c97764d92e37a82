"""Screenshots of the demo's three views for docs/demo.md, taken in headless chromium.

    python scripts/demo_screenshots.py [--out docs]

Starts `python -m paraphrastic.demo` on a free loopback port (with the multilingual model where it is
installed, else the English default), fills in each view, and writes demo-similarity.png, demo-search.png
and demo-matching.png. Needs the `demo` and `test` extras (gradio, selenium) and Debian's chromium and
chromium-driver.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from paraphrastic.static import SHIPPED

ROOT = Path(__file__).resolve().parents[1]
MATCH_EN = [
    "The weather is nice today.",
    "Where is the train station?",
    "I like to read books.",
    "Thank you very much.",
]
MATCH_DE = ["Vielen Dank.", "Ich lese gern Bücher.", "Das Wetter ist heute schön.", "Wo ist der Bahnhof?"]
MATCH_PARAPHRASES = ["Thanks a lot.", "Reading books is something I enjoy.", "It is lovely weather today.",
                     "How do I get to the railway station?"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_page(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"error: the demo did not start at {url}")


def fill(driver, box: str, text: str) -> None:
    """Set a text box's content as a paste does."""
    area = driver.find_element(By.CSS_SELECTOR, f"#{box} textarea")
    driver.execute_script(
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input', {bubbles: true}));",
        area,
        text,
    )


def message(driver, view: str) -> str:
    return driver.find_element(By.ID, f"{view}-message").text


def run_view(driver, button: str, done, path: Path) -> None:
    """Click the view's button, wait until `done(driver)`, and save a screenshot of the whole page."""
    driver.find_element(By.ID, button).click()
    WebDriverWait(driver, 60).until(done)
    time.sleep(0.5)  # let the result finish rendering
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 2000), "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs"), help="folder for the PNG files")
    args = p.parse_args()
    multilingual = SHIPPED["multilingual"].exists()
    url = f"http://127.0.0.1:{free_port()}/"
    command = [sys.executable, "-m", "paraphrastic.demo", "--port", url.split(":")[-1].strip("/")]
    command += ["--model", "multilingual"] if multilingual else []
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(command, env=os.environ | {"GRADIO_TEMP_DIR": tmp})
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            wait_for_page(url, proc)
            driver.get(url)
            WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sentence-1 textarea"))
            out = Path(args.out)
            fill(driver, "sentence-1", "A man is playing a guitar on the street.")
            fill(driver, "sentence-2", "Someone is strumming a guitar outdoors. Café ☕")
            score = (By.CSS_SELECTOR, "#score textarea")
            run_view(
                driver,
                "score-button",
                lambda d: d.find_element(*score).get_attribute("value"),
                out / "demo-similarity.png",
            )
            driver.find_element(By.XPATH, "//button[@role='tab' and contains(., 'Search')]").click()
            fill(driver, "query", "A puppy plays in the snow.")
            run_view(driver, "search-button", lambda d: "Top" in message(d, "search"), out / "demo-search.png")
            driver.find_element(By.XPATH, "//button[@role='tab' and contains(., 'Translation matching')]").click()
            fill(driver, "first-list", "\n".join(MATCH_EN))
            fill(driver, "second-list", "\n".join(MATCH_DE if multilingual else MATCH_PARAPHRASES))
            run_view(driver, "match-button", lambda d: "lines" in message(d, "matching"), out / "demo-matching.png")
        finally:
            driver.quit()
            proc.terminate()
            proc.wait(timeout=20)


if __name__ == "__main__":
    main()
