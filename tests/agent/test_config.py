"""Agent configuration: preferences, TOML file, environment and flag precedence."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from minions.agents.macos import config
from minions.agents.macos.config import AgentConfigError, Preference


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/minions/agent.toml of the developer's


def parse(argv: list[str], env: dict[str, str] | None = None) -> config.AgentConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(argv), {"MINIONS_TOKEN": "t0k", **(env or {})})


def test_preferences_with_nulls() -> None:
    assert config.parse_preference("search") == Preference("search", None, None)
    assert config.parse_preference("search/ranker") == Preference("search", "ranker", None)
    assert config.parse_preference("search/ranker/emb-1").to_json() == {
        "team": "search",
        "project": "ranker",
        "task_name": "emb-1",
    }
    for bad in ("", "search//x", "a/b/c/d", "-search", "sea rch", "x" * 65):
        with pytest.raises(AgentConfigError):
            config.parse_preference(bad)


def test_a_preference_name_with_a_newline_is_refused() -> None:
    # The same rule as the API's (minions/names.py, \Z): "$" would accept "search\n".
    for bad in ("search\n/ranker", "search/ranker\n/emb-1"):
        with pytest.raises(AgentConfigError):
            config.parse_preference(bad)


def test_repeatable_prefer_keeps_order() -> None:
    cfg = parse(["--prefer", "search/ranker/emb-1", "--prefer", "ads"])
    assert [p.to_json() for p in cfg.preferences] == [
        {"team": "search", "project": "ranker", "task_name": "emb-1"},
        {"team": "ads", "project": None, "task_name": None},
    ]


def test_defaults() -> None:
    cfg = parse([])
    assert cfg.kinds == ("embedding", "completion", "sleep")
    assert cfg.ollama_host == "http://127.0.0.1:11434"
    assert cfg.completion_backend == "ollama" and not cfg.allow_pull
    assert 0 < cfg.mps_memory_fraction <= 0.5
    assert cfg.policy.idle_minutes > 0 and cfg.policy.require_ac_power and cfg.policy.avoid_thermal_pressure
    assert cfg.name  # the host name


def test_file_env_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text(
        'api_url = "http://file:1"\ntoken = "from-file"\nname = "anna-mbp"\nkinds = ["embedding", "sleep"]\n'
        'prefer = ["search/ranker"]\nthreads = 2\n[policy]\nidle_minutes = 10\nrequire_ac_power = false\n'
    )
    cfg = parse(["--config", str(file)], env={"MINIONS_API_URL": "http://env:2", "OLLAMA_HOST": "http://o:3"})
    assert (cfg.api_url, cfg.token, cfg.name, cfg.threads) == ("http://env:2", "t0k", "anna-mbp", 2)
    assert cfg.kinds == ("embedding", "sleep") and cfg.ollama_host == "http://o:3"
    assert cfg.policy.idle_minutes == 10 and not cfg.policy.require_ac_power
    assert cfg.preferences == (Preference("search", "ranker"),)

    cfg = parse(
        [
            "--config",
            str(file),
            "--api-url",
            "http://flag:4",
            "--kind",
            "completion",
            "--no-idle-check",
            "--no-thermal-check",
            "--allow-pull",
            "--completion-backend",
            "transformers",
            "--model",
            "m1",
            "--model",
            "m1",
            "--max-load",
            "3.5",
            "--mps-memory-fraction",
            "0.3",
        ],
        env={"MINIONS_API_URL": "http://env:2"},
    )
    assert cfg.api_url == "http://flag:4" and cfg.kinds == ("completion",) and cfg.models == ("m1",)
    assert cfg.policy.idle_minutes == 0 and not cfg.policy.avoid_thermal_pressure and cfg.policy.max_load == 3.5
    assert cfg.allow_pull and cfg.completion_backend == "transformers" and cfg.mps_memory_fraction == 0.3


def test_config_round_trips_through_toml(tmp_path: Path) -> None:
    cfg = parse(
        ["--prefer", "search/ranker", "--kind", "sleep", "--threads", "3", "--max-load", "2", "--token", 'we"ird\\tok']
    )
    file = tmp_path / "agent.toml"
    file.write_text(config.to_toml(cfg))
    assert parse(["--config", str(file)], env={"MINIONS_TOKEN": ""}) == cfg


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mps-memory-fraction", "1.5"], "mps_memory_fraction"),
        (["--threads", "0"], "threads"),
        (["--prefer", "a/b/c/d"], "--prefer"),
    ],
)
def test_invalid_values_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(AgentConfigError, match=message):
        parse(argv)


def test_device_settings() -> None:
    cfg = parse([])
    assert (cfg.precision, cfg.min_cosine, cfg.generation_batch_size, cfg.ollama_parallel) == ("auto", 0.9999, None, 1)
    assert parse([], {"OLLAMA_NUM_PARALLEL": "4"}).ollama_parallel == 4  # as many as Ollama's slots
    cfg = parse(
        ["--precision", "bf16", "--min-cosine", "0.999", "--generation-batch-size", "8", "--ollama-parallel", "2"],
        {"OLLAMA_NUM_PARALLEL": "4"},
    )
    assert (cfg.precision, cfg.min_cosine, cfg.generation_batch_size, cfg.ollama_parallel) == ("bf16", 0.999, 8, 2)
    for argv, message in (
        (["--min-cosine", "1.5"], "min_cosine"),
        (["--generation-batch-size", "0"], "generation_batch_size"),
        (["--ollama-parallel", "0"], "ollama_parallel"),
    ):
        with pytest.raises(AgentConfigError, match=message):
            parse(argv)
    with pytest.raises(AgentConfigError, match="OLLAMA_NUM_PARALLEL"):
        parse([], {"OLLAMA_NUM_PARALLEL": "many"})


def test_missing_token_and_unknown_file_keys(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="no token"):
        parse([], env={"MINIONS_TOKEN": ""})
    file = tmp_path / "agent.toml"
    file.write_text('tokn = "typo"\n')
    with pytest.raises(AgentConfigError, match="unknown setting"):
        parse(["--config", str(file)])
