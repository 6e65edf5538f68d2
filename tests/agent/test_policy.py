"""Owner policy: parsers on recorded real command outputs, and the checks built on them."""

from __future__ import annotations

import sys

import pytest

from minions.agents.macos import policy
from minions.agents.macos.config import PolicyConfig
from minions.agents.macos.policy import OwnerPolicy
from tests.agent.conftest import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_idle_time_is_parsed_from_nanoseconds() -> None:
    assert policy.parse_idle_seconds(fixture("ioreg_active.txt")) == pytest.approx(0.066589625)
    assert policy.parse_idle_seconds(fixture("ioreg_idle.txt")) == pytest.approx(412.345678901)
    assert policy.parse_idle_seconds("+-o Root  <class IORegistryEntry>") is None


def test_power_source() -> None:
    assert policy.parse_on_ac_power(fixture("pmset_batt_ac.txt")) is True
    assert policy.parse_on_ac_power(fixture("pmset_batt_desktop.txt")) is True
    assert policy.parse_on_ac_power(fixture("pmset_batt_battery.txt")) is False
    assert policy.parse_on_ac_power("Now drawing from 'UPS Power'\n") is False
    assert policy.parse_on_ac_power("") is None


def test_cpu_speed_limit() -> None:
    assert policy.parse_cpu_speed_limit(fixture("pmset_therm_ok.txt")) == 100
    assert policy.parse_cpu_speed_limit(fixture("pmset_therm_throttled.txt")) == 76
    assert policy.parse_cpu_speed_limit(fixture("pmset_therm_apple_silicon.txt")) is None


class RecordedMac:
    """Answers the policy's commands with recorded outputs."""

    def __init__(self, ioreg: str, batt: str, therm: str | None) -> None:
        self.outputs = {"ioreg": fixture(ioreg), "batt": fixture(batt), "therm": therm and fixture(therm)}
        self.calls: list[tuple[str, ...]] = []

    async def __call__(self, *argv: str) -> str | None:
        self.calls.append(argv)
        return self.outputs["ioreg" if argv[0] == "ioreg" else argv[-1]]


async def test_mac_available_when_idle_on_ac_and_cool() -> None:
    mac = RecordedMac("ioreg_idle.txt", "pmset_batt_ac.txt", "pmset_therm_apple_silicon.txt")
    verdict = await OwnerPolicy(PolicyConfig(idle_minutes=5), "Darwin", mac).check()
    assert verdict.available, verdict.reason
    assert {c[0] for c in mac.calls} == {"ioreg", "pmset"}


@pytest.mark.parametrize(
    ("ioreg", "batt", "therm", "reason"),
    [
        ("ioreg_active.txt", "pmset_batt_ac.txt", "pmset_therm_ok.txt", "user active"),
        ("ioreg_idle.txt", "pmset_batt_battery.txt", "pmset_therm_ok.txt", "on battery power"),
        ("ioreg_idle.txt", "pmset_batt_ac.txt", "pmset_therm_throttled.txt", "thermal pressure"),
    ],
)
async def test_mac_unavailable(ioreg: str, batt: str, therm: str, reason: str) -> None:
    verdict = await OwnerPolicy(PolicyConfig(idle_minutes=5), "Darwin", RecordedMac(ioreg, batt, therm)).check()
    assert not verdict.available
    assert reason in verdict.reason


async def test_each_check_can_be_turned_off() -> None:
    mac = RecordedMac("ioreg_active.txt", "pmset_batt_battery.txt", "pmset_therm_throttled.txt")
    off = PolicyConfig(idle_minutes=0, require_ac_power=False, avoid_thermal_pressure=False)
    assert (await OwnerPolicy(off, "Darwin", mac).check()).available
    assert mac.calls == []  # a check that is off runs no command


async def test_unreadable_command_fails_open() -> None:
    async def broken(*argv: str) -> str | None:
        return None

    assert (await OwnerPolicy(PolicyConfig(), "Darwin", broken).check()).available


async def test_linux_is_available_unless_loaded() -> None:
    assert (await OwnerPolicy(PolicyConfig(), "Linux", load_average=lambda: 50.0).check()).available
    busy = OwnerPolicy(PolicyConfig(max_load=4.0), "Linux", load_average=lambda: 6.5)
    verdict = await busy.check()
    assert not verdict.available and "load average 6.50" in verdict.reason
    assert (await OwnerPolicy(PolicyConfig(max_load=4.0), "Linux", load_average=lambda: 1.0).check()).available


async def test_run_command_captures_stdout_and_reports_failures() -> None:
    assert await policy.run_command(sys.executable, "-c", "print('HIDIdleTime')") == "HIDIdleTime\n"
    assert await policy.run_command(sys.executable, "-c", "raise SystemExit(3)") is None
    assert await policy.run_command("/nonexistent/ioreg") is None
    assert await policy.run_command(sys.executable, "-c", "import time; time.sleep(5)", timeout_s=0.2) is None
