"""The web UI in a real browser (Debian's Chromium, driven by Playwright) against the real services
as processes and test executors over HTTP: sign in, a rejected then an accepted submission, a task
watched from running to completed, the results preview and download, the executors page. Then the
trust spot checks earn (sql/schema/11_checks.sql), shown on the executors page and on a task whose results a
quarantine put in doubt.

Each page is saved as a full-page screenshot under test-artifacts/screenshots/ for review."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yarl

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token, make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor

CHROMIUM = os.environ.get("MINIONS_CHROMIUM", "/usr/bin/chromium")
ENABLE = "enable them with: apt-get install -y chromium && pip install playwright (no `playwright install`)"
if not Path(CHROMIUM).exists():
    pytest.skip(f"browser tests need Chromium at {CHROMIUM} (or MINIONS_CHROMIUM); {ENABLE}",
                allow_module_level=True)
if importlib.util.find_spec("playwright") is None:
    pytest.skip(f"browser tests need the playwright package; {ENABLE}", allow_module_level=True)

from playwright.async_api import Page, async_playwright, expect  # noqa: E402

from tests.support.api import running_api  # noqa: E402
from tests.support.usage import build_pool  # noqa: E402

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
RECORDS = [{"id": f"rec-{i:03d}", "ms": 250} for i in range(48)]
MACHINES: list[dict[str, Any]] = [
    {"name": "anna-mbp", "hardware": {"os": "macOS 15.1", "chip": "Apple M3 Max", "memory_gb": 64, "device": "mps",
                                      "precision": [{"model": "all-MiniLM-L6-v2", "device": "mlx-gpu",
                                                     "precision": "fp16", "cosine": 0.99995, "setting": "auto",
                                                     "backend": "mlx",
                                                     "why": "faster: torch 9.1 ms, mlx 4.2 ms per probe batch"}]},
     "preferences": [{"team": "search", "project": "ranker", "task_name": None}]},
    {"name": "studio-02", "hardware": {"os": "macOS 14.6", "chip": "Apple M2 Ultra", "memory_gb": 192,
                                       "device": "mps"}},
    {"name": "gpu-box-7", "hardware": {"os": "Ubuntu 24.04", "chip": "NVIDIA L4", "memory_gb": 24, "device": "cuda",
                                       "precision": [{"model": "all-MiniLM-L6-v2", "device": "cuda",
                                                      "precision": "fp16", "weights": "fp16", "cosine": 0.99996,
                                                      "setting": "auto"}]}},
]





async def _call(session: aiohttp.ClientSession, url: str, token: str, method: str = "GET",
                body: Any = None) -> Any:
    async with session.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status < 300, await resp.text()
        return await resp.json()


async def _seed_history(api_url: str, admin: str) -> None:
    """Some earlier tasks, so the list shows more than one status: completed, queued, cancelled."""
    async with aiohttp.ClientSession() as session:
        tasks = f"{api_url}/api/v1/tasks"
        await _call(session, tasks, admin, "POST", {
            "team": "search", "project": "ranker", "name": "warmup", "kind": "sleep", "subtask_size": 2,
            "input": {"records": [{"id": i, "ms": 10} for i in range(6)]}})
        await _call(session, tasks, admin, "POST", {
            "team": "search", "project": "ranker", "name": "emb-2026-w18", "kind": "embedding",
            "model": "sentence-transformers/all-MiniLM-L6-v2", "params": {"normalize": True},
            "input": {"records": [{"id": f"d{i}", "text": "hello"} for i in range(1200)]}, "subtask_size": 100})
        await _call(session, tasks, admin, "POST", {
            "team": "support", "project": "triage", "name": "summaries-v2", "kind": "completion",
            "model": "llama3.2:1b", "input": {"records": [{"id": "q1", "prompt": "hi"}]}})
        await _call(session, f"{tasks}/support/triage/summaries-v2/cancel", admin, "POST")
        for _ in range(200):
            warmup = await _call(session, f"{tasks}/search/ranker/warmup", admin)
            if warmup["status"] == "completed":
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"warm-up task never completed: {warmup}")


async def _shot(page: Page, name: str) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    await page.evaluate("window.scrollTo(0, 0)")  # a sticky header would otherwise sit mid-page
    await page.screenshot(path=str(path), full_page=True)
    return path


async def test_web_ui_end_to_end(services: Services) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {SCREENSHOTS}")
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)

    # The static app is public (the page itself holds no secret); the API behind it is not.
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{services.api_url}/") as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            assert "no-cache" in resp.headers["Cache-Control"]
        async with session.get(f"{services.api_url}/ui/app.js") as resp:
            assert resp.status == 200 and resp.content_type == "text/javascript"
        for escape in ("/ui/%2e%2e/ui/routes.py", "/ui/..%2Fapp.py", "/ui/%2E%2E%2F%2E%2E%2Fapp.py"):
            async with session.get(yarl.URL(services.api_url + escape, encoded=True)) as resp:
                assert resp.status == 404, escape

    executors = [SleepExecutor(services.api_url, executor_token, m["name"]) for m in MACHINES]
    hung = SleepExecutor(services.api_url, executor_token, "bob-air", hang_after_claim=True)
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        for executor, machine in zip(executors, MACHINES, strict=True):
            await executor.register(session, hardware=machine["hardware"],
                                    preferences=machine.get("preferences", []))
        await hung.register(session, hardware={"os": "macOS 15.0", "chip": "Apple M1", "memory_gb": 8,
                                               "device": "mps"})
    runners = [asyncio.create_task(e.run(stop)) for e in executors]
    console_errors: list[str] = []
    try:
        await _seed_history(services.api_url, admin)
        hung_run = asyncio.create_task(hung.run(stop))  # claims one subtask of the next task, then goes silent
        runners.append(hung_run)
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = await browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True,
                                                timezone_id="Asia/Tokyo")
            page = await context.new_page()
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            await _sign_in(page, services.api_url, admin)
            await _submit_with_errors_then_fix(page)
            await _watch_task(page)
            await _submit_upload(page)
            await _submit_drill(services.api_url, admin)  # keeps the executors busy for the next pages
            await _executors_page(page)
            await _tasks_page_live(page)
            await _sign_out(page)
            await browser.close()
    finally:
        stop.set()
        hung_run.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
    # The browser logs the deliberate failures (a wrong token: 401, an invalid task: 422); nothing else.
    expected = ("status of 401", "status of 422")
    unexpected = [e for e in console_errors if not any(x in e for x in expected)]
    assert not unexpected, unexpected


async def _sign_in(page: Page, api_url: str, admin: str) -> None:
    await page.goto(f"{api_url}/")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await _shot(page, "01-sign-in")
    await page.fill("#token", "not-a-real-token")
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page.locator("#token-error")).to_contain_text("not recognised")
    await page.fill("#token", admin)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
    assert await page.evaluate("localStorage.getItem('minions.token')") == admin
    await expect(page.locator("tr[data-task='search/ranker/warmup'] .pill")).to_have_text("completed")
    await expect(page.locator("tr[data-task='search/ranker/emb-2026-w18'] .pill")).to_have_text("queued")
    await expect(page.locator("tr[data-task='support/triage/summaries-v2'] .pill")).to_have_text("cancelled")
    # filter by status, then back to all
    await page.get_by_role("tab", name="Completed").click()
    await expect(page.locator("tbody tr")).to_have_count(1)
    await page.get_by_role("tab", name="All", exact=True).click()
    await expect(page.locator("tbody tr")).to_have_count(3)
    # The embedding task has no executor that serves its model (these serve sleep): its page says so.
    await page.goto(f"{api_url}/#/tasks/search/ranker/emb-2026-w18")
    await expect(page.locator(".banner-warning[data-warning=unservable]")).to_contain_text(
        "no online executor serves embedding with model sentence-transformers/all-MiniLM-L6-v2")
    await page.goto(f"{api_url}/#/tasks")
    await expect(page.locator("tbody tr")).to_have_count(3)


async def _submit_with_errors_then_fix(page: Page) -> None:
    await page.get_by_role("link", name="New task").click()
    await expect(page.get_by_role("heading", name="Submit a task")).to_be_visible()
    await page.fill("input[name=team]", "search")
    await page.fill("input[name=project]", "ranker")
    await page.fill("input[name=name]", "bad name!")
    await page.locator(".kind-card[data-kind=sleep]").click()
    await expect(page.locator("input[name=model]")).to_have_value("sleep")
    await page.fill("input[name=subtask_size]", "4")
    await page.fill("textarea[name=records]", '{"id": "r1", "ms": 10}\n\n{"id": "r2"}')
    await page.get_by_role("button", name="Submit task").click()
    # The server's 422 fields, each shown under its own field.
    await expect(page.locator("#name-error")).to_be_visible()
    await expect(page.locator("#name-error")).to_contain_text("must be")
    await expect(page.locator("#records-error")).to_contain_text("Line 3")
    await expect(page.locator("input[name=name]")).to_have_attribute("aria-invalid", "true")
    await expect(page.locator("#team-error")).to_be_hidden()
    await _shot(page, "03-submit-invalid")

    await page.fill("input[name=name]", "ui-sleep")
    await page.fill("textarea[name=records]", "\n".join(json.dumps(r) for r in RECORDS))
    await page.get_by_role("button", name="Submit task").click()
    await page.wait_for_url("**/#/tasks/search/ranker/ui-sleep")


async def _watch_task(page: Page) -> None:
    status = page.locator(".task-title .pill")
    await expect(status).to_have_text("running", timeout=20_000)
    await expect(page.locator(".cells .cell-done").first).to_be_visible(timeout=20_000)
    await expect(page.locator("table.attempts-table tbody tr").first).to_be_visible()
    await _shot(page, "04-task-running")

    await expect(status).to_have_text("completed", timeout=90_000)
    await expect(page.locator(".cells .cell-done")).to_have_count(12)
    await expect(page.locator(".progress-big")).to_have_text("100%")
    # Times carry their zone (the browser's, here Tokyo's: GMT+9).
    await expect(page.locator(".stat", has_text="Finished").locator(".stat-value")).to_contain_text("GMT+9")
    await page.get_by_role("button", name="Preview").click()
    await expect(page.locator(".preview li")).to_have_count(20)
    await expect(page.locator(".preview li").first).to_contain_text('"rec-000"')
    # The lost lease shows in the history: the silent executor's attempt, then someone else's.
    await expect(page.locator("table.attempts-table tr[data-outcome=lost]")).to_have_count(1)
    await expect(page.locator("tr[data-executor='bob-air']")).to_be_visible()
    await _shot(page, "05-task-completed")
    # Narrow screens: the layout folds into one column and nothing overflows sideways.
    await page.set_viewport_size({"width": 390, "height": 844})
    await expect(page.locator(".grid-main")).to_be_visible()
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    await _shot(page, "07-task-mobile")
    await page.set_viewport_size({"width": 1440, "height": 900})

    async with page.expect_download() as info:
        await page.get_by_role("button", name="Download .jsonl").click()
    download = await info.value
    assert download.suggested_filename == "search-ranker-ui-sleep.jsonl"
    saved = await download.path()
    lines = [json.loads(line) for line in (await asyncio.to_thread(Path(saved).read_text)).splitlines()]
    assert lines == [{"id": r["id"], "slept_ms": 250} for r in RECORDS]


async def _submit_upload(page: Page) -> None:
    """Records from a file: stored with POST /api/v1/inputs, then submitted by uri."""
    await page.get_by_role("link", name="Submit", exact=True).click()
    await expect(page.locator("input[name=team]")).to_have_value("search")  # remembered from the last task
    await page.fill("input[name=name]", "ui-upload")
    await page.locator(".kind-card[data-kind=sleep]").click()
    await page.get_by_role("tab", name="Upload .jsonl file").click()
    body = "".join(json.dumps({"id": f"u{i}", "ms": 5}) + "\n" for i in range(7))
    await page.set_input_files("#records-file", files=[
        {"name": "batch.jsonl", "mimeType": "application/x-ndjson", "buffer": body.encode()}])
    await expect(page.locator(".dropzone")).to_contain_text("batch.jsonl")
    await page.get_by_role("button", name="Submit task").click()
    await page.wait_for_url("**/#/tasks/search/ranker/ui-upload")
    await expect(page.locator(".task-title .pill")).to_have_text("completed", timeout=30_000)
    await expect(page.locator(".progress-of")).to_have_text("7 of 7 records")


async def _submit_drill(api_url: str, admin: str) -> None:
    async with aiohttp.ClientSession() as session:
        await _call(session, f"{api_url}/api/v1/tasks", admin, "POST", {
            "team": "search", "project": "capacity", "name": "drill-long", "kind": "sleep", "subtask_size": 2,
            "input": {"records": [{"id": i, "ms": 1500} for i in range(40)]}})


async def _executors_page(page: Page) -> None:
    await page.get_by_role("link", name="Executors", exact=True).click()
    await expect(page.get_by_role("heading", name="Executors", exact=True)).to_be_visible()
    await expect(page.locator("tr[data-executor='anna-mbp']")).to_contain_text("Apple M3 Max")
    await expect(page.locator("tr[data-executor='anna-mbp']")).to_contain_text("search / ranker")
    await expect(page.locator("tr[data-executor='gpu-box-7'] .precision")).to_have_text("fp16 · cos 0.99996")
    await expect(page.locator("tr[data-executor='gpu-box-7'] .precision")).to_have_attribute(
        "title", re.compile(r"\(auto, fp16 weights\), cosine to fp32 0\.99996"))
    await expect(page.locator("tr[data-executor='anna-mbp'] .precision")).to_have_text("mlx fp16 · cos 0.99995")
    await expect(page.locator("tr[data-executor='bob-air'] .pill")).to_have_text("lost")
    await expect(page.locator("tbody tr")).to_have_count(4)
    # busy executors name the subtask they hold, linked to its task
    await expect(page.locator("tr[data-status=busy]")).to_have_count(3, timeout=20_000)
    await expect(page.locator("tr[data-executor='gpu-box-7'] .cell-current a")).to_have_text(
        "search/capacity/drill-long")
    await _shot(page, "06-executors")
    await _pauses_while_hidden(page)


async def _pauses_while_hidden(page: Page) -> None:
    """No polling while the tab is hidden; an immediate refresh when it shows again."""
    calls: list[str] = []
    page.on("request", lambda r: calls.append(r.url) if "/api/v1/" in r.url else None)
    await page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {value: true, configurable: true});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    await page.wait_for_timeout(500)  # a refresh already in flight may finish
    calls.clear()
    await page.wait_for_timeout(3500)
    assert calls == [], calls
    await expect(page.locator("#live")).to_have_attribute("data-state", "paused")
    await page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {value: false, configurable: true});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    await expect(page.locator("#live")).to_have_attribute("data-state", "live")
    await page.wait_for_timeout(300)
    assert any("/api/v1/executors" in url for url in calls), calls


async def _tasks_page_live(page: Page) -> None:
    await page.get_by_role("link", name="Tasks", exact=True).click()
    drill = page.locator("tr[data-task='search/capacity/drill-long']")
    await expect(drill.locator(".pill")).to_have_text("running")
    await expect(page.locator("tr[data-task='search/ranker/ui-sleep'] .pill")).to_have_text("completed")
    await expect(page.locator("tr[data-task='search/ranker/ui-upload'] .pill")).to_have_text("completed")
    await expect(drill.locator(".progress-records")).not_to_have_text("0 / 40 records", timeout=20_000)
    await _shot(page, "02-tasks")
    await drill.locator("a.task-name").click()
    await page.wait_for_url("**/#/tasks/search/capacity/drill-long")
    # cancelling asks first, then stops the task
    await page.get_by_role("button", name="Cancel task").click()
    await page.locator("dialog [data-action=confirm-cancel]").click()
    await expect(page.locator(".task-title .pill")).to_have_text("cancelled")


async def _sign_out(page: Page) -> None:
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert await page.evaluate("localStorage.getItem('minions.token')") is None


async def _trust_scenario(database_url: str) -> None:
    """Executors of four owners (sql/schema/11_checks.sql, every lease checked): 'liar' commits the result of a task
    that then completes, loses a quorum to 'honest' and 'referee' (vouched for, so 'honest' earns trust by agreeing
    with it), and is quarantined by hand; 'newbie' has not been checked yet."""
    conn = await connect(database_url)
    try:
        await conn.execute("SET minions.spot_check_share = '0'")
        await conn.execute("SET minions.trust_agreements = '0'")
        ids = {}
        for name in ("liar", "honest", "newbie"):
            _, token_id = await make_token(conn, "executor")
            ids[name] = await make_executor(conn, token_id, name=name)
        claim = "SELECT * FROM minion_claim_batch($1, NULL, 1) WHERE verdict = 'leased'"
        complete = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL)"
        vote = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, NULL, $2::smallint)"
        await make_task(conn, name="before", subtasks=1)
        lease = await conn.fetchrow(claim, ids["liar"])
        assert await conn.fetchval(complete, lease["lease_token"]) == "ok"
        await conn.execute("SET minions.spot_check_share = '1'")
        await conn.execute("SET minions.trust_agreements = '1'")
        await make_task(conn, name="disputed", subtasks=1)
        held = await conn.fetchrow(claim, ids["liar"])
        assert await conn.fetchval(complete, held["lease_token"]) == "held"
        # A volunteer is offered a replica only while no vouched executor could run it: the referee comes later.
        second = await conn.fetchrow(claim, ids["honest"])
        assert await conn.fetchval(vote, second["lease_token"], None) == "disputed"
        _, token_id = await make_token(conn, "executor", trusted=True)
        ids["referee"] = await make_executor(conn, token_id, name="referee")
        third = await conn.fetchrow(claim, ids["referee"])
        assert await conn.fetchval(vote, third["lease_token"], 2) == "agreed"
        await conn.fetchval("SELECT minion_quarantine_executor($1, 'returned random vectors')", ids["liar"])
    finally:
        await conn.close()


async def test_web_ui_shows_trust(database_url: str, tmp_path: Path) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await _trust_scenario(database_url)
    console_errors: list[str] = []
    async with running_api(database_url, tmp_path / "store") as api, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await (await browser.new_context(viewport={"width": 1440, "height": 900})).new_page()
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: console_errors.append(str(e)))
        await page.goto(f"{api.url}/")
        await page.fill("#token", api.admin)
        await page.get_by_role("button", name="Sign in", exact=True).click()
        await expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()

        await page.get_by_role("link", name="Executors", exact=True).click()
        liar = page.locator("tr[data-executor='liar'] .cell-trust")
        await expect(liar).to_have_attribute("data-trust", "quarantined")
        await expect(liar.locator(".trust")).to_have_text("QUARANTINED: returned random vectors")
        await expect(liar.locator(".trust-counts")).to_have_text("0 agreed · 1 disagreed")
        for name, state, counts in (("honest", "trusted", "1 agreed · 0 disagreed"),
                                    ("referee", "vouched", "0 agreed · 0 disagreed"),
                                    ("newbie", "checked", "0 agreed · 0 disagreed")):
            cell = page.locator(f"tr[data-executor='{name}'] .cell-trust")
            await expect(cell).to_have_attribute("data-trust", state)
            await expect(cell.locator(".trust")).to_have_text(state)
            await expect(cell.locator(".trust-counts")).to_have_text(counts)
        await expect(page.locator(".banner-error[data-notice=quarantined]")).to_contain_text("1 executor quarantined")
        await _shot(page, "08-executors-trust")

        # The task that completed with the liar's result says so; the disputed one shows the lost quorum.
        await page.goto(f"{api.url}/#/tasks/search/ranker/before")
        doubt = page.locator(".banner-warning[data-warning=quarantined_results]")
        await expect(doubt).to_contain_text("Results in doubt.")
        await expect(doubt).to_contain_text("1 subtask result(s) came from executor")
        await expect(page.locator(".banner-warning[data-warning=unservable]")).to_have_count(0)
        await _shot(page, "09-task-results-in-doubt")
        await page.goto(f"{api.url}/#/tasks/search/ranker/disputed")
        await expect(page.locator("table.attempts-table tr[data-outcome=outvoted] .pill")).to_have_text("outvoted")
        await expect(page.locator("table.attempts-table tr[data-outcome=agreed]")).to_have_count(1)
        await browser.close()
    assert not console_errors, console_errors


async def test_web_ui_shows_usage(database_url: str, tmp_path: Path) -> None:
    """The usage page (tests/support/usage.py's attempts): each team's used, verification and lost
    compute, then what each executor and owner gave, over a window the page chooses; a team's token
    sees its own team only."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    conn = await connect(database_url)
    try:
        pool = await build_pool(conn)
        search_user, _ = await make_token(conn, "user", team="search")
    finally:
        await conn.close()
    console_errors: list[str] = []
    async with running_api(database_url, tmp_path / "store") as api, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await (await browser.new_context(viewport={"width": 1440, "height": 900})).new_page()
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: console_errors.append(str(e)))
        await _sign_in_as(page, api.url, api.admin)
        await page.get_by_role("link", name="Usage", exact=True).click()
        await expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
        teams = page.locator("table.usage-table[data-by=team]")
        search = teams.locator("tr[data-team=search]")
        # search's spot-check replicas (0.05 s) are its verification; its 30 s lost lease is nobody's.
        await expect(search.locator(".usage-verification")).to_have_text("<0.1 s")
        await expect(search.locator(".usage-lost")).to_have_text("30 s")
        await expect(teams.locator("tr[data-team=ads] .usage-lost")).not_to_have_text("0 s")  # bob's release
        await expect(teams.locator("tbody tr")).to_have_count(2)
        givers = page.locator("table.usage-table[data-by=executor]")
        await expect(givers.locator("tr[data-executor=lab-2]")).to_contain_text(f"token {pool.unlabelled_token}")
        await expect(givers.locator("tbody tr")).to_have_count(len(pool.executors))
        await _shot(page, "10-usage")

        await page.locator("button[data-by=owner]").click()
        owners = page.locator("table.usage-table[data-by=owner]")
        await expect(owners.locator("tbody tr")).to_have_count(4)
        await expect(owners.locator("tr[data-owner=mallory] .usage-used")).to_have_text("0 s")
        await page.locator("button[data-since='1h']").click()
        await page.wait_for_url("**/#/usage?since=1h&by=owner")
        await expect(owners.locator("tbody tr")).to_have_count(4)

        # A team's token: its own team, every executor that served it.
        user_page = await (await browser.new_context(viewport={"width": 1440, "height": 900})).new_page()
        user_page.on("pageerror", lambda e: console_errors.append(str(e)))
        await _sign_in_as(user_page, api.url, search_user)
        await user_page.goto(f"{api.url}/#/usage")
        await expect(user_page.locator("table.usage-table[data-by=team] tbody tr")).to_have_count(1)
        await expect(user_page.locator("tr[data-team=search]")).to_be_visible()
        await expect(user_page.locator(".toolbar")).to_contain_text("team search")
        await browser.close()
    assert not console_errors, console_errors


