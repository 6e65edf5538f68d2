"""Owner policy: the machine works only while its owner does not need it.

On macOS: the user has been idle long enough (`ioreg -c IOHIDSystem`), the Mac is on AC power
(`pmset -g batt`) and not thermally throttled (`pmset -g therm`). On Linux the machine is always
available, unless a load-average limit is set. The parsers are pure functions of the commands'
text, so tests feed them recorded real outputs; the commands run through `run_command`.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from minions.agents.macos.config import PolicyConfig
from minions.logging import get_logger

log = get_logger(__name__)

CommandRunner = Callable[..., Awaitable[str | None]]
T = TypeVar("T")

_HID_IDLE = re.compile(r'"HIDIdleTime"\s*=\s*(\d+)')
_POWER_SOURCE = re.compile(r"Now drawing from '([^']+)'")
_CPU_SPEED_LIMIT = re.compile(r"CPU_Speed_Limit\s*=\s*(\d+)")


@dataclass(frozen=True)
class Verdict:
    available: bool
    reason: str  # why not, or "available"


# -- pure parsers ------------------------------------------------------------------------------


def parse_idle_seconds(ioreg_output: str) -> float | None:
    """Seconds since the last keyboard/mouse event; ioreg reports HIDIdleTime in nanoseconds."""
    match = _HID_IDLE.search(ioreg_output)
    return int(match.group(1)) / 1e9 if match else None


def parse_on_ac_power(pmset_batt_output: str) -> bool | None:
    """True on 'AC Power', False on 'Battery Power' (or a UPS), None if the text says neither."""
    match = _POWER_SOURCE.search(pmset_batt_output)
    if match is None:
        return None
    return match.group(1) == "AC Power"


def parse_cpu_speed_limit(pmset_therm_output: str) -> int | None:
    """The CPU speed limit in percent; below 100 the system is throttling for heat. Apple Silicon
    often records no limit at all ('No thermal warning level has been recorded'): None."""
    match = _CPU_SPEED_LIMIT.search(pmset_therm_output)
    return int(match.group(1)) if match else None


# -- command runner ----------------------------------------------------------------------------


async def run_command(*argv: str, timeout_s: float = 5.0) -> str | None:
    """stdout of a command, or None when it is missing, fails or hangs."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
    except OSError:
        return None
    try:
        stdout, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    return stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


# -- the policy --------------------------------------------------------------------------------


class OwnerPolicy:
    """Decides whether the agent may work right now."""

    def __init__(
        self,
        config: PolicyConfig,
        system: str | None = None,
        runner: CommandRunner = run_command,
        load_average: Callable[[], float] = lambda: os.getloadavg()[0],
    ) -> None:
        self._config = config
        self._system = system or platform.system()
        self._run = runner
        self._load_average = load_average
        self._warned: set[str] = set()

    async def check(self) -> Verdict:
        if self._system == "Darwin":
            checks = [self._idle(), self._power(), self._thermal()]
        else:
            checks = [self._load()]
        for verdict in await asyncio.gather(*checks):
            if not verdict.available:
                return verdict
        return Verdict(True, "available")

    async def wait_until_available(self, poll_s: float = 5.0) -> None:
        """Returns once every check passes; logs each change of the reason it waits for."""
        last_reason = ""
        while True:
            verdict = await self.check()
            if verdict.available:
                if last_reason:
                    log.info("policy_available")
                return
            if verdict.reason != last_reason:
                log.info("policy_waiting", reason=verdict.reason)
                last_reason = verdict.reason
            await asyncio.sleep(poll_s)

    async def _idle(self) -> Verdict:
        needed_s = self._config.idle_minutes * 60
        if needed_s <= 0:
            return _OK
        idle_s = _parsed(await self._run("ioreg", "-c", "IOHIDSystem"), parse_idle_seconds)
        if idle_s is None:
            return self._unknown("ioreg HIDIdleTime")
        if idle_s < needed_s:
            return Verdict(False, f"user active (idle {idle_s:.0f} s of {needed_s:.0f} s needed)")
        return _OK

    async def _power(self) -> Verdict:
        if not self._config.require_ac_power:
            return _OK
        on_ac = _parsed(await self._run("pmset", "-g", "batt"), parse_on_ac_power)
        if on_ac is None:
            return self._unknown("pmset -g batt")
        return _OK if on_ac else Verdict(False, "on battery power")

    async def _thermal(self) -> Verdict:
        if not self._config.avoid_thermal_pressure:
            return _OK
        output = await self._run("pmset", "-g", "therm")
        if output is None:
            return self._unknown("pmset -g therm")
        limit = parse_cpu_speed_limit(output)
        if limit is not None and limit < 100:
            return Verdict(False, f"thermal pressure (CPU speed limited to {limit}%)")
        return _OK

    async def _load(self) -> Verdict:
        if self._config.max_load is None:
            return _OK
        load = self._load_average()
        if load > self._config.max_load:
            return Verdict(False, f"load average {load:.2f} above {self._config.max_load:g}")
        return _OK

    def _unknown(self, what: str) -> Verdict:
        # Fail open: a machine whose tools answer oddly would otherwise never work at all; the
        # owner can still turn the agent off. Warn once, not every second.
        if what not in self._warned:
            self._warned.add(what)
            log.warning("policy_check_unreadable", check=what, assumed="available")
        return _OK


_OK = Verdict(True, "available")


def _parsed(output: str | None, parse: Callable[[str], T | None]) -> T | None:
    return None if output is None else parse(output)
