"""A real headless browser for the page tests: Debian's ``chromium`` driven
by Playwright (the wheel's own browser download is not used).

The tests run whenever ``chromium`` is on PATH; without it they skip, except
under ``CI=true``, where they fail: CI must never pass without having run them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, async_playwright


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; under CI=true the browser tests must run")
        pytest.skip(message)
    return found


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium (``--no-sandbox``: the tests may run as root)."""
    executable = chromium_path()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox"], headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()