async def _sign_in_as(page: Page, api_url: str, token: str) -> None:
    await page.goto(f"{api_url}/")
    await page.fill("#token", token)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()


async def test_a_priority_above_the_teams_cap_is_shown_at_the_priority_field(database_url: str,
                                                                            tmp_path: Path) -> None:
    """A team's user submits above the team's priority cap: the 403 names the cap under Priority, and
    the same form submits once the priority is within it."""
    conn = await connect(database_url)
    try:
        user, _ = await make_token(conn, "user", "search")
    finally:
        await conn.close()
    console_errors: list[str] = []
    async with running_api(database_url, tmp_path / "store") as api, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await (await browser.new_context(viewport={"width": 1440, "height": 900})).new_page()
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        await page.goto(f"{api.url}/")
        await page.fill("#token", user)
        await page.get_by_role("button", name="Sign in", exact=True).click()
        await expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
        await page.goto(f"{api.url}/#/submit")
        await page.fill("input[name=team]", "search")
        await page.fill("input[name=project]", "ranker")
        await page.fill("input[name=name]", "urgent")
        await page.locator(".kind-card[data-kind=sleep]").click()
        await page.fill("input[name=priority]", "5")
        await page.fill("textarea[name=records]", '{"id": "r1", "ms": 10}')
        await page.get_by_role("button", name="Submit task").click()
        await expect(page.locator("#priority-error")).to_contain_text("above team search's priority cap of 0")
        await expect(page.locator("#team-error")).to_be_hidden()
        await _shot(page, "10-submit-priority-above-cap")

        await page.fill("input[name=priority]", "0")
        await page.get_by_role("button", name="Submit task").click()
        await page.wait_for_url("**/#/tasks/search/ranker/urgent")
        await browser.close()
    assert [e for e in console_errors if "status of 403" not in e] == []
