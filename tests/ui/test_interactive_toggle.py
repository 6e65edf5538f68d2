"""The web UI's task list leaves the OpenAI interactive lane's requests (a task each) out until its
"Interactive requests" toggle asks for them, and keeps the choice in the page's address."""

from __future__ import annotations

from pathlib import Path

from minions.db.connect import connect
from minions.testing.factories import make_task, make_token
from tests.support.api import running_api
from tests.ui.test_browser import CHROMIUM, CHROMIUM_ARGS, async_playwright, expect


async def test_interactive_requests_are_hidden_until_the_toggle_shows_them(database_url: str,
                                                                           tmp_path: Path) -> None:
    conn = await connect(database_url)
    try:
        admin, _ = await make_token(conn, "admin")
        await make_task(conn, team="search", project="ranker", name="nightly")
        lane = await conn.fetchval("SELECT minion_openai_interactive_priority()")
        await make_task(conn, team="openai", project="interactive", name="req_0123abcd", subtasks=1, priority=lane)
    finally:
        await conn.close()
    console_errors: list[str] = []
    async with running_api(database_url, tmp_path / "store") as api, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await (await browser.new_context(viewport={"width": 1400, "height": 900})).new_page()
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        await page.goto(f"{api.url}/")
        await page.fill("#token", admin)
        await page.get_by_role("button", name="Sign in", exact=True).click()
        native = page.locator("tr[data-task='search/ranker/nightly']")
        request = page.locator("tr[data-task='openai/interactive/req_0123abcd']")
        await expect(native).to_be_visible()
        await expect(request).to_have_count(0)

        await page.get_by_label("Interactive requests").check()
        await expect(request).to_be_visible()
        await expect(native).to_be_visible()
        assert "interactive=all" in page.url
        await page.reload()  # the choice is in the address
        await expect(request).to_be_visible()
        await expect(page.get_by_label("Interactive requests")).to_be_checked()

        await page.get_by_label("Interactive requests").uncheck()
        await expect(request).to_have_count(0)
        await browser.close()
    assert console_errors == []
