"""The demo page in a real browser: headless Chromium driven by Selenium uploads a photo,
reads the caption, hovers over words and meets bad files.

Skipped where Chromium, chromedriver or Selenium is missing (Debian: `apt-get install
chromium chromium-driver`; PyPI: `selenium`). Run as a script it takes the page's
screenshot instead of testing:

  python tests/demo_browser_test.py --screenshot=docs/demo_page.png \
      --export=exports/sat/1,exports/sat/2 [--photo=PATH] [--hover=2]
"""

import argparse
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import pytest
from absl.testing import absltest
from demo_test import bad_uploads, exports, photo, signature_outputs, start_server
from fixtures import scenes
from PIL import Image

from sat_tf.server import demo

try:
    from selenium import webdriver
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# A root user in a container, no GPU, and no network beyond 127.0.0.1: without these
# Chromium refuses to start or keeps trying to reach its update and sync services.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--window-size=1200,1500",
)
WAIT_SECONDS = 60


def browser_problem():
    """Why no browser test can run here, or None."""
    if webdriver is None:
        return "selenium is not installed (pip install selenium)"
    if not any(shutil.which(b) for b in BROWSERS):
        return f"no Chromium found ({', '.join(BROWSERS)}; apt-get install chromium)"
    if not shutil.which("chromedriver"):
        return "no chromedriver on PATH (apt-get install chromium-driver)"
    return None


def start_browser(profile):
    """Headless Chromium with a fresh profile folder `profile`, via the system chromedriver."""
    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(b) for b in BROWSERS if shutil.which(b))
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


class Page:
    """The demo page open in `driver`: actions that wait until the page has answered."""

    def __init__(self, driver, url):
        self.driver = driver
        driver.get(url)
        self.wait_for("idle")

    def state(self):
        return self.driver.find_element(By.TAG_NAME, "body").get_attribute("data-state")

    def wait_for(self, *states):
        WebDriverWait(self.driver, WAIT_SECONDS).until(lambda _: self.state() in states)
        return self.state()

    def act(self, action):
        """Runs `action` (which starts a caption request) and waits for its answer."""
        self.driver.execute_script("document.body.dataset.state = 'waiting'")
        action()
        return self.wait_for("done", "error")

    def upload(self, path):
        return self.act(lambda: self.driver.find_element(By.ID, "file").send_keys(path))

    def choose(self, beam_size):
        radio = self.driver.find_element(By.CSS_SELECTOR, f"input[value='{beam_size}']")
        return self.act(radio.click)

    def text(self, element_id):
        return self.driver.find_element(By.ID, element_id).text

    def words(self):
        return self.driver.find_elements(By.CSS_SELECTOR, ".word")

    def hover(self, index):
        """Moves the mouse over word `index`; returns the main picture's src."""
        ActionChains(self.driver).move_to_element(self.words()[index]).perform()
        return self.driver.find_element(By.ID, "picture").get_attribute("src")


def save_photo(folder):
    """Writes `demo_test.photo()` into `folder`; returns (path, bytes)."""
    name, data = photo()
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, data


