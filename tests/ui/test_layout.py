"""The web UI's tables fit a 1,400 px wide window (no sideways scrolling, no cell out of its
table), with long names, models and errors; a task waiting for an executor links the Executors
page from its "Waiting" banner. Headless Chromium via Playwright, against the real API."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token
from tests.support.usage import build_pool

CHROMIUM = os.environ.get("MINIONS_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists() or importlib.util.find_spec("playwright") is None:
    pytest.skip("layout tests need Chromium and playwright (see tests/ui/test_browser.py)", allow_module_level=True)

from playwright.async_api import Page, async_playwright, expect  # noqa: E402

from tests.support.api import running_api  # noqa: E402

WIDTH = 1400
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
LONG_MODEL = "sentence-transformers/paraphrase-multilingual-mpnet-base-v2@0123456789abcdef0123456789abcdef01234567"
# Every table, and the page itself: how far each reaches past its box (0 when it fits).
OVERFLOW_JS = """() => {
  const out = [];
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth) out.push(`page: ${page.scrollWidth} > ${page.clientWidth}`);
  for (const table of document.querySelectorAll("table")) {
    const box = table.parentElement;
    if (table.scrollWidth > box.clientWidth + 1 || box.scrollWidth > box.clientWidth + 1)
      out.push(`${table.className || "table"}: ${table.scrollWidth} in ${box.clientWidth} (columns ` +
               [...table.querySelectorAll("th")].map((th) => `${th.textContent} ${th.offsetWidth}`).join(", ") + ")");
  }
  return out;
}"""


async def _seed(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        await build_pool(conn)
        _, token_id = await make_token(conn, "executor")
        for i in range(3):
            await make_task(conn, team="search-quality-evaluation", project="multilingual-rankers-2026",
                            name=f"embeddings-of-the-whole-catalogue-with-a-long-name-{i}", kind="embedding",
                            model=LONG_MODEL, subtasks=40)
        await make_executor(conn, token_id, name="a-volunteer-macbook-pro-with-a-very-long-host-name-in-berlin",
                            kinds=("embedding", "completion", "sleep"),
                            models=(LONG_MODEL.replace("mpnet", "MiniLM"), "llama3.2:1b-instruct-q4_K_M",
                                    "qwen2.5:7b-instruct"))
    finally:
        await conn.close()


async def _overflows(page: Page) -> list[Any]:
    await page.wait_for_timeout(300)  # the view's first render and its fonts
    result: list[Any] = await page.evaluate(OVERFLOW_JS)
    return result


async def test_tables_fit_1400_px_and_waiting_links_the_executors(database_url: str, tmp_path: Path) -> None:
    await _seed(database_url)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    async with running_api(database_url, tmp_path / "store") as api, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await (await browser.new_context(viewport={"width": WIDTH, "height": 900})).new_page()
        await page.goto(f"{api.url}/")
        await page.fill("#token", api.admin)
        await page.get_by_role("button", name="Sign in", exact=True).click()
        await expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
        found: dict[str, list[Any]] = {}
        for view, ready in (("#/tasks", "table"), ("#/executors", "table"), ("#/usage", "table.usage-table"),
                            ("#/tasks/search-quality-evaluation/multilingual-rankers-2026/"
                             "embeddings-of-the-whole-catalogue-with-a-long-name-0", ".banner-warning")):
            await page.goto(f"{api.url}/{view}")
            await expect(page.locator(ready).first).to_be_visible()
            found[view] = await _overflows(page)
            name = view.split("/")[1]
            await page.screenshot(path=str(SCREENSHOTS / f"layout-1400-{name}-{len(found)}.png"), full_page=True)
        assert not any(found.values()), found

        # The task waits: no executor online serves its model. Its banner leads to the Executors page.
        waiting = page.locator(".banner-warning[data-warning=unservable]")
        await expect(waiting).to_contain_text("Waiting.")
        await waiting.get_by_role("link", name="See the executors →").click()
        await page.wait_for_url("**/#/executors")
        await expect(page.get_by_role("heading", name="Executors", exact=True)).to_be_visible()

        # One executor claimed three subtasks ahead: one runs, two wait behind it.
        assert (await api.call("POST", "/api/v1/tasks", json={
            "team": "search", "project": "ranker", "name": "ahead", "kind": "completion", "model": "tiny-llm",
            "subtask_size": 1, "input": {"records": [{"id": i, "prompt": "hi"} for i in range(5)]}})).status == 201
        executor = await api.register("one-mac", kinds=["completion"], models=["tiny-llm"])  # nothing else to take
        for _ in range(3):
            claim = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0", token="executor")
            assert claim.status == 200, claim.body
        await page.goto(f"{api.url}/#/tasks/search/ranker/ahead")
        await expect(page.get_by_text("1 running, 2 claimed ahead, 2 pending")).to_be_visible()
        await browser.close()
