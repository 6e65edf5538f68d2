"""Client state follows the XDG base directories: the agent's config under XDG_CONFIG_HOME, and the
up.json of a running `minions up` under XDG_STATE_HOME, found from any folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from minions import up_json
from minions.agents.macos import cli as agent_cli
from minions.agents.macos import config as agent_config
from minions.agents.macos import install


def test_agent_config_honours_xdg_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("MINIONS_TOKEN", raising=False)
    (tmp_path / "xdg" / "minions").mkdir(parents=True)
    (tmp_path / "xdg" / "minions" / "agent.toml").write_text('token = "from-xdg"\nname = "xdg-box"\n')
    parser = argparse.ArgumentParser()
    agent_cli.add_parser(parser.add_subparsers(dest="command"))
    loaded = agent_config.from_args(parser.parse_args(["agent"]))
    assert loaded.token == "from-xdg" and loaded.name == "xdg-box"
    steps = install.plan(loaded, system="Linux")
    written = [path for path, _, _ in steps.files]
    assert written == [tmp_path / "xdg/minions/agent.toml", tmp_path / "xdg/systemd/user/minions-agent.service"]
    unit = steps.files[1][1]
    assert f"--config {tmp_path / 'xdg/minions/agent.toml'}" in unit


def test_relative_xdg_config_home_is_ignored(tmp_path: Path) -> None:
    assert agent_config.default_config_path(tmp_path, {"XDG_CONFIG_HOME": "rel/dir"}) == \
        tmp_path / ".config/minions/agent.toml"


def test_up_json_is_found_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    data_dir = tmp_path / "project" / ".minions"
    assert up_json.read_up_json(None) == {}
    up_json.publish_up_json(data_dir, {"api_url": "http://127.0.0.1:1", "admin_token": "t"})
    published = tmp_path / "state" / "minions" / "up.json"
    assert published.stat().st_mode & 0o777 == 0o600
    assert up_json.read_up_json(None)["api_url"] == "http://127.0.0.1:1"
    # A ./.minions of a `minions up` started in this folder comes first.
    (elsewhere / ".minions").mkdir()
    (elsewhere / ".minions" / "up.json").write_text('{"api_url": "http://127.0.0.1:2"}')
    assert up_json.read_up_json(None)["api_url"] == "http://127.0.0.1:2"
    # Stopping withdraws it, but only if it is still this data dir's.
    up_json.withdraw_up_json(tmp_path / "another")
    assert published.exists()
    up_json.withdraw_up_json(data_dir)
    assert not published.exists()
