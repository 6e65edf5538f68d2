"""When nothing listens at the API URL, the SDK and the CLI say so in the user's terms (which URL,
and that `minions up` may not be running), not in aiohttp's."""

from __future__ import annotations

import argparse
import socket

import pytest

from minions.cli.client_command import client_command
from minions.sdk import ApiUnreachable, MinionsClient


def _closed_port_url() -> str:
    # A port just released by this process: nothing listens on it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_the_sdk_names_the_url_and_the_likely_cause() -> None:
    url = _closed_port_url()
    async with MinionsClient(url, "mn_unused", retries=0) as client:
        with pytest.raises(ApiUnreachable) as caught:
            await client.tasks()
    assert str(caught.value) == f"cannot reach the API at {url} (Connection refused) — is `minions up` running?"
    assert isinstance(caught.value, ConnectionError)


def test_a_cli_command_prints_one_line_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = _closed_port_url()

    @client_command
    async def status(args: argparse.Namespace) -> int:
        async with MinionsClient(args.api_url, "mn_unused", retries=1) as client:
            await client.tasks()
        return 0

    assert status(argparse.Namespace(api_url=url)) == 1
    err = capsys.readouterr().err
    assert err == f"minions: cannot reach the API at {url} (Connection refused) — is `minions up` running?\n"
    assert "ClientConnectorError" not in err and "Traceback" not in err


async def test_the_cli_says_at_once_why_it_waits(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's client retries a connection never made (an API restarting), but says on the first
    failure why nothing happens yet, once, instead of staying silent for half a minute."""
    from minions.cli import connection

    url = _closed_port_url()
    args = argparse.Namespace(data_dir=None, api_url=url, token="mn_unused")
    client = connection.client_from_args(args)
    client.retries = 2
    client._backoff.first_s = 0.01
    async with client:
        with pytest.raises(ApiUnreachable):
            await client.tasks()
    err = capsys.readouterr().err
    assert err == (f"minions: cannot reach the API at {url} (Connection refused) — is `minions up` running? "
                   "Trying again for about half a minute.\n")
