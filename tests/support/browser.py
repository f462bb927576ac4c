"""Debian's Chromium, driven by Playwright's Python package (no browser is downloaded): the UI
tests look at Airflow and MLflow as a person would, and keep what they saw as screenshots."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import procs
from tests.support.require import missing

if TYPE_CHECKING:
    from playwright.sync_api import Page

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
"""Headless as root on a machine whose network is closed (its background connections are refused)."""


def screenshots() -> Path:
    """Where the UI tests keep their screenshots: `$CI_ARTIFACTS/screenshots` or `.trainyard/screenshots`."""
    folder = Path(os.environ.get("CI_ARTIFACTS") or procs.REPO_ROOT / ".trainyard") / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def chromium_page(*, width: int = 1500, height: int = 1000) -> Iterator[Page]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        missing("chromium", "no chromium here to look at the UIs as a person would")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()
