"""A real headless Chromium for the dashboard's tests: Debian's ``chromium`` driven by
Playwright for Python (its own browser download is never used: ``executable_path``).

Every page records what its console says and every uncaught error, so a test can assert the
dashboard ran cleanly; screenshots go to ``ARTIFACTS`` (``VIBEMQ_TEST_ARTIFACTS``, default
``tests/artifacts/dashboard/``) for a person to look at.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Error, Page, expect, sync_playwright

#: where the screenshots of a run are kept (test artifacts)
ARTIFACTS = Path(
    os.environ.get("VIBEMQ_TEST_ARTIFACTS", Path(__file__).parents[1] / "artifacts")
) / ("dashboard")
#: Debian's chromium (scripts/_system.sh installs it when it is missing)
CHROMIUM = os.environ.get("VIBEMQ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: what a root user on a headless machine needs, and nothing that calls home (Playwright adds
#: --headless and a fresh --user-data-dir of its own for every launch)
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: a bounded wait for anything the page shows (ms, Playwright's unit)
WAIT_MS = 10_000
# expect(...) waits as long (its own default is 5 s: short on a busy CI machine)
expect.set_options(timeout=WAIT_MS)
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@dataclass
class Watched:
    """A page and everything it complained about."""

    page: Page
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning", "assert"):
            self.console.append(f"{message.type}: {message.text} ({message.location})")

    def on_error(self, error: Error) -> None:
        self.errors.append(str(error))

    def assert_clean(self) -> None:
        assert not self.errors, f"uncaught errors in the page: {self.errors}"
        assert not self.console, f"the browser console complained: {self.console}"

    def shot(self, name: str) -> Path:
        """A full-page screenshot ``ARTIFACTS/<name>.png``."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def overflow_x(self) -> int:
        """How many pixels the page is wider than the viewport (0: no sideways scrolling)."""
        width = self.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert isinstance(width, int)
        return width


@contextmanager
def chromium(*extra: str) -> Iterator[Browser]:
    """``extra``: more command-line flags (e.g. a test certificate to trust)."""
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=[*FLAGS, *extra], headless=True
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def watched_page(browser: Browser, viewport: dict[str, int] = DESKTOP) -> Iterator[Watched]:
    """A page in a fresh context (no storage shared with other tests)."""
    context = browser.new_context(viewport=viewport)  # type: ignore[arg-type]
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    watched = Watched(page)
    page.on("console", watched.on_console)
    page.on("pageerror", watched.on_error)
    try:
        yield watched
    finally:
        context.close()
