"""`minions agent install --dry-run`: the unit files carry the keys that make the agent behave."""

from __future__ import annotations

import argparse
import plistlib
from pathlib import Path

import pytest

from minions.agents.macos import cli, config, install


def agent_config(**changes: object) -> config.AgentConfig:
    return config.build({"token": "s3cret", "name": "anna-mbp", "prefer": ["search/ranker"], **changes})


def test_launchd_plist_has_the_required_keys(tmp_path: Path) -> None:
    steps = install.plan(agent_config(), system="Darwin", home=tmp_path)
    (conf_path, conf, conf_mode), (plist_path, plist_text, _) = steps.files
    assert plist_path == tmp_path / "Library/LaunchAgents/com.minions.agent.plist"
    assert conf_mode == 0o600 and "s3cret" in conf and "s3cret" not in plist_text
    plist = plistlib.loads(plist_text.encode())
    assert plist["Label"] == "com.minions.agent"
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProcessType"] == "Adaptive"
    assert plist["LowPriorityIO"] is True
    assert plist["StandardOutPath"].startswith(str(tmp_path / "Library/Logs/minions/"))
    assert plist["StandardErrorPath"].startswith(str(tmp_path / "Library/Logs/minions/"))
    assert plist["ProgramArguments"][1:] == ["-m", "minions.agents.macos", "--config", str(conf_path)]
    assert steps.activate == ("launchctl", "load", "-w", str(plist_path))
    standard = install.plan(agent_config(), system="Darwin", home=tmp_path, process_type="Standard")
    assert plistlib.loads(standard.files[1][1].encode())["ProcessType"] == "Standard"
    with pytest.raises(ValueError):
        install.render_launchd(conf_path, process_type="Background")


def test_systemd_unit(tmp_path: Path) -> None:
    steps = install.plan(agent_config(), system="Linux", home=tmp_path)
    unit_path, unit, _ = steps.files[1]
    assert unit_path == tmp_path / ".config/systemd/user/minions-agent.service"
    assert "Restart=on-failure" in unit and "WantedBy=default.target" in unit
    assert "-m minions.agents.macos --config" in unit and "s3cret" not in unit
    assert steps.activate is None and "systemctl --user enable --now minions-agent.service" in steps.hint


def test_dry_run_prints_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MINIONS_TOKEN", "s3cret")
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", "install", "--dry-run", "--prefer", "search", "--no-ac-check"])
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and 'token = "<redacted>"' in out
    assert 'prefer = ["search"]' in out and "require_ac_power = false" in out
    assert ("<key>KeepAlive</key>" in out) or ("Restart=on-failure" in out)
    assert not any(tmp_path.rglob("*.plist")) and not any(tmp_path.rglob("*.service"))


def test_install_writes_private_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(install.platform, "system", lambda: "Linux")
    assert install.install(agent_config()) == 0
    conf = tmp_path / ".config/minions/agent.toml"
    assert conf.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / ".config/systemd/user/minions-agent.service").exists()