@unittest.skipIf(browser_problem(), browser_problem() or "")
@pytest.mark.long(1)
@pytest.mark.scope_group("exports")
class BrowserTest(absltest.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp(prefix="demo_browser_")
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        _, cls.export_dirs = exports()
        samples = os.path.join(cls.root, "samples")
        os.makedirs(samples)
        Image.fromarray(scenes(5, 1, 150, 200)[0]).save(os.path.join(samples, "sample.png"))
        cls.sample = os.path.join(samples, "sample.png")
        app = demo.create_app(demo.load_captioners(cls.export_dirs), demo.find_samples(samples))
        cls.server, cls.url = start_server(app)
        cls.addClassCleanup(cls.server.shutdown)
        cls.photo, cls.photo_bytes = save_photo(cls.root)
        cls.driver = start_browser(os.path.join(cls.root, "profile"))
        cls.addClassCleanup(cls.driver.quit)

    def setUp(self):
        self.page = Page(self.driver, self.url)

    def caption_of(self, data, beam_size=1):
        path = self.export_dirs[0 if beam_size == 1 else 1]
        return signature_outputs(path, data)["caption"].decode()

    def test_caption_and_attention_of_a_photo(self):
        self.assertEqual(self.page.upload(self.photo), "done")
        self.assertEqual(self.page.text("caption"), self.caption_of(self.photo_bytes))
        self.assertIn("greedy", self.page.text("score"))
        self.assertRegex(self.page.text("score"), r"^log p = -\d+\.\d{3} ")
        self.assertGreaterEqual(len(self.page.words()), 2)
        picture = self.driver.find_element(By.ID, "picture").get_attribute("src")
        first, second = self.page.hover(0), self.page.hover(1)
        self.assertNotEqual(first, picture)
        self.assertNotEqual(first, second)
        self.assertIn("active", self.page.words()[1].get_attribute("class"))
        strip = self.driver.find_elements(By.CSS_SELECTOR, "#strip figure")
        self.assertLen(strip, len(self.page.words()) + 1)
        screenshot = os.path.join(self.root, "page.png")
        self.assertTrue(self.driver.save_screenshot(screenshot))
        self.assertGreater(os.path.getsize(screenshot), 10_000)

    def test_beam_3_and_samples(self):
        self.assertEqual(self.page.upload(self.photo), "done")
        self.assertEqual(self.page.choose(3), "done")
        self.assertIn("beam 3", self.page.text("score"))
        self.assertEqual(self.page.text("caption"), self.caption_of(self.photo_bytes, 3))
        sample = self.driver.find_element(By.CSS_SELECTOR, "#samples button")
        self.assertEqual(self.page.act(sample.click), "done")
        with open(self.sample, "rb") as f:
            self.assertEqual(self.page.text("caption"), self.caption_of(f.read(), 3))

    def test_the_beams_captions_and_the_attention_of_the_one_clicked(self):
        self.assertEqual(self.page.upload(self.photo), "done")
        box = self.driver.find_element(By.ID, "alternatives-box")
        self.assertFalse(box.is_displayed())  # greedy: one caption
        self.assertEqual(self.page.choose(3), "done")
        self.assertTrue(box.is_displayed())
        outputs = signature_outputs(self.export_dirs[1], self.photo_bytes)
        pairs = zip(outputs["captions"], outputs["log_probs"], strict=True)
        texts = [text.decode() for text, log_prob in pairs if log_prob > -np.inf]
        buttons = self.driver.find_elements(By.CSS_SELECTOR, "#alternatives button")
        self.assertLen(buttons, len(texts))
        self.assertGreater(len(texts), 1)
        for button, text, log_prob in zip(buttons, texts, outputs["log_probs"], strict=False):
            self.assertStartsWith(button.text, f"{text} p = ")
            self.assertIn(f"(log p {log_prob:.3f})", button.text)
        self.assertIn("chosen", buttons[0].get_attribute("class"))
        first = self.strip_pictures()
        # The second caption: its words in the caption line, its pictures in the strip.
        buttons[1].click()
        self.assertEqual(self.page.text("caption"), texts[1])
        self.assertIn("chosen", buttons[1].get_attribute("class"))
        self.assertNotIn("chosen", buttons[0].get_attribute("class"))
        second = self.strip_pictures()
        self.assertLen(second, len(self.page.words()) + 1)
        self.assertNotEqual(second, first)
        self.assertNotEqual(self.page.hover(len(self.page.words()) - 1), first[0])
        buttons[0].click()
        self.assertEqual(self.page.text("caption"), texts[0])
        self.assertEqual(self.strip_pictures(), first)

    def strip_pictures(self):
        figures = self.driver.find_elements(By.CSS_SELECTOR, "#strip img")
        return [f.get_attribute("src") for f in figures]

    def test_bad_files_get_one_line_and_the_page_goes_on(self):
        # One bad file after another (each refusal replaces the last), then a photo: the
        # page captions it and hides the message.
        for name, data, words in bad_uploads().values():
            path = os.path.join(self.root, name)
            with open(path, "wb") as f:
                f.write(data)
            self.assertEqual(self.page.upload(path), "error", name)
            message = self.page.text("message")
            self.assertNotIn("\n", message)
            self.assertIn(words if name != "large.bmp" else "large.bmp is 20.1 MB", message)
        self.assertEqual(self.page.upload(self.photo), "done")
        self.assertEqual(self.page.text("caption"), self.caption_of(self.photo_bytes))
        self.assertFalse(self.driver.find_element(By.ID, "message").is_displayed())


def take_screenshot(export_dirs, photo_path, output, hover=1):
    """Serves `export_dirs`, captions `photo_path` in the page, hovers over word `hover`
    and saves the window as a PNG at `output`."""
    problem = browser_problem()
    if problem:
        raise SystemExit(f"error: cannot take a screenshot: {problem}")
    root = tempfile.mkdtemp(prefix="demo_screenshot_")
    app = demo.create_app(demo.load_captioners(export_dirs))
    server, url = start_server(app)
    driver = start_browser(os.path.join(root, "profile"))
    try:
        page = Page(driver, url)
        if page.upload(os.path.abspath(photo_path)) != "done":
            raise SystemExit(
                f"error: the page did not caption {photo_path}: {page.text('message')}"
            )
        hover = min(hover, len(page.words()) - 1)
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        bottom = "return document.querySelector('main').getBoundingClientRect().bottom"
        height = max(600, int(driver.execute_script(bottom)) + 40)
        driver.set_window_size(1200, height)
        chrome = height - driver.execute_script("return window.innerHeight")
        driver.set_window_size(1200, height + max(0, chrome))
        page.hover(hover)
        driver.save_screenshot(output)
        print(f"{output}: {page.text('caption')!r}, hovering {page.words()[hover].text!r}")
    finally:
        driver.quit()
        server.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def main(argv):
    parser = argparse.ArgumentParser(description="Screenshot of the demo page.")
    parser.add_argument("--screenshot", required=True, help="PNG to write.")
    parser.add_argument("--export", action="append", required=True, help="Export folder(s).")
    parser.add_argument("--photo", help="Photo to caption; default the first Flickr8k test photo.")
    parser.add_argument("--hover", type=int, default=1, help="Word to hover over.")
    args = parser.parse_args(argv)
    export_dirs = [p for value in args.export for p in value.split(",") if p]
    if args.photo:
        take_screenshot(export_dirs, args.photo, args.screenshot, args.hover)
        return
    with tempfile.TemporaryDirectory() as folder:
        path, _ = save_photo(folder)
        take_screenshot(export_dirs, path, args.screenshot, args.hover)


if __name__ == "__main__":
    if any(arg.startswith("--screenshot") for arg in sys.argv[1:]):
        main(sys.argv[1:])
    else:
        absltest.main()
