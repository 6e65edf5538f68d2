"""The agent process: load the runners and models, run an Agent until SIGINT/SIGTERM, and say how
it ended in its exit status (0, or 78 for a configuration no restart can fix)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Mapping
from typing import Any

from minions.agents.macos import hardware
from minions.agents.macos.agent import Agent
from minions.agents.macos.client import AuthError, ExecutorClient, Quarantined, Rejected
from minions.agents.macos.config import AgentConfig
from minions.agents.macos.policy import OwnerPolicy
from minions.agents.macos.runners.base import ChoosesPrecision, Runner, RunnerError
from minions.agents.macos.runners.registry import build_runners, uses_torch
from minions.logging import get_logger

log = get_logger(__name__)

EXIT_OK = 0
# EX_CONFIG: a bad token or configuration. The systemd unit does not restart on it (a restart
# loop cannot fix a token), and launchd throttles it.
EXIT_CONFIG = 78


async def discover_models(config: AgentConfig, runners: Mapping[str, Runner]) -> list[str]:
    """The configured models plus those the runners find locally, without duplicates."""
    found = await asyncio.gather(*(r.advertised_models() for r in runners.values()))
    return list(dict.fromkeys([*config.models, *(m for models in found for m in models)]))


async def prepare_models(runners: Mapping[str, Runner]) -> None:
    """Load the models the runners hold locally before registering, so that their precision (chosen
    at load) is reported at registration; a model that fails to load is left to the first subtask."""
    for runner in runners.values():
        if not isinstance(runner, ChoosesPrecision):
            continue
        for model in await runner.advertised_models():
            try:
                await runner.prepare(model)
            except RunnerError as exc:
                log.warning("model_prepare_failed", model=model, error=str(exc))


async def serve(config: AgentConfig) -> int:
    """Run an agent until SIGINT/SIGTERM (exit 0) or a refused token (exit 78)."""
    main = asyncio.current_task()
    assert main is not None
    # Handlers first: a SIGTERM during the (seconds-long) torch probe must still exit cleanly.
    stopping = _install_signal_handlers(main)
    runners: dict[str, Runner] = {}
    try:
        machine = await asyncio.to_thread(hardware.detect, config.device, uses_torch(config))
        runners = build_runners(config, machine.device)
        models = await discover_models(config, runners)
        await prepare_models(runners)
        async with ExecutorClient(config.api_url, config.token) as client:
            agent = Agent(config, client, runners, OwnerPolicy(config.policy), machine, models,
                          max_leases=config.max_leases)
            await agent.run()
        return EXIT_OK
    except asyncio.CancelledError:
        if not stopping():
            raise
        main.uncancel()
        log.info("agent_stopped")
        return EXIT_OK
    except Quarantined as exc:
        log.error("executor_quarantined", error=str(exc))
        return EXIT_CONFIG
    except AuthError as exc:
        log.error("token_refused", error=str(exc))
        return EXIT_CONFIG
    except Rejected as exc:
        # Only registration lets a 4xx escape (e.g. 422: a preference outside the token's team);
        # restarting cannot fix the configuration, so this is a configuration exit too.
        log.error("registration_rejected", error=f"the API rejected this agent's registration: {exc}")
        return EXIT_CONFIG
    finally:
        _remove_signal_handlers()
        await asyncio.gather(*(r.aclose() for r in runners.values()), return_exceptions=True)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _install_signal_handlers(main: asyncio.Task[Any]) -> Callable[[], bool]:
    """The first SIGINT/SIGTERM cancels the main task (which hands work back and deregisters);
    later ones are ignored so the clean-up is not cut short."""
    state = {"stopping": False}

    def on_signal(name: str) -> None:
        if state["stopping"]:
            log.info("agent_already_stopping", signal=name)
            return
        state["stopping"] = True
        log.info("agent_stopping", signal=name)
        main.cancel()

    loop = asyncio.get_running_loop()
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    return lambda: state["stopping"]


def _remove_signal_handlers() -> None:
    loop = asyncio.get_running_loop()
    for sig in _SIGNALS:
        loop.remove_signal_handler(sig)
