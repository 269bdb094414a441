"""``relaxweb.browser.keep_chromium``: the pages one thread opens share a Chromium, each in a
fresh context (nothing stored by one page is seen by the next), and other threads, or a page
asking for its own browser, launch their own.  The test suite runs with it on
(``tests/conftest.py``), so these tests check the suite's own set-up too."""

from __future__ import annotations

import threading
from pathlib import Path

from relaxweb import browser
from relaxweb.browser import open_runner_page, run_in_browser
from tests.fixtures.handmade_bundle import expected_output, random_input, write_handmade_bundle
from tests.helpers import assert_close, in_the_browser
from tests.runtime_js.test_browser_models import own_processes

STORE = """async () => {
  localStorage.setItem("kept", "1");
  await (await caches.open("kept")).put("/kept", new Response("1"));
}"""
STORED = """async () => ({ local: localStorage.getItem("kept"), caches: await caches.keys() })"""


def chromium_browsers() -> set[int]:
    """The browser processes (not renderers, GPU or utility processes) this process started."""
    found = set()
    for pid in own_processes():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()  # a child's, rewritten by Chromium: one string
        except OSError:
            continue
        if command.startswith(b"/") and b"chrom" in command.split(b"\0")[0] and b"--type=" not in command:
            found.add(pid)
    return found


@in_the_browser
def test_pages_share_one_chromium_and_nothing_they_store(tmp_path: Path) -> None:
    write_handmade_bundle(tmp_path / "bundle")
    with open_runner_page(tmp_path / "bundle") as page:
        page.evaluate(STORE)
        assert page.evaluate(STORED) == {"local": "1", "caches": ["kept"]}
        first = chromium_browsers()
    with open_runner_page(tmp_path / "bundle") as page:
        assert page.evaluate(STORED) == {"local": None, "caches": []}
        assert chromium_browsers() == first
    with open_runner_page(tmp_path / "bundle", own_browser=True) as page:
        assert page.evaluate(STORED) == {"local": None, "caches": []}
        assert len(chromium_browsers() - first) == 1
    assert chromium_browsers() == first


@in_the_browser
def test_another_thread_launches_its_own_and_keeping_ends_with_the_block(tmp_path: Path) -> None:
    write_handmade_bundle(tmp_path / "bundle")
    x = random_input(3)
    outputs: dict = {}
    worker = threading.Thread(target=lambda: outputs.update(run_in_browser(tmp_path / "bundle", {"x": x})))
    worker.start()
    worker.join(120)
    assert_close(outputs["z"], expected_output(x))
    with browser.sync_playwright() as playwright:  # the kept instance in this thread
        assert playwright is browser._kept_here().playwright
    assert browser._kept_here() is not None
    other: list = []
    elsewhere = threading.Thread(target=lambda: other.append(browser._kept_here()))
    elsewhere.start()
    elsewhere.join()
    assert other == [None]
