"""The API stops promptly on SIGTERM, even with executors long-polling: each waiting claim is
answered 204 at once (the executor claims again, from a replica still serving) rather than holding
the process until its poll or the server's shutdown timeout runs out."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor


async def test_sigterm_answers_waiting_claims_and_exits_at_once(services: Services, database_url: str) -> None:
    _, executor_token = await make_tokens(database_url)
    services.long_poll_s = 60.0  # longer than any shutdown timeout: only an answer now ends these polls
    services.workdir.mkdir(parents=True)
    api = services.start("api")
    await services.wait_healthy()
    assert api.process is not None
    executors = [SleepExecutor(services.api_url, executor_token, f"poller-{i}") for i in range(3)]
    async with aiohttp.ClientSession() as session:
        for executor in executors:
            await executor.register(session)

        async def claim(executor: SleepExecutor) -> int:
            async with session.post(f"{services.api_url}/api/v1/executors/{executor.executor_id}/claim",
                                    params={"wait": "60"}, headers=executor._headers()) as resp:
                await resp.read()
                return resp.status

        claims = [asyncio.create_task(claim(e)) for e in executors]
        await asyncio.sleep(1.0)  # each has run its claim query and is waiting
        assert not any(c.done() for c in claims)

        stopped = time.monotonic()
        exit_code = await asyncio.to_thread(api.terminate, 30)
        exit_s = time.monotonic() - stopped
        statuses = await asyncio.wait_for(asyncio.gather(*claims), 5)

    assert exit_code == 0, api.log()[-3000:]
    assert exit_s < 2.5, f"the API took {exit_s:.1f} s to exit with claims waiting"
    assert statuses == [204, 204, 204]
