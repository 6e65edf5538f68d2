"""GET /api/docs: a human page for the OpenAPI document, served without a token and rendered in a
real browser from /api/openapi.json with nothing from the internet."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from minions.services.api.openapi.routes import DOCS_PATH
from tests.support.api import running_api

CHROMIUM = os.environ.get("MINIONS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


async def test_docs_page_is_served_without_a_token(database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        page = await api.call("GET", DOCS_PATH, token=None)
        assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        assert 'src="/ui/apidocs.js"' in page.body.decode() and "http" not in page.body.decode()
        script = await api.call("GET", "/ui/apidocs.js", token=None)
        assert script.status == 200 and b"/api/openapi.json" in script.body


@pytest.mark.skipif(not Path(CHROMIUM).exists() or importlib.util.find_spec("playwright") is None,
                    reason="needs Chromium and the playwright package")
async def test_docs_page_renders_operations_parameters_and_schemas(database_url: str, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    async with running_api(database_url, tmp_path / "store") as api, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        outside: list[str] = []
        page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(api.url) else None)
        await page.goto(api.url + DOCS_PATH)
        claim = page.locator("section#claim")
        await claim.wait_for()
        text = await claim.inner_text()
        assert "/api/v1/executors/{executor_id}/claim" in text and "wait" in text and "max" in text
        assert "LeaseBatch" in text and "204" in text
        schema = await page.locator("section#schema-CompletionBatch").inner_text()
        assert "leases" in schema and "array of LeaseCompletion" in schema
        await page.click("a[href='#schema-LeaseBatch']")
        assert errors == [] and outside == []
        await browser.close()
