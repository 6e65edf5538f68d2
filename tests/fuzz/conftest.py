"""One live API server for the fuzz package (see live.py), and a `requests` session to reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

from tests.fuzz.live import LiveApi

if TYPE_CHECKING:
    from tests.support.database import TestDatabases


@pytest.fixture(scope="package")
def live(template_ready: TestDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    with LiveApi(template_ready.fresh, Path(tmp_path_factory.mktemp("fuzz-store"))) as api:
        yield api


@pytest.fixture(scope="package")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session
